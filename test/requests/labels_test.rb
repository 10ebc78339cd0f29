# frozen_string_literal: true

require_relative "../test_helper"

# Contprof.with_labels: every sample carries exactly the labels in force where it was taken
# (nested blocks, fibers, threads, exceptions), with no allocation per sample.
class LabelsTest < Minitest::Test
  OWN_LABELS = ["thread id", "thread name", "thread state", "end_timestamp_ns"].freeze

  # Each phase is a method of its own: a sample's phase is the burn_* method on its stack.
  def burn_outer = burn_cpu(0.15)
  def burn_inner = burn_cpu(0.15)
  def burn_outer_again = burn_cpu(0.15)
  def burn_removed = burn_cpu(0.15)
  def burn_raising = burn_cpu(0.15)
  def burn_after_raise = burn_cpu(0.15)
  def burn_in_fiber = burn_cpu(0.15)
  def burn_in_fiber_again = burn_cpu(0.15)
  def burn_between_resumes = burn_cpu(0.15)
  def burn_in_child_thread = burn_cpu(0.15)
  def burn_relabelled = burn_cpu(0.15)
  # Allocates for 50 ms of CPU: after the burn phases, which allocate next to nothing, the
  # sampler's hook is off and the allocation rate it measured is near zero, so the phase
  # must last a few sampling rounds (5 ms here) for one to arm the hook within it.
  def allocate_labelled
    start = thread_cpu_time
    10_000.times { Object.new } while thread_cpu_time - start < 0.05
  end

  EXPECTED = {
    "burn_outer" => { "phase" => "outer" },
    "burn_inner" => { "phase" => "inner", "extra" => "x" },
    "burn_outer_again" => { "phase" => "outer" },
    "burn_removed" => {},
    "burn_raising" => { "phase" => "raising" },
    "burn_after_raise" => {},
    "burn_in_fiber" => { "phase" => "fiber" },
    "burn_in_fiber_again" => { "phase" => "fiber" },
    "burn_between_resumes" => { "phase" => "main" },
    "burn_in_child_thread" => {},
    "burn_relabelled" => { "phase" => "outer", "endpoint" => "Items#show" },
    "allocate_labelled" => { "tenant" => "acme" },
  }.freeze

  def phase_of(sample)
    sample.locations.each do |frame|
      phase = EXPECTED.keys.find { |name| frame.function_name.end_with?("##{name}") }
      return phase if phase
    end
    nil
  end

  def workload
    Contprof.with_labels(phase: "outer") do
      burn_outer
      Contprof.with_labels(phase: "inner", extra: "x") { burn_inner }
      burn_outer_again
      Contprof.with_labels(phase: nil) { burn_removed }
      Contprof.with_labels(phase: "outer") do
        Contprof.relabel(endpoint: "Items#show")
        burn_relabelled
      end
    end
    begin
      Contprof.with_labels(phase: "raising") do
        burn_raising
        raise "unwinds the labels"
      end
    rescue RuntimeError
      burn_after_raise
    end
    fiber = Fiber.new do
      Contprof.with_labels(phase: "fiber") do
        burn_in_fiber
        Fiber.yield
        burn_in_fiber_again
      end
    end
    Contprof.with_labels(phase: "main") do
      fiber.resume
      burn_between_resumes
      fiber.resume
      Thread.new { burn_in_child_thread }.join
    end
    Contprof.with_labels(tenant: "acme") { allocate_labelled }
  end

  def test_every_sample_carries_the_labels_in_force_where_it_was_taken
    skip Contprof.unsupported_reason unless Contprof.supported?
    allocation = Contprof::Collectors::Allocations.unsupported_reason.nil?
    profile = Contprof.profile(interval: 0.005, allocation: allocation, allocation_interval: 500) { workload }.decode
    seen = Hash.new(0)
    profile.samples.each do |sample|
      phase = phase_of(sample) or next
      next if sample.labels.key?("gc age") # (live-heap samples carry no thread or request labels)
      labels = sample.labels.reject { |key, _| OWN_LABELS.include?(key) || key.start_with?("gc ") || key == "allocation class" }
      assert_equal EXPECTED.fetch(phase), labels, "#{phase}: #{sample.values}"
      seen[phase] += 1
    end
    expected_phases = allocation ? EXPECTED.keys : EXPECTED.keys - ["allocate_labelled"]
    assert_empty expected_phases - seen.keys, "every phase was sampled (#{seen})"
    assert_empty Contprof.labels, "nothing is left in force"
  end

  def test_labels_are_checked_when_set
    error = assert_raises(ArgumentError) { Contprof.with_labels(phase: 1.5) {} }
    assert_match(/label :phase has value 1.5, which must be a String, a Symbol, an Integer or nil/, error.message)
    assert_raises(ArgumentError) { Contprof.with_labels("thread id": "1") {} }
    assert_raises(ArgumentError) { Contprof.with_labels(phase: "") {} }
    assert_raises(ArgumentError) { Contprof.with_labels(1 => "x") {} }
    assert_raises(ArgumentError) { Contprof.with_labels(**(1..11).to_h { |i| [:"k#{i}", i] }) {} }
    assert_raises(ArgumentError) { Contprof.with_labels(phase: "x") }
    assert_raises(Contprof::Error) { Contprof.relabel(phase: "x") }
    assert_equal({ "phase" => "7", "a b" => "c" }, Contprof.with_labels("phase" => 7, "a b": :c) { Contprof.labels })
  end

  # Reading the labels in force allocates nothing: a sample of a labelled thread costs the
  # same allocations as one of an unlabelled thread (none).
  def test_sampling_a_labelled_thread_allocates_nothing
    skip Contprof.unsupported_reason unless Contprof.supported?
    recorder = Contprof::StackRecorder.new
    collector = Contprof::Collectors::ThreadContext.new(recorder: recorder)
    Contprof.with_labels(phase: "p", tenant: "t") do
      collector.sample # starts the clocks
      burn_cpu(0.002)
      allocated = 2.times.map do # the first record of a stack may grow the recorder's tables
        before = GC.stat(:total_allocated_objects)
        20.times { collector.sample }
        GC.stat(:total_allocated_objects) - before
      end
      assert_equal 0, allocated.last
    end
  end
end
