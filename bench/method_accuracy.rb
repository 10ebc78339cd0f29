# frozen_string_literal: true

# Known-answer benchmark, per method: many distinct methods, each called for 10-100 ms
# (bench/method_accuracy_workload.rb: C code holding the GVL, sleeps without it, Ruby code,
# a mix), each method's own time measured by the program. For each workload, profiler and
# rate, RUNS fresh processes; the table shows the mean over methods of |profiled share -
# true share| / true share, in percent (min-max over the runs).
#
#   contprof   Contprof at `interval` 1/HZ
#   rperf      rperf (Ruby 3.4+) at `frequency` HZ, cpu or wall mode as the workload needs
#   stackprof  stackprof at `interval` 1/HZ, cpu or wall mode
#   vernier    vernier's wall mode at `interval` 1/HZ (wall workloads)
#   datadog    Datadog's profiler at its own rate (shown in the 100 Hz column)
#
# With LOAD=N, N processes burn CPU beside every run (a competing load).
#
#   ruby -Ilib bench/method_accuracy.rb     # SECONDS=4 RUNS=3 HZ=100,1000 WORKLOADS=all LOAD=0
#                                           # PROFILERS=contprof,rperf,stackprof,vernier,datadog
require "json"
require "open3"
require "rbconfig"
require_relative "support/peers"
require_relative "method_accuracy_workload"

ROOT = File.expand_path("..", __dir__)
SECONDS = Float(ENV.fetch("SECONDS", "4"))
RUNS = Integer(ENV.fetch("RUNS", "3"))
RATES = ENV.fetch("HZ", "100,1000").split(",").map { |hz| Integer(hz) }
WORKLOADS = ENV.fetch("WORKLOADS", MethodAccuracy::WORKLOADS.keys.join(",")).split(",")
LOAD = Integer(ENV.fetch("LOAD", "0"))

WANTED = ENV.fetch("PROFILERS", "contprof,rperf,stackprof,vernier,datadog").split(",")
PROFILERS = WANTED.select { |name| name == "contprof" || Peers.available?(name) }

def measures?(profiler, type, hz)
  return type == "wall" if profiler == "vernier"
  return hz == RATES.min if profiler == "datadog"

  true
end

def run(profiler, workload, hz)
  out, err, status = Open3.capture3(Peers.env, RbConfig.ruby, "-I#{File.join(ROOT, "lib")}",
                                    File.join(__dir__, "method_accuracy_workload.rb"), profiler, workload, hz.to_s,
                                    SECONDS.to_s)
  unless status.success?
    # The exception's line ("...: message (Errno::ENOENT)"), not the backtrace's end.
    why = err.lines.find { |line| line.match?(/\((?:\w+::)*\w+\)$/) } || err.lines.last
    warn "bench: #{profiler} on #{workload} at #{hz} Hz failed: #{why.to_s.strip[0, 300]}"
    return nil
  end
  JSON.parse(out)["mean_error"]
end

burners = Array.new(LOAD) { spawn(RbConfig.ruby, "-e", "loop { }") }
begin
  puts "Per-method error, mean over 8 methods, % (min-max of #{RUNS} runs of #{SECONDS} s; Ruby #{RUBY_VERSION}; " \
       "#{LOAD.zero? ? "no competing load" : "#{LOAD} CPU burners beside"})"
  header = format("%-11s %-5s", "workload", "time")
  columns = PROFILERS.product(RATES).select { |profiler, hz| profiler != "datadog" || hz == RATES.min }
  columns.each { |profiler, hz| header << format(" %16s", profiler == "datadog" ? "datadog" : "#{profiler} #{hz}") }
  puts header
  WORKLOADS.each do |workload|
    type, = MethodAccuracy::WORKLOADS.fetch(workload)
    line = format("%-11s %-5s", workload, type)
    columns.each do |profiler, hz|
      unless measures?(profiler, type, hz)
        line << format(" %16s", "-")
        next
      end
      errors = Array.new(RUNS) { run(profiler, workload, hz) }.compact
      cell = errors.empty? ? "failed" : format("%.1f-%.1f", errors.min, errors.max)
      line << format(" %16s", cell)
    end
    puts line
    $stdout.flush
  end
ensure
  burners.each { |pid| Process.kill(:KILL, pid) }
  Process.waitall
end
