# frozen_string_literal: true

require_relative "../test_helper"
require "json"

# The oracle is Ruby itself: a sampled stack must equal Thread#backtrace_locations frame
# for frame (file and line exactly; names after the documented rule that methods are
# qualified by their owner: "sleep" is "Kernel#sleep", "block in bar" is
# "block in StackParking#bar").
class CollectorsStackTest < Minitest::Test
  Stack = Contprof::Collectors::Stack

  # Places where test threads park; each line that parks is known to the tests.
  class StackParking
    def initialize(queue)
      @queue = queue
    end

    def sleep_in_method
      sleep
    end

    def sleep_in_block
      [1].each { |_| loop { sleep } }
    end

    def nested_blocks
      [1].each { [2].map { sleep } }
    end

    def wait_in_select
      reader, _writer = IO.pipe
      IO.select([reader])
    end

    def wait_in_queue_pop
      @queue.pop
    end

    def self.sleep_in_singleton
      sleep
    end

    def build_class
      Class.new do
        sleep
      end
    end

    def recurse(depth)
      depth.zero? ? sleep : recurse(depth - 1)
    end

    def raise_and_rescue
      raise "parking"
    rescue RuntimeError
      sleep
    end

    def in_eval
      eval("sleep", binding, "/virtual/eval_file.rb", 77) # rubocop:disable Security/Eval
    end
  end

  module Helper
    def self.module_method
      sleep
    end
  end

  def setup
    @recorder = Contprof::StackRecorder.new
    @threads = []
  end

  def teardown
    @threads.each(&:kill).each(&:join)
  end

  def park(&block)
    thread = Thread.new(&block)
    @threads << thread
    wait_until_parked(thread)
    thread
  end

  def wait_until_parked(thread)
    deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + 5
    until thread.status == "sleep" && thread.stop?
      raise "thread did not park" if Process.clock_gettime(Process::CLOCK_MONOTONIC) > deadline

      Thread.pass
    end
    # Blocked in C, the backtrace no longer changes.
    sleep 0.01
  end

  def sample(thread, max_frames: Contprof::Limits::MAX_FRAMES, wall: 1)
    Stack.sample(thread, @recorder, { "wall-time" => wall }, { "thread id" => 1 }, max_frames: max_frames)
  end

  def sampled_stacks
    decode_profile(@recorder.serialize[2]).samples.map { |s| s.locations.map(&:to_a) }
  end

  def oracle(thread)
    thread.backtrace_locations.map { |l| [unqualified(VMBackend.frame_label(l.label)), l.absolute_path || l.path, l.lineno] }
  end

  # The documented naming rule, undone: "Foo::Bar#baz" → "baz", "block in Foo.bar" →
  # "block in bar"; "<main>", "<class:Foo>" and the like are unchanged. (Ruby 3.4's own
  # labels follow the rule, so the oracle's labels are undone the same way.)
  def unqualified(name)
    name.sub(/(\A|\bin )[A-Z][\w:]*[#.](?=[^\s]+\z)/, '\1')
  end

  def assert_matches_backtrace(thread, stack)
    labels = thread.backtrace_locations.map(&:label)
    expected = oracle(thread)
    assert_equal expected.size, stack.size, "frame count differs:\n#{expected.inspect}\n#{stack.inspect}"
    expected.zip(stack, labels).each_with_index do |((label, path, line), (name, file, sampled_line), ruby_label), i|
      assert_equal label, unqualified(name), "frame #{i}: name #{name.inspect} vs label #{label.inspect}"
      # Ruby 3.4 qualifies its labels by the same rule: they must then be equal as they are.
      assert_equal ruby_label, name, "frame #{i}: qualified name" if qualified_labels?
      assert_equal path, file, "frame #{i} (#{name}): file"
      assert_equal line, sampled_line, "frame #{i} (#{name}): line"
    end
  end

  def qualified_labels? = RUBY_VERSION >= "3.4" && !VMBackend.public_api?

  def sample_and_compare(thread)
    sample(thread)
    stack = sampled_stacks.first
    assert_matches_backtrace(thread, stack)
    stack
  end

  def test_asleep_inside_a_method
    parking = StackParking.new(Queue.new)
    stack = sample_and_compare(park { parking.sleep_in_method })
    assert_equal ["Kernel#sleep", "CollectorsStackTest::StackParking#sleep_in_method"], stack.first(2).map(&:first)
    assert_equal [File.expand_path(__FILE__)] * 2, stack.first(2).map { |f| f[1] }
    assert_equal stack[1][2], stack[0][2], "a C frame takes its caller's line"
  end

  def test_inside_a_block_inside_a_method
    parking = StackParking.new(Queue.new)
    stack = sample_and_compare(park { parking.sleep_in_block })
    expected = ["Kernel#sleep", "block (2 levels) in CollectorsStackTest::StackParking#sleep_in_block", "Kernel#loop",
                "block in CollectorsStackTest::StackParking#sleep_in_block", "Array#each",
                "CollectorsStackTest::StackParking#sleep_in_block"]
    assert_equal expected.map { |name| VMBackend.frame_label(name) }, stack.first(6).map(&:first)
  end

  def test_nested_blocks
    parking = StackParking.new(Queue.new)
    stack = sample_and_compare(park { parking.nested_blocks })
    assert_equal VMBackend.frame_label("block (2 levels) in CollectorsStackTest::StackParking#nested_blocks"), stack[1][0]
    assert_equal "Array#map", stack[2][0]
  end

  def test_in_io_select
    parking = StackParking.new(Queue.new)
    stack = sample_and_compare(park { parking.wait_in_select })
    assert_equal ["IO.select", "CollectorsStackTest::StackParking#wait_in_select"], stack.first(2).map(&:first)
  end

  def test_in_queue_pop
    parking = StackParking.new(Queue.new)
    stack = sample_and_compare(park { parking.wait_in_queue_pop })
    assert_equal ["Thread::Queue#pop", "CollectorsStackTest::StackParking#wait_in_queue_pop"], stack.first(2).map(&:first)
  end

  def test_inside_a_singleton_method_and_a_module_function
    stack = sample_and_compare(park { StackParking.sleep_in_singleton })
    assert_equal "CollectorsStackTest::StackParking.sleep_in_singleton", stack[1][0]
    @recorder.serialize
    stack = sample_and_compare(park { Helper.module_method })
    assert_equal "CollectorsStackTest::Helper.module_method", stack[1][0]
  end

  def test_inside_a_class_new_body
    parking = StackParking.new(Queue.new)
    stack = sample_and_compare(park { parking.build_class })
    assert_equal ["Kernel#sleep", VMBackend.frame_label("block in CollectorsStackTest::StackParking#build_class")],
                 stack.first(2).map(&:first)
    assert_includes stack.map(&:first), "Class#initialize"
  end

  def test_rescue_clause_and_eval
    parking = StackParking.new(Queue.new)
    if VMBackend.public_api?
      # The rescue clause's frame carries its method's name, at the clause's line, above the
      # method's own frame (Ruby 3.4's backtraces leave that frame out).
      sample(park { parking.raise_and_rescue })
      stack = sampled_stacks.first
      line = StackParking.instance_method(:raise_and_rescue).source_location[1] + 3 # the `sleep`
      assert_equal [["Kernel#sleep", line], ["CollectorsStackTest::StackParking#raise_and_rescue", line]],
                   stack.first(2).map { |name, _, sampled_line| [name, sampled_line] }
    else
      stack = sample_and_compare(park { parking.raise_and_rescue })
      # Ruby 3.4's backtraces name the clause's frame as its method, and leave out the
      # method's own frame.
      clause = RUBY_VERSION >= "3.4" ? "" : "rescue in "
      assert_equal "#{clause}CollectorsStackTest::StackParking#raise_and_rescue", stack[1][0]
    end
    @recorder.serialize
    if VMBackend.public_api?
      # Ruby 3.3+'s public API gives code eval'd inside a method as the method itself: its
      # name and file, with the eval's line (a documented limit of that backend).
      sample(park { parking.in_eval })
      stack = sampled_stacks.first
      assert_equal ["Kernel#sleep", File.expand_path(__FILE__), 77], stack[0]
      assert_equal ["CollectorsStackTest::StackParking#in_eval", File.expand_path(__FILE__), 77], stack[1]
    else
      stack = sample_and_compare(park { parking.in_eval })
      assert_equal ["/virtual/eval_file.rb", 77], stack[1][1..2]
    end
  end

  def test_bottom_of_a_1000_deep_recursion
    parking = StackParking.new(Queue.new)
    thread = park { parking.recurse(1000) }
    sample(thread, max_frames: 10_000)
    stack = sampled_stacks.first
    assert_operator stack.size, :>, 1000
    assert_matches_backtrace(thread, stack)
    assert_equal 1001, stack.count { |name, _, _| name == "CollectorsStackTest::StackParking#recurse" }
  end

  def test_truncation_keeps_the_newest_frames_and_counts_the_rest
    parking = StackParking.new(Queue.new)
    thread = park { parking.recurse(1000) }
    total = thread.backtrace_locations.size
    sample(thread, max_frames: 50)
    stack = sampled_stacks.first
    assert_equal 50, stack.size
    assert_equal ["#{total - 49} frames omitted", "", 0], stack.last
    assert_matches_backtrace_prefix(thread, stack.first(49))

    # A stack of exactly max_frames frames is kept whole.
    sample(thread, max_frames: total)
    assert_equal total, sampled_stacks.first.size
    sample(thread, max_frames: total - 1)
    assert_equal ["2 frames omitted", "", 0], sampled_stacks.first.last
  end

  def assert_matches_backtrace_prefix(thread, stack)
    oracle(thread).first(stack.size).zip(stack).each do |(label, path, line), (name, file, sampled_line)|
      assert_equal [label, path, line], [unqualified(name), file, sampled_line]
    end
  end

  def test_a_thread_not_yet_started_is_in_native_code
    thread = Thread.new { sleep }
    @threads << thread
    sample(thread) # before it can run: this thread holds the GVL
    assert_equal [[["In native code", "", 0]]], sampled_stacks
  end

  def test_a_thread_running_only_native_code_is_in_native_code
    pid = spawn("sleep 5")
    waiter = Process.detach(pid)
    wait_until_parked(waiter)
    assert_empty waiter.backtrace_locations
    sample(waiter)
    assert_equal [[["In native code", "", 0]]], sampled_stacks
  ensure
    begin
      Process.kill(:KILL, pid)
    rescue Errno::ESRCH # already done (a slow machine)
    end
    waiter&.join
  end

  # Ruby 4.0's backtraces show methods written in Ruby inside Ruby ("<internal:...>") as if
  # written in C; the frame-layout reader does the same there. Ruby 4.0 is not at hand, so
  # the rule is asked for on this Ruby and checked against backtrace_locations rewritten by it.
  def test_internal_frames_hidden_as_ruby_4_shows_them
    skip "the frame-layout reader only" unless Contprof::Native.vm_backend == "frame_layout"
    script = <<~'RUBY'
      require "contprof"
      require "json"
      def park(queue) = 3.times { [1].each { loop { queue.pop } } }
      queue = Queue.new
      thread = Thread.new { park(queue) }
      Thread.pass until thread.status == "sleep"
      sleep 0.05
      recorder = Contprof::StackRecorder.new
      Contprof::Collectors::Stack.sample(thread, recorder, { "wall-time" => 1 }, { "thread id" => 1 })
      File.binwrite(ARGV[0], recorder.serialize[2])
      locations = thread.backtrace_locations
      expected = locations.each_with_index.filter_map do |location, i|
        path = location.absolute_path || location.path
        next [location.label, path, location.lineno] unless path.start_with?("<internal:")
        caller = locations[(i + 1)..].find { |l| !(l.absolute_path || l.path).start_with?("<internal:") }
        [location.label, caller.absolute_path || caller.path, caller.lineno]
      end
      puts JSON.generate(expected)
    RUBY
    Tempfile.create(["internal", ".pprof"]) do |file|
      out, status = Open3.capture2e({ "CONTPROF_VM_HIDE_INTERNAL_FRAMES" => "1" }, RbConfig.ruby,
                                    "-I#{File.expand_path("../../lib", __dir__)}", "-e", script, file.path)
      assert status.success?, out
      expected = JSON.parse(out.lines.last)
      assert expected.any? { |label, _, _| label.end_with?("times") }, "Integer#times is written in Ruby here"
      stack = decode_profile(File.binread(file.path)).samples.first.locations.map(&:to_a)
      assert_equal expected.map { |label, path, line| [unqualified(label), path, line] },
                   stack.map { |name, file, line| [unqualified(name), file, line] }
    end
  end

  # How the running Ruby's backtraces look (clause frames, <internal:> frames) is asked of
  # it at load time, not read off its version, and said by `contprof doctor`.
  def test_backtrace_look_asked_of_the_running_ruby
    skip "the frame-layout reader only" unless Contprof::Native.vm_backend == "frame_layout"
    depth = caller_locations(0).size
    merged = begin
      raise "a clause to look at"
    rescue
      caller_locations(0).size == depth
    end
    internal_shown = 1.times { break caller_locations(1, 1).first.path }.start_with?("<internal:")
    note = Contprof::Native.vm_backend_note
    assert_match(/clause frames #{merged ? "merged" : "apart"}/, note)
    assert_match(/<internal:> frames #{internal_shown ? "shown" : "hidden"}/, note)
  end

  def test_sampling_the_current_thread
    expected = Thread.current.backtrace_locations; sample(Thread.current) # same line on purpose
    stack = sampled_stacks.first
    assert_equal ["Contprof::Collectors::Stack.sample", "CollectorsStackTest#sample",
                  "CollectorsStackTest#test_sampling_the_current_thread"], stack.first(3).map(&:first)
    # Below the sampling helper, the stack is the one Ruby reports.
    expected = expected.drop(1).map { |l| [unqualified(VMBackend.frame_label(l.label)), l.absolute_path || l.path, l.lineno] }
    assert_equal expected, stack.drop(2).map { |name, file, line| [unqualified(name), file, line] }
  end

  def test_sampling_100_threads
    parking = StackParking.new(Queue.new)
    threads = Array.new(100) { |i| Thread.new { parking.recurse(i) } }
    @threads.concat(threads)
    threads.each { |t| wait_until_parked(t) }
    threads.each_with_index { |t, i| Stack.sample(t, @recorder, { "wall-time" => i + 1 }, { "thread id" => i + 1 }) }
    samples = decode_profile(@recorder.serialize[2]).samples
    assert_equal 100, samples.size
    samples.each do |s|
      depth = s.labels.fetch("thread id") - 1
      assert_equal depth + 1, s.values["wall-time"]
      assert_equal depth + 1, s.locations.count { |f| f.function_name.end_with?("#recurse") }
      assert_equal oracle(threads[depth]).size, s.locations.size
    end
  end

  def test_argument_errors
    thread = park { sleep }
    error = assert_raises(ArgumentError) { sample(thread, max_frames: 4) }
    assert_match(/max_frames must be an Integer from 5 to 10000, got 4/, error.message)
    assert_raises(ArgumentError) { sample(thread, max_frames: 10_001) }
    assert_raises(ArgumentError) { sample(thread, max_frames: "400") }
    assert_raises(TypeError) { Stack.sample(Object.new, @recorder, {}, {}) }
    assert_raises(TypeError) { Stack.sample(thread, Object.new, {}, {}) }
    assert_raises(ArgumentError) { Stack.sample(thread, @recorder, { "nope" => 1 }, {}) }
    dead = Thread.new {}
    dead.join
    error = assert_raises(ArgumentError) { sample(dead) }
    assert_match(/the thread is dead/, error.message)
    assert_empty decode_profile(@recorder.serialize[2]).samples
  end

  # Frames are found by the addresses of their VM objects; GC compaction moves objects,
  # so names must survive compactions between samples.
  def test_names_stay_right_across_gc_compaction
    parking = StackParking.new(Queue.new)
    thread = park { parking.sleep_in_block }
    expected = oracle(thread).map { |label, _, _| label }
    20.times do |i|
      GC.compact if i.even?
      GC.start(full_mark: false) if i % 3 == 1
      Array.new(1000) { Object.new }
      sample(thread)
    end
    stacks = sampled_stacks
    assert_equal 1, stacks.size, "all 20 samples aggregate into one stack"
    assert_equal expected, stacks.first.map { |name, _, _| unqualified(name) }
  end

  # Through the public API, naming a frame allocates (its class path), and a GC that
  # compacts in the middle may move the objects of frames not named yet: those are named
  # "(frame moved by GC compaction)" (never "", which a profile would keep for good) until
  # frames are next read or handed in (a capture, an allocation), and named again then.
  def test_frames_that_compaction_may_have_moved_while_naming_are_said_so_and_named_again
    skip "only the public-API backend allocates while naming (Ruby 3.3+)" unless VMBackend.public_thread_api?
    skip "GC.auto_compact is not available here" unless GC.respond_to?(:auto_compact=)
    program = <<~RUBY
      require "contprof"
      GC.auto_compact = true
      recorder = Contprof::StackRecorder.new(sample_types: Contprof::Collectors::Allocations.sample_types(true, false))
      worker = Contprof::Collectors::CpuAndWallTimeWorker.new(recorder: recorder, allocation_interval: 1, interval: 0.001)
      worker.start
      40.times { |i| Object.define_method(:"m\#{i}") { |n| n.zero? ? Array.new(3) { "x" * 10 } : send(:"m\#{i}", n - 1) } }
      GC.stress = true # (every allocation a GC, every GC a compaction)
      40.times { |i| send(:"m\#{i}", 3) }
      GC.stress = false
      def after_stress = 40.times { |i| 20.times { send(:"m\#{i}", 3) } }
      after_stress
      worker.stop
      $stdout.binmode.write(recorder.serialize[2])
    RUBY
    out, err, status = Open3.capture3({ "CONTPROF_VM_LAYOUT" => "off" }, RbConfig.ruby, "-I#{File.expand_path("../../lib", __dir__)}",
                                      "-e", program, binmode: true)
    assert status.success?, err
    profile = decode_profile(out)
    names = profile.samples.flat_map { |sample| sample.locations.map(&:function_name) }
    refute_includes names, "", "no frame is named \"\""
    assert_includes names, "(frame moved by GC compaction)", "the stress did move frames while they were named"
    after = profile.samples.select { |sample| sample.locations.any? { |f| f.function_name == "Object#after_stress" } }
    refute_empty after
    after.each do |sample|
      refute sample.locations.any? { |f| f.function_name.start_with?("(frame moved") }, "named again after the stress"
    end
  end

  def test_stress_with_threads_starting_finishing_and_dying
    parking = StackParking.new(Queue.new)
    stop = false
    spawner = Thread.new do
      until stop
        t = Thread.new { parking.recurse(rand(30)) }
        Thread.new { rand < 0.5 ? t.kill : nil }
        Thread.new { 3.times { [1, 2].map(&:to_s) } }
        Thread.pass
      end
    end
    @threads << spawner
    recorded = 0
    skipped = 0
    10_000.times do
      thread = Thread.list.sample
      begin
        Stack.sample(thread, @recorder, { "cpu-samples" => 1 }, nil, max_frames: 20)
        recorded += 1
      rescue ArgumentError => e
        raise unless e.message.include?("dead")

        skipped += 1
      end
    end
    stop = true
    spawner.join
    Thread.list.each { |t| t.kill unless t == Thread.current }
    profile = decode_profile(@recorder.serialize[2])
    assert_equal recorded, profile.total("cpu-samples")
    assert_operator recorded, :>, 5000
    profile.samples.each do |s|
      refute_empty s.locations
      assert_operator s.locations.size, :<=, 20
      s.locations.each { |f| refute_empty f.function_name }
    end
  end
end
