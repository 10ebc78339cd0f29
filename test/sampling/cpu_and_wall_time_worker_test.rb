# frozen_string_literal: true

require_relative "../test_helper"
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
    first = w.stats[:rounds]
    assert_operator first, :>=, 3
    w.start
    burn_cpu(0.05)
    w.stop
    assert_operator w.stats[:rounds], :>, first
    assert_nil w.failure
  end

  def sigmask(how)
    require "fiddle"
    @sigmask ||= Fiddle::Function.new(Fiddle.dlopen(nil)["pthread_sigmask"],
                                      [Fiddle::TYPE_INT, Fiddle::TYPE_VOIDP, Fiddle::TYPE_VOIDP], Fiddle::TYPE_INT)
    set = Fiddle::Pointer.malloc(128, Fiddle::RUBY_FREE)
    set[0, 128] = "\0" * 128
    bit = Signal.list.fetch("PROF") - 1
    set[bit / 8] = 1 << (bit % 8)
    @sigmask.call(how, set, nil)
  end

  # SIGPROF blocked, then unblocked (native code does so): the timer's signals of that time
  # merge into one, while it counted every period of CPU. The CPU is where it was used.
  def blocked_phase(seconds)
    sigmask(0) # SIG_BLOCK
    burn_cpu(seconds)
    sigmask(1) # SIG_UNBLOCK: the pending signal's round runs in here
    burn_cpu(0.02)
  end

  def open_phase(seconds)
    burn_cpu(seconds)
  end

  def test_cpu_counted_while_the_timers_signals_merged_stays_where_it_was_used
    w = worker
    w.start
    skip "no perf event timers here (POSIX timers count merged expirations themselves)" if w.stats[:perf_events_armed].zero?
    truth = {}
    thread = Thread.new do
      Thread.current.name = "blocker"
      started = thread_cpu_time
      blocked_phase(0.25)
      truth["blocked"] = thread_cpu_time - started
      started = thread_cpu_time
      open_phase(0.25)
      truth["open"] = thread_cpu_time - started
    end
    thread.join
    w.stop
    profile = decode_profile(@recorder.serialize[2])
    in_method = ->(name) { profile.total("cpu-time") { |s| s.locations.any? { |f| f.function_name.end_with?("##{name}") } } / 1e9 }
    assert_in_delta truth["blocked"], in_method.("blocked_phase"), 0.1 * truth["blocked"] + 0.01, "truth #{truth}"
    assert_in_delta truth["open"], in_method.("open_phase"), 0.1 * truth["open"] + 0.01, "truth #{truth}"
  end

  # A thread that blocks SIGPROF for a while is found not hearing its timer (and why: its
  # signal mask), its CPU meanwhile read from its clock; once it unblocks, the verdict is
  # taken back and its timer places its CPU again.
  def test_a_thread_not_hearing_its_timer_is_heard_again_once_it_unblocks_sigprof
    w = worker(interval: 0.005, overhead_target: 1) # (a steady period: a new one restarts the check)
    w.start
    skip "no CPU timers here" if w.stats[:cpu_timers_live].zero?
    verdicts = nil
    # (Two checks of its clock, 32 wall rounds apart, make a verdict: burnt until it comes.)
    burn_until = lambda do |seconds, &done|
      deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + seconds
      burn_cpu(0.01) until done.call || Process.clock_gettime(Process::CLOCK_MONOTONIC) > deadline
    end
    thread = Thread.new do
      sigmask(0) # SIG_BLOCK
      burn_until.call(10) { w.stats[:threads_not_hearing_timers].positive? }
      verdicts = w.stats.slice(:threads_not_hearing_timers, :threads_blocking_sigprof, :threads_with_silent_timer)
      sigmask(1) # SIG_UNBLOCK
      burn_until.call(10) { w.stats[:timers_heard_again].positive? }
    end
    thread.join
    stats = w.stats
    w.stop
    assert_equal({ threads_not_hearing_timers: 1, threads_blocking_sigprof: 1, threads_with_silent_timer: 0 }, verdicts)
    assert_equal 1, stats[:timers_heard_again], stats.inspect
    assert_equal 0, stats[:threads_not_hearing_timers]
  end

  # A timer replaced before it could expire (the adaptive rate moves the period; here every
  # few milliseconds) counts nothing, however much CPU the thread uses: that is no sign of
  # a blocked signal. Silences are measured per timer.
  def test_timers_replaced_again_and_again_bring_no_false_verdict
    w = worker(interval: 0.01)
    w.start
    skip "no CPU timers here" if w.stats[:cpu_timers_live].zero?
    periods = [0.010, 0.014]
    deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + 1.5
    while Process.clock_gettime(Process::CLOCK_MONOTONIC) < deadline
      burn_cpu(0.002)
      Worker::Testing.rearm_timers(periods.rotate!.first)
    end
    stats = w.stats
    w.stop
    assert_operator stats[:wall_rounds], :>=, 2 * 32, "enough wall rounds for two checks"
    assert_equal 0, stats[:threads_blocking_sigprof] + stats[:threads_with_silent_timer], stats.inspect
  end

  # A collector that was never initialized (allocate without new) is refused, not used.
  def test_a_worker_refuses_an_uninitialized_collector
    w = Worker.allocate
    error = assert_raises(Contprof::Error) do
      w.send(:_native_initialize, Contprof::Collectors::ThreadContext.allocate, 0.01, 0.02, true, 400, 0)
    end
    assert_match(/not initialized/, error.message)
  end

  # A thread that ran GCs and ended is not kept alive by the profiler: the GC time its
  # samples carried points at no thread once it has ended.
  def test_a_thread_that_ran_gcs_is_not_kept_alive_after_it_ends
    require "objspace"
    w = worker
    w.start
    ended = Thread.new do
      # Allocates until a sample has landed in a GC (a fraction of a second; longer under
      # the sanitizers), at most 10 s.
      deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + 10
      until w.stats[:gc_samples].positive? || Process.clock_gettime(Process::CLOCK_MONOTONIC) > deadline
        200.times { Array.new(1000) { "x" * 100 } }
      end
    end
    ended.join
    reference = ObjectSpace::WeakMap.new
    reference[ended] = true
    ended = nil
    3.times { Contprof::Collectors::CpuAndWallTimeWorker::Testing.wall_round }
    w.stop
    assert_operator w.stats[:gc_samples], :>, 0
    4.times { GC.start }
    assert_equal 0, reference.size, "the ended thread is still referenced"
  end

  # The final round runs after sampling ended and leaves it ended: nothing (the wall clock,
  # a thread's start) can see it on again meanwhile.
  def test_the_final_round_does_not_turn_sampling_back_on
    w = worker
    w.start
    burn_cpu(0.02)
    w.stop
    refute Contprof::Collectors::CpuAndWallTimeWorker::Testing.final_round_saw_sampling?
    refute w.sampling?
    assert_operator w.stats[:wall_rounds], :>=, 1
  end

  # A round runs no Ruby code, not even a method the application redefined on Thread (it may
  # be inside a hash iteration, holding raw frames): a redefined Thread#name leaves the
  # thread without a name label rather than being called.
  def test_rounds_never_call_methods_the_application_redefined
    calls = Queue.new
    sleeper = Thread.new { sleep }
    sleeper.name = "sleeper"
    Thread.pass until sleeper.status == "sleep"
    sleeper.define_singleton_method(:name) { calls << :name; "redefined" }
    sleeper.define_singleton_method(:alive?) { calls << :alive?; true }
    w = worker
    w.start
    5.times { Contprof::Collectors::CpuAndWallTimeWorker::Testing.wall_round }
    w.stop
    names = decode_profile(@recorder.serialize[2]).samples.map { |s| s.labels["thread name"] }
    refute_includes names, "redefined"
    assert_equal 0, calls.size, "called from a round: #{Array.new(calls.size) { calls.pop }.tally}"
  ensure
    sleeper&.kill&.join
  end

  # Two clocks: wall rounds every interval whatever the threads do, CPU rounds when a
  # thread's own timer says it used an interval of CPU. Counts are checked against the
  # worker's own accounting (how many rounds a noisy machine lets it take is not ours).
  def test_wall_rounds_every_interval_and_cpu_rounds_from_each_threads_timer
    w = worker(overhead_target: 1)
    w.start
    helper = Thread.new { burn_cpu(0.1) }
    burn_cpu(0.3)
    helper.join
    deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + 10
    burn_cpu(0.01) until w.stats[:wall_rounds] >= 20 || Process.clock_gettime(Process::CLOCK_MONOTONIC) > deadline
    w.stop
    stats = w.stats
    assert_operator stats[:cpu_timers_armed], :>=, 2, stats.inspect # main and helper
    assert_equal 0, stats[:cpu_timers_failed]
    assert_equal stats[:cpu_timers_armed], stats[:perf_events_armed] + stats[:posix_timers_armed]
    assert_operator stats[:timer_signals], :>=, 25, stats.inspect # 400 ms of CPU, one per 10 ms
    assert_operator stats[:cpu_rounds], :>=, 20, stats.inspect
    # Every tick asked for a wall round, found the previous one pending, or took the GVL;
    # and the wall clock never backed off.
    assert_operator stats[:wall_rounds], :>=, 20, stats.inspect
    assert_operator stats[:wall_rounds], :>=, stats[:rounds_requested] + stats[:rounds_with_gvl_taken] - 1, stats.inspect
    assert_operator stats[:rounds_requested], :>=, stats[:wall_rounds] / 2, "asked of the busy thread: #{stats}"
    assert_equal 0, stats[:ticks_lost], stats.inspect
    assert_equal stats[:interval_ns], stats[:effective_interval_ns]
    assert_equal 0, stats[:cpu_timers_live], "every timer is deleted at stop"
    profile = decode_profile(@recorder.serialize[2])
    assert_operator profile.total("cpu-time"), :>, 350_000_000
  end

  def test_posix_timers_when_asked_for
    w = worker(cpu_timers: :posix, overhead_target: 1)
    w.start
    burn_cpu(0.2)
    w.stop
    stats = w.stats
    assert_equal 0, stats[:perf_events_armed], stats.inspect
    assert_operator stats[:posix_timers_armed], :>=, 1
    assert_operator stats[:timer_signals], :>=, 5, stats.inspect # the kernel's tick merges some
    profile = decode_profile(@recorder.serialize[2])
    burned = profile.total("cpu-time") { |s| s.locations.any? { |f| f.function_name.end_with?("#burn_cpu") } }
    assert_operator burned, :>, 150_000_000
  end

  # Timers of threads that end, are killed or die of an exception go. Each thread says
  # when it runs (its timer is armed by then), and the clean-up round is taken on the spot.
  def test_timers_of_ended_killed_and_failed_threads_are_deleted
    w = worker
    w.start
    live = w.stats[:cpu_timers_live]
    armed_at_start = w.stats[:cpu_timers_armed]
    assert_operator live, :>=, 1, "the threads alive at start have timers"
    started = Queue.new
    gate = Queue.new
    finished = Array.new(5) { Thread.new { started << 1; gate.pop; burn_cpu(0.01) } }
    failed = Array.new(5) do
      Thread.new do
        Thread.current.report_on_exception = false
        started << 1
        gate.pop
        raise "ends by an exception"
      end
    end
    killed = Array.new(5) { Thread.new { started << 1; sleep } }
    15.times { started.pop }
    armed = w.stats[:cpu_timers_armed]
    # (Counted from the armings: a thread of an earlier test may end meanwhile.)
    assert_operator armed - armed_at_start, :>=, 15, "new threads get timers: #{w.stats}"
    assert_operator w.stats[:cpu_timers_live], :>=, 15, "new threads get timers: #{w.stats}"
    killed.each(&:kill)
    10.times { gate << :go }
    (finished + failed + killed).each { |t| t.join rescue nil } # rubocop:disable Style/RescueModifier
    # A wall round deletes the timers of threads that died unannounced (killed, failed).
    Worker::Testing.wall_round
    assert_operator w.stats[:cpu_timers_live], :<=, live, w.stats.inspect
  end

  # Without CPU timers no signal is ever sent (the wall clock never signals), CPU comes
  # from the threads' clocks, and another SIGPROF handler may stay installed.
  def test_without_cpu_timers_no_signal_at_all
    received = 0
    Signal.trap("PROF") { received += 1 }
    [{ cpu_timers: false }, { signals: false }].each do |options|
      w = worker(**options)
      w.start
      burn_cpu(0.2)
      deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + 10
      burn_cpu(0.01) until w.stats[:wall_rounds] >= 10 || Process.clock_gettime(Process::CLOCK_MONOTONIC) > deadline
      w.stop
      assert_equal 0, received, "no SIGPROF reached the process (#{options})"
      stats = w.stats
      assert_equal 0, stats[:cpu_timers_armed]
      assert_operator stats[:wall_rounds], :>=, 10
      assert_operator stats[:cpu_clock_reads], :>=, 10
      profile = decode_profile(@recorder.serialize[2])
      assert_operator profile.total("cpu-time"), :>, 150_000_000
    end
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
    busy = Thread.new { burn_cpu(0.3) } # likely on the first worker's native thread
    second = worker(interval: 0.005)
    second.start
    busy.join
    second.stop
    stats = second.stats
    assert_equal 0, stats[:ticks_lost], stats.inspect
    assert_operator stats[:timer_signals], :>=, 20, stats.inspect
  end

  # Under a thread limit Thread.new raises: start must not leave its signal handler, hooks
  # and CPU timers behind (they would keep sampling with no worker to stop them).
  def test_a_worker_thread_that_cannot_start_leaves_nothing_installed
    w = worker
    failing = ->(*) { raise ThreadError, "can't create Thread: Resource temporarily unavailable" }
    Contprof::Native.stub(:profiler_thread, failing) do
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
    assert_operator w.stats[:rounds], :>=, 3
  end

  # Makes the worker's thread wait before its sampling loop until the returned queue gets
  # an item.
  def hold_back_the_loop(worker)
    gate = Queue.new
    original = worker.method(:_native_sampling_loop)
    worker.define_singleton_method(:_native_sampling_loop) do |generation|
      gate.pop
      original.call(generation)
    end
    gate
  end

  # The profiler's threads are left out from the moment they exist: a round between the
  # worker thread's creation and the start of its loop does not sample it.
  def test_the_worker_thread_is_never_sampled_even_before_its_loop_starts
    w = worker
    gate = hold_back_the_loop(w) # the thread will exist; its loop will not have started
    starter = Thread.new { w.start }
    Thread.pass until w.thread
    Worker::Testing.queue_wall_round { burn_cpu(0.01) } while Worker.running_worker.nil?
    3.times { Worker::Testing.queue_wall_round { burn_cpu(0.005) } }
    gate << :go
    starter.join
    burn_cpu(0.05)
    worker_thread = w.thread
    assert_includes Contprof::Native.profiler_threads, worker_thread
    contexts = Contprof::Collectors::ThreadContext::Testing.per_thread_context(w.collector)
    refute contexts.key?(worker_thread), "the worker thread has no sampling state"
    w.stop
    profile = decode_profile(@recorder.serialize[2])
    names = profile.samples.flat_map { |s| s.locations.map(&:function_name) }
    refute_includes names, "Contprof::Collectors::CpuAndWallTimeWorker#_native_sampling_loop"
  end

  # A worker thread of an earlier run that only gets to run after the next run started
  # ends at once: it must not run a second wall clock for the new run.
  def test_a_late_worker_thread_of_an_earlier_run_ends_at_once
    w = worker
    gate = hold_back_the_loop(w)
    starter = Thread.new { w.start } # waits up to 5 s for a loop that is held back
    Thread.pass until w.thread
    late = w.thread
    w.stop
    starter.join
    w.singleton_class.send(:remove_method, :_native_sampling_loop)
    w.start
    assert w.running?
    gate << :go # the first run's thread now gets to its loop
    assert late.join(2), "the late thread ended without looping"
    assert w.running?, "the current run goes on"
    burn_cpu(0.05)
    w.stop
  end

  def test_refuses_to_replace_an_existing_sigprof_handler
    Signal.trap("PROF") { nil }
    w = worker
    error = assert_raises(Contprof::Error) { w.start }
    assert_match(/a SIGPROF handler is already installed/, error.message)
    assert_match(/cpu_timers: false/, error.message)
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
    assert_match(/cpu_timers must be true, false or :posix, got nil/, error.message)
    error = assert_raises(ArgumentError) { worker(overhead_target: 2) }
    assert_match(/overhead_target/, error.message)
    assert_raises(ArgumentError) { worker(max_frames: 2) }
  end

  # The main thread's profiled CPU (ns), exact but for what the profiler's rounds cost it
  # (left out): at least the `burn` seconds measured inside start and stop, at most the
  # whole from before start to after stop, which the profile also holds some of (the final
  # round gives the caller's last stretch, stop included, to where it was last seen; a GC
  # there, with the suite's large heap, can take tens of milliseconds).
  def assert_profiled_between_burn_and_whole(profiled, burn, whole, own_ns)
    bounds = "profiled #{profiled}, burn #{(burn * 1e9).round}, start to stop #{(whole * 1e9).round}, own #{own_ns}"
    assert_operator profiled, :>=, (burn * 1e9) - own_ns - (burn * 1e9 * 0.01), bounds
    assert_operator profiled, :<=, (whole * 1e9) + (burn * 1e9 * 0.01), bounds
  end

  # A busy thread's CPU comes from its timer's expirations (no clock read), and the totals
  # stay exact.
  def test_a_busy_threads_cpu_comes_from_its_timer_and_adds_up
    w = worker(overhead_target: 1)
    around_start = thread_cpu_time
    w.start
    cpu_start = thread_cpu_time
    burn_cpu(0.4)
    used = thread_cpu_time - cpu_start
    w.stop
    used_around = thread_cpu_time - around_start
    stats = w.stats
    profile = decode_profile(@recorder.serialize[2])
    burned = profile.total("cpu-time") { |s| s.locations.any? { |f| f.function_name.end_with?("#burn_cpu") } }
    assert_profiled_between_burn_and_whole(burned, used, used_around, stats[:sampling_ns_total])
    skip "no CPU timers in this build" unless stats[:cpu_timers_armed].positive?
    assert_operator stats[:cpu_samples_from_timers], :>=, stats[:timer_signals] * 3 / 4, stats.inspect
    assert_operator stats[:cpu_clock_reads], :<, 20, "clocks are read at start and stop only: #{stats}"
  end

  # CPU used in native code without the GVL goes to that native call's stack, captured by
  # the thread's signal handler, even though the thread is elsewhere (asleep) when a round
  # records it.
  def test_cpu_in_native_code_without_the_gvl_stays_with_the_native_call
    require "zlib"
    data = Random.new(1).bytes(2 << 20)
    w = worker(overhead_target: 1)
    w.start
    truth = 0.0
    worker_thread = Thread.new do
      Thread.current.name = "compressor"
      8.times do
        before = thread_cpu_time
        Zlib::Deflate.deflate(data, Zlib::BEST_COMPRESSION)
        truth += thread_cpu_time - before
        sleep 0.02
      end
    end
    worker_thread.join
    w.stop
    stats = w.stats
    skip "no CPU timers in this build" unless stats[:cpu_timers_armed].positive?
    assert_operator stats[:captures], :>=, 5, stats.inspect
    profile = decode_profile(@recorder.serialize[2])
    mine = profile.samples.select { |s| s.labels["thread name"] == "compressor" }
    in_deflate = mine.select { |s| s.locations.any? { |f| f.function_name == "Zlib::Deflate.deflate" } }
    in_sleep = mine.select { |s| s.locations.first.function_name == "Kernel#sleep" }
    assert_in_delta truth * 1e9, in_deflate.sum { |s| s.values["cpu-time"] }, truth * 1e9 * 0.15
    assert_operator in_sleep.sum { |s| s.values["cpu-time"] }, :<, truth * 1e9 * 0.05, "not in Kernel#sleep"
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
    deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + 10
    sleep 0.01 until w.stats[:rounds_with_gvl_taken] >= 20 || Process.clock_gettime(Process::CLOCK_MONOTONIC) > deadline
    w.stop
    stats = w.stats
    assert_operator stats[:rounds_with_gvl_taken], :>=, 20, "the worker took the GVL itself: #{stats}"
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

  # Issue #15, item 16: a failed pthread call is never ignored (a wait that failed would
  # spin): sampling stops, the worker thread's failure names the call, the application
  # goes on.
  def test_a_failed_pthread_call_stops_sampling_with_the_call_named
    w = worker
    w.start
    Worker::Testing.fail_pthread_call
    deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + 5
    sleep 0.01 while w.running? && Process.clock_gettime(Process::CLOCK_MONOTONIC) < deadline
    refute w.running?
    assert_kind_of Errno::EINVAL, w.failure
    assert_match(/pthread_mutex_lock\(injected\)/, w.failure.message)
    w.stop
    w2 = worker
    w2.start
    assert w2.running?
  end

  def test_adaptive_rate_stretches_the_interval_to_meet_the_overhead_target
    w = worker(interval: 0.001, overhead_target: 0.0005)
    around_start = thread_cpu_time
    w.start
    wall_start = Process.clock_gettime(Process::CLOCK_MONOTONIC, :nanosecond)
    cpu_start = thread_cpu_time
    burn_cpu(0.5)
    used = thread_cpu_time - cpu_start
    w.stop
    used_around = thread_cpu_time - around_start
    wall = Process.clock_gettime(Process::CLOCK_MONOTONIC, :nanosecond) - wall_start
    stats = w.stats
    assert_operator stats[:effective_interval_ns], :>, 1_000_000 * 5, "stretched: #{stats}"
    assert_operator stats[:rounds], :<, 250, "far fewer than 500 rounds at 1 ms"
    # Values stay right: they are time deltas (only where they are attributed blurs).
    profile = decode_profile(@recorder.serialize[2])
    burner = profile.samples.find { |s| s.locations.any? { |f| f.function_name.end_with?("#burn_cpu") } }
    main_id = burner.labels["thread id"]
    main_cpu = profile.total("cpu-time") { |s| s.labels["thread id"] == main_id }
    # Exact, though the timers were replaced at each new period and rounds may take the
    # thread's CPU from its timer's expiry count.
    assert_profiled_between_burn_and_whole(main_cpu, used, used_around, stats[:sampling_ns_total])
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
      timers = w.stats.slice(:cpu_timers_live, :timer_signals, :cpu_samples_from_timers)
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
    assert_operator result[:timers][:cpu_samples_from_timers], :>=, 3, "and counts its expirations"
    assert_includes result[:names], "CollectorsCpuAndWallTimeWorkerTest#child_work"
    refute_includes result[:names], "CollectorsCpuAndWallTimeWorkerTest#parent_work"
    assert_operator result[:cpu], :>, 100_000_000
    # The parent keeps profiling, and keeps hearing its own timers: the child must not
    # switch off the perf events it inherited (they are the parent's).
    assert w.running?
    signals_before = w.stats[:timer_signals]
    parent_work
    assert_operator w.stats[:timer_signals] - signals_before, :>=, 5, "the parent's timer fires after the fork"
    assert_equal 0, w.stats[:threads_not_hearing_timers]
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
