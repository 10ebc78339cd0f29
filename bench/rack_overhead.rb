# frozen_string_literal: true

# What Contprof::Rack and its labels cost per request, while Contprof profiles:
#
#   ruby -Ilib bench/rack_overhead.rb     # SEGMENTS=20 SECONDS=1.5 ENDPOINT=/items
#
# 1. Alone: the middleware around an app that does nothing, against that app bare (the
#    CPU per call of the middleware itself: the endpoint name, the label set, the counts).
# 2. In the Rails JSON API of bench/rails.rb (bench/rails/config.ru, Debian's Rails 6.1),
#    called in-process (no network noise): the app with the middleware and its Rails hook,
#    and without either, in alternating segments of SECONDS; the ratio of their CPU per
#    request, median and spread over the pairs of segments.
require "rbconfig"
require "tmpdir"

SEGMENTS = Integer(ENV.fetch("SEGMENTS", "20"))
SECONDS = Float(ENV.fetch("SECONDS", "1.5"))
ENDPOINT = ENV.fetch("ENDPOINT", "/items")
APP = File.join(__dir__, "rails", "config.ru")

abort "bench/rack_overhead.rb needs Rails (Debian: apt-get install ruby-rails)" unless system(RbConfig.ruby, "-e", "require 'rails'", err: File::NULL)

require "contprof"
require "rack"
require "rack/mock"

def cpu = Process.clock_gettime(Process::CLOCK_PROCESS_CPUTIME_ID)

def median(values)
  sorted = values.sort
  sorted.size.odd? ? sorted[sorted.size / 2] : (sorted[sorted.size / 2 - 1] + sorted[sorted.size / 2]) / 2.0
end

def serve(app, env_template)
  status, headers, body = app.call(env_template.dup)
  body.each { |_| nil }
  body.close if body.respond_to?(:close)
  [status, headers]
end

output = Dir.mktmpdir("contprof-bench-rack")
Contprof.start(output: output, rack: false) # the middleware is added by hand below

# 1. The middleware alone.
bare = ->(_env) { [200, {}, ["ok"]] }
wrapped = Contprof::Rack.new(bare)
env = Rack::MockRequest.env_for("/users/42/orders?page=2")
calls = 200_000
timings = 5.times.map do
  [bare, wrapped].map do |app|
    start = cpu
    calls.times { app.call(env) }
    (cpu - start) / calls
  end
end
alone = median(timings.map { |bare_cost, wrapped_cost| wrapped_cost - bare_cost })

# 2. In the Rails app.
rails_app = Rack::Builder.parse_file(APP)
rails_app = rails_app.first if rails_app.is_a?(Array) # rack 2 returns [app, options]
with_middleware = Contprof::Rack.new(rails_app)
rails_env = Rack::MockRequest.env_for(ENDPOINT)
200.times { serve(with_middleware, rails_env) } # warm-up, both paths
hook = Contprof::Rack::Frameworks.send(:uninstrument_rails)
200.times { serve(rails_app, rails_env) }
ratios = []
per_request = { "with" => [], "without" => [] }
SEGMENTS.times do |segment|
  pair = {}
  order = segment.even? ? %w[with without] : %w[without with]
  order.each do |variant|
    Contprof::Rack::Frameworks.send(:instrument_rails) if variant == "with"
    app = variant == "with" ? with_middleware : rails_app
    requests = 0
    start = cpu
    wall_end = Process.clock_gettime(Process::CLOCK_MONOTONIC) + SECONDS
    while Process.clock_gettime(Process::CLOCK_MONOTONIC) < wall_end
      serve(app, rails_env)
      requests += 1
    end
    pair[variant] = (cpu - start) / requests
    per_request[variant] << pair[variant]
    Contprof::Rack::Frameworks.send(:uninstrument_rails) if variant == "with"
  end
  ratios << pair["with"] / pair["without"]
end
Contprof.stop
hook # (unsubscribed above)

puts "Ruby #{RUBY_VERSION}, Contprof profiling at its defaults (rack: false; the middleware added by hand)"
puts format("middleware alone: %.2f µs per request (median of 5 runs of %d calls)", alone * 1e6, calls)
puts format("Rails %s, %d pairs of %.1f s segments: %.3f ms per request without, %.3f ms with",
            ENDPOINT, SEGMENTS, SECONDS, median(per_request["without"]) * 1e3, median(per_request["with"]) * 1e3)
puts format("  with/without CPU per request: median %.4f (spread %.4f-%.4f); the middleware alone is %.2f%% of it",
            median(ratios), ratios.min, ratios.max, 100 * alone / median(per_request["without"]))
