# frozen_string_literal: true

# Overhead of continuous profiling, side by side with stackprof, and the sample rate
# actually achieved.
#
#   ruby -Ilib bench/overhead.rb   (also part of `rake bench`; PROCESSES=3 SEGMENTS=20 RUNS=10 SECONDS=2 by default)
#
# A CPU-bound workload (recursive Ruby calls in the main thread, bench/overhead_workload.rb),
# once with no other thread and once with 15 more threads blocked on a queue, profiled by
# Contprof at a 10 ms interval with each kind of CPU trigger (perf events, the default
# where the kernel allows them; POSIX CPU timers; none: no signal at all, CPU read from
# clocks at wall rounds), wall rounds every interval in every case, and by stackprof (cpu
# mode, its default 1 ms interval).
#
# 1. Steady state: per profiler, PROCESSES processes (taking turns with the other rows)
#    each alternate SEGMENTS pairs of 0.5 s segments with and without the profiler
#    running, in random order; the ratio is the median over all pairs of whole-process CPU
#    with / without. Same process, same memory layout, same moment of the machine: this is
#    the figure for a profiler left running. A "control" row does the same with no
#    profiler in either segment: the noise floor.
# 2. Whole runs: each run a fresh process, with the profiler from start to end (its start,
#    stop and final serialization included), interleaved, RUNS times each; the ratio is
#    the median over rounds of (CPU with the profiler / CPU of the unprofiled run of the
#    same round). The "control" row is a second unprofiled run, "contprof-loaded" loads
#    Contprof and sets a worker up without starting it. Each process has its own memory
#    layout (address-space randomization), which moves Ruby's speed by a few percent:
#    these rows are noisier than the steady state. (Switching randomization off with
#    setarch -R steadies each row but fixes one layout per row, a bias of its own.)
# 3. Samples collected versus expected over 10 s of busy CPU: Contprof at 10 ms, and
#    stackprof asked for 1 ms.
require "open3"
require "rbconfig"
require_relative "support/statistics"
include BenchStatistics # rubocop:disable Style/MixinUsage

ROOT = File.expand_path("..", __dir__)
WORKLOAD = File.join(ROOT, "bench", "overhead_workload.rb")
RUNS = Integer(ENV.fetch("RUNS", "10"))
SEGMENTS = Integer(ENV.fetch("SEGMENTS", "20"))
SECONDS = Float(ENV.fetch("SECONDS", "2"))
PROCESSES = Integer(ENV.fetch("PROCESSES", "3"))
SECTIONS = ENV.fetch("SECTIONS", "1,2,3").split(",").map { |section| Integer(section) }
PROFILERS = %w[contprof contprof-posix contprof-notimers stackprof].freeze

def run_workload(profiler, blocked, seconds, units: nil, interval: nil, segments: nil)
  env = units ? { "WORK_UNITS" => units.to_s } : {}
  env["INTERLEAVED"] = segments.to_s if segments
  command = [RbConfig.ruby, "-I#{File.join(ROOT, "lib")}", WORKLOAD, profiler, blocked.to_s, seconds.to_s]
  command << interval.to_s if interval
  out, err, status = Open3.capture3(env, *command)
  raise "#{command.join(" ")} failed: #{err}" unless status.success?

  out.scan(/(\w+)=(\S+)/).to_h.transform_values { |v| v.include?(",") ? v : Float(v) }
end

# A comma-separated list of numbers printed by the workload.
def list(result, key) = result[key].to_s.split(",").map { |v| Float(v) }

floor_binary = File.join(ROOT, "bench", "build", "wakeup_floor")
Dir.mkdir(File.dirname(floor_binary)) unless Dir.exist?(File.dirname(floor_binary))
system("cc", "-O2", "-o", floor_binary, File.join(ROOT, "bench", "wakeup_floor.c"), "-lpthread", exception: true)
floor = `#{floor_binary}`.scan(/(\w+)=(\S+)/).to_h.transform_values { |v| Float(v) }
puts "Platform floor (bench/wakeup_floor.c): a thread waking every 10 ms costs #{floor["plain_us_per_wakeup"]} us " \
     "of CPU per wakeup (#{(floor["plain_us_per_wakeup"] / 100).round(2)}% of a core), " \
     "#{floor["signal_us_per_wakeup"]} us when it also signals a busy thread (#{(floor["signal_us_per_wakeup"] / 100).round(2)}%)"
puts "  One wakeup after sleeping 10 ms / 100 ms / 1 s is charged #{floor["sleep_10ms_us_per_wakeup"]} / " \
     "#{floor["sleep_100ms_us_per_wakeup"]} / #{floor["sleep_1000ms_us_per_wakeup"]} us"

def describe(blocked)
  blocked.zero? ? "1 thread, busy" : "16 threads: 1 busy, #{blocked} blocked"
end

def own_cost(profiler, runs, wall_key)
  return "-" unless profiler.start_with?("contprof") && profiler != "contprof-loaded"

  format("%.2f%% + %.2f%%", median(runs.map { |r| r["sampling"] / r[wall_key] * 100 }),
         median(runs.map { |r| r["trigger"] / r[wall_key] * 100 }))
end

if SECTIONS.include?(1)
  segment_units = run_workload("none", 0, 0.5)["units"].to_i
  puts
  puts "1. Steady state: #{PROCESSES} processes per row, each alternating #{SEGMENTS} pairs of 0.5 s segments " \
       "(#{segment_units} work units) with and without the profiler, in random order."
  puts "   Ratio: median over all #{PROCESSES * SEGMENTS} pairs of (process CPU with the profiler / without); in " \
       "brackets, the lowest and highest median of one process. CPU/sample: median extra CPU of a profiled " \
       "segment / its median samples. Own cost: Contprof's sampling rounds + its worker thread, as a share of " \
       "the profiled CPU."
  [0, 15].each do |blocked|
    rows = ["control"] + PROFILERS
    results = Hash.new { |h, k| h[k] = [] }
    PROCESSES.times do
      rows.each { |profiler| results[profiler] << run_workload(profiler, blocked, 0.5, units: segment_units, segments: SEGMENTS) }
    end
    puts
    puts "#{describe(blocked)}:"
    printf("  %-20s %8s %17s %9s %12s %22s\n", "profiler", "ratio", "(per process)", "samples", "CPU/sample",
           "own cost: sample+timer")
    rows.each do |profiler|
      runs = results[profiler]
      ratio = median(runs.flat_map { |r| list(r, "ratios") })
      spread = runs.map { |r| median(list(r, "ratios")) }.minmax
      samples = median(runs.flat_map { |r| list(r, "segment_samples") })
      extra = median(runs.flat_map { |r| list(r, "extra") })
      per_sample = samples.positive? ? format("%.1f us", extra / samples * 1e6) : "-"
      own = own_cost(profiler, [{ "sampling" => runs.sum { |r| r["sampling"] }, "trigger" => runs.sum { |r| r["trigger"] },
                                  "profiled_cpu" => runs.sum { |r| r["profiled_cpu"] } }], "profiled_cpu")
      printf("  %-20s %8.4f %17s %9d %12s %22s\n", profiler, ratio, format("(%.3f-%.3f)", *spread), samples,
             per_sample, own)
    end
  end
end

if SECTIONS.include?(2)
  units = run_workload("none", 0, SECONDS)["units"].to_i
  puts
  puts "2. Whole runs: #{units} work units (~#{SECONDS} s of CPU) per run, a fresh process each, " \
       "#{RUNS} rounds of one run per profiler, in turn."
  puts "   Ratio: median over rounds of (CPU with the profiler / CPU without, same round). Start, stop and the " \
       "final serialization are inside the measurement."
  [0, 15].each do |blocked|
    rows = %w[none control contprof-loaded] + PROFILERS
    results = Hash.new { |h, k| h[k] = [] }
    RUNS.times do
      rows.each { |profiler| results[profiler] << run_workload(profiler, blocked, SECONDS, units: units) }
    end
    baseline = results["none"].map { |r| r["cpu"] }
    puts
    puts "#{describe(blocked)}:"
    printf("  %-20s %8s %8s %8s %9s %22s\n", "profiler", "CPU s", "ratio", "rounds", "samples", "own cost: sample+timer")
    rows.each do |profiler|
      runs = results[profiler]
      ratio = median(runs.each_with_index.map { |r, i| r["cpu"] / baseline[i] })
      printf("  %-20s %8.3f %8.4f %8d %9d %22s\n", profiler, median(runs.map { |r| r["cpu"] }), ratio,
             median(runs.map { |r| r["rounds"] }), median(runs.map { |r| r["samples"] }), own_cost(profiler, runs, "wall"))
    end
  end
end

if SECTIONS.include?(3)
  puts
  puts "3. Samples collected versus expected over 10 s of busy CPU:"
  contprof = run_workload("contprof", 0, 10, interval: 0.01)
  printf("  %-38s %6d wall rounds of %6d expected (%.1f%%), %d CPU rounds of %d expected (%.1f%%)\n",
         "contprof, 10 ms interval", contprof["wall_rounds"], contprof["wall"] / 0.01,
         100 * contprof["wall_rounds"] / (contprof["wall"] / 0.01), contprof["cpu_rounds"], contprof["cpu"] / 0.01,
         100 * contprof["cpu_rounds"] / (contprof["cpu"] / 0.01))
  stackprof = run_workload("stackprof", 0, 10, interval: 1000)
  expected = stackprof["cpu"] / 0.001
  printf("  %-38s %6d of %6d expected (%.1f%%)\n", "stackprof, cpu mode asked for 1 ms", stackprof["samples"], expected,
         100 * stackprof["samples"] / expected)
end
