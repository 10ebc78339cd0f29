# frozen_string_literal: true

require_relative "../test_helper"
require "zlib"
require "tmpdir"
require "fileutils"
require "contprof/reports/report"

# Known answers for "thread state", "Waiting for GVL" and the timeline: the program measures
# its own truth (when each thread ran, slept or waited) and the profile must agree.
class ThreadStatesTest < Minitest::Test
  include CpuHelpers

  STATE = "thread state"
  INTERVAL = 0.01
  TIMELINE_TICK_NS = 1 << 20 # ext/contprof/pprof/pprof_profile.h

  def setup
    skip Contprof.unsupported_reason unless Contprof.supported?
  end

  def monotonic
    Process.clock_gettime(Process::CLOCK_MONOTONIC)
  end

  # Wall time per thread name, split by whether the leaf is "Waiting for GVL".
  def gvl_shares(profile)
    totals = Hash.new { |h, k| h[k] = { gvl: 0, all: 0 } }
    profile.samples.each do |sample|
      name = sample.labels["thread name"] or next
      wall = sample.values["wall-time"]
      totals[name][:all] += wall
      next unless sample.locations.first&.function_name == "Waiting for GVL"

      totals[name][:gvl] += wall
      assert_equal "waiting for gvl", sample.labels[STATE]
    end
    totals
  end

  # N threads running Ruby code share the GVL: each waits about (N-1)/N of its time. Only
  # the thread holding the GVL runs Ruby code, so the spinners log each handover (a thread
  # whose iteration follows another's): a thread holds the GVL from its first iteration
  # after a handover to the next handover, and waits the rest of its time, from its first
  # iteration on. (Gaps in a thread's own iterations are no measure: on a loaded machine
  # the kernel also preempts the thread holding the GVL.) The profile's is its samples in
  # that loop (spin_for).
  def gvl_contention(threads)
    handovers = [] # [spinner, when it took over]
    spans = {}
    lock = Mutex.new
    # overhead_target 1: the interval stays INTERVAL even where rounds are slow (a sanitized
    # build), so that the sampled (3.1) tolerance counts the samples there are.
    profile = Contprof.profile(interval: INTERVAL, overhead_target: 1, allocation: false) do
      start_line = Queue.new
      workers = Array.new(threads) do |i|
        Thread.new do
          Thread.current.name = "spinner-#{i}"
          start_line.pop
          span = spin_for(2.0, "spinner-#{i}", handovers)
          lock.synchronize { spans["spinner-#{i}"] = span }
        end
      end
      sleep 0.05
      threads.times { start_line << true }
      workers.each(&:join)
    end.decode
    truth = gvl_waits_from_handovers(handovers, spans)
    shares = Hash.new { |h, k| h[k] = Hash.new(0) }
    profile.samples.each do |sample|
      next unless sample.locations.any? { |f| f.function_name.end_with?("#spin_for") }

      name = sample.labels["thread name"]
      shares[name][:all] += sample.values["wall-time"]
      if sample.locations.first.function_name == "Waiting for GVL"
        shares[name][:gvl] += sample.values["wall-time"]
        assert_equal "waiting for gvl", sample.labels[STATE]
      else
        shares[name][sample.labels[STATE]] += sample.values["wall-time"]
      end
    end
    # The rest is running Ruby code (on 3.3+ a thread between giving the GVL up and asking
    # for it again is briefly "native").
    shares.each do |name, share|
      assert_operator share["running"], :>=, 0.9 * (share[:all] - share[:gvl]), "#{name}: #{share}"
    end
    truth.each do |name, expected|
      yield name, shares[name][:gvl].fdiv(shares[name][:all]), expected
    end
  end

  # Runs Ruby code for `seconds`, noting in `handovers` each time it takes over from
  # another thread; returns its first and last iteration's times. (No interrupt check comes
  # between the test of the last handover and the append with the clock read in it: the
  # GVL cannot change hands there, so the log is in the order of its times.)
  def spin_for(seconds, name, handovers)
    clock = Process::CLOCK_MONOTONIC
    began = now = Process.clock_gettime(clock)
    loop do
      handovers << [name, Process.clock_gettime(clock)] unless handovers.last&.first == name
      now = Process.clock_gettime(clock)
      break if now - began >= seconds
    end
    [began, now]
  end

  # Each spinner's share of its time (first to last iteration) not holding the GVL.
  def gvl_waits_from_handovers(handovers, spans)
    held = Hash.new(0.0)
    # A spinner that has finished holds the GVL no longer than its last iteration (the next
    # handover can come much later: its thread exits, the profiler's thread runs).
    handovers.each_cons(2) { |(name, from), (_, to)| held[name] += [to, spans[name][1]].min - from }
    last_name, last_from = handovers.last
    held[last_name] += spans[last_name][1] - last_from
    spans.to_h { |name, (first, last)| [name, 1.0 - held[name] / (last - first)] }
  end

  [2, 4, 8].each do |threads|
    define_method(:"test_gvl_waits_of_#{threads}_threads_sharing_the_gvl") do
      # (A timing comparison, as the accuracy tests the sanitized run leaves out: under
      # AddressSanitizer it failed 2 CI runs in 3 on 2026-12-08, every spinner measured at
      # 0.75 whatever its truth; not yet understood, see the issue notes.)
      skip "timings under AddressSanitizer are not what this test measures" if ENV["CONTPROF_SANITIZED"]
      misses = []
      found = []
      gvl_contention(threads) do |name, measured, expected|
        # Its own wait, measured (3.3+): 3 points, the issue's bar; or sampled (3.1): about
        # 2 s / INTERVAL samples, each finding it waiting or not: 3 standard errors of that
        # proportion.
        # (A proportion is taken as at least one sample from 0 or 1: a spinner that happened to
        # run alone still has a standard error.)
        samples = 2.0 / INTERVAL
        proportion = expected.clamp(1 / samples, 1 - 1 / samples)
        tolerance = VMBackend.public_thread_api? ? 0.03 : 3 * Math.sqrt(proportion * (1 - proportion) / samples)
        line = format("%s: %.3f measured, %.3f true", name, measured, expected)
        found << line
        misses << line if (measured - expected).abs > tolerance
      end
      assert_empty misses, found.join("; ")
      assert_equal threads, found.size
    end
  end

  # A thread per state, each in it for its whole life: most of its wall time carries that
  # state. (Running Ruby code is the GVL tests': their spinners' time not waiting for it.)
  def test_every_thread_state_is_named_right
    reader, writer = IO.pipe
    queue = Queue.new
    mutex = Mutex.new
    ready = Queue.new
    data = Random.new(1).bytes(4 << 20)
    threads = nil
    profile = Contprof.profile(interval: INTERVAL, allocation: false) do
      mutex.lock
      threads = {
        "sleeping" => Thread.new { ready << 1; sleep 1.2 },
        "io" => Thread.new { ready << 1; reader.read(1) },
        "waiting-queue" => Thread.new { ready << 1; queue.pop },
        "waiting-mutex" => Thread.new { ready << 1; mutex.synchronize { nil } },
        "native" => Thread.new do
          ready << 1
          deadline = monotonic + 1.2
          Zlib::Deflate.deflate(data, Zlib::BEST_COMPRESSION) while monotonic < deadline
        end,
      }
      threads.each { |name, thread| thread.name = name }
      threads.size.times { ready.pop }
      sleep 1.2
      writer.write("x")
      queue << 1
      mutex.unlock
      threads.each_value(&:join)
    end.decode
    expected = {
      "sleeping" => "sleeping", "io" => "io", "waiting-queue" => "waiting", "waiting-mutex" => "waiting",
      "native" => "native"
    }
    by_state = Hash.new { |h, k| h[k] = Hash.new(0) }
    profile.samples.each do |sample|
      name = sample.labels["thread name"]
      next unless expected.key?(name)

      refute_nil sample.labels[STATE], "#{name}: every sample has a state"
      by_state[name][sample.labels[STATE]] += sample.values["wall-time"]
    end
    # The flame graph's "exclude idle waits" goes by the state.
    idle_frames = Contprof::Report.idle_frames(profile)
    profile.samples.each_with_index do |sample, i|
      next unless %w[sleeping io waiting native].include?(sample.labels[STATE])

      assert_equal sample.labels[STATE] != "native", Contprof::Report.idle_sample?(profile, i, idle_frames), sample.labels
    end
    expected.each do |name, state|
      total = by_state[name].values.sum
      # The zlib thread holds the GVL between calls and for some of each call's work (3.4:
      # up to a fifth of its time), and may wait for it then.
      others = name == "native" ? by_state[name]["waiting for gvl"] + by_state[name]["running"] : 0
      share = (by_state[name][state] + others).fdiv(total)
      assert_operator share, :>=, 0.9, "#{name}: #{by_state[name]}"
      assert_operator by_state[name][state].fdiv(total), :>=, 0.5, "#{name}: #{by_state[name]}"
    end
  ensure
    [reader, writer].each { |io| io&.close }
  end

  # A slow request among fast ones: the timeline puts its sleep where the program saw it.
  def test_the_timeline_finds_a_slow_request_at_the_right_moment
    slow = nil
    requests = []
    profile = Contprof.profile(interval: INTERVAL, allocation: false, timeline: true) do
      40.times do |i|
        began = Process.clock_gettime(Process::CLOCK_REALTIME, :nanosecond)
        if i == 25
          slow_request
          slow = [began, Process.clock_gettime(Process::CLOCK_REALTIME, :nanosecond)]
        else
          fast_request
        end
        requests << began
      end
    end.decode
    interval_ns = (INTERVAL * 1e9).to_i
    sleeping = profile.samples.select { |s| s.locations.any? { |f| f.function_name.end_with?("#slow_request") } }
    refute_empty sleeping
    assert(sleeping.all? { |s| s.labels["end_timestamp_ns"].is_a?(Integer) })
    first_start = sleeping.map { |s| s.labels["end_timestamp_ns"] - s.values["wall-time"] }.min
    last_end = sleeping.map { |s| s.labels["end_timestamp_ns"] }.max
    # Timeline times go out on a grid of 2^20 ns (PPROF_TIMELINE_TICK_NS): a start, an end
    # less a wall time, may be two ticks off besides the sampling's interval (and jitter).
    tolerance = interval_ns + 2_000_000 + 2 * TIMELINE_TICK_NS
    assert_in_delta slow[0], first_start, tolerance, "the slow request's start"
    assert_in_delta slow[1], last_end, tolerance, "the slow request's end"
    asleep = sleeping.select { |s| s.labels[STATE] == "sleeping" }.sum { |s| s.values["wall-time"] }
    assert_in_delta 300_000_000, asleep, 2 * interval_ns

    # The thread's records tile its time: each starts where the previous ended, to within
    # a tick. (Where stretches off the GVL are timed, 3.3+, the record of
    # the code that runs after one reaches back over the tick's interval, which is what a
    # tick in running code stands for: up to the longest interval, 1.25 of the mean.)
    main = profile.samples.select { |s| s.labels["thread id"] == sleeping.first.labels["thread id"] && s.values["wall-time"] > 0 }
    # (Sorted by end, then start: a timed stretch and the record after it may end on the
    # same tick of the timeline's grid.)
    spans = main.map { |s| [s.labels["end_timestamp_ns"] - s.values["wall-time"], s.labels["end_timestamp_ns"]] }
                .sort_by { |start, finish| [finish, start] }
    spans.each_cons(2) do |(_, previous_end), (start, finish)|
      assert_operator finish, :>=, previous_end
      assert_in_delta previous_end, start, 1.25 * interval_ns + 2 * TIMELINE_TICK_NS,
                      "records tile the thread's time: #{spans.map { |a, b| [a - spans[0][0], b - spans[0][0]] }}"
    end
  end

  # `contprof report --from/--to` on a timeline: the samples of that stretch, each for the
  # part of it inside the range.
  def test_a_time_range_keeps_the_timeline_samples_in_it
    require "contprof/reports/profiles"
    dir = Dir.mktmpdir("contprof-timeline")
    slow = nil
    exported = Contprof.profile(interval: INTERVAL, allocation: false, timeline: true, output: dir) do
      5.times { fast_request }
      slow = [Time.now]
      slow_request
      slow << Time.now
      5.times { fast_request }
    end
    from = slow[0] + 0.05
    to = slow[1] - 0.05
    ranged = Contprof::Report::Profiles.load(exported.paths, from: from, to: to)
    main = ranged.samples.select { |s| s.locations.any? { |f| f.function_name.end_with?("#slow_request") } }
    expected = ((to - from) * 1e9).round
    assert_in_delta expected, main.sum { |s| s.values["wall-time"] }, 2_000_000
    thread = main.first.labels["thread id"]
    assert_in_delta expected, ranged.samples.select { |s| s.labels["thread id"] == thread }.sum { |s| s.values["wall-time"] },
                    2_000_000, "nothing else of that thread"
  ensure
    FileUtils.rm_rf(dir) if dir
  end

  # speedscope's evented profile of that thread: balanced, in time order, and the slow
  # request open for its 300 ms.
  def test_speedscope_draws_the_timeline_of_each_thread
    require "contprof/reports/speedscope"
    profile = Contprof.profile(interval: INTERVAL, allocation: false, timeline: true) do
      5.times { fast_request }
      slow_request
      5.times { fast_request }
    end.decode
    document = Contprof::Speedscope.document(profile)
    evented = document["profiles"].select { |p| p["type"] == "evented" }
    refute_empty evented
    frames = document["shared"]["frames"]
    evented.each do |timeline|
      open = []
      timeline["events"].each_cons(2) { |a, b| assert_operator a["at"], :<=, b["at"] }
      slow = []
      timeline["events"].each do |event|
        if event["type"] == "O"
          open << event["frame"]
        else
          assert_equal open.pop, event["frame"], "events close what they opened, innermost first"
        end
        slow << event["at"] if frames[event["frame"]]["name"].end_with?("#slow_request")
      end
      assert_empty open
      next if slow.empty?

      assert_equal 2, slow.size, "the slow request is one stretch"
      assert_in_delta 300_000_000, slow[1] - slow[0], 2 * INTERVAL * 1e9
    end
  end

  def slow_request
    sleep 0.3
  end

  def fast_request
    burn_cpu(0.01)
  end

  # Without the timeline (timeline: false; it is on by default), equal stacks merge and
  # nothing carries a timestamp.
  def test_no_timestamps_without_the_timeline
    profile = Contprof.profile(interval: INTERVAL, allocation: false, timeline: false) { 10.times { fast_request; sleep 0.01 } }.decode
    assert(profile.samples.none? { |s| s.labels.key?("end_timestamp_ns") })
    assert(profile.samples.all? { |s| s.labels.key?(STATE) || s.locations.first.function_name.include?("Garbage") })
  end
end
