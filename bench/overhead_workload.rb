# frozen_string_literal: true

# One run of the overhead benchmark (bench/overhead.rb starts it as a fresh process):
#   ruby -Ilib bench/overhead_workload.rb PROFILER BLOCKED_THREADS SECONDS_OF_WORK [INTERVAL]
# PROFILER is none, contprof, contprof-nosignals or stackprof. Burns a fixed amount of
# CPU in the main thread (recursive Ruby calls) while BLOCKED_THREADS other threads wait
# on a queue, and prints the whole process's CPU time around it, and how many samples
# the profiler collected, as key=value pairs.
profiler, blocked, seconds, interval = ARGV
blocked = Integer(blocked)
seconds = Float(seconds)

def fib(n)
  n < 2 ? n : fib(n - 1) + fib(n - 2)
end

def calibrate
  # Work units of roughly 1 ms each, counted once so that every run does the same work.
  start = Process.clock_gettime(Process::CLOCK_THREAD_CPUTIME_ID)
  runs = 0
  runs += 1 while fib(15) && Process.clock_gettime(Process::CLOCK_THREAD_CPUTIME_ID) - start < 0.2
  runs / 200.0
end

units = Integer(ENV.fetch("WORK_UNITS") { (calibrate * seconds * 1000).round.to_s })
queue = Queue.new
threads = Array.new(blocked) { Thread.new { queue.pop } }
Thread.pass until threads.all? { |t| t.status == "sleep" }

case profiler
when "contprof", "contprof-nosignals"
  require "contprof"
  recorder = Contprof::StackRecorder.new
  worker = Contprof::Collectors::CpuAndWallTimeWorker.new(
    recorder: recorder, signals: profiler == "contprof", interval: Float(interval || 0.01),
  )
when "stackprof"
  require "stackprof"
end

cpu_start = Process.clock_gettime(Process::CLOCK_PROCESS_CPUTIME_ID)
wall_start = Process.clock_gettime(Process::CLOCK_MONOTONIC)
worker&.start
StackProf.start(mode: :cpu, interval: Integer(interval || 1000)) if profiler == "stackprof"

units.times { fib(15) }

samples = rounds = sampling = trigger = 0
case profiler
when "contprof", "contprof-nosignals"
  worker.stop
  recorder.serialize
  stats = worker.stats
  rounds = stats[:sample_rounds]
  samples = recorder.stats[:samples_recorded]
  sampling = stats[:sampling_ns_total] / 1e9
  trigger = stats[:trigger_thread_cpu_ns] / 1e9
when "stackprof"
  StackProf.stop
  results = StackProf.results
  rounds = samples = results[:samples]
end
cpu = Process.clock_gettime(Process::CLOCK_PROCESS_CPUTIME_ID) - cpu_start
wall = Process.clock_gettime(Process::CLOCK_MONOTONIC) - wall_start
threads.each { queue << nil }
threads.each(&:join)
puts "units=#{units} cpu=#{cpu} wall=#{wall} rounds=#{rounds} samples=#{samples} sampling=#{sampling} trigger=#{trigger}"
