# frozen_string_literal: true

# Overhead of continuous profiling, side by side with stackprof, and the sample rate
# actually achieved.
#
#   ruby -Ilib bench/overhead.rb          (also part of `rake bench`; RUNS=10 SECONDS=2 by default)
#
# 1. A CPU-bound workload (recursive Ruby calls in the main thread) runs in a fresh
#    process per run: with no profiler, with Contprof (10 ms interval, with and without
#    signals) and with stackprof (cpu mode, its default 1 ms interval), interleaved,
#    RUNS times each; once with no other thread and once with 15 more threads blocked on
#    a queue. Reported: median whole-process CPU time, its ratio to the unprofiled run,
#    samples collected, and the CPU each sample cost.
# 2. Samples collected versus expected over 10 s of busy CPU: Contprof at 10 ms, and
#    stackprof asked for 1 ms.
require "open3"
require "rbconfig"

ROOT = File.expand_path("..", __dir__)
WORKLOAD = File.join(ROOT, "bench", "overhead_workload.rb")
RUNS = Integer(ENV.fetch("RUNS", "10"))
SECONDS = Float(ENV.fetch("SECONDS", "2"))
PROFILERS = %w[none contprof contprof-nosignals stackprof].freeze

def run_workload(profiler, blocked, seconds, units: nil, interval: nil)
  env = units ? { "WORK_UNITS" => units.to_s } : {}
  command = [RbConfig.ruby, "-I#{File.join(ROOT, "lib")}", WORKLOAD, profiler, blocked.to_s, seconds.to_s]
  command << interval.to_s if interval
  out, err, status = Open3.capture3(env, *command)
  raise "#{command.join(" ")} failed: #{err}" unless status.success?

  out.scan(/(\w+)=(\S+)/).to_h.transform_values { |v| Float(v) }
end

def median(values)
  sorted = values.sort
  sorted.size.odd? ? sorted[sorted.size / 2] : (sorted[sorted.size / 2 - 1] + sorted[sorted.size / 2]) / 2
end

floor_binary = File.join(ROOT, "bench", "build", "wakeup_floor")
Dir.mkdir(File.dirname(floor_binary)) unless Dir.exist?(File.dirname(floor_binary))
system("cc", "-O2", "-o", floor_binary, File.join(ROOT, "bench", "wakeup_floor.c"), "-lpthread", exception: true)
floor = `#{floor_binary}`.scan(/(\w+)=(\S+)/).to_h.transform_values { |v| Float(v) }
puts "Platform floor (bench/wakeup_floor.c): a thread waking every 10 ms costs #{floor["plain_us_per_wakeup"]} us " \
     "of CPU per wakeup (#{(floor["plain_us_per_wakeup"] / 100).round(2)}% of a core), " \
     "#{floor["signal_us_per_wakeup"]} us when it also signals a busy thread (#{(floor["signal_us_per_wakeup"] / 100).round(2)}%)"

units = run_workload("none", 0, SECONDS)["units"].to_i
puts "Overhead: #{units} work units (~#{SECONDS} s of CPU), #{RUNS} rounds of one run per profiler, in turn."
puts "Ratio: median over rounds of (CPU with the profiler / CPU without, same round)."
[0, 15].each do |blocked|
  results = Hash.new { |h, k| h[k] = [] }
  RUNS.times do
    PROFILERS.each { |profiler| results[profiler] << run_workload(profiler, blocked, SECONDS, units: units) }
  end
  baseline = results["none"].map { |r| r["cpu"] }
  puts
  puts "#{blocked.zero? ? "1 thread, busy" : "16 threads: 1 busy, #{blocked} blocked"}:"
  printf("  %-20s %8s %8s %8s %9s %12s %22s\n", "profiler", "CPU s", "ratio", "rounds", "samples", "CPU/sample",
         "own cost: sample+timer")
  PROFILERS.each do |profiler|
    runs = results[profiler]
    ratio = median(runs.each_with_index.map { |r, i| r["cpu"] / baseline[i] })
    cpu = median(runs.map { |r| r["cpu"] })
    samples = median(runs.map { |r| r["samples"] })
    per_sample = samples.positive? ? format("%.1f us", (cpu - median(baseline)) / samples * 1e6) : "-"
    own = if profiler.start_with?("contprof")
            format("%.2f%% + %.2f%%", median(runs.map { |r| r["sampling"] / r["wall"] * 100 }),
                   median(runs.map { |r| r["trigger"] / r["wall"] * 100 }))
          else
            "-"
          end
    printf("  %-20s %8.3f %8.4f %8d %9d %12s %22s\n", profiler, cpu, ratio, median(runs.map { |r| r["rounds"] }),
           samples, per_sample, own)
  end
end

puts
puts "Samples collected versus expected over 10 s of busy CPU:"
contprof = run_workload("contprof", 0, 10, interval: 0.01)
expected = contprof["wall"] / 0.01
printf("  %-38s %6d of %6d expected (%.1f%%)\n", "contprof, 10 ms interval", contprof["rounds"], expected,
       100 * contprof["rounds"] / expected)
stackprof = run_workload("stackprof", 0, 10, interval: 1000)
expected = stackprof["cpu"] / 0.001
printf("  %-38s %6d of %6d expected (%.1f%%)\n", "stackprof, cpu mode asked for 1 ms", stackprof["samples"], expected,
       100 * stackprof["samples"] / expected)
