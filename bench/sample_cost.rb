# frozen_string_literal: true

# What sampling costs the sampled program, with the kernel's part of the triggers left
# out, side by side with stackprof.
#
#   ruby -Ilib bench/sample_cost.rb   (also part of `rake bench`; CALLS=20000 REPEATS=7 by default)
#
# Each kind of work is called directly, many times, with the calling thread's CPU clock,
# interleaved, median of REPEATS, minus the same loop without sampling:
#
# - contprof, CPU round: Worker::Testing.cpu_round counts one expiry of the calling
#   thread's CPU timer and runs the sampling job, exactly as the timer's signal would
#   (that thread's stack and CPU, recorded into the pprof profile). One per interval of
#   CPU a thread uses.
# - contprof, wall round: Worker::Testing.wall_round runs the job the worker thread asks
#   for every interval (every thread's stack and wall time). One per interval.
# - contprof with timeline: true: the same two rounds, whose records carry timestamps and
#   extend the thread's previous one instead of merging with equal stacks.
# - stackprof: StackProf.sample, its own sample-and-record path (cpu mode: the running
#   thread only). One per tick of the kernel while the process runs (its timer is asked
#   for 1 ms; the kernel's 250 Hz tick caps it here).
#
# The stacks are 21-30 frames deep and change from one call to the next, as a busy
# thread's do between samples; the code is old (promoted by the GC), as in a program
# that has run for a while. The last lines turn the costs into a share of one core for a
# busy thread at each profiler's default rate.
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
  # Intervals of 60 s keep the real triggers out of the measurement.
  worker = Worker.new(recorder: Contprof::StackRecorder.new, interval: 60, overhead_target: 1)
  timeline_worker = Worker.new(recorder: Contprof::StackRecorder.new, interval: 60, overhead_target: 1, timeline: true)
  4.times { GC.start } # old code, as in a program that has run for a while
  rows = Hash.new { |h, k| h[k] = [] }
  REPEATS.times do
    rows[:loop] << per_call { nil }
    worker.start
    raise "no CPU timers in this build" unless Worker::Testing.cpu_round

    rows[:cpu_round] << per_call { Worker::Testing.cpu_round }
    rows[:wall_round] << per_call { Worker::Testing.wall_round }
    worker.stop
    timeline_worker.start
    rows[:cpu_round_timeline] << per_call { Worker::Testing.cpu_round }
    rows[:wall_round_timeline] << per_call { Worker::Testing.wall_round }
    timeline_worker.stop
    StackProf.start(mode: :cpu, interval: 999_999)
    rows[:stackprof] << per_call { StackProf.sample }
    StackProf.stop
  end
  StackProf.results
  threads.each { queue << nil }.each(&:join)
  rows.transform_values { |values| median(values) }
end

puts "Cost of sampling on the program's thread, the kernel's part of the triggers left out"
puts "(#{CALLS} calls x #{REPEATS}, median; stacks of 21-30 frames)"
costs = {}
[0, 15].each do |blocked|
  result = measure(blocked)
  cost = result.except(:loop).transform_values { |value| (value - result[:loop]) * 1e6 }
  costs[blocked] = cost
  threads = blocked + 1
  puts
  puts blocked.zero? ? "1 thread, busy:" : "#{threads} threads (1 busy, #{blocked} blocked):"
  printf("  %-44s %7s %18s\n", "", "us", "us/thread sampled")
  [[:stackprof, "stackprof: the running thread", 1],
   [:cpu_round, "contprof, CPU round: the signalled thread", 1],
   [:wall_round, "contprof, wall round: every thread", threads],
   [:cpu_round_timeline, "contprof timeline, CPU round", 1],
   [:wall_round_timeline, "contprof timeline, wall round", threads]].each do |key, label, sampled|
    printf("  %-44s %7.2f %18.2f\n", label, cost[key], cost[key] / sampled)
  end
end

puts
puts "Per second of a busy thread, at the default rates (contprof: one CPU round per 10 ms of CPU and"
puts "one wall round per 10 ms; stackprof: one sample per 4 ms tick), the kernel's part left out:"
costs.each do |blocked, cost|
  contprof = 100 * (cost[:cpu_round] + cost[:wall_round])
  timeline = 100 * (cost[:cpu_round_timeline] + cost[:wall_round_timeline])
  stackprof = 250 * cost[:stackprof]
  printf("  %-30s contprof %6.1f us (%.3f%% of a core), with timeline %6.1f us (%.3f%%), stackprof %6.1f us (%.3f%%)\n",
         blocked.zero? ? "1 thread:" : "#{blocked + 1} threads (1 busy):", contprof, contprof / 1e4, timeline,
         timeline / 1e4, stackprof, stackprof / 1e4)
end
