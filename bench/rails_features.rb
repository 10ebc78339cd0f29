# frozen_string_literal: true

# What each Contprof feature costs a Rails request, measured in-process (no network, no
# puma, no load generator: their noise hides a percent), on the JSON API of bench/rails.rb
# (bench/rails/config.ru, Debian's Rails 6.1 on 3.1, 7.2 on 3.3):
#
#   ruby -Ilib bench/rails_features.rb    # ROUNDS=20 SECONDS=1.5 ENDPOINT=/items SWITCHES=200
#
# First, the middleware's own cost: Contprof::Rack around an app that does nothing, and a
# controller's dispatch with and without its Rails hook (200,000 calls each). Then, with the profiler running throughout, the Rails app with and without the
# middleware and hook, switched every 0.25 s SWITCHES times (this virtual machine's CPU
# time per request drifts by tens of percent over seconds: short alternating segments
# share the drift). Last, variants that need the profiler restarted, each a segment of
# SECONDS per round, in random order:
#   off    no profiler
#   time   time profiling alone (CPU and wall time; allocation: false, timeline: false)
#   alloc  time profiling and allocation profiling at its default rate (the defaults on 3.1.4+)
#   heap   that and live-heap tracking (Ruby 3.3+)
#   armed  allocation profiling at a fixed interval of ARMED_INTERVAL (2,000), below the
#          sampler's arming margin at Rails' allocation rate, so its hook is on for every
#          allocation: a cost large enough to measure well
#   timeline time profiling with timeline: true (every sample timestamped; the default)
# The allocation hook's share of the allocations is counted (stats) in `alloc` and `armed`,
# which bounds `alloc`'s cost from above: armed's cost beyond time profiling, times the
# ratio of the hook's calls per request (armed also records far more samples per hook
# call, so its cost per call is the larger).
# Each segment starts the profiler before and stops it after (its CPU is the process's, so
# the profiler's own threads count; the final flush does not, nor the first 0.1 s after
# start, before the allocation sampler has measured the allocation rate, when a fixed
# interval (as `armed`) keeps its hook on: a profiler left on pays that once, not every
# segment). The figure is the ratio of CPU
# per request to `time`'s (what a feature adds beyond time profiling) and to `off`'s, median
# and spread over the rounds.
require "rbconfig"
require "tmpdir"

ROUNDS = Integer(ENV.fetch("ROUNDS", "20"))
SECONDS = Float(ENV.fetch("SECONDS", "1.5"))
SWITCHES = Integer(ENV.fetch("SWITCHES", "200"))
ENDPOINT = ENV.fetch("ENDPOINT", "/items")
APP = File.join(__dir__, "rails", "config.ru")

abort "bench/rails_features.rb needs Rails (Debian: apt-get install ruby-rails)" unless system(RbConfig.ruby, "-e", "require 'rails'", err: File::NULL)

require "contprof"
require "rack"
require "rack/mock"
require_relative "support/statistics"
include BenchStatistics # rubocop:disable Style/MixinUsage

def cpu = Process.clock_gettime(Process::CLOCK_PROCESS_CPUTIME_ID)
def now = Process.clock_gettime(Process::CLOCK_MONOTONIC)

def serve(app, env)
  _, _, body = app.call(env.dup)
  body.each { |_| nil }
  body.close if body.respond_to?(:close)
end

output = Dir.mktmpdir("contprof-bench-rails-features")
quiet = { output: output, log_level: "error", rack: false }

# The middleware alone.
Contprof.start(**quiet)
bare = ->(_env) { [200, {}, ["ok"]] }
wrapped = Contprof::Rack.new(bare)
env = Rack::MockRequest.env_for("/users/42/orders?page=2")
calls = 200_000
alone = median(Array.new(5) do
  costs = [bare, wrapped].map do |app|
    start = cpu
    calls.times { app.call(env) }
    (cpu - start) / calls
  end
  costs[1] - costs[0]
end)
Contprof.stop

rails_app = Rack::Builder.parse_file(APP)
rails_app = rails_app.first if rails_app.is_a?(Array) # rack 2 returns [app, options]
with_rack = Contprof::Rack.new(rails_app)
Contprof::Rack::Frameworks.send(:uninstrument_rails)
request_env = Rack::MockRequest.env_for(ENDPOINT)
heap = Contprof::Collectors::Allocations.heap_supported?
variants = {
  "off" => nil, "time" => { allocation: false, timeline: false }, "alloc" => { allocation: true, timeline: false },
}
variants["heap"] = { allocation: true, heap: true, timeline: false } if heap
ARMED_INTERVAL = Integer(ENV.fetch("ARMED_INTERVAL", "2000"))
variants["armed"] = { allocation: true, allocation_interval: ARMED_INTERVAL, timeline: false }
variants["timeline"] = { allocation: false, timeline: true }
# The Rails hook alone: a controller's dispatch inside a request, with the hook naming the
# route and without (the prepended method's call itself is in both: about 0.1 µs).
class BenchMetal < ActionController::Metal
  def index
    self.response_body = "ok"
  end
end
Contprof.start(**quiet)
Contprof::Rack::Frameworks.send(:instrument_rails)
metal_request = ActionDispatch::Request.new(Rack::MockRequest.env_for("/"))
Thread.current[:__contprof_request] = ["BenchMetal#index", "GET /", nil]
hook = median(Array.new(5) do
  costs = [false, true].map do |hooked|
    Contprof::Rack::Frameworks.send(hooked ? :instrument_rails : :uninstrument_rails)
    start = cpu
    calls.times { BenchMetal.dispatch("index", metal_request, ActionDispatch::Response.new) }
    (cpu - start) / calls
  end
  costs[1] - costs[0]
end)
Thread.current[:__contprof_request] = nil
Contprof::Rack::Frameworks.send(:uninstrument_rails)
Contprof.stop

# The middleware in the app, the profiler running throughout.
Contprof.start(**quiet)
300.times { serve(with_rack, request_env) } # warm-up: both paths, the route cache
300.times { serve(rails_app, request_env) }
switched = { false => [0.0, 0], true => [0.0, 0] }
SWITCHES.times do |i|
  middleware = i.odd?
  Contprof::Rack::Frameworks.send(middleware ? :instrument_rails : :uninstrument_rails)
  app = middleware ? with_rack : rails_app
  start = cpu
  deadline = now + 0.25
  requests = 0
  while now < deadline
    serve(app, request_env)
    requests += 1
  end
  switched[middleware][0] += cpu - start
  switched[middleware][1] += requests
end
Contprof::Rack::Frameworks.send(:uninstrument_rails)
Contprof.stop
with_middleware, without_middleware = [true, false].map { |key| switched[key][0] / switched[key][1] }

per_request = Hash.new { |h, k| h[k] = [] }
# The allocation hook's calls, allocations and samples, per variant, over all rounds.
hook_counts = Hash.new { |h, k| h[k] = Hash.new(0) }
ROUNDS.times do
  variants.keys.shuffle.each do |name|
    settings = variants[name]
    Contprof.start(**quiet, **settings) if settings
    app = rails_app
    settle = now + 0.1 # the allocation sampler's first rate check
    serve(app, request_env) while now < settle
    requests = 0
    before = settings && Contprof::Profiler.running.stats[:worker]
    allocated = GC.stat(:total_allocated_objects)
    start = cpu
    deadline = now + SECONDS
    while now < deadline
      serve(app, request_env)
      requests += 1
    end
    per_request[name] << (cpu - start) / requests
    if before && settings[:allocation]
      after = Contprof::Profiler.running.stats[:worker]
      hook_counts[name][:calls] += after[:allocation_hook_calls] - before[:allocation_hook_calls]
      hook_counts[name][:samples] += after[:allocation_samples] - before[:allocation_samples]
      hook_counts[name][:late] += after[:allocation_late_armings] - before[:allocation_late_armings]
      hook_counts[name][:allocations] += GC.stat(:total_allocated_objects) - allocated
      hook_counts[name][:requests] += requests
    end
    Contprof.stop if settings
  end
end

puts "Ruby #{RUBY_VERSION}, Rails #{Rails.version}, #{ENDPOINT}, #{ROUNDS} rounds of #{SECONDS} s per variant, in-process"
puts format("Contprof::Rack alone: %.2f µs per request; its Rails hook: %.2f µs (medians of 5 runs of %d calls)",
            alone * 1e6, hook * 1e6, calls)
puts format("Contprof::Rack in the app (%d switches of 0.25 s): %.3f ms per request with, %.3f ms without: %.4f; " \
            "middleware and hook alone: %.3f%% of a request", SWITCHES, with_middleware * 1e3, without_middleware * 1e3,
            with_middleware / without_middleware, 100 * (alone + hook) / without_middleware)
puts format("  %-6s %12s %20s %20s", "", "CPU/request", "vs time (spread)", "vs off (spread)")
variants.each_key do |name|
  vs = ->(base) { per_request[name].zip(per_request[base]).map { |a, b| a / b } }
  against_time = vs.("time")
  against_off = vs.("off")
  puts format("  %-6s %9.3f ms %8.4f (%.3f-%.3f) %8.4f (%.3f-%.3f)", name, median(per_request[name]) * 1e3,
              median(against_time), against_time.min, against_time.max, median(against_off), against_off.min, against_off.max)
end

hook_counts.each do |name, counts|
  puts format("  %-6s hook on for %.2f%% of %d allocations per request; %.3f samples per request (%d late of %d)", name,
              100.0 * counts[:calls] / counts[:allocations], counts[:allocations] / counts[:requests],
              counts[:samples].fdiv(counts[:requests]), counts[:late], counts[:samples])
end
if hook_counts.key?("armed") && hook_counts.key?("alloc")
  armed_cost = median(per_request["armed"].zip(per_request["time"]).map { |a, b| a / b }) - 1
  calls_ratio = hook_counts["alloc"][:calls].fdiv(hook_counts["alloc"][:requests]) /
                hook_counts["armed"][:calls].fdiv(hook_counts["armed"][:requests])
  puts format("allocation profiling's cost bound: armed adds %.1f%% per request; alloc's hook calls are %.4f of armed's: " \
              "alloc adds at most %.3f%%", 100 * armed_cost, calls_ratio, 100 * armed_cost * calls_ratio)
end
