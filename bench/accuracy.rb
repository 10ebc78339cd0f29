# frozen_string_literal: true

# Known-answer benchmark: where does each profiler put the time? Threads loop over six
# phases shorter than the sampling interval (bench/accuracy_workload.rb: Ruby CPU of two
# sizes, native CPU without the GVL, sleep, an I/O wait, a Mutex/ConditionVariable wait),
# measuring their own truth with clocks around each phase. For 1, 4 and 16 threads, each
# profiler runs the workload in a fresh process, and the table shows, per phase, its share
# of wall-time and of cpu-time as profiled minus the truth of that same run, in points:
#
#   contprof          the default (wall on the worker's clock, CPU on perf events)
#   contprof (POSIX)  cpu_timers: :posix, CPU timers checked at the kernel's tick
#   stackprof         Debian's ruby-stackprof: wall mode at 10 ms, cpu mode at its default 1 ms
#   datadog           Datadog's profiler (the `datadog` gem) at its defaults: wall and CPU
#   vernier           vernier's wall mode (Ruby 3.2.1+)
#
# The peers are installed by bench/support/peers.rb when they can be had; one line says
# when one cannot.
#
#   ruby -Ilib bench/accuracy.rb            # SECONDS=20 per run, THREADS=1,4,16
require "json"
require "open3"
require "rbconfig"

ROOT = File.expand_path("..", __dir__)
WORKLOAD = File.join(__dir__, "accuracy_workload.rb")
SECONDS = Float(ENV.fetch("SECONDS", "20"))
THREADS = ENV.fetch("THREADS", "1,4,16").split(",").map { |t| Integer(t) }
PHASES = %w[ruby_long ruby_short native sleep io_wait lock_wait other].freeze

require_relative "support/peers"

# [label, profiler run, kinds of time it measures]
PROFILERS = [["contprof", "contprof", %w[wall cpu]], ["contprof (POSIX)", "contprof-posix", %w[wall cpu]]]
PROFILERS << ["stackprof wall", "stackprof-wall", %w[wall]] << ["stackprof cpu", "stackprof-cpu", %w[cpu]] if Peers.available?("stackprof")
PROFILERS << ["datadog", "datadog", %w[wall cpu]] if Peers.available?("datadog")
PROFILERS << ["vernier", "vernier", %w[wall]] if Peers.available?("vernier")

def run(profiler, threads)
  out, err, status = Open3.capture3(Peers.env, RbConfig.ruby, "-I#{File.join(ROOT, "lib")}", WORKLOAD, profiler,
                                    threads.to_s, SECONDS.to_s)
  abort "#{profiler} with #{threads} threads failed: #{err}" unless status.success?
  JSON.parse(out)
end

puts "Known-answer accuracy: profiled share minus true share, in points (#{SECONDS} s per run, Ruby #{RUBY_VERSION})"
worst = Hash.new(0.0)
THREADS.each do |threads|
  runs = PROFILERS.to_h { |label, profiler, _| [label, run(profiler, threads)] }
  columns = %w[wall cpu].flat_map { |type| PROFILERS.select { |_, _, kinds| kinds.include?(type) }.map { |label, _, _| [type, label] } }
  puts
  puts "#{threads} thread#{"s" if threads > 1}"
  header = format("%-11s %6s %6s", "phase", "wall%", "cpu%")
  columns.each { |type, label| header << format(" %17s", "#{type}: #{label}") }
  puts header
  truth = runs["contprof"]
  PHASES.each do |phase|
    line = format("%-11s %6.1f %6.1f", phase, truth["truth_wall"][phase], truth["truth_cpu"][phase])
    columns.each do |type, label|
      result = runs[label]
      error = result[type][phase] - result["truth_#{type}"][phase]
      worst[[threads, type, label]] = [worst[[threads, type, label]], error.abs].max unless phase == "other"
      line << format(" %17s", format("%+.1f", error))
    end
    puts line
  end
  counts = runs.map { |name, result| "#{name}: #{result["samples"]}" }.join(", ")
  puts "samples (cpu): #{counts}"
  puts "contprof: #{runs["contprof"]["stats"]}"
end

puts
puts "Largest error over the six phases, in points (other: the loop and the measurements)"
THREADS.each do |threads|
  line = worst.select { |(t, _, _), _| t == threads }.map { |(_, type, name), error| "#{type} #{name} #{error.round(1)}" }
  puts "  #{threads} threads: #{line.join(", ")}"
end
