# frozen_string_literal: true

require_relative "../test_helper"
require_relative "../support/native_workload"

# Where the time of native code goes, against what the program measures itself: C methods
# written for the test (test/support/native_workload) burn CPU or sleep with the GVL held
# or released, or call back into Ruby, between Ruby methods that burn CPU. Each method's
# wall and CPU time is measured around every call (CLOCK_MONOTONIC, the thread's CPU
# clock); the profile must give each method, and each C method's own frame, that time.
#
# Tolerances come from the sampling: a method that took T seconds is found by about T / I
# samples of interval I, each standing for I, so its estimate spreads by about
# sqrt(T * I); 3 of those, plus 2 intervals for the run's first and last stretches. I is
# the interval the run had on average (the adaptive rate stretches it on a loaded machine).
class NativeCodeTimeTest < Minitest::Test
  INTERVAL = 0.01

  # The methods, one per shape (their frames are what the profile is searched for).
  class Shapes
    def sleep_holding_gvl(seconds) = NativeWorkload.sleep_with_gvl(seconds)
    def busy_holding_gvl(seconds) = NativeWorkload.busy_with_gvl(seconds)
    def sleep_without_gvl(seconds) = NativeWorkload.sleep_without_gvl(seconds)
    def busy_without_gvl(seconds) = NativeWorkload.busy_without_gvl(seconds)

    def ruby_busy(seconds)
      deadline = Process.clock_gettime(Process::CLOCK_THREAD_CPUTIME_ID) + seconds
      x = 0
      x += 1 while Process.clock_gettime(Process::CLOCK_THREAD_CPUTIME_ID) < deadline
      x
    end

    # A C method holding the GVL that calls back into Ruby: its own CPU, then the block's.
    def busy_calling_back(seconds, block_truth)
      NativeWorkload.busy_with_gvl_yielding(seconds, seconds / 4) do
        started = Process.clock_gettime(Process::CLOCK_THREAD_CPUTIME_ID)
        ruby_busy(seconds / 8)
        block_truth[:cpu] += Process.clock_gettime(Process::CLOCK_THREAD_CPUTIME_ID) - started
      end
    end
  end

  def setup
    NativeWorkloadBuild.load
    @recorder = Contprof::StackRecorder.new
  end

  def tolerance(truth_seconds) = 3 * Math.sqrt(truth_seconds * @interval) + 2 * @interval

  # Runs `steps` (method name => seconds) in a loop for `seconds`, in random order of
  # random lengths within 0.5x to 1.5x; returns per method its wall and CPU seconds.
  def run_loop(steps, seconds:, extra: {})
    shapes = Shapes.new
    random = Random.new(7)
    truth = Hash.new { |hash, key| hash[key] = { wall: 0.0, cpu: 0.0 } }
    # (overhead_target 1: the interval stays INTERVAL where rounds are slow, a sanitized
    # build's; the exact stretches are those longer than 1.25 of it.)
    worker = Contprof::Collectors::CpuAndWallTimeWorker.new(recorder: @recorder, interval: INTERVAL, overhead_target: 1)
    worker.start
    started = Process.clock_gettime(Process::CLOCK_MONOTONIC)
    deadline = started + seconds
    while Process.clock_gettime(Process::CLOCK_MONOTONIC) < deadline
      steps.each do |name, length|
        length *= random.rand(0.5..1.5)
        wall_before = Process.clock_gettime(Process::CLOCK_MONOTONIC)
        cpu_before = Process.clock_gettime(Process::CLOCK_THREAD_CPUTIME_ID)
        shapes.public_send(name, length, *extra[name])
        truth[name][:cpu] += Process.clock_gettime(Process::CLOCK_THREAD_CPUTIME_ID) - cpu_before
        truth[name][:wall] += Process.clock_gettime(Process::CLOCK_MONOTONIC) - wall_before
      end
    end
    @stats = worker.stats
    @interval = [INTERVAL, (Process.clock_gettime(Process::CLOCK_MONOTONIC) - started) / [@stats[:wall_rounds], 1].max].max
    truth
  ensure
    worker&.stop
  end

  def profile = @profile ||= decode_profile(@recorder.serialize[2])

  def method_seconds(type, method, leaf: nil)
    name = "NativeCodeTimeTest::Shapes##{method}"
    profile.total(type) do |sample|
      names = sample.locations.map(&:function_name)
      names.include?(name) && (leaf.nil? || names.first == leaf)
    end / 1e9
  end

  def assert_seconds(truth, profiled, what)
    assert_in_delta truth, profiled, tolerance(truth),
                    "#{what}: profiled #{profiled.round(3)} s against #{truth.round(3)} s measured " \
                    "(tolerance #{tolerance(truth).round(3)} s at a mean interval of #{(@interval * 1000).round(1)} ms; worker #{@stats.slice(:wall_rounds, :cpu_rounds, :ticks_skipped, :wall_rounds_late)})"
  end

  # A method's measured `kind` of time (:wall, :cpu) against its profile, on its own frame
  # or, with `leaf`, on the frame of that C method under it.
  def assert_method_time(truth, method, kind, leaf: nil)
    assert_seconds truth[method][kind], method_seconds("#{kind}-time", method, leaf: leaf), "#{leaf || method} #{kind}"
  end

  # Native calls holding the GVL put rounds off until they return. The Ruby code that
  # follows each keeps its wall time (a round charging up to when it ran left it a quarter
  # to a half of it, the rest going to the next native call), and each native call has its
  # time on its own frame.
  def test_wall_and_cpu_of_native_code_holding_the_gvl
    truth = run_loop({ sleep_holding_gvl: 0.02, ruby_busy: 0.008, busy_holding_gvl: 0.012 }, seconds: 4)
    assert_method_time truth, :ruby_busy, :wall
    assert_method_time truth, :sleep_holding_gvl, :wall, leaf: "NativeWorkload.sleep_with_gvl"
    assert_method_time truth, :busy_holding_gvl, :wall, leaf: "NativeWorkload.busy_with_gvl"
    assert_method_time truth, :busy_holding_gvl, :cpu, leaf: "NativeWorkload.busy_with_gvl"
    assert_method_time truth, :ruby_busy, :cpu
    assert_operator method_seconds("cpu-time", :sleep_holding_gvl), :<, tolerance(truth[:sleep_holding_gvl][:cpu]),
                    "a sleep holding the GVL uses no CPU"
  end

  # Native code without the GVL: its wall time (asleep) and CPU (busy) on its own frame.
  def test_wall_and_cpu_of_native_code_without_the_gvl
    truth = run_loop({ sleep_without_gvl: 0.02, ruby_busy: 0.008, busy_without_gvl: 0.012 }, seconds: 4)
    assert_method_time truth, :sleep_without_gvl, :wall, leaf: "NativeWorkload.sleep_without_gvl"
    assert_method_time truth, :busy_without_gvl, :cpu, leaf: "NativeWorkload.busy_without_gvl"
    assert_method_time truth, :ruby_busy, :wall
    assert_method_time truth, :ruby_busy, :cpu
  end

  # Ruby 3.3+: a stretch off the GVL longer than the longest interval between wall ticks
  # (1.25 intervals) is timed by the thread events, from giving the GVL up to wanting it
  # back, not sampled: its wall time is exact, to the run's two edges (a tick each, and one
  # more for a tick late on a loaded machine) and what the program's own measure adds around
  # each call (0.5 ms allowed: once on a loaded machine the profile had 0.7 ms a call more
  # than the program measured, not understood yet). Sampled, the same calls spread by
  # sqrt(T * I) (0.15 s here): the bound below is about half of that.
  def test_long_stretches_off_the_gvl_are_timed_exactly
    skip "stretches off the GVL are timed where the VM has thread events (Ruby 3.3+)" unless VMBackend.public_thread_api?

    truth = run_loop({ sleep_without_gvl: 0.03, ruby_busy: 0.004 }, seconds: 3)
    measured = truth[:sleep_without_gvl][:wall]
    calls = (3 / 0.034).ceil
    bound = 3 * @interval + calls * 0.0005
    profiled = method_seconds("wall-time", :sleep_without_gvl, leaf: "NativeWorkload.sleep_without_gvl")
    assert_in_delta measured, profiled, bound,
                    "profiled #{profiled.round(4)} s against #{measured.round(4)} s measured (bound #{bound.round(4)} s; " \
                    "worker #{@stats.slice(:wall_rounds, :ticks_skipped, :wall_rounds_late)})"
    assert_method_time truth, :ruby_busy, :wall
  end

  # A thread blocked since before sampling started: only the time since its clocks
  # started is its (its stretch off the GVL began long before).
  def test_a_wait_begun_before_sampling_counts_from_the_start
    queue = Queue.new
    waiter = Thread.new { queue.pop }
    Thread.pass until waiter.status == "sleep"
    sleep 0.5
    worker = Contprof::Collectors::CpuAndWallTimeWorker.new(recorder: @recorder, interval: INTERVAL, overhead_target: 1)
    worker.start
    started = Process.clock_gettime(Process::CLOCK_MONOTONIC)
    sleep 0.3
    worker.stop
    sampled = Process.clock_gettime(Process::CLOCK_MONOTONIC) - started
    queue << nil
    waiter.join
    # (Minitest's own threads wait in Queue#pop too: the waiter is the one in this test's block.)
    waited = profile.total("wall-time") do |sample|
      names = sample.locations.map(&:function_name)
      names.first == "Thread::Queue#pop" && names.any? { |name| name.include?("test_a_wait_begun_before_sampling") }
    end / 1e9
    assert_operator waited, :<=, sampled + 2 * INTERVAL, "the waiting thread's wall time, against #{sampled.round(3)} s sampled"
    assert_operator waited, :>=, sampled - 3 * INTERVAL
  end

  # Short stretches off the GVL (a third of an interval) are seen by a tick only now and
  # then; one seen stands for those unseen (its length over its chance of being seen), so
  # their total stays unbiased, with the spread of sampling.
  def test_short_stretches_off_the_gvl_keep_their_share
    truth = run_loop({ sleep_without_gvl: 0.003, ruby_busy: 0.006 }, seconds: 4)
    assert_method_time truth, :sleep_without_gvl, :wall, leaf: "NativeWorkload.sleep_without_gvl"
    assert_method_time truth, :ruby_busy, :wall
  end

  # A C method holding the GVL that calls back into Ruby: its own CPU stays on its frame,
  # the block's goes to the block.
  def test_native_code_calling_back_into_ruby
    unless Contprof::Native.vm_backend == "frame_layout"
      skip "the CPU of a C method goes to its frame when it calls back into Ruby only where stacks are read " \
           "from the VM's frames and the VM fences their writes (Ruby 3.3+): here it goes to the block"
    end
    block_truth = { cpu: 0.0 }
    truth = run_loop({ busy_calling_back: 0.02, ruby_busy: 0.008 }, seconds: 4,
                     extra: { busy_calling_back: [block_truth] })
    own = truth[:busy_calling_back][:cpu] - block_truth[:cpu]
    assert_seconds own, method_seconds("cpu-time", :busy_calling_back, leaf: "NativeWorkload.busy_with_gvl_yielding"),
                   "busy_with_gvl_yielding's own CPU"
    # It held the GVL: running, not in native code without it.
    states = profile.samples.select { |sample| sample.locations.first.function_name == "NativeWorkload.busy_with_gvl_yielding" }
                    .map { |sample| sample.labels["thread state"] }.uniq
    assert_equal ["running"], states
    in_block = profile.total("cpu-time") do |sample|
      names = sample.locations.map(&:function_name)
      names.include?("NativeWorkload.busy_with_gvl_yielding") && names.include?("NativeCodeTimeTest::Shapes#ruby_busy")
    end / 1e9
    assert_seconds block_truth[:cpu], in_block, "the block's CPU"
  end
end
