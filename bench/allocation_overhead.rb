# frozen_string_literal: true

# What leaving a profiler on costs the code production runs: allocation-heavy Ruby, with 1
# and 16 threads, side by side with the profilers users would pick instead, in one run.
#
#   ruby -Ilib bench/allocation_overhead.rb   # PROCESSES=3 SEGMENTS=20 THREADS=1,16 SHAPES=alloc,fib PROFILERS=…
#
# Per row, PROCESSES fresh processes (taking turns with the other rows) each alternate
# SEGMENTS pairs of half-second segments with and without the profiler, in random order
# (bench/allocation_workload.rb); the ratio is the median over all pairs of the process CPU
# with / without, the spread the lowest and highest median of one process. The "none" row
# runs no profiler in either segment: the noise floor. Profilers at their defaults:
# contprof; stackprof (cpu mode, 1 ms); datadog (the `datadog` gem's profiler; on Ruby
# 3.1.2 it turns its GC profiling off by itself); vernier (wall mode, Ruby 3.2.1+). Shapes:
# alloc (strings, a hash, a sort: about 30 allocations per unit of work) and fib (recursive
# calls, no allocation: the shape of the older bench/overhead.rb). ALLOCATION=1 adds the
# allocation profilers: contprof-time (time profiling alone: where allocation profiling is on
# by default, Ruby 3.1.4+, the contprof row has it), contprof-alloc (allocation sampling at
# its default), contprof-heap
# (with live-heap tracking, Ruby 3.3+), stackprof-object
# (object mode, every 1000th allocation), datadog-alloc (its allocation profiling).
require "open3"
require "rbconfig"
require_relative "support/peers"
require_relative "support/statistics"
include BenchStatistics # rubocop:disable Style/MixinUsage

ROOT = File.expand_path("..", __dir__)
WORKLOAD = File.join(__dir__, "allocation_workload.rb")
PROCESSES = Integer(ENV.fetch("PROCESSES", "3"))
SEGMENTS = Integer(ENV.fetch("SEGMENTS", "20"))
THREADS = ENV.fetch("THREADS", "1,16").split(",").map { |t| Integer(t) }
SHAPES = ENV.fetch("SHAPES", "alloc,fib").split(",")

def run(profiler, threads, shape, segments, units: nil, agent_port: nil)
  env = Peers.env.merge("AGENT_PORT" => agent_port.to_s)
  env["WORK_UNITS"] = units.to_s if units
  out, err, status = Open3.capture3(env, RbConfig.ruby, "-I#{File.join(ROOT, "lib")}", WORKLOAD, profiler, threads.to_s,
                                    segments.to_s, shape)
  abort "#{profiler} (#{threads} threads, #{shape}) failed: #{err}" unless status.success?
  result = out.scan(/(\w+)=(\S+)/).to_h
  result["ratios"] = result["ratios"].split(",").map { |r| Float(r) }
  result
end

peers = %w[stackprof datadog vernier].select { |name| Peers.available?(name) }
profilers = ["none", "contprof", *peers]
if ENV["ALLOCATION"] == "1"
  profilers << "contprof-time" << "contprof-alloc"
  profilers << "contprof-heap" if Gem::Version.new(RUBY_VERSION) >= Gem::Version.new("3.3")
  profilers << "stackprof-object" if peers.include?("stackprof")
  profilers << "datadog-alloc" if peers.include?("datadog")
end
profilers &= ENV["PROFILERS"].split(",") if ENV["PROFILERS"] # a subset, e.g. PROFILERS=none,contprof,contprof-alloc
agent_port, sink = Peers.sink if profilers.any? { |name| name.start_with?("datadog") }
puts "Ruby #{RUBY_VERSION}; #{PROCESSES} processes x #{SEGMENTS} pairs of segments per row; profilers: #{profilers.join(", ")}"
begin
  SHAPES.each do |shape|
    THREADS.each do |threads|
      units = Integer(run("none", threads, shape, 1)["units"])
      results = Hash.new { |h, k| h[k] = [] }
      PROCESSES.times do
        profilers.each do |profiler|
          results[profiler] << run(profiler, threads, shape, SEGMENTS, units: units, agent_port: agent_port)
        end
      end
      puts
      puts "#{shape}, #{threads} thread#{"s" if threads > 1} (#{units} units per segment)"
      printf("  %-10s %8s %17s %9s\n", "profiler", "ratio", "(per process)", "samples")
      profilers.each do |profiler|
        runs = results[profiler]
        ratio = median(runs.flat_map { |r| r["ratios"] })
        spread = runs.map { |r| median(r["ratios"]) }.minmax
        printf("  %-10s %8.4f %17s %9d\n", profiler, ratio, format("(%.3f-%.3f)", *spread),
               median(runs.map { |r| Float(r["samples"]) }))
      end
    end
  end
ensure
  Process.kill("KILL", sink) if sink
end
