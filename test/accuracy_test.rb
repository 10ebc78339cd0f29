# frozen_string_literal: true

require_relative "test_helper"

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

  def test_cpu_total_and_a_three_to_one_split_with_signals
    run_three_to_one_split(signals: true)
  end

  def test_cpu_total_and_a_three_to_one_split_without_signals
    run_three_to_one_split(signals: false)
  end

  def test_a_thread_asleep_for_two_seconds
    slept = nil
    sleeper = nil
    profile_while do
      sleeper = Thread.new do
        Thread.current.name = "sleeper"
        start = Process.clock_gettime(Process::CLOCK_MONOTONIC, :nanosecond)
        sleep 2
        slept = Process.clock_gettime(Process::CLOCK_MONOTONIC, :nanosecond) - start
      end
      sleeper.join
    end
    profile = decode_profile(@recorder.serialize[2])
    sleeping = profile.samples.select { |s| s.labels["thread name"] == "sleeper" }
    in_sleep = sleeping.select { |s| s.locations.first.function_name == "Kernel#sleep" }.sum { |s| s.values["wall-time"] }
    assert_in_delta slept, in_sleep, slept * 0.05, "wall-time in Kernel#sleep"
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
