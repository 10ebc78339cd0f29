# frozen_string_literal: true

require_relative "../test_helper"
require "json"
require "open3"
require "tmpdir"
require "fileutils"

# Known answers under M:N threads (RUBY_MN_THREADS=1, Ruby 3.3+), where Ruby threads share
# native threads and a native thread's CPU clock counts all of them. The variable is read
# when Ruby boots, so the program runs in a process of its own; it measures its own truth.
class MnThreadsTest < Minitest::Test
  THREADS = 4
  SECONDS = 3

  # Four threads each burn CPU in burn_a (2 ms of work) and burn_b (1 ms). Under M:N no clock
  # tells a Ruby thread's own CPU (the native thread's counts every thread it ran, and the
  # scheduler switches threads inside a call), so the work is counted instead: the same
  # loop, twice as many turns in burn_a, and each thread's share is its share of the turns.
  # The total is the process's CPU clock.
  PROGRAM = <<~RUBY
    require "contprof"
    require "json"
    def process_cpu = Process.clock_gettime(Process::CLOCK_PROCESS_CPUTIME_ID)
    def monotonic = Process.clock_gettime(Process::CLOCK_MONOTONIC)
    def work(turns)
      i = 0
      i += 1 while i < turns
      turns
    end
    began = process_cpu
    work(2_000_000)
    TURNS_PER_MS = (2_000_000 / ((process_cpu - began) * 1000)).to_i
    def burn_a = work(2 * TURNS_PER_MS)
    def burn_b = work(TURNS_PER_MS)

    recorder = Contprof::StackRecorder.new
    worker = Contprof::Collectors::CpuAndWallTimeWorker.new(recorder: recorder)
    worker.start
    cpu_before = process_cpu
    truth = Hash.new(0.0)
    lifetimes = {}
    turns_by_thread = {}
    start_waits = {}
    lock = Mutex.new
    start_line = Queue.new
    threads = Array.new(#{THREADS}) do |i|
      born = monotonic # (a thread may wait for the GVL before its first line runs)
      Thread.new do
        Thread.current.name = "burner-\#{i}"
        released = start_line.pop
        began = monotonic
        mine = Hash.new(0.0)
        while monotonic - began < #{SECONDS}
          mine["burn_a"] += burn_a
          mine["burn_b"] += burn_b
        end
        lock.synchronize do
          mine.each { |name, turns| truth[name] += turns }
          turns_by_thread["burner-\#{i}"] = mine.values.sum
          lifetimes["burner-\#{i}"] = monotonic - born
          start_waits["burner-\#{i}"] = released - born # (asleep: the GVL waits begin there)
        end
      end
    end
    sleep 0.05
    released = monotonic
    #{THREADS}.times { start_line << released }
    threads.each(&:join)
    worker.stop
    process_used = process_cpu - cpu_before
    File.binwrite(ARGV[0], recorder.serialize[2])
    stats = worker.stats
    puts JSON.generate(truth: truth, turns_by_thread: turns_by_thread, lifetimes: lifetimes, start_waits: start_waits, process_cpu: process_used,
                       stats: stats.slice(:mn_threads_requested, :threads_sharing_native, :clock_cpu_ns, :sampling_ns_total,
                                          :cpu_timers_live, :perf_events_armed, :posix_timers_armed))
  RUBY

  def setup
    skip "M:N threads are Ruby 3.3+'s" if RUBY_VERSION < "3.3"
    skip Contprof.unsupported_reason unless Contprof.supported?
    skip "runs the program under the public-API backend" unless VMBackend.public_thread_api?
  end

  def run_program(environment)
    dir = Dir.mktmpdir("contprof-mn")
    path = File.join(dir, "profile.pprof")
    out, err, status = Open3.capture3(environment, RbConfig.ruby, "-I#{File.expand_path("../../lib", __dir__)}", "-e", PROGRAM, path)
    assert status.success?, err
    [decode_profile(File.binread(path)), JSON.parse(out.lines.last)]
  ensure
    FileUtils.rm_rf(dir) if dir
  end

  def burner_cpu(profile)
    profile.samples.group_by { |sample| sample.labels["thread name"] }.select { |name, _| name&.start_with?("burner-") }
           .transform_values { |samples| samples.sum { |sample| sample.values["cpu-time"] } }
  end

  # The CPU each burner used is its own, not its native thread's: the burners' total is the
  # process's CPU (less the profiler's clock thread, which no profile shows) within 2%;
  # each burner's and each method's share of it is its share of the work, within 3
  # standard errors of the CPU samples behind it (CPU is charged at wall samples: an M:N
  # thread has no CPU timer). Wall time and GVL waits (timed by the thread hooks, not
  # sampled) are each burner's lifetime, and that less its CPU and its wait to start.
  def test_cpu_wall_and_gvl_waits_per_ruby_thread_under_mn_threads
    profile, result = run_program("RUBY_MN_THREADS" => "1")
    stats = result["stats"]
    assert_equal true, stats["mn_threads_requested"]
    assert_operator stats["threads_sharing_native"], :>=, 2, "the burners were seen sharing native threads: #{stats}"
    by_thread = burner_cpu(profile)
    assert_equal THREADS, by_thread.size, by_thread.inspect
    profiled = by_thread.values.sum / 1e9
    used = result["process_cpu"] - stats["clock_cpu_ns"] / 1e9
    assert_in_delta used, profiled, used * 0.02, "burners' CPU: profile #{profiled.round(3)} s, process #{used.round(3)} s (#{stats})"

    samples = profile.total("cpu-samples") { |sample| sample.labels["thread name"]&.start_with?("burner-") }
    within_three_errors = lambda do |expected, actual, message|
      assert_in_delta expected, actual, 3 * Math.sqrt(expected * (1 - expected) / samples), "#{message} (#{samples} CPU samples)"
    end
    turns = result["turns_by_thread"]
    all_turns = turns.values.sum.to_f
    by_thread.each do |name, cpu|
      within_three_errors.(turns[name] / all_turns, cpu / 1e9 / profiled, "#{name}'s share (#{by_thread}, turns #{turns})")
    end
    truth = result["truth"]
    on_stack = ->(name) { profile.total("cpu-time") { |s| s.locations.any? { |l| l.function_name == "Object##{name}" } } }
    a = on_stack.("burn_a")
    b = on_stack.("burn_b")
    within_three_errors.(truth["burn_a"] / all_turns, a.fdiv(a + b), "burn_a's share (turns #{truth})")

    per_thread = lambda do |selected|
      selected.group_by { |sample| sample.labels["thread name"] }
              .transform_values { |list| list.sum { |sample| sample.values["wall-time"] } / 1e9 }
    end
    walls = per_thread.(profile.samples)
    waits = per_thread.(profile.samples.select { |sample| sample.locations.first&.function_name == "Waiting for GVL" })
    result["lifetimes"].each do |name, lifetime|
      assert_in_delta lifetime, walls[name], lifetime * 0.02 + 0.03, "#{name}'s wall time"
      waited = lifetime - result["start_waits"][name] - turns[name] / all_turns * used
      assert_in_delta waited, waits[name], lifetime * 0.03 + 0.03, "#{name}'s GVL waits (#{waits})"
    end
  end

  # Without M:N no thread is ever taken for one sharing a native thread (glibc hands a
  # finished thread's pthread to the next one: an entry outliving its thread would do it),
  # so every thread keeps its CPU timer and the clock never signals.
  def test_one_to_one_threads_are_never_taken_for_sharing
    program = <<~RUBY
      require "contprof"
      require "json"
      recorder = Contprof::StackRecorder.new
      worker = Contprof::Collectors::CpuAndWallTimeWorker.new(recorder: recorder)
      worker.start
      20.times { Array.new(10) { Thread.new { 2_000.times { } ; Thread.pass; sleep 0.001 } }.each(&:join) }
      worker.stop
      puts JSON.generate(worker.stats.slice(:mn_threads_requested, :threads_sharing_native, :wall_round_signals))
    RUBY
    out, err, status = Open3.capture3({ "RUBY_MN_THREADS" => nil }, RbConfig.ruby, "-I#{File.expand_path("../../lib", __dir__)}", "-e", program)
    assert status.success?, err
    assert_equal({ "mn_threads_requested" => false, "threads_sharing_native" => 0, "wall_round_signals" => 0 }, JSON.parse(out.lines.last))
  end

  # What cannot be exact under M:N is said, in the profiler's gaps (logged, and in stats).
  def test_the_profiler_says_what_mn_threads_change
    dir = Dir.mktmpdir("contprof-mn-gaps")
    program = <<~RUBY
      require "contprof"
      require "json"
      Contprof.start(output: #{dir.inspect}, log_level: "error")
      2.times.map { Thread.new { 200.times { 10_000.times { } ; Thread.pass } } }.each(&:join)
      puts JSON.generate(Contprof::Profiler.running.stats[:not_profiled])
      Contprof.stop
    RUBY
    out, err, status = Open3.capture3({ "RUBY_MN_THREADS" => "1" }, RbConfig.ruby, "-I#{File.expand_path("../../lib", __dir__)}", "-e", program)
    assert status.success?, err
    gaps = JSON.parse(out.lines.last)
    assert_match(/shared native threads \(M:N threads/, gaps["mn_threads"].to_s, gaps.inspect)
  ensure
    FileUtils.rm_rf(dir) if dir
  end
end
