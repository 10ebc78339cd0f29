# frozen_string_literal: true

require_relative "../test_helper"

# Profiles checked against ground truth: each thread measures its own CPU time
# (CLOCK_THREAD_CPUTIME_ID) around each section and its sleeps with the monotonic clock.
# No timing thresholds: the comparisons are between the profile and those measurements.
class AccuracyTest < Minitest::Test
  def setup
    @recorder = Contprof::StackRecorder.new
  end

  def profile_while(signals: true)
    worker = Contprof::Collectors::CpuAndWallTimeWorker.new(recorder: @recorder, signals: signals)
    worker.start
    yield
  ensure
    worker.stop
    @stats = worker.stats.merge(threads: Thread.list.map { |t| [t.name, t.status] })
  end

  def method_a(seconds)
    burn_cpu(seconds)
  end

  def method_b(seconds)
    burn_cpu(seconds)
  end

  def on_stack?(sample, name)
    sample.locations.any? { |frame| frame.function_name == name }
  end

  # Two methods burn CPU in a 3:1 ratio, in sections of random lengths (so that no period
  # of the workload lines up with the sampling interval). Sections last a few intervals:
  # the test measures the profiler's attribution, not the statistics of sampling sections
  # shorter than the interval (whose spread alone would exceed 3 points at ~200 samples).
  def run_three_to_one_split(signals:)
    random = Random.new(42)
    truth = Hash.new(0.0)
    main_cpu = nil
    profile_while(signals: signals) do
      start = thread_cpu_time
      while truth["a"] + truth["b"] < 2.0
        length = random.rand(0.02..0.08)
        name = random.rand < 0.75 ? "a" : "b"
        before = thread_cpu_time
        name == "a" ? method_a(length) : method_b(length)
        truth[name] += thread_cpu_time - before
      end
      main_cpu = thread_cpu_time - start
    end
    profile = decode_profile(@recorder.serialize[2])
    main_id = profile.samples.find { |s| on_stack?(s, "AccuracyTest#method_a") }.labels["thread id"]
    profiled_cpu = profile.total("cpu-time") { |s| s.labels["thread id"] == main_id }
    assert_in_delta main_cpu * 1e9, profiled_cpu, main_cpu * 1e9 * 0.05, "total cpu-time within 5%"

    a = profile.total("cpu-time") { |s| on_stack?(s, "AccuracyTest#method_a") }
    b = profile.total("cpu-time") { |s| on_stack?(s, "AccuracyTest#method_b") }
    expected_share = truth["a"] / (truth["a"] + truth["b"])
    assert_in_delta expected_share, a.to_f / (a + b), 0.03,
                    "method_a's share of CPU (truth #{truth.transform_values { |v| v.round(3) }}; worker #{@stats})"
  end

  def spin_until(deadline)
    nil while Process.clock_gettime(Process::CLOCK_MONOTONIC) < deadline
  end

  def first_half(deadline) = spin_until(deadline)
  def second_half(deadline) = spin_until(deadline)

  # A loop locked to the clock, its period exactly half the sampling interval: halves of
  # 2.5 ms, each burning CPU until its deadline. Sampled at a fixed cadence (wall ticks every
  # 10 ms, CPU timers every 10 ms of CPU), every sample would fall on the same point of the
  # loop and one half would take (nearly) all of the time; random intervals must give each
  # half its half, within the binomial spread of the samples (4 sigma + 1 point).
  def test_a_loop_in_step_with_the_interval_is_not_sampled_at_one_point
    profile_while do
      started = Process.clock_gettime(Process::CLOCK_MONOTONIC)
      400.times do |i| # 2 s
        first_half(started + (i * 0.005) + 0.0025)
        second_half(started + ((i + 1) * 0.005))
      end
    end
    profile = decode_profile(@recorder.serialize[2])
    %w[wall-time cpu-time].each do |type|
      first = profile.total(type) { |sample| on_stack?(sample, "AccuracyTest#first_half") }
      second = profile.total(type) { |sample| on_stack?(sample, "AccuracyTest#second_half") }
      samples = (first + second) / 1e7 # one per 10 ms (of wall or of CPU)
      share = 100.0 * first / (first + second)
      tolerance = 100 * 4 * Math.sqrt(0.25 / samples) + 1
      assert_in_delta 50, share, tolerance, "#{type}: first half's share (#{samples} samples; #{@stats})"
    end
  end

  def test_cpu_total_and_a_three_to_one_split_with_signals
    run_three_to_one_split(signals: true)
  end

  # The known-answer workload of bench/accuracy.rb (phases shorter than the interval: Ruby
  # CPU of two sizes, native CPU without the GVL, sleep, an I/O wait, a lock wait), with 4
  # threads. Every phase's share of wall-time and of cpu-time must match the truth the
  # threads measured, within 4 standard deviations of sampling (binomial, from the number
  # of samples) plus one point. Sampled every 2 ms for more samples in a short test; the
  # benchmark shows the same at the default interval over longer runs. (The workload loops
  # with a steady period: with a fixed sampling cadence, runs whose loop happened to line
  # up with it put up to 7 points of one phase into another. See jitter.h.)
  def test_every_phase_gets_its_share_of_wall_and_cpu_time
    require_relative "../../bench/accuracy_workload"
    AccuracyWorkload.calibrate
    check_phase_shares
  end

  def check_phase_shares
    worker = Contprof::Collectors::CpuAndWallTimeWorker.new(recorder: @recorder, interval: 0.002, overhead_target: 1)
    worker.start
    truth = AccuracyWorkload.run(threads: 4, seconds: 4)
    worker.stop
    stats = worker.stats
    profile = decode_profile(@recorder.serialize[2])
    samples = { "wall" => stats[:wall_rounds] * 4, "cpu" => truth["all"]["cpu"] / 0.002 }
    { "wall" => "wall-time", "cpu" => "cpu-time" }.each do |kind, type|
      expected = AccuracyWorkload.truth_shares(truth, kind)
      actual = AccuracyWorkload.contprof_shares(profile, type)
      AccuracyWorkload::PHASES.each do |phase|
        share = expected[phase] / 100
        tolerance = 100 * 4 * Math.sqrt(share * (1 - share) / samples[kind]) + 1
        assert_in_delta expected[phase], actual[phase], tolerance,
                        "#{kind} share of #{phase} (truth #{expected.transform_values { |v| v.round(1) }}, " \
                        "profile #{actual.transform_values { |v| v.round(1) }}, #{samples[kind].round} samples; #{stats})"
      end
    end
  end

  def allocate_strings
    list = nil
    2_000.times { list = Array.new(20) { "x" * 40 } }
    list
  end

  def compute_without_allocating
    x = 0
    20_000.times { |i| x += i * i }
    x
  end

  # GC time goes to "Garbage Collection" (marking, sweeping) on top of the frames that
  # triggered it, in the amount GC.total_time counts, and no longer to those frames.
  def test_gc_time_is_its_own_frame_in_the_amount_ruby_measures
    worker = Contprof::Collectors::CpuAndWallTimeWorker.new(recorder: @recorder)
    GC.start
    allocating_cpu = 0.0
    gc_before = GC.total_time
    worker.start
    main_cpu_before = thread_cpu_time
    started = Process.clock_gettime(Process::CLOCK_MONOTONIC)
    deadline = started + 2
    while Process.clock_gettime(Process::CLOCK_MONOTONIC) < deadline
      before = thread_cpu_time
      allocate_strings
      allocating_cpu += thread_cpu_time - before
      compute_without_allocating
    end
    main_cpu = thread_cpu_time - main_cpu_before
    worker.stop
    gc_ns = GC.total_time - gc_before
    stats = worker.stats
    profile = decode_profile(@recorder.serialize[2])
    in_gc = ->(s) { s.locations.any? { |f| f.function_name == "Garbage Collection" } }
    gc_samples = profile.samples.select(&in_gc)
    # Every nanosecond the GC's clock counted is in the profile, once as CPU and once as
    # wall time; that clock (GC.stat(:time)) counts milliseconds of GC.total_time.
    %w[cpu-time wall-time].each do |type|
      assert_equal stats[:gc_time_ns], gc_samples.sum { |s| s.values[type] }, "#{type} in GC vs the GC's clock"
      assert_in_delta gc_ns, gc_samples.sum { |s| s.values[type] }, [gc_ns * 0.1, 2e6].max, "#{type} in GC vs GC.total_time"
    end
    # (How many samples found a GC depends on how many GCs this machine's speed makes: the
    # amounts above are the known answer, and they need samples in GC to be placed.)
    assert_operator stats[:gc_samples], :>, 0, "GC samples: #{stats.slice(:gc_samples, :expirations_in_gc, :ticks_in_gc)}"
    # A sample may land in the instants of a GC that are in neither phase (setting up the
    # marking, tidying up after the sweeping): "Garbage Collection" alone, a sliver.
    phased = gc_samples.select { |s| %w[Marking Sweeping].include?(s.locations.first.function_name) }
    assert_operator phased.sum { |s| s.values["cpu-time"] }, :>=, 0.9 * stats[:gc_time_ns],
                    gc_samples.map { |s| [s.locations.first.function_name, s.values["cpu-time"]] }.inspect
    assert gc_samples.all? { |s| %w[major minor].include?(s.labels["gc type"]) && s.labels["gc cause"] }
    under_allocation = gc_samples.select { |s| s.locations.any? { |f| f.function_name.end_with?("#allocate_strings") } }
    assert_operator under_allocation.sum { |s| s.values["cpu-time"] }, :>=, gc_ns * 0.9, "on top of the allocating frames"
    # The allocating method keeps its own CPU only: what its clock measured, less the GC's.
    # The GC's share is taken off by the CPU samples that fell in a GC (10 ms each), a
    # binomial count: 4 standard deviations of it, plus one sample.
    own = profile.total("cpu-time") { |s| !in_gc.(s) && s.locations.any? { |f| f.function_name.end_with?("#allocate_strings") } }
    expected = allocating_cpu * 1e9 - gc_ns
    period = 10_000_000
    samples = main_cpu * 1e9 / period
    share = gc_ns / (main_cpu * 1e9)
    tolerance = 4 * period * Math.sqrt(samples * share * (1 - share)) + period
    assert_in_delta expected, own, tolerance, "allocate_strings without its GC (#{stats.slice(:expirations_in_gc, :ticks_in_gc)})"
    computing_gc = gc_samples.select { |s| s.locations.any? { |f| f.function_name.end_with?("#compute_without_allocating") } }
    # (A flush, one interval of GC time, runs at the thread's next safe point: when a GC
    # ends with the last allocation of allocate_strings, that point may be past its return.
    # One such flush is allowed.)
    assert_operator computing_gc.sum { |s| s.values["cpu-time"] }, :<, gc_ns * 0.02 + period,
                    "GC is not put on code that does not allocate"
  end

  # Runs shorter than one interval: the program's time, never the profiler's frames.
  def test_a_short_profiled_block_shows_no_profiler_frame
    result = Contprof.profile { burn_cpu(0.003) }
    frames = result.decode.samples.flat_map { |s| s.locations.map { |f| [f.function_name, f.file_name] } }
    contprof_lib = File.expand_path("../../lib/contprof", __dir__)
    refute frames.any? { |name, file| name.start_with?("Contprof") || file.start_with?(contprof_lib) }, frames.inspect
    assert_operator result.decode.total("cpu-time"), :>, 2_000_000, "the block's CPU is there"
  end

  def test_cpu_total_and_a_three_to_one_split_without_signals
    run_three_to_one_split(signals: false)
  end

  # The sleeper's last wall sample is taken, by construction, while it still sleeps: the
  # main thread takes a wall round before waking it.
  def test_a_thread_asleep_for_two_seconds
    slept = nil
    sleeper = nil
    profile_while do
      asleep = Queue.new
      sleeper = Thread.new do
        Thread.current.name = "sleeper"
        start = Process.clock_gettime(Process::CLOCK_MONOTONIC, :nanosecond)
        asleep << true
        sleep
        slept = Process.clock_gettime(Process::CLOCK_MONOTONIC, :nanosecond) - start
      end
      asleep.pop
      sleep 2
      Thread.pass until sleeper.status == "sleep"
      Contprof::Collectors::CpuAndWallTimeWorker::Testing.wall_round
      sleeper.wakeup
      sleeper.join
    end
    profile = decode_profile(@recorder.serialize[2])
    sleeping = profile.samples.select { |s| s.labels["thread name"] == "sleeper" }
    in_sleep = sleeping.select { |s| s.locations.first.function_name == "Kernel#sleep" }.sum { |s| s.values["wall-time"] }
    # All of it but the instants between the last round and the wakeup.
    assert_in_delta slept, in_sleep, slept * 0.02, "wall-time in Kernel#sleep"
    assert_operator sleeping.sum { |s| s.values["cpu-time"] }, :<, 10_000_000, "a sleeping thread uses ~no CPU"
  end

  # A pool thread that works between waits at the very same place: samples mostly find
  # it waiting, with an unchanged stack (the cheap path, which defers CPU clock reads),
  # yet all its CPU must be counted.
  def test_a_pool_thread_waiting_at_the_same_place_between_jobs
    jobs = Queue.new
    used = 0.0
    profile_while do
      pool = Thread.new do
        Thread.current.name = "pool"
        while (job = jobs.pop)
          start = thread_cpu_time
          burn_cpu(job)
          used += thread_cpu_time - start
        end
      end
      30.times do
        jobs << 0.005
        sleep 0.03
      end
      jobs << nil
      pool.join
    end
    profile = decode_profile(@recorder.serialize[2])
    profiled = profile.total("cpu-time") { |s| s.labels["thread name"] == "pool" }
    assert_in_delta used * 1e9, profiled, used * 1e9 * 0.05, "cpu-time of the pool thread"
  end

  def test_threads_created_and_finished_during_profiling_have_correct_totals
    truth = {}
    lock = Mutex.new
    profile_while do
      sleep 0.05
      threads = Array.new(4) do |i|
        Thread.new do
          Thread.current.name = "short-lived-#{i}"
          start = thread_cpu_time
          burn_cpu(0.1 + (0.05 * i))
          used = thread_cpu_time - start
          lock.synchronize { truth["short-lived-#{i}"] = used }
        end
      end
      threads.each(&:join)
      sleep 0.05
    end
    profile = decode_profile(@recorder.serialize[2])
    truth.each do |name, seconds|
      profiled = profile.total("cpu-time") { |s| s.labels["thread name"] == name }
      assert_in_delta seconds * 1e9, profiled, seconds * 1e9 * 0.05, "cpu-time of #{name}"
    end
  end
end
