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

def run(profiler, threads)
  out, err, status = Open3.capture3(RbConfig.ruby, "-I#{File.join(ROOT, "lib")}", WORKLOAD, profiler, threads.to_s,
                                    SECONDS.to_s)
  abort "#{profiler} with #{threads} threads failed: #{err}" unless status.success?
  JSON.parse(out)
end

stackprof = begin
  require "stackprof"
  true
rescue LoadError
  warn "stackprof is not installed (Debian: ruby-stackprof): its columns stay empty"
  false
end

puts "Known-answer accuracy: profiled share minus true share, in points (#{SECONDS} s per run)"
worst = Hash.new(0.0)
THREADS.each do |threads|
  runs = { "contprof" => run("contprof", threads), "contprof (POSIX)" => run("contprof-posix", threads) }
  if stackprof
    runs["stackprof wall"] = run("stackprof-wall", threads)
    runs["stackprof cpu"] = run("stackprof-cpu", threads)
  end
  puts
  puts "#{threads} thread#{"s" if threads > 1}"
  columns = [["wall", "contprof"], ["wall", "contprof (POSIX)"], ["wall", "stackprof wall"],
             ["cpu", "contprof"], ["cpu", "contprof (POSIX)"], ["cpu", "stackprof cpu"]]
  puts format("%-11s %6s %6s | %9s %9s %9s | %6s | %9s %9s %9s", "phase", "wall%", "", "contprof", "(POSIX)",
              "stackprof", "cpu%", "contprof", "(POSIX)", "stackprof")
  PHASES.each do |phase|
    truth = runs["contprof"]
    cells = columns.map do |type, name|
      result = runs[name]
      next "" unless result && result[type]

      error = result[type][phase] - result["truth_#{type}"][phase]
      worst[[threads, type, name]] = [worst[[threads, type, name]], error.abs].max unless phase == "other"
      format("%+.1f", error)
    end
    puts format("%-11s %6.1f %6s | %9s %9s %9s | %6.1f | %9s %9s %9s", phase, truth["truth_wall"][phase], "",
                *cells[0, 3], truth["truth_cpu"][phase], *cells[3, 3])
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
