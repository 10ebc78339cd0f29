# frozen_string_literal: true

# What one sample costs the sampled program, with the kernel's part of the trigger left
# out, side by side with stackprof.
#
#   ruby -Ilib bench/sample_cost.rb   (also part of `rake bench`; CALLS=20000 REPEATS=7 by default)
#
# Both profilers are triggered the same way: a CPU-time timer's SIGPROF, whose handler
# queues a postponed job. The kernel's share (timer, signal delivery) is the same for
# both; what differs is the work on the program's thread, measured here by calling it
# directly, many times, with the calling thread's CPU clock, interleaved, median of
# REPEATS, minus the same loop without sampling:
#
# - contprof, timer round: Worker::Testing.timer_round counts one expiry of the calling
#   thread's CPU timer and runs the sampling job, exactly as the signal would (the job:
#   every thread's stack, CPU and wall time, recorded into the pprof profile).
# - contprof, collector: CpuAndWallTime#sample, which reads every CPU clock it needs
#   (a system call each), as rounds not started by a CPU timer do.
# - stackprof: StackProf.sample, its own sample-and-record path (cpu mode).
#
# The stacks are 21-30 frames deep and change from one call to the next, as a busy
# thread's do between samples; the code is old (promoted by the GC), as in a program
# that has run for a while.
require "contprof"
require "stackprof"

CALLS = Integer(ENV.fetch("CALLS", "20000"))
REPEATS = Integer(ENV.fetch("REPEATS", "7"))
Worker = Contprof::Collectors::CpuAndWallTimeWorker

def dive(depth, &block) = depth.zero? ? yield : dive(depth - 1, &block)

def thread_cpu = Process.clock_gettime(Process::CLOCK_THREAD_CPUTIME_ID)

# CPU seconds per call of the block, at depths cycling through 20..29.
def per_call
  start = thread_cpu
  i = 0
  while i < CALLS
    dive(20 + i % 10) { yield }
    i += 1
  end
  (thread_cpu - start) / CALLS
end

def median(values) = values.sort[values.size / 2]

def measure(blocked)
  queue = Queue.new
  threads = Array.new(blocked) { Thread.new { queue.pop } }
  Thread.pass until threads.all? { |t| t.status == "sleep" }
  collector = Contprof::Collectors::CpuAndWallTime.new(recorder: Contprof::StackRecorder.new)
  collector.sample # starts every thread's clocks
  # Intervals of 60 s keep the real timers out of the measurement.
  worker = Worker.new(recorder: Contprof::StackRecorder.new, interval: 60, overhead_target: 1)
  4.times { GC.start } # old code, as in a program that has run for a while
  rows = Hash.new { |h, k| h[k] = [] }
  REPEATS.times do
    rows[:loop] << per_call { nil }
    worker.start
    raise "no CPU timers in this build" unless Worker::Testing.timer_round

    rows[:timer_round] << per_call { Worker::Testing.timer_round }
    worker.stop
    rows[:collector] << per_call { collector.sample }
    StackProf.start(mode: :cpu, interval: 999_999)
    rows[:stackprof] << per_call { StackProf.sample }
    StackProf.stop
  end
  StackProf.results
  threads.each { queue << nil }.each(&:join)
  rows.transform_values { |values| median(values) }
end

syscall = median(Array.new(REPEATS) do
  start = thread_cpu
  CALLS.times { Process.clock_gettime(Process::CLOCK_THREAD_CPUTIME_ID) }
  monotonic_start = thread_cpu
  CALLS.times { Process.clock_gettime(Process::CLOCK_MONOTONIC) }
  ((monotonic_start - start) - (thread_cpu - monotonic_start)) / CALLS
end)

# In production the rounds of a busy thread also move the watchdog on (a timerfd_settime,
# a system call like the clock read) every few rounds: how often, at the default interval.
def watchdog_pushes_per_round
  worker = Worker.new(recorder: Contprof::StackRecorder.new)
  worker.start
  start = thread_cpu
  nil while thread_cpu - start < 0.5
  worker.stop
  stats = worker.stats
  stats[:watchdog] ? stats[:watchdog_pushes].fdiv(stats[:sample_rounds]) : 0.0
end
pushes = watchdog_pushes_per_round

puts "Cost of one sample on the program's thread, the kernel's part of the trigger left out"
puts "(#{CALLS} calls x #{REPEATS}, median; stacks of 21-30 frames). Reading a thread's CPU clock, a " \
     "system call, costs #{format("%.2f", syscall * 1e6)} us here."
[0, 15].each do |blocked|
  result = measure(blocked)
  cost = result.except(:loop).transform_values { |value| (value - result[:loop]) * 1e6 }
  threads = blocked + 1
  puts
  puts blocked.zero? ? "1 thread, busy:" : "#{threads} threads (1 busy, #{blocked} blocked):"
  printf("  %-44s %7s %18s %10s\n", "", "us", "us/thread sampled", "/stackprof")
  cost[:with_pushes] = cost[:timer_round] + pushes * syscall * 1e6
  [[:stackprof, "stackprof: the running thread", 1],
   [:timer_round, "contprof, timer round: every thread", threads],
   [:with_pushes, format("  + watchdog pushes (%.2f per round)", pushes), threads],
   [:collector, "contprof, collector: every thread", threads]].each do |key, label, sampled|
    printf("  %-44s %7.2f %18.2f %10.2f\n", label, cost[key], cost[key] / sampled,
           cost[key] / sampled / cost[:stackprof])
  end
end
