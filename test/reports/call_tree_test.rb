# frozen_string_literal: true

require_relative "../test_helper"
require_relative "../support/synthetic_profiles"
require "contprof/reports/flamegraph"

# Report::CallTree built in C (Native.call_tree) against the same tree built by its Ruby
# code, attribute for attribute, over profiles of many shapes, both directions, several
# cutoffs and slice layouts; and Native.call_tree refusing bad input.
class CallTreeTest < Minitest::Test
  CallTree = Contprof::Report::CallTree
  ATTRIBUTES = %i[size callers? parents names totals selfs sample_nodes sample_ends].freeze
  CUTOFFS = [0, 0.001, 0.05].freeze

  def setup
    skip "the native extension is not loaded" unless defined?(Contprof::Native) && Contprof::Native.respond_to?(:call_tree)
  end

  def decode(bytes) = Contprof::Pprof.decode(bytes)

  # name_ids as the flame graph makes them: per frame, its function's index among the
  # distinct names in first-seen order.
  def name_ids(profile)
    index = {}
    profile.frames.map { |frame| frame && (index[frame.function_name] ||= index.size) }
  end

  # [slices, slice_count] layouts: the flame graph's (its threads, idle waits apart), all
  # in one busy slice, and `threads` threads by sample index with one sample in 3 idle.
  def layouts(profile, threads: 8)
    keys, = Contprof::Flamegraph.send(:threads, profile)
    idle = Contprof::Report.idle_frames(profile)
    flamegraph = Array.new(profile.sample_count) do |i|
      keys.fetch(Contprof::Report.thread_key(profile.labels[i])) * 2 + (Contprof::Report.idle_sample?(profile, i, idle) ? 1 : 0)
    end
    [[flamegraph, keys.size * 2], [Array.new(profile.sample_count, 0), 2],
     [Array.new(profile.sample_count) { |i| (i % threads) * 2 + (i % 3 == 0 ? 1 : 0) }, threads * 2]]
  end

  def assert_same_trees(profile, cutoffs: CUTOFFS, track_samples: false, layouts: layouts(profile))
    ids = name_ids(profile)
    layouts.each do |slices, slice_count|
      %i[callees callers].each do |direction|
        cutoffs.each do |cutoff|
          options = { slices: slices, slice_count: slice_count, name_ids: ids, direction: direction, cutoff: cutoff,
                      track_samples: track_samples }
          refute_nil Contprof::Native.call_tree(profile.stacks, profile.values, slices, slice_count, ids, profile.sample_types.size,
                                                direction, cutoff, track_samples), "C declined"
          native = CallTree.new(profile, **options)
          ruby = CallTree.new(profile, **options, native: false)
          ATTRIBUTES.each do |attribute|
            expected = ruby.public_send(attribute)
            message = "#{attribute}, #{direction}, cutoff #{cutoff}, #{slice_count} slices"
            expected.nil? ? assert_nil(native.public_send(attribute), message) : assert_equal(expected, native.public_send(attribute), message)
          end
        end
      end
    end
  end

  def test_wide_profiles
    [[16, false], [3, false], [7, true]].each do |seed, deep_idle|
      profile = decode(SyntheticProfiles.wide(stacks: 500, seed: seed, idle_one_in: deep_idle ? 4 : 50, deep_idle: deep_idle))
      assert_same_trees(profile, track_samples: seed != 3)
    end
  end

  def test_a_deep_profile
    assert_same_trees(decode(SyntheticProfiles.deep), track_samples: true)
  end

  def test_many_functions
    assert_same_trees(decode(SyntheticProfiles.many_functions(stacks: 800, functions: 20_000)))
  end

  def test_a_recorded_timeline
    skip Contprof.unsupported_reason unless Contprof.supported?
    # Two busy threads, and the main one also waiting on a queue (an idle wait).
    exported = Contprof.profile(interval: 0.01, allocation: false, timeline: true) do
      worker = Thread.new { 3.times { burn_cpu(0.02) || sleep(0.01) } }
      burn_cpu(0.04)
      queue = Thread::Queue.new
      Thread.new { sleep 0.03; queue << :done }
      queue.pop
      worker.join
    end
    profile = decode(exported.pprof)
    assert Contprof::Report::Profiles.timeline?(profile)
    assert_same_trees(profile, track_samples: true)
  end

  # Negative values, samples whose values are all zero (left out: node -1), and samples
  # ending at inner nodes.
  def test_negative_zero_and_inner_samples
    recorder = Contprof::StackRecorder.new
    random = Random.new(9)
    300.times do |n|
      frames = Array.new(1 + random.rand(4)) { |level| ["f#{level}_#{random.rand(3)}", "/a.rb", 1] }
      values = n % 7 == 0 ? { "cpu-time" => 0, "cpu-samples" => 0, "wall-time" => 0 } : { "cpu-time" => random.rand(1000) - 300, "cpu-samples" => 1, "wall-time" => random.rand(2000) }
      recorder.record_sample(frames, values, { "thread id" => 1 + n % 3, "thread name" => "t" })
    end
    profile = decode(recorder.serialize.last)
    assert(profile.values.any? { |row| row.all?(&:zero?) })
    assert_same_trees(profile, cutoffs: [0, 0.01, 0.2], track_samples: true)
    tree = CallTree.new(profile, slices: Array.new(profile.sample_count, 0), slice_count: 2, name_ids: name_ids(profile),
                                 direction: :callees, cutoff: 0, track_samples: true)
    assert_includes tree.sample_nodes, -1
  end

  def test_an_empty_profile
    profile = decode(Contprof::StackRecorder.new.serialize.last)
    assert_same_trees(profile, track_samples: true, layouts: [[[], 2]])
  end

  # Values whose sums do not fit int64: Native.call_tree declines (nil), the Ruby code builds.
  def test_sums_beyond_int64_fall_back_to_ruby
    stacks = [[0, 1], [1]]
    assert_nil Contprof::Native.call_tree(stacks, [[2**62], [2**62]], [0, 0], 2, [5, 6], 1, :callees, 0.0, false)
    assert_nil Contprof::Native.call_tree(stacks, [[2**64], [1]], [0, 0], 2, [5, 6], 1, :callees, 0.0, false)
    parents, names, totals, selfs, nodes, ends = Contprof::Native.call_tree(stacks, [[2**61], [2**61]], [0, 1], 2, [5, 6], 1, :callers, 0.0, true)
    assert_equal [-1, 0, 1, 0], parents
    assert_equal [-1, 5, 6, 6], names
    assert_equal [[0, 0, 2**61, 0, 1, 2**61, 1, 0, 2**61, 2, 0, 2**61, 3, 1, 2**61]], totals
    assert_equal [[2, 0, 2**61, 3, 1, 2**61]], selfs
    assert_equal [[2, 3], [true, true]], [nodes, ends]
  end

  def test_bad_input_raises
    good = [[[0, 1]], [[1, 2]], [0], 2, [7, 8], 2, :callees, 0.001, false]
    refute_nil Contprof::Native.call_tree(*good)
    {
      0 => [[nil, TypeError], [[[0, "1"]], TypeError], [[[0, 2]], ArgumentError], [[[-1]], ArgumentError], [[[0], [1]], ArgumentError]],
      1 => [[[[1, 2.0]], TypeError], [[[1]], ArgumentError], [[nil], TypeError]],
      2 => [[[2], ArgumentError], [[-1], ArgumentError], [[:a], TypeError]],
      3 => [[3, ArgumentError], [-2, ArgumentError], ["2", TypeError]],
      4 => [[[7, nil], TypeError], [[7, "8"], TypeError], [{}, TypeError]],
      5 => [[-1, ArgumentError], [nil, TypeError]],
      6 => [[:up, ArgumentError], ["callers", ArgumentError]],
      7 => [["0.1", TypeError], [nil, TypeError]]
    }.each do |position, cases|
      cases.each do |bad, error|
        arguments = good.dup
        arguments[position] = bad
        assert_raises(error, "argument #{position}: #{bad.inspect}") { Contprof::Native.call_tree(*arguments) }
      end
    end
  end
end
