# frozen_string_literal: true

require_relative "test_helper"
require "minitest/mock"

class CollectorsCpuAndWallTimeWorkerTest < Minitest::Test
  Worker = Contprof::Collectors::CpuAndWallTimeWorker

  def setup
    @recorder = Contprof::StackRecorder.new
    @workers = []
  end

  def teardown
    @workers.each(&:stop)
    Signal.trap("PROF", "DEFAULT")
  end

  def worker(**options)
    Worker.new(recorder: @recorder, **options).tap { |w| @workers << w }
  end

  def test_start_and_stop_are_idempotent_and_restartable
    w = worker
    refute w.running?
    w.stop
    w.start
    w.start
    assert w.running?
    assert_equal Worker.running_worker, w
    burn_cpu(0.05)
    w.stop
    w.stop
    refute w.running?
    assert_nil Worker.running_worker
    first = w.stats[:sample_rounds]
    assert_operator first, :>=, 3
    w.start
    burn_cpu(0.05)
    w.stop
    assert_operator w.stats[:sample_rounds], :>, first
    assert_nil w.failure
  end

  def test_busy_threads_signal_themselves_with_cpu_timers
    w = worker
    w.start
    helper = Thread.new { burn_cpu(0.1) }
    burn_cpu(0.3)
    helper.join
    w.stop
    stats = w.stats
    # One timer per thread (main, helper); each fires after every 10 ms of its own CPU.
    assert_operator stats[:cpu_timers_armed], :>=, 2, stats.inspect
    assert_operator stats[:timer_signals], :>=, 20, stats.inspect
    assert_equal 0, stats[:cpu_timers_failed]
    # The worker thread only checks that rounds keep coming: it wakes up far less often
    # than there are rounds, and sends (almost) no signal of its own. With the watchdog
    # (a timerfd the rounds keep moving on) it does not wake at all while they come.
    assert_operator stats[:trigger_wakeups], :<, stats[:sample_rounds], stats.inspect
    assert_operator stats[:signals_sent], :<, stats[:timer_signals] / 4, stats.inspect
    if stats[:watchdog]
      assert_operator stats[:trigger_wakeups], :<=, 3, stats.inspect
      assert_operator stats[:watchdog_pushes], :>=, 3, stats.inspect
      assert_operator stats[:watchdog_pushes], :<=, stats[:sample_rounds] / 2, "one timerfd_settime per few rounds"
    end
    assert_equal 0, stats[:cpu_timers_live], "every timer is deleted at stop"
    profile = decode_profile(@recorder.serialize[2])
    assert_operator profile.total("cpu-time"), :>, 350_000_000
  end

  def test_timers_of_ended_killed_and_failed_threads_are_deleted
    w = worker
    w.start
    live = w.stats[:cpu_timers_live]
    assert_operator live, :>=, 1, "the threads alive at start have timers"
    finished = Array.new(5) { Thread.new { burn_cpu(0.01) } }
    failed = Array.new(5) do
      Thread.new do
        Thread.current.report_on_exception = false
        burn_cpu(0.01)
        raise "ends by an exception"
      end
    end
    killed = Array.new(5) { Thread.new { sleep } }
    Thread.pass until killed.all? { |t| t.status == "sleep" }
    # Every live thread but the worker's has a timer (threads left by other test files may
    # end at any moment, so counts are taken against the threads alive now).
    assert_operator w.stats[:cpu_timers_live], :>=, Thread.list.size - 1, "new threads get timers"
    killed.each(&:kill)
    (finished + failed + killed).each { |t| t.join rescue nil } # rubocop:disable Style/RescueModifier
    burn_cpu(0.05) # a few rounds: they delete the timers of threads that died unannounced
    assert_equal Thread.list.size - 1, w.stats[:cpu_timers_live], w.stats.inspect
    assert_operator w.stats[:cpu_timers_armed], :>=, live + 15
  end

  def test_signals_go_to_the_gvl_holder
    w = worker(signals: true, cpu_timers: false)
    w.start
    burn_cpu(0.2)
    w.stop
    stats = w.stats
    assert_operator stats[:signals_sent], :>=, 10
    assert_equal 0, stats[:timer_signals]
    assert_equal 0, stats[:interrupts_raised]
    assert_operator stats[:sample_rounds], :>=, 10
    assert_operator stats[:sampling_ns_max], :>=, stats[:sampling_ns_average]
    assert_operator stats[:sampling_ns_total], :>, 0
    profile = decode_profile(@recorder.serialize[2])
    assert_operator profile.total("cpu-time"), :>, 150_000_000
  end

  def test_signal_free_mode_sends_no_signal
    received = 0
    Signal.trap("PROF") { received += 1 }
    w = worker(signals: false)
    w.start
    burn_cpu(0.2)
    w.stop
    assert_equal 0, received, "no SIGPROF reached the process"
    stats = w.stats
    assert_equal 0, stats[:signals_sent]
    assert_operator stats[:interrupts_raised], :>=, 10
    profile = decode_profile(@recorder.serialize[2])
    assert_operator profile.total("cpu-time"), :>, 150_000_000
  end

  # The worker thread blocks SIGPROF while it runs. Ruby reuses native threads: a thread
  # created after a worker stopped must still receive the signal (regression).
  def test_threads_reusing_a_stopped_workers_native_thread_still_get_signals
    first = worker
    first.start
    burn_cpu(0.02)
    first.stop
    first.thread&.join
    sleep 0.05
    [false, true].each do |cpu_timers|
      busy = Thread.new { burn_cpu(0.5) } # likely on the first worker's native thread
      second = Worker.new(recorder: @recorder, interval: 0.005, cpu_timers: cpu_timers).tap { |w| @workers << w }
      second.start
      busy.join
      second.stop
      stats = second.stats
      assert_equal 0, stats[:nudges_lost], stats.inspect
      assert_operator stats[cpu_timers ? :timer_signals : :signals_sent], :>=, 20, stats.inspect
    end
  end

  # Under a thread limit Thread.new raises: start must not leave its signal handler, hooks
  # and CPU timers behind (they would keep sampling with no worker to stop them).
  def test_a_worker_thread_that_cannot_start_leaves_nothing_installed
    w = worker
    Thread.stub(:new, ->(*) { raise ThreadError, "can't create Thread: Resource temporarily unavailable" }) do
      assert_raises(ThreadError) { w.start }
    end
    refute w.running?
    refute w.sampling?
    assert_nil Worker.running_worker
    assert_equal 0, w.stats[:cpu_timers_live]
    assert_includes %w[DEFAULT SYSTEM_DEFAULT], Signal.trap("PROF", "DEFAULT"), "the previous SIGPROF disposition is back"
    w.start # and it can start for real afterwards
    burn_cpu(0.05)
    w.stop
    assert_operator w.stats[:sample_rounds], :>=, 3
  end

  def test_refuses_to_replace_an_existing_sigprof_handler
    Signal.trap("PROF") { nil }
    w = worker(signals: true)
    error = assert_raises(Contprof::Error) { w.start }
    assert_match(/a SIGPROF handler is already installed/, error.message)
    assert_match(/signals: false/, error.message)
    refute w.running?
  end

  def test_only_one_worker_at_a_time
    first = worker
    first.start
    second = Worker.new(recorder: Contprof::StackRecorder.new)
    error = assert_raises(Contprof::Error) { second.start }
    assert_match(/another CpuAndWallTimeWorker is running/, error.message)
  end

  def test_invalid_settings
    error = assert_raises(ArgumentError) { worker(interval: 0) }
    assert_match(/interval must be a number of seconds from 0.001 to 60.0, got 0/, error.message)
    assert_raises(ArgumentError) { worker(interval: "0.01") }
    error = assert_raises(ArgumentError) { worker(signals: "yes") }
    assert_match(/signals must be true or false/, error.message)
    error = assert_raises(ArgumentError) { worker(cpu_timers: nil) }
    assert_match(/cpu_timers must be true or false, got nil/, error.message)
    error = assert_raises(ArgumentError) { worker(overhead_target: 2) }
    assert_match(/overhead_target/, error.message)
    assert_raises(ArgumentError) { worker(max_frames: 2) }
  end

  # When the busy threads go idle, the rounds (and the watchdog's pushes) stop: within
  # 16 intervals the worker thread wakes up and samples the sleepers itself.
  # A busy thread's rounds take its CPU from its timer's expirations (no clock read), and
  # the totals stay exact.
  def test_a_busy_threads_cpu_comes_from_its_timer_and_adds_up
    w = worker(overhead_target: 1)
    w.start
    cpu_start = thread_cpu_time
    burn_cpu(0.4)
    used = thread_cpu_time - cpu_start
    w.stop
    stats = w.stats
    profile = decode_profile(@recorder.serialize[2])
    burned = profile.total("cpu-time") { |s| s.locations.any? { |f| f.function_name.end_with?("#burn_cpu") } }
    assert_in_delta used * 1e9, burned, used * 1e9 * 0.01
    skip "no CPU timers in this build" unless stats[:cpu_timers_armed].positive?
    assert_operator stats[:cpu_times_from_timers], :>=, stats[:timer_signals] * 3 / 4, stats.inspect
    assert_operator stats[:cpu_clock_reads], :<, stats[:sample_rounds], stats.inspect
  end

  def test_sampling_resumes_when_the_busy_threads_go_idle
    w = worker(overhead_target: 1)
    w.start
    burn_cpu(0.2)
    busy = w.stats
    sleep 0.5 # the worker wakes up within 16 intervals (160 ms)
    w.stop
    stats = w.stats
    assert_operator busy[:timer_signals], :>=, 10, busy.inspect
    taken = stats[:samples_with_gvl_taken] - busy[:samples_with_gvl_taken]
    assert_operator taken, :>=, 20, "rounds the worker took while everything slept: #{stats}"
    profile = decode_profile(@recorder.serialize[2])
    sleeping = profile.total("wall-time") { |s| s.locations.first&.function_name == "Kernel#sleep" }
    assert_in_delta 500_000_000, sleeping, 100_000_000
  end

  # Each run's trigger loop has its own watchdog: a loop of the previous run, still ending
  # when the next run starts, can neither steal nor clear the new loop's expiry.
  def test_quick_restarts_keep_the_watchdog_working
    w = worker(overhead_target: 1)
    5.times do
      w.start
      burn_cpu(0.02)
      w.stop
    end
    w.start
    burn_cpu(0.05)
    before = w.stats[:samples_with_gvl_taken]
    sleep 0.5
    w.stop
    taken = w.stats[:samples_with_gvl_taken] - before
    assert_operator taken, :>=, 20, "the last run's worker sampled the sleeping program: #{w.stats}"
  end

  # A thread busy in native code without the GVL receives its CPU timer's signals, but they
  # start no round: the worker thread must keep sampling every interval, not back off.
  def test_signals_without_rounds_do_not_quiet_the_worker
    require "zlib"
    w = worker(overhead_target: 1)
    data = Random.new(1).bytes(4 << 20)
    stop = false
    compressor = Thread.new { Zlib::Deflate.deflate(data, Zlib::BEST_COMPRESSION) until stop }
    sleep 0.1
    w.start
    before = w.stats
    sleep 0.6 # the main thread sleeps; the compressor runs without the GVL
    stats = w.stats
    w.stop
    stop = true
    compressor.join
    skip "the compressor kept the GVL (#{stats})" if stats[:timer_signals] < 10 && stats[:cpu_timers_armed].positive?
    # ~60 intervals: the worker wakes at most of them and rounds keep coming (fewer when
    # the compressor happens to hold the GVL as its timer fires: that round moves the
    # watchdog on). Backing off on mere signals, it woke ~12 times for ~9 rounds.
    assert_operator stats[:trigger_wakeups] - before[:trigger_wakeups], :>=, 20, stats.inspect
    assert_operator stats[:sample_rounds] - before[:sample_rounds], :>=, 20, stats.inspect
  end

  # A fork between the first step of #stop (sampling ended) and its last: the child must
  # not wait for a worker thread that will never start, and stays stopped.
  def test_a_fork_in_the_middle_of_stop_leaves_the_child_stopped
    w = worker
    w.start
    burn_cpu(0.05)
    w.send(:_native_request_stop) # what #stop does first
    started = Process.clock_gettime(Process::CLOCK_MONOTONIC)
    pid = fork { exit!(w.running? || w.sampling? ? 1 : 0) }
    Process.wait(pid)
    assert $?.success?, "the child stayed stopped"
    assert_operator Process.clock_gettime(Process::CLOCK_MONOTONIC) - started, :<, 2, "without waiting for a worker"
    w.stop
    refute w.running?
  end

  def test_sampling_continues_when_every_thread_sleeps
    # Counts rounds: no adaptive stretching (sampling is slow under the sanitizers).
    w = worker(overhead_target: 1)
    w.start
    sleep 0.3
    w.stop
    stats = w.stats
    assert_operator stats[:samples_with_gvl_taken], :>=, 10, "the worker took the GVL itself: #{stats}"
    # No CPU timer fires while everything sleeps, so the worker never backs off: (almost)
    # every wakeup is a round. (Its own rounds must not pass for timer-driven ones.)
    assert_operator stats[:samples_with_gvl_taken], :>=, stats[:trigger_wakeups] - 3, stats.inspect
    profile = decode_profile(@recorder.serialize[2])
    sleeping = profile.total("wall-time") { |s| s.locations.first&.function_name == "Kernel#sleep" }
    assert_operator sleeping, :>=, 250_000_000
  end

  def test_a_sampling_failure_stops_the_worker_and_reaches_its_thread_only
    w = worker
    w.start
    Worker::Testing.fail_next_sample
    deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + 5
    burn_cpu(0.01) while w.running? && Process.clock_gettime(Process::CLOCK_MONOTONIC) < deadline
    refute w.running?
    assert_kind_of RuntimeError, w.failure
    assert_match(/injected sampling failure/, w.failure.message)
    w.stop # no raise
    assert_nil Worker.running_worker
    # The signal handler is gone: starting a signal-based worker again works.
    w2 = worker
    w2.start
    assert w2.running?
  end

  def test_adaptive_rate_stretches_the_interval_to_meet_the_overhead_target
    w = worker(interval: 0.001, overhead_target: 0.0005)
    w.start
    wall_start = Process.clock_gettime(Process::CLOCK_MONOTONIC, :nanosecond)
    cpu_start = thread_cpu_time
    burn_cpu(0.5)
    used = thread_cpu_time - cpu_start
    w.stop
    wall = Process.clock_gettime(Process::CLOCK_MONOTONIC, :nanosecond) - wall_start
    stats = w.stats
    assert_operator stats[:effective_interval_ns], :>, 1_000_000 * 5, "stretched: #{stats}"
    assert_operator stats[:sample_rounds], :<, 250, "far fewer than 500 rounds at 1 ms"
    # Values stay right: they are time deltas (only where they are attributed blurs).
    profile = decode_profile(@recorder.serialize[2])
    burner = profile.samples.find { |s| s.locations.any? { |f| f.function_name.end_with?("#burn_cpu") } }
    main_id = burner.labels["thread id"]
    main_cpu = profile.total("cpu-time") { |s| s.labels["thread id"] == main_id }
    # Exact, though the timers were replaced at each new period and rounds may take the
    # thread's CPU from its timer's expiry count: only the rounds' own CPU is left out.
    assert_in_delta used * 1e9, main_cpu, used * 1e9 * 0.01
    main_wall = profile.total("wall-time") { |s| s.labels["thread id"] == main_id }
    assert_in_delta wall, main_wall, 0.05e9
  end

  def test_fork_gives_the_child_a_fresh_running_profiler_without_the_parents_samples
    w = worker(overhead_target: 1) # counts timer signals: no adaptive stretching
    w.start
    parent_work
    reader, writer = IO.pipe
    pid = fork do
      reader.close
      running = w.running?
      child_work
      timers = w.stats.slice(:cpu_timers_live, :timer_signals, :cpu_times_from_timers)
      w.stop
      profile = Contprof::Pprof.decode(@recorder.serialize[2])
      names = profile.samples.flat_map { |s| s.locations.map(&:function_name) }.uniq
      writer.write(Marshal.dump(running: running, names: names, cpu: profile.total("cpu-time"), timers: timers))
      writer.close
      exit!(0)
    end
    writer.close
    result = Marshal.load(reader.read) # rubocop:disable Security/MarshalLoad
    Process.wait(pid)
    assert $?.success?
    assert result[:running], "the worker runs in the child"
    assert_equal 1, result[:timers][:cpu_timers_live], "the child armed a timer for its one thread"
    assert_operator result[:timers][:timer_signals], :>=, 5, "and it fires"
    assert_operator result[:timers][:cpu_times_from_timers], :>=, 3, "and counts its expirations"
    assert_includes result[:names], "CollectorsCpuAndWallTimeWorkerTest#child_work"
    refute_includes result[:names], "CollectorsCpuAndWallTimeWorkerTest#parent_work"
    assert_operator result[:cpu], :>, 100_000_000
    # The parent keeps profiling.
    assert w.running?
    parent_work
    w.stop
    names = decode_profile(@recorder.serialize[2]).samples.flat_map { |s| s.locations.map(&:function_name) }
    assert_includes names, "CollectorsCpuAndWallTimeWorkerTest#parent_work"
    refute_includes names, "CollectorsCpuAndWallTimeWorkerTest#child_work"
  end

  def parent_work
    burn_cpu(0.15)
  end

  def child_work
    burn_cpu(0.15)
  end

  def test_exec_stops_the_worker_first
    w = worker
    w.start
    10.times do
      pid = fork do
        burn_cpu(0.02)
        exec(RbConfig.ruby, "-e", "x = 0; 2_000_000.times { x += 1 }; exit 7")
      end
      Process.wait(pid)
      assert_equal 7, $?.exitstatus, "the exec'd program ran to its end (#{$?.inspect})"
    end
    assert w.running?
  end

  def test_failed_exec_resumes_sampling
    w = worker
    w.start
    assert_raises(Errno::ENOENT) { exec("/nonexistent/program") }
    assert w.running?
    assert_equal w, Worker.running_worker
  end
end
