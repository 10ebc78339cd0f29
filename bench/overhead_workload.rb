# frozen_string_literal: true

# The workload of the overhead benchmark (bench/overhead.rb starts it as fresh processes):
#
#   ruby -Ilib bench/overhead_workload.rb PROFILER BLOCKED_THREADS SECONDS_OF_WORK [INTERVAL]
#     One run: burns a fixed amount of CPU in the main thread (recursive Ruby calls) while
#     BLOCKED_THREADS other threads wait on a queue, with PROFILER running from start to
#     end, and prints the whole process's CPU time around it (start, stop and the final
#     serialization included) and how many samples the profiler collected.
#
#   INTERLEAVED=SEGMENTS ruby -Ilib bench/overhead_workload.rb PROFILER BLOCKED_THREADS SECONDS_OF_WORK
#     Steady state, in one process: SEGMENTS pairs of segments of SECONDS_OF_WORK each,
#     one with PROFILER running and one without, in random order. The profiler is started
#     before its segment and stopped after it, so only continuous profiling is measured;
#     the process, its memory layout and the machine's moment are the same for both.
#     Prints the median over pairs of (process CPU with / without) and the medians.
#
# PROFILER is none, contprof (the defaults: CPU timers that are perf events where the
# kernel allows them), contprof-posix (POSIX CPU timers), contprof-notimers (no CPU timers,
# no signal at all: CPU read from clocks at wall rounds) or stackprof (cpu mode). All
# values as key=value pairs.
profiler, blocked, seconds, interval = ARGV
blocked = Integer(blocked)
seconds = Float(seconds)
segments = ENV["INTERLEAVED"] && Integer(ENV["INTERLEAVED"])

require_relative "support/statistics"
include BenchStatistics # rubocop:disable Style/MixinUsage

def fib(n)
  n < 2 ? n : fib(n - 1) + fib(n - 2)
end

def calibrate
  # Work units of a few tens of microseconds each, counted once so that every run does the
  # same work.
  start = Process.clock_gettime(Process::CLOCK_THREAD_CPUTIME_ID)
  runs = 0
  runs += 1 while fib(15) && Process.clock_gettime(Process::CLOCK_THREAD_CPUTIME_ID) - start < 0.2
  runs / 200.0
end

def process_cpu
  Process.clock_gettime(Process::CLOCK_PROCESS_CPUTIME_ID)
end

units = Integer(ENV.fetch("WORK_UNITS") { (calibrate * seconds * 1000).round.to_s })
queue = Queue.new
threads = Array.new(blocked) { Thread.new { queue.pop } }
Thread.pass until threads.all? { |t| t.status == "sleep" }

case profiler
when "contprof-loaded" # loaded and set up, never started: what loading costs
  require "contprof"
  Contprof::Collectors::CpuAndWallTimeWorker.new(recorder: Contprof::StackRecorder.new)
when "contprof", "contprof-posix", "contprof-notimers"
  require "contprof"
  recorder = Contprof::StackRecorder.new
  timers = { "contprof" => true, "contprof-posix" => :posix, "contprof-notimers" => false }.fetch(profiler)
  worker = Contprof::Collectors::CpuAndWallTimeWorker.new(recorder: recorder, cpu_timers: timers,
                                                          interval: Float(interval || 0.01))
when "stackprof"
  require "stackprof"
end

start_profiler = lambda do
  worker&.start
  StackProf.start(mode: :cpu, interval: Integer(interval || 1000)) if profiler == "stackprof"
end

if segments
  with = []
  without = []
  samples = []
  random = Random.new
  sampling = trigger = rounds = 0
  threads_before = Thread.list.size
  units.times { fib(15) } # warm-up
  segments.times do
    [true, false].shuffle(random: random).each do |profiled|
      recorded = recorder&.stats&.dig(:samples_recorded)
      # The previous segment's bookkeeping (StackProf.results builds a large Hash) must not
      # leave garbage for this segment's GC to pay.
      GC.start
      start_profiler.call if profiled
      before = process_cpu
      units.times { fib(15) }
      used = process_cpu - before
      (profiled ? with : without) << used
      next unless profiled

      if worker
        worker.stop
        # The worker thread ends on its own after stop: outside the measured segments.
        Thread.pass while Thread.list.size > threads_before
        samples << recorder.stats[:samples_recorded] - recorded
      elsif profiler == "stackprof"
        StackProf.stop
        result = StackProf.results
        samples << result[:samples]
        rounds += result[:samples]
      else
        samples << 0
      end
    end
  end
  if worker
    stats = worker.stats
    rounds = stats[:rounds]
    sampling = stats[:sampling_ns_total] / 1e9
    trigger = stats[:clock_cpu_ns] / 1e9
  end
  # Per pair: the ratio, and the extra CPU per sample collected in the profiled segment.
  ratios = with.zip(without).map { |profiled, plain| profiled / plain }
  extra = with.zip(without).map { |profiled, plain| profiled - plain }
  puts "units=#{units} ratio=#{median(ratios)} with=#{median(with)} without=#{median(without)} rounds=#{rounds.to_i} " \
       "profiled_cpu=#{with.sum} sampling=#{sampling} trigger=#{trigger} samples=#{median(samples)} " \
       "ratios=#{ratios.join(",")} extra=#{extra.join(",")} segment_samples=#{samples.join(",")}"
else
  cpu_start = process_cpu
  wall_start = Process.clock_gettime(Process::CLOCK_MONOTONIC)
  start_profiler.call

  units.times { fib(15) }

  samples = rounds = sampling = trigger = 0
  extra = ""
  if worker
    worker.stop
    recorder.serialize
    stats = worker.stats
    rounds = stats[:rounds]
    samples = recorder.stats[:samples_recorded]
    extra = "wall_rounds=#{stats[:wall_rounds]} cpu_rounds=#{stats[:cpu_rounds]} "
    sampling = stats[:sampling_ns_total] / 1e9
    trigger = stats[:clock_cpu_ns] / 1e9
  elsif profiler == "stackprof"
    StackProf.stop
    results = StackProf.results
    rounds = samples = results[:samples]
  end
  cpu = process_cpu - cpu_start
  wall = Process.clock_gettime(Process::CLOCK_MONOTONIC) - wall_start
  puts "units=#{units} cpu=#{cpu} wall=#{wall} rounds=#{rounds} samples=#{samples} sampling=#{sampling} " \
       "trigger=#{trigger} #{extra}"
end
threads.each { queue << nil }
threads.each(&:join)
