# frozen_string_literal: true

# The known-answer workload behind bench/accuracy.rb and test/collectors/accuracy_test.rb: threads
# that loop over phases shorter than the sampling interval, each phase a method of its
# own, with the truth measured by the program itself (CLOCK_MONOTONIC and the thread's CPU
# clock around every phase). A profile is right when each phase's share of wall-time and
# of cpu-time matches the truth.
#
# Phases, per loop (about 7 ms on this machine with one thread):
#   ruby_long   Ruby code burning CPU, ~1.5 ms
#   ruby_short  Ruby code burning CPU, ~0.5 ms
#   native      Zlib::Deflate.deflate of 64 KB: CPU in native code with the GVL released
#   sleep       Kernel#sleep 2 ms
#   io_wait     IO.select on a pipe nobody writes to, 1 ms: a blocking I/O wait
#   lock_wait   ConditionVariable#wait for 1 ms: a Mutex/Queue-style wait in Ruby
#
# Run as a program, it profiles itself and prints JSON (see bench/accuracy.rb):
#   ruby -Ilib bench/accuracy_workload.rb PROFILER THREADS SECONDS
# with PROFILER one of contprof, contprof-posix (POSIX CPU timers only), stackprof-wall,
# stackprof-cpu, datadog (the `datadog` gem, see bench/support/peers.rb), vernier, none.
require "zlib"

module AccuracyWorkload
  PHASES = %w[ruby_long ruby_short native sleep io_wait lock_wait].freeze

  # Work units calibrated once per process so that the Ruby phases take their intended
  # CPU time here.
  def self.calibrate
    @units_per_ms ||= begin
      units = 20_000
      loop do
        started = cpu_now
        Phases.spin(units)
        elapsed = cpu_now - started
        break (units / (elapsed * 1000.0)).ceil if elapsed > 0.02

        units *= 2
      end
    end
  end

  def self.cpu_now
    Process.clock_gettime(Process::CLOCK_THREAD_CPUTIME_ID)
  end

  def self.wall_now
    Process.clock_gettime(Process::CLOCK_MONOTONIC)
  end

  # The phases, one method each (their names are what profiles are searched for).
  class Phases
    def self.spin(units)
      i = 0
      x = 0
      while i < units
        x = (x * 31 + i) & 0xffff
        i += 1
      end
      x
    end

    def initialize(units_per_ms)
      @long = (units_per_ms * 1.5).round
      @short = (units_per_ms * 0.5).round
      random = Random.new(7)
      @data = Array.new(64 * 1024) { (97 + random.rand(20)).chr }.join # compressible, not trivially
      @reader, @writer = IO.pipe
      @mutex = Mutex.new
      @condition = ConditionVariable.new
    end

    def ruby_long
      Phases.spin(@long)
    end

    def ruby_short
      Phases.spin(@short)
    end

    def native
      Zlib::Deflate.deflate(@data)
    end

    def sleep
      Kernel.sleep(0.002)
    end

    def io_wait
      IO.select([@reader], nil, nil, 0.001)
    end

    def lock_wait
      @mutex.synchronize { @condition.wait(@mutex, 0.001) }
    end

    def close
      @reader.close
      @writer.close
    end
  end

  # Runs `threads` threads for `seconds` (one thread: the calling thread itself, so that
  # profilers that sample only the main thread can measure it); returns the truth: per
  # phase, the wall and CPU seconds summed over threads, plus each thread's whole wall and
  # CPU ("all").
  def self.run(threads:, seconds:)
    units = calibrate
    truth = Hash.new { |hash, key| hash[key] = { "wall" => 0.0, "cpu" => 0.0 } }
    lock = Mutex.new
    deadline = wall_now + seconds
    body = lambda do |index|
      previous_name = Thread.current.name
      Thread.current.name = "accuracy-#{index}"
      begin
        mine = Hash.new { |hash, key| hash[key] = { "wall" => 0.0, "cpu" => 0.0 } }
        phases = Phases.new(units)
        wall_start = wall_now
        cpu_start = cpu_now
        while wall_now < deadline
          PHASES.each do |phase|
            # The wall-clock window holds the phase only, not the CPU clock reads: reading a
            # thread's CPU clock is a system call, which on virtual machines sometimes
            # stalls for long, and that time is in neither the phase's method nor its truth.
            cpu_before = cpu_now
            wall_before = wall_now
            phases.public_send(phase)
            wall_after = wall_now
            mine[phase]["cpu"] += cpu_now - cpu_before
            mine[phase]["wall"] += wall_after - wall_before
          end
        end
        mine["all"]["wall"] = wall_now - wall_start
        mine["all"]["cpu"] = cpu_now - cpu_start
        phases.close
        lock.synchronize do
          mine.each do |phase, values|
            truth[phase]["wall"] += values["wall"]
            truth[phase]["cpu"] += values["cpu"]
          end
        end
      ensure
        Thread.current.name = previous_name
      end
    end
    if threads == 1
      body.call(0)
    else
      Array.new(threads) { |index| Thread.new { body.call(index) } }.each(&:join)
    end
    truth
  end

  # Each phase's share of the workload threads' whole time, in percent, and the rest
  # ("other": the loop and the measurements themselves).
  def self.truth_shares(truth, type)
    total = truth["all"][type]
    shares = PHASES.to_h { |phase| [phase, 100.0 * truth[phase][type] / total] }
    with_other(shares)
  end

  def self.with_other(shares)
    shares.merge("other" => 100.0 - shares.values.sum)
  end

  # The same from a decoded pprof profile (Contprof's, or Datadog's): a sample belongs to
  # the phase whose method is on its stack; the total is every sample of the workload
  # threads. Contprof names the method AccuracyWorkload::Phases#sleep; Datadog's profiler
  # names it just sleep, as it names Kernel#sleep and Mutex#sleep, whose frames take their
  # caller's file and line: its frames are told apart by the line, that of the method's
  # body.
  def self.contprof_shares(profile, type)
    samples = profile.samples.select { |sample| sample.labels["thread name"].to_s.start_with?("accuracy-") }
    total = samples.sum { |sample| sample.values[type] }.to_f
    shares = PHASES.to_h do |phase|
      name = "AccuracyWorkload::Phases##{phase}"
      body_line = Phases.instance_method(phase).source_location[1] + 1
      in_phase = samples.select do |sample|
        sample.locations.any? do |frame|
          frame.function_name == name || (frame.function_name == phase && frame.file_name == __FILE__ && frame.line == body_line)
        end
      end
      [phase, total.zero? ? 0.0 : 100.0 * in_phase.sum { |sample| sample.values[type] } / total]
    end
    with_other(shares)
  end

  # The same from a vernier result (wall mode): its samples of the workload threads, by
  # weight, per phase whose method is on the stack. (vernier names a thread when it starts:
  # by where it was created, the workload's own threads, or the main thread for one.)
  def self.vernier_shares(result, threads)
    totals = Hash.new(0)
    all = 0
    result.threads.each_value do |thread|
      next unless threads == 1 ? thread[:is_main] : thread[:name].to_s.include?(File.basename(__FILE__))

      thread[:samples].zip(thread[:weights]) do |stack_index, weight|
        labels = result.stack(stack_index).frames.map(&:label)
        all += weight
        phase = PHASES.find { |candidate| labels.include?("AccuracyWorkload::Phases##{candidate}") }
        totals[phase] += weight if phase
      end
    end
    with_other(PHASES.to_h { |phase| [phase, all.zero? ? 0.0 : 100.0 * totals[phase] / all] })
  end

  # The same from a StackProf result (raw: true): samples per phase over all samples.
  def self.stackprof_shares(result)
    require_relative "support/peers"
    counts = Hash.new(0)
    total = 0
    Peers.each_stackprof_sample(result) do |names, count|
      total += count
      phase = PHASES.find { |candidate| names.include?("AccuracyWorkload::Phases##{candidate}") }
      counts[phase] += count if phase
    end
    with_other(PHASES.to_h { |phase| [phase, total.zero? ? 0.0 : 100.0 * counts[phase] / total] })
  end
end

if $PROGRAM_NAME == __FILE__
  require "json"
  profiler, threads, seconds = ARGV
  threads = Integer(threads)
  seconds = Float(seconds)
  AccuracyWorkload.calibrate
  result = { "profiler" => profiler, "threads" => threads }
  case profiler
  when "contprof", "contprof-posix"
    require "contprof"
    recorder = Contprof::StackRecorder.new
    timers = profiler == "contprof-posix" ? :posix : true
    worker = Contprof::Collectors::CpuAndWallTimeWorker.new(recorder: recorder, cpu_timers: timers)
    worker.start
    truth = AccuracyWorkload.run(threads: threads, seconds: seconds)
    worker.stop
    profile = Contprof::Pprof.decode(recorder.serialize[2])
    result["wall"] = AccuracyWorkload.contprof_shares(profile, "wall-time")
    result["cpu"] = AccuracyWorkload.contprof_shares(profile, "cpu-time")
    result["samples"] = profile.samples.sum { |sample| sample.values["cpu-samples"] }
    result["stats"] = worker.stats.slice(:wall_rounds, :cpu_rounds, :perf_events_armed, :posix_timers_armed, :captures,
                                         :captures_missed, :ticks_skipped, :rounds_with_gvl_taken,
                                         :gvl_taken_delay_ns_total, :gvl_taken_delay_ns_max, :rounds_requested,
                                         :wall_round_delay_ns_total, :wall_round_delay_ns_max, :wall_rounds_late,
                                         :holder_rounds_late, :holder_rounds_by_worker, :expirations_in_gc, :gc_samples,
                                         :clock_wakeups, :clock_wakeups_late, :clock_wakeup_late_ns_total,
                                         :clock_wakeup_late_ns_max, :sampling_ns_total, :cpu_rounds_without_expiry,
                                         :cpu_samples_from_timers, :timer_signals, :jobs_already_queued, :cpu_signals_timed, :cpu_signal_lag_ns_total, :cpu_signal_lag_ns_max, :cpu_signals_late)
  when "datadog"
    # Datadog's profiler at its defaults (bench/support/peers.rb).
    require "contprof"
    require_relative "support/peers"
    bytes, truth = Peers.datadog_profile { AccuracyWorkload.run(threads: threads, seconds: seconds) }
    profile = Contprof::Pprof.decode(bytes)
    result["wall"] = AccuracyWorkload.contprof_shares(profile, "wall-time")
    result["cpu"] = AccuracyWorkload.contprof_shares(profile, "cpu-time")
    result["samples"] = profile.samples.sum { |sample| sample.values["cpu-samples"] }
  when "vernier"
    require_relative "support/peers"
    Peers.use_gem_dir!
    require "vernier"
    truth = nil
    vernier = Vernier.profile(mode: :wall) { truth = AccuracyWorkload.run(threads: threads, seconds: seconds) }
    result["wall"] = AccuracyWorkload.vernier_shares(vernier, threads)
    result["samples"] = vernier.total_samples
  when "stackprof-wall", "stackprof-cpu"
    require "stackprof"
    mode = profiler == "stackprof-wall" ? :wall : :cpu
    # The issue's reference: wall mode at 10 ms; cpu mode at its default interval.
    interval = mode == :wall ? 10_000 : 1000
    truth = nil
    data = StackProf.run(mode: mode, interval: interval, raw: true) do
      truth = AccuracyWorkload.run(threads: threads, seconds: seconds)
    end
    result[mode == :wall ? "wall" : "cpu"] = AccuracyWorkload.stackprof_shares(data)
    result["samples"] = data[:samples]
  else
    truth = AccuracyWorkload.run(threads: threads, seconds: seconds)
  end
  result["truth_wall"] = AccuracyWorkload.truth_shares(truth, "wall")
  result["truth_cpu"] = AccuracyWorkload.truth_shares(truth, "cpu")
  puts JSON.generate(result)
end
