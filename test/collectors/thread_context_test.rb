# frozen_string_literal: true

require_relative "../test_helper"

# ThreadContext (the seed's CpuAndWallTime) driven by hand: each #sample records, per thread, the time elapsed since
# that thread's previous sample.
class CollectorsThreadContextTest < Minitest::Test
  Testing = Contprof::Collectors::ThreadContext::Testing

  def test_the_seeds_name_is_the_same_class
    assert_same Contprof::Collectors::ThreadContext, Contprof::Collectors::CpuAndWallTime
  end

  def setup
    @recorder = Contprof::StackRecorder.new
    @collector = Contprof::Collectors::ThreadContext.new(recorder: @recorder)
    @threads = []
  end

  def teardown
    @threads.each(&:kill).each(&:join)
  end

  def worker_step(name)
    commands = Queue.new
    results = Queue.new
    thread = Thread.new do
      Thread.current.name = name
      while (command = commands.pop)
        results << command.call
      end
    end
    @threads << thread
    [thread, ->(work) { commands << work; results.pop }]
  end

  def samples_for(profile, thread_name)
    profile.samples.select { |s| s.labels["thread name"] == thread_name }
  end

  def test_first_sample_starts_the_clocks_then_samples_record_deltas
    thread, run = worker_step("burner")
    run.(-> { :ready })
    @collector.sample
    assert_empty decode_profile(@recorder.serialize[2]).samples, "the first sample only starts the clocks"
    context = Testing.per_thread_context(@collector)
    assert context.key?(thread)
    assert context[thread][:clocks_started]

    burned = run.(lambda {
      start = thread_cpu_time
      burn_cpu(0.05)
      thread_cpu_time - start
    })
    wall_start = Process.clock_gettime(Process::CLOCK_MONOTONIC, :nanosecond)
    @collector.sample
    profile = decode_profile(@recorder.serialize[2])
    # (On a loaded machine the thread may also have waited for the GVL on its way back to its
    # queue: that wait is a record of its own, in state "waiting for gvl", seen twice in CI.)
    burner = samples_for(profile, "burner").reject { |s| s.labels["thread state"] == "waiting for gvl" }
    assert_equal 1, burner.size, samples_for(profile, "burner").map { |s| [s.labels, s.values] }.inspect
    cpu = burner.first.values["cpu-time"]
    assert_operator cpu, :>=, (burned * 1e9).to_i
    assert_operator cpu, :<, (burned * 1e9).to_i + 20_000_000, "only the thread's own CPU since its previous sample"
    assert_equal 1, burner.first.values["cpu-samples"]
    assert_includes burner.first.locations.map(&:function_name), "Thread::Queue#pop"
    assert_operator burner.first.values["wall-time"], :>=, cpu

    # Idle since then: no CPU, no cpu-sample, but wall time.
    sleep 0.02
    @collector.sample
    wall_elapsed = Process.clock_gettime(Process::CLOCK_MONOTONIC, :nanosecond) - wall_start
    idle = samples_for(decode_profile(@recorder.serialize[2]), "burner").first
    # (On Ruby 3.3+ a wait cannot be told from native code: the few microseconds of CPU the
    # thread used going back to its wait may count as one cpu-sample there.)
    assert_equal 0, idle.values["cpu-samples"] unless VMBackend.public_thread_api?
    assert_operator idle.values["cpu-time"], :<, 1_000_000
    assert_operator idle.values["wall-time"], :>=, 20_000_000
    assert_operator idle.values["wall-time"], :<=, wall_elapsed
  end

  def spin_until(flag)
    Thread.pass until flag[0]
  end

  # CPU a thread used before it started waiting is not shown in the waiting frame
  # (Kernel#sleep uses no CPU): it goes to the thread's last sample taken while running.
  def test_cpu_used_before_a_wait_is_not_attributed_to_the_wait
    # Ruby 3.3+'s public API does not tell a wait in Ruby from native code without the GVL
    # (a documented limit of that backend; with CPU timers, the default, it does not arise).
    skip "the public thread API cannot tell a wait in Ruby from native code" if VMBackend.public_thread_api?
    go = [false]
    thread = Thread.new do
      Thread.current.name = "spinner"
      spin_until(go)
      burn_cpu(0.03)
      sleep
    end
    @threads << thread
    # Running Ruby code (a thread not started yet has no CPU clock to start).
    Thread.pass until thread.backtrace_locations.to_a.any? { |l| l.label == "spin_until" }
    @collector.sample # starts the clocks
    @collector.sample # a sample of the spinning thread, not waiting
    go[0] = true
    Thread.pass until thread.status == "sleep"
    @collector.sample # finds it asleep, 30 ms of CPU later
    samples = samples_for(decode_profile(@recorder.serialize[2]), "spinner")
    asleep = samples.select { |s| s.locations.first.function_name == "Kernel#sleep" }
    refute_empty asleep
    assert_equal 0, asleep.sum { |s| s.values["cpu-time"] }
    running = samples.select { |s| s.locations.any? { |f| f.function_name.end_with?("#spin_until") } }
    assert_operator running.sum { |s| s.values["cpu-time"] }, :>=, 30_000_000
  end

  def test_labels_thread_id_is_stable_and_thread_name_appears_when_set
    named, run = worker_step("named-thread")
    run.(-> { :started })
    unnamed = Thread.new { sleep }
    @threads << unnamed
    Thread.pass until unnamed.status == "sleep"
    3.times { @collector.sample }
    profile = decode_profile(@recorder.serialize[2])
    ids = Testing.per_thread_context(@collector).transform_values { |c| c[:thread_id] }
    # A string label (as Datadog reads it), the thread's number in decimal.
    named_samples = profile.samples.select { |s| s.labels["thread id"] == ids[named].to_s }
    refute_empty named_samples
    assert(named_samples.all? { |s| s.labels["thread name"] == "named-thread" })
    unnamed_samples = profile.samples.select { |s| s.labels["thread id"] == ids[unnamed].to_s }
    refute_empty unnamed_samples
    assert(unnamed_samples.none? { |s| s.labels.key?("thread name") })
    assert_equal ids.values.uniq.size, ids.size, "thread ids are unique"
    @collector.sample
    later = Testing.per_thread_context(@collector).transform_values { |c| c[:thread_id] }
    # Threads left by other test files may end meanwhile (their entries go, as they should):
    # every thread in both tables keeps its id, and this test's threads are in both.
    [Thread.main, named, unnamed].each { |thread| assert_equal ids.fetch(thread), later[thread] }
    (ids.keys & later.keys).each { |thread| assert_equal ids[thread], later[thread], thread.inspect }
  end

  # A sample calls no Ruby method: where one returns, Ruby may switch threads (a round then
  # waits out other threads' time slices) or raise the program's pending Thread#raise
  # inside the profiler (vm_public_api.c, "Thread names"). Names still follow Thread#name=.
  def test_samples_call_no_thread_method_and_follow_renames
    named, run = worker_step("before")
    run.(-> { :started })
    named.name = "after"
    calls = []
    watch = TracePoint.new(:c_call) { |tp| calls << tp.method_id if tp.defined_class == Thread }
    watch.enable { 3.times { @collector.sample } }
    assert_empty calls, "Thread methods called while sampling"
    profile = decode_profile(@recorder.serialize[2])
    id = Testing.per_thread_context(@collector).fetch(named)[:thread_id].to_s
    names = profile.samples.select { |s| s.labels["thread id"] == id }.map { |s| s.labels["thread name"] }
    assert_equal ["after"], names.uniq
  end

  def test_ignored_threads_are_never_sampled
    hidden = Thread.new { Thread.current.name = "hidden"; sleep }
    @threads << hidden
    Thread.pass until hidden.status == "sleep"
    @collector.ignore_thread(hidden)
    3.times { @collector.sample }
    names = decode_profile(@recorder.serialize[2]).samples.map { |s| s.labels["thread name"] }
    refute_includes names, "hidden"
    refute Testing.per_thread_context(@collector).key?(hidden)
    assert_raises(TypeError) { @collector.ignore_thread(:not_a_thread) }
  end

  def test_dead_threads_leave_the_table
    thread = Thread.new { sleep }
    Thread.pass until thread.status == "sleep"
    @collector.sample
    assert Testing.per_thread_context(@collector).key?(thread)
    thread.kill.join
    @collector.sample
    refute Testing.per_thread_context(@collector).key?(thread)
  end

  def test_table_survives_gc_compaction
    threads = Array.new(5) { |i| Thread.new { Thread.current.name = "t#{i}"; sleep } }
    @threads.concat(threads)
    threads.each { |t| Thread.pass until t.status == "sleep" }
    @collector.sample
    ids = Testing.per_thread_context(@collector).transform_values { |c| c[:thread_id] }
    GC.compact
    GC.verify_compaction_references(double_heap: false, toward: :empty)
    @collector.sample
    assert_equal ids, Testing.per_thread_context(@collector).transform_values { |c| c[:thread_id] }
    profile = decode_profile(@recorder.serialize[2])
    threads.each_with_index do |thread, i|
      sample = profile.samples.find { |s| s.labels["thread name"] == "t#{i}" }
      assert sample, "thread t#{i} sampled after compaction"
      assert_equal ids[thread].to_s, sample.labels["thread id"]
    end
  end

  def test_inspect_and_arguments
    @collector.sample
    assert_match(/#<Contprof::Collectors::ThreadContext threads=\{.*thread_id.*\} rounds=1/, @collector.inspect)
    assert_raises(ArgumentError) { Contprof::Collectors::ThreadContext.new }
    assert_raises(TypeError) { Contprof::Collectors::ThreadContext.new(recorder: Object.new) }
    error = assert_raises(ArgumentError) { Contprof::Collectors::ThreadContext.new(recorder: @recorder, max_frames: 3) }
    assert_match(/max_frames/, error.message)
    other = Contprof::StackRecorder.new(sample_types: [%w[alloc-size bytes]])
    error = assert_raises(ArgumentError) { Contprof::Collectors::ThreadContext.new(recorder: other) }
    assert_match(/cpu-time, cpu-samples or wall-time/, error.message)
  end

  def test_a_recorder_with_only_some_of_the_sample_types
    recorder = Contprof::StackRecorder.new(sample_types: [%w[wall-time nanoseconds]])
    collector = Contprof::Collectors::ThreadContext.new(recorder: recorder)
    collector.sample
    sleep 0.01
    collector.sample
    profile = decode_profile(recorder.serialize[2])
    assert_operator profile.total("wall-time"), :>=, 10_000_000
  end
end
