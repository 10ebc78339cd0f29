# frozen_string_literal: true

require_relative "../test_helper"
require "open3"
require "tmpdir"

# The wall clock parks while every thread waits off the GVL in a stretch a tick has found
# (Ruby 3.3+: sampling/wall_clock.c, "Parking"): an idle process costs no wakeups, and the
# profile still has every thread's time, against what the program measures itself.
class ClockParkingTest < Minitest::Test
  INTERVAL = 0.01

  def setup
    skip Contprof.unsupported_reason unless Contprof.supported?
    @recorder = Contprof::StackRecorder.new
    # (overhead_target 1: the interval stays INTERVAL where rounds are slow, a sanitized build's.)
    @worker = Contprof::Collectors::CpuAndWallTimeWorker.new(recorder: @recorder, interval: INTERVAL, overhead_target: 1,
                                                               allocation_interval: nil)
  end

  def teardown
    @worker&.stop
  end

  def monotonic = Process.clock_gettime(Process::CLOCK_MONOTONIC)

  # Wall seconds per thread name (of the threads named here).
  def wall_by_thread(bytes)
    totals = Hash.new(0.0)
    decode_profile(bytes).samples.each do |sample|
      name = sample.labels["thread name"]
      totals[name] += sample.values["wall-time"] / 1e9 if name
    end
    totals
  end

  # A process whose threads all sleep for a second: on 3.3+ a few ticks find them asleep and
  # the clock parks until they wake (on 3.1, which has no thread events, it ticks on).
  def test_an_idle_process_parks_the_clock
    @worker.start
    sleeper = Thread.new { sleep 1.0 }
    sleep 1.0
    sleeper.join
    stats = @worker.stats
    unless VMBackend.public_thread_api?
      assert_equal 0, stats[:clock_parks], "no thread events, no parking (#{stats.slice(:clock_wakeups, :clock_parks)})"
      return
    end
    # Ticks until every thread is in a stretch a tick found, four more, and one or two when
    # the threads wake (more where a slow round has ticks skipped): a quarter of the 100
    # that would tick unparked at most.
    assert_operator stats[:clock_wakeups], :<=, 25, stats.slice(:clock_wakeups, :clock_parks, :clock_parked_ns).to_s
    assert_operator stats[:clock_parks], :>=, 1
    assert_operator stats[:clock_parked_ns], :>=, 0.8e9
  end

  # Threads that sleep and wake again and again (the clock parks and unparks each time):
  # each thread's wall time in the profile is its life as the thread measures it. Sleeps
  # are timed exactly; the short running stretches between them are sampled, unbiased only
  # if the ticks after each park fall as if the clock had never stopped (a tick after a
  # park that counted from before it gave each thread 10-20% too much).
  def test_threads_waking_from_parks_keep_their_wall_time
    truth = {}
    lock = Mutex.new
    @worker.start
    threads = Array.new(3) do |i|
      Thread.new do
        Thread.current.name = "sleeper-#{i}"
        started = monotonic
        8.times do
          sleep 0.08 + 0.03 * i
          x = 0
          20_000.times { x += 1 }
        end
        lock.synchronize { truth["sleeper-#{i}"] = monotonic - started }
      end
    end
    threads.each(&:join)
    stats = @worker.stats
    @worker.stop
    profiled = wall_by_thread(@recorder.serialize[2])
    # Each thread: its start and end (a tick each) and 8 short runs sampled (each at most
    # one interval off, independently: 3 sqrt(8) intervals at worst).
    tolerance = (2 + 3 * Math.sqrt(8)) * INTERVAL
    truth.each do |name, seconds|
      assert_in_delta seconds, profiled[name], tolerance,
                      "#{name}: profiled #{profiled[name].round(3)} s, lived #{seconds.round(3)} s " \
                      "(#{stats.slice(:clock_wakeups, :clock_parks, :wall_rounds)})"
    end
    assert_operator stats[:clock_parks], :>=, 8, stats.slice(:clock_wakeups, :clock_parks).to_s if VMBackend.public_thread_api?
  end

  def nap(seconds) = sleep(seconds)

  # 1000 Hz, a thread that sleeps 4 ms at a time with only a moment of Ruby between: the
  # clock parks during each sleep and the waking thread unparks it, so the clock often
  # ticks while that thread still runs, and the round asked of it then waits for its next
  # interrupt check, after its next sleep. Those rounds are asked again at the next tick
  # (else every tick until then was skipped, and that sleep, seen by none, lost: runs of
  # the per-method benchmark lost 3-6% of their sleeps; this test, 80% in one run of three).
  # Sleeps of 4 ms are timed exactly (longer than 1.25 intervals), but for a round the
  # waking thread runs itself when the worker is late to take the GVL (its sleep is then
  # sampled): within 3% and the run's two edges.
  def test_sleeps_between_parks_are_all_seen
    skip "stretches off the GVL are timed where the VM has thread events (Ruby 3.3+)" unless VMBackend.public_thread_api?

    worker = Contprof::Collectors::CpuAndWallTimeWorker.new(recorder: @recorder, interval: 0.001, overhead_target: 1)
    worker.start
    measured = 0.0
    calls = 300
    calls.times do
      before = monotonic
      nap(0.004)
      measured += monotonic - before
    end
    stats = worker.stats
    worker.stop
    profiled = decode_profile(@recorder.serialize[2]).total("wall-time") do |sample|
      sample.locations.any? { |frame| frame.function_name == "ClockParkingTest#nap" }
    end / 1e9
    assert_in_delta measured, profiled, 0.002 + 0.03 * measured,
                    "profiled #{profiled.round(4)} s of #{measured.round(4)} s asleep " \
                    "(#{stats.slice(:clock_parks, :holder_rounds_taken_over, :ticks_skipped)})"
  end

  # Threads blocked since before Contprof was loaded (no hook saw them give the GVL up):
  # their waits are stretches from the moment it was, so the clock parks with them too, and
  # each has its whole wait since the start in the profile. (A separate process: this one
  # loaded Contprof long ago.)
  def test_threads_blocked_before_contprof_was_loaded
    program = <<~RUBY
      queue = Queue.new
      waiters = Array.new(4) { |i| Thread.new { Thread.current.name = "waiter-\#{i}"; queue.pop } }
      sleep 0.1
      require "contprof"
      recorder = Contprof::StackRecorder.new
      worker = Contprof::Collectors::CpuAndWallTimeWorker.new(recorder: recorder, interval: #{INTERVAL}, overhead_target: 1)
      started = Process.clock_gettime(Process::CLOCK_MONOTONIC)
      worker.start
      sleep 1.0
      stats = worker.stats
      worker.stop
      stopped = Process.clock_gettime(Process::CLOCK_MONOTONIC)
      $stdout.write(Marshal.dump([recorder.serialize[2], stats.slice(:clock_wakeups, :clock_parks), stopped - started]))
      4.times { queue << nil }
      waiters.each(&:join)
    RUBY
    out, err, status = Open3.capture3(RbConfig.ruby, "-I#{File.expand_path("../../lib", __dir__)}", "-e", program, binmode: true)
    assert status.success?, err
    bytes, stats, lasted = Marshal.load(out) # rubocop:disable Security/MarshalLoad
    profiled = wall_by_thread(bytes)
    4.times do |i|
      assert_in_delta lasted, profiled["waiter-#{i}"], 2 * INTERVAL, "waiter-#{i} (#{stats}): #{profiled}"
    end
    assert_operator stats[:clock_wakeups], :<=, 25, stats.to_s if VMBackend.public_thread_api?
  end

  # Flushes while the clock is parked (Profiler#flush): the profile has the wait so far of
  # a thread blocked since before the park, not only the few ticks before it; and the next
  # profile has the rest, though the wait ends before any tick comes (its record in the
  # flushed profile can take no more: the flush gives it one in the next).
  def test_flushes_while_parked_split_a_wait_between_profiles
    Dir.mktmpdir do |dir|
      profiler = Contprof.start(output: dir, interval: INTERVAL, overhead_target: 1, log_level: "error")
      times = {}
      sleeper = Thread.new do
        Thread.current.name = "sleeper"
        times[:started] = monotonic
        sleep 1.5
        times[:ended] = monotonic
      end
      sleep 1.0
      flushed_at = monotonic
      first = wall_by_thread(profiler.flush.pprof)
      sleeper.join
      sleep 0.1
      stats = profiler.stats[:worker]
      last = wall_by_thread(Contprof.stop.pprof)
      # (Each within three intervals: its first tick, the flush's own few milliseconds.)
      assert_in_delta flushed_at - times[:started], first["sleeper"], 3 * INTERVAL,
                      "the first profile: #{first} (#{stats.slice(:clock_wakeups, :clock_parks)})"
      assert_in_delta times[:ended] - flushed_at, last["sleeper"], 3 * INTERVAL,
                      "the last profile: #{last} (#{stats.slice(:clock_wakeups, :clock_parks)})"
    end
  ensure
    Contprof.stop
  end
end
