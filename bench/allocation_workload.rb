# frozen_string_literal: true

# The workload of bench/allocation_overhead.rb (which starts it as fresh processes):
#
#   ruby -Ilib bench/allocation_workload.rb PROFILER THREADS SEGMENTS [SHAPE]
#
# Steady state of a profiler left running, in one process: SEGMENTS pairs of segments of
# the same work, one with PROFILER running and one without, in random order; the ratio of
# a pair is the process CPU of its profiled segment over its plain one. The profiler is
# started before its segment and stopped after it (outside the measurement), so only
# continuous profiling is measured, in the same process, memory layout and moment of the
# machine for both. THREADS threads share the work (16: they contend for the GVL, as a
# server's thread pool does). PROFILER is none (the noise floor), contprof (its defaults),
# stackprof (cpu mode, 1 ms), datadog (its defaults) or vernier (wall mode); see
# bench/support/peers.rb. SHAPE is alloc (default: builds strings, fills a hash and sorts
# an array, as most Ruby code does), fib (recursive calls that allocate nothing) or rails
# (requests to bench/rails/config.ru's JSON endpoint through Rack, in the process).
# Prints key=value pairs.
require_relative "support/peers"
require_relative "support/statistics"
include BenchStatistics # rubocop:disable Style/MixinUsage

profiler, threads, segments, shape = ARGV
threads = Integer(threads)
segments = Integer(segments)
shape ||= "alloc"
agent_port = ENV["AGENT_PORT"].to_s.empty? ? nil : Integer(ENV["AGENT_PORT"])

WORDS = %w[alpha beta gamma delta epsilon zeta eta theta iota kappa].freeze

# One unit: about 30 allocations, as ordinary application code makes them.
def alloc_unit(table, seed)
  names = Array.new(12) { |i| "#{WORDS[(seed + i) % WORDS.size]}-#{seed * 7 + i}" }
  names.sort!
  names.each_with_index { |name, i| table[name[0, 5]] = [i, name.upcase] }
  table.size + names.sum(&:size)
end

def fib(n) = n < 2 ? n : fib(n - 1) + fib(n - 2)

# SHAPE rails: one request of bench/rails/config.ru's JSON endpoint, through Rack in this
# process (no server, no socket): Rails' own code, without puma's threads and I/O.
if shape == "rails"
  require "rack"
  ENV["RAILS_ENV"] = "production"
  RAILS_APP = Rack::Builder.parse_file(File.join(__dir__, "rails", "config.ru")).then { |app| app.is_a?(Array) ? app[0] : app }
  RAILS_ENV = Rack::MockRequest.env_for("/items").freeze
end

def rails_request
  status, _headers, body = RAILS_APP.call(RAILS_ENV.dup)
  raise "GET /items answered #{status}" unless status == 200

  body.close if body.respond_to?(:close)
  true
end

def unit(shape, table, seed)
  case shape
  when "fib" then fib(12)
  when "rails" then rails_request
  else alloc_unit(table, seed)
  end
end

def process_cpu = Process.clock_gettime(Process::CLOCK_PROCESS_CPUTIME_ID)

# Units for about half a second of CPU (WORK_UNITS: the same work in every process).
units = ENV["WORK_UNITS"]&.then { |n| Integer(n) } || begin
  table = {}
  start = process_cpu
  calibration = 0
  calibration += 1 while unit(shape, table, calibration) && process_cpu - start < 0.2
  calibration * 5 / 2
end

# A pool of THREADS threads; a segment hands each its share and waits for all.
jobs = Array.new(threads) { Queue.new }
done = Queue.new
pool = jobs.map.with_index do |queue, index|
  Thread.new do
    Thread.current.name = "worker #{index}"
    own = {}
    while (count = queue.pop)
      count.times { |i| unit(shape, own, i) }
      done << true
    end
  end
end
run_segment = lambda do
  jobs.each_with_index { |queue, index| queue << (units / threads + (index < units % threads ? 1 : 0)) }
  threads.times { done.pop }
end

peer = profiler == "none" ? nil : Peers::InProcess.new(profiler, agent_port: agent_port)
# Warm-up, the profiler's first start and stop included (a first start loads code).
peer&.start
run_segment.call
peer&.stop
with = []
without = []
samples = []
random = Random.new
segments.times do
  [true, false].shuffle(random: random).each do |profiled|
    # Garbage left by the previous segment (and by a profiler's stop) is not this one's.
    GC.start
    peer&.start if profiled
    before = process_cpu
    run_segment.call
    used = process_cpu - before
    (profiled ? with : without) << used
    next unless profiled && peer

    peer.stop
    samples << peer.samples.to_i
  end
end
jobs.each { |queue| queue << nil }
pool.each(&:join)
ratios = with.zip(without).map { |profiled, plain| profiled / plain }
puts "units=#{units} ratio=#{median(ratios)} with=#{median(with)} without=#{median(without)} " \
     "samples=#{samples.empty? ? 0 : median(samples)} ratios=#{ratios.join(",")}"
