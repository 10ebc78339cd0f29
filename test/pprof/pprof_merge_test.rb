# frozen_string_literal: true

require_relative "../test_helper"
require_relative "../support/synthetic_profiles"
require "contprof/reports/report"
require "contprof/reports/profiles"
require "objspace"
require "tmpdir"
require "zlib"

# The C merger and summary (Contprof::Native::PprofMerge, Native.pprof_summary: the pprof
# core's pprof_merge.c and pprof_reader.c) against the Ruby ones they stand in for
# (Report::Profiles.load, Pprof.summary): the same stacks and totals for every sample type,
# with no range, with a range cutting files (and their timeline samples) in the middle, and
# with a range leaving files out; and the errors they raise.
class PprofMergeTest < Minitest::Test
  include CpuHelpers
  include ProfileAssertions

  Merge = Contprof::Native::PprofMerge if defined?(Contprof::Native::PprofMerge)
  MINUTE = 60 * 1_000_000_000
  T0 = 1_796_000_000 * 1_000_000_000

  def setup
    skip "the native extension is not built" unless defined?(Merge)
    @dir = Dir.mktmpdir("contprof-merge-test")
  end

  def teardown
    FileUtils.rm_rf(@dir) if @dir
  end

  def write(name, bytes)
    File.join(@dir, name).tap { |path| File.binwrite(path, bytes) }
  end

  # Three minutes of a server (SyntheticProfiles.wide, retimed), as the viewer's files.
  def synthetic_paths
    Array.new(3) do |i|
      write("wide-#{i}.pprof", SyntheticProfiles.retimed(SyntheticProfiles.wide(stacks: 300, seed: 100 + i), T0 + i * MINUTE, MINUTE))
    end
  end

  # Minutes of timeline samples (numeric end_timestamp_ns labels), of random wall times
  # ending anywhere in their minute, some instants, some with negative values.
  def timeline_paths(count = 3)
    random = Random.new(5)
    Array.new(count) do |minute|
      recorder = Contprof::StackRecorder.new
      start = T0 + minute * MINUTE
      400.times do |n|
        wall = n % 10 == 0 ? 0 : random.rand(20 * 1_000_000_000)
        labels = { "thread id" => 1 + random.rand(3), "thread name" => "t", "end_timestamp_ns" => start + random.rand(MINUTE) }
        labels.delete("end_timestamp_ns") if n % 17 == 0
        frames = [["leaf_#{random.rand(5)}", "/a.rb", 1 + random.rand(3)], ["mid_#{random.rand(3)}", "/b.rb", 5], ["main", "/a.rb", 1]]
        recorder.record_sample(frames, { "cpu-time" => random.rand(wall + 1) - (n % 23 == 0 ? 1000 : 0), "cpu-samples" => 1,
                                         "wall-time" => wall }, labels)
      end
      recorder.add_comment("minute=#{minute}")
      recorder.add_comment("same")
      write("timeline-#{minute}.pprof", SyntheticProfiles.retimed(recorder.serialize.last, start, MINUTE))
    end
  end

  def time_of(nanos) = Time.at(nanos / 1_000_000_000, nanos % 1_000_000_000, :nsec)

  def merged(paths, from: nil, to: nil)
    merge = Merge.new(from, to)
    added = paths.map { |path| merge.add_file(path) }
    [merge, added]
  end

  # The C merge decodes to the Ruby merge's stacks, per sample type.
  def assert_same_as_ruby(paths, from: nil, to: nil)
    merge, added = merged(paths, from: from, to: to)
    pprof, comments, sample_count = merge.result
    assert_equal Encoding::BINARY, pprof.encoding
    profile = Contprof::Pprof.decode(pprof)
    expected = Contprof::Report::Profiles.load(paths, from: from && time_of(from), to: to && time_of(to))
    expected.sample_types.each do |type|
      assert_equal expected.stacks_by_function(type.type), profile.stacks_by_function(type.type), type.type
    end
    assert_equal expected.sample_types, profile.sample_types
    assert_equal expected.time_nanos, profile.time_nanos
    assert_equal expected.duration_nanos, profile.duration_nanos
    assert_equal expected.period, profile.period
    assert_equal profile.sample_count, sample_count
    refute(profile.labels.any? { |labels| labels.key?("end_timestamp_ns") })
    assert(comments.all? { |comment| comment.encoding == Encoding::UTF_8 })
    [profile, comments, added]
  end

  def test_synthetic_profiles_merge_as_in_ruby
    paths = synthetic_paths
    profile, _, added = assert_same_as_ruby(paths)
    assert_equal [true, true, true], added
    assert_equal [1, 2, 3, 4].sort, profile.labels.map { |labels| labels["thread id"] }.uniq.sort
    # A range of the middle file: the others are left out.
    _, _, added = assert_same_as_ruby(paths, from: T0 + MINUTE + 1, to: T0 + 2 * MINUTE)
    assert_equal [false, true, false], added
  end

  def test_timeline_samples_are_cut_as_in_ruby
    paths = timeline_paths
    _, comments, = assert_same_as_ruby(paths)
    assert_equal ["minute=0", "same", "minute=1", "minute=2"], comments.sort_by { |c| c == "same" ? "minute=0~" : c }
    assert_equal "minute=0", comments.first
    # Ranges cutting the middle of files, and leaving one out; one open side each.
    [[T0 + MINUTE / 3, T0 + MINUTE + MINUTE / 2], [T0 + 90 * 1_000_000_000, nil], [nil, T0 + MINUTE / 7],
     [T0 + MINUTE + 1, T0 + 2 * MINUTE - 1]].each do |from, to|
      assert_same_as_ruby(paths, from: from, to: to)
    end
    _, _, added = assert_same_as_ruby(paths, from: T0 + MINUTE + 1, to: T0 + 2 * MINUTE - 1)
    assert_equal [false, true, false], added
  end

  # Go's writer (`go tool pprof -proto` rewrites a profile): its own ids, mappings and
  # addresses, its field order.
  def test_profiles_written_by_go_merge_as_in_ruby
    paths = (synthetic_paths.first(2) + timeline_paths(2)).map do |path|
      write("go-#{File.basename(path)}", go_pprof(File.binread(path), "-proto"))
    end
    assert_same_as_ruby(paths.first(2))
    assert_same_as_ruby(paths.last(2), from: T0 + MINUTE / 2, to: T0 + MINUTE + MINUTE / 3)
    paths.each do |path|
      assert_equal Contprof::Pprof.summary(File.binread(path)).totals.values, Contprof::Native.pprof_summary(path)[3]
    end
  end

  def test_a_recorded_timeline_merges_as_in_ruby
    skip Contprof.unsupported_reason unless Contprof.supported?
    exported = Contprof.profile(interval: 0.01, allocation: false, timeline: true) do
      5.times do
        burn_cpu(0.02)
        sleep 0.02
      end
      Thread.new { burn_cpu(0.03) }.join
    end
    path = write("recorded.pprof", exported.pprof)
    start = Contprof::Pprof.decode(exported.pprof).time_nanos
    duration = Contprof::Pprof.decode(exported.pprof).duration_nanos
    assert_same_as_ruby([path, path])
    assert_same_as_ruby([path], from: start + duration / 3, to: start + 2 * duration / 3)
  end

  def test_a_merge_result_merges_again
    paths = timeline_paths(2)
    first = Merge.new(nil, nil)
    paths.each { |path| first.add_file(path) }
    again = Merge.new(nil, nil)
    assert again.add(first.result[0], "cached")
    assert again.add_file(paths[0])
    expected = Contprof::Report::Profiles.load(paths + [paths[0]])
    assert_equal expected.stacks_by_function("wall-time"), Contprof::Pprof.decode(again.result[0]).stacks_by_function("wall-time")
  end

  def test_summary_as_in_ruby
    (synthetic_paths + timeline_paths(1)).each do |path|
      summary = Contprof::Pprof.summary(File.binread(path))
      types, time_nanos, duration_nanos, totals, comments, reach = Contprof::Native.pprof_summary(path)
      assert_equal summary.sample_types.map(&:to_a), types
      assert_equal [summary.time_nanos, summary.duration_nanos], [time_nanos, duration_nanos]
      assert_equal summary.totals.values, totals
      assert_equal summary.comments, comments
      # The reach: the span the timeline samples' stretches cover (Profiles.stretch).
      profile = Contprof::Pprof.decode_file(path)
      wall = profile.sample_types.index { |type| type.type == "wall-time" }
      stretches = profile.sample_count.times.filter_map { |i| Contprof::Report::Profiles.stretch(profile, i, wall) }
      assert_equal stretches.empty? ? [] : [stretches.map { |start, finish| [start, finish].min }.min, stretches.map(&:last).max], reach
    end
    refute_empty Contprof::Native.pprof_summary(timeline_paths(1).first)[5], "a timeline has a reach"
    plain = write("plain.pprof", Zlib.gunzip(File.binread(synthetic_paths.first)))
    assert_equal Contprof::Pprof.summary(File.binread(plain)).totals.values, Contprof::Native.pprof_summary(plain)[3]
  end

  def test_errors
    good = synthetic_paths.first
    garbage = write("garbage.pprof", "\xff".b * 40)
    truncated = write("truncated.pprof", File.binread(good)[0, 5000])
    merge = Merge.new(nil, nil)
    assert_raises(Merge::DecodeError) { merge.add_file(garbage) }
    error = assert_raises(Merge::DecodeError) { merge.add_file(truncated) }
    refute_includes error.message, truncated # the caller names the file
    assert_raises(Merge::DecodeError) { merge.add("not a profile", "memory") }
    missing = File.join(@dir, "missing.pprof")
    error = assert_raises(Errno::ENOENT) { merge.add_file(missing) }
    assert_includes error.message, missing
    assert_kind_of SystemCallError, error
    assert_raises(Errno::EISDIR) { merge.add_file(@dir) }
    assert_nil merge.result # nothing merged yet

    other_path = write("other.pprof", one_type_profile)
    assert merge.add_file(good)
    error = assert_raises(Merge::TypesDiffer) { merge.add_file(other_path) }
    assert_match(/\Asample types differ: #{Regexp.escape(good)} has cpu-time \(nanoseconds\), .*, #{Regexp.escape(other_path)} has .* \(merge only profiles of the same kind\)\z/, error.message)
    assert merge.add_file(good) # the merge goes on
    assert merge.result

    assert_raises(Merge::DecodeError) { Contprof::Native.pprof_summary(truncated) }
    assert_raises(Errno::ENOENT) { Contprof::Native.pprof_summary(missing) }
    assert_operator Merge::DecodeError, :<, StandardError
    assert_operator Merge::TypesDiffer, :<, StandardError
  end

  # A profile of one sample type, written by hand (protobuf).
  def one_type_profile
    w = Contprof::Protobuf::Writer
    out = +"".b
    ["", "cpu-time", "nanoseconds"].each { |s| w.length_delimited(out, 6, s) }
    type = +"".b
    w.varint_field(type, 1, 1)
    w.varint_field(type, 2, 2)
    w.length_delimited(out, 1, type)
    Zlib.gzip(out)
  end

  # While one thread merges without the GVL, another thread's call is refused, not run.
  def test_a_merge_in_use_by_another_thread_raises
    big = write("big.pprof", SyntheticProfiles.many_functions(stacks: 3000))
    merge = Merge.new(nil, nil)
    refused = Queue.new
    adder = Thread.new do
      5.times do
        merge.add_file(big)
      rescue RuntimeError => e
        refused << e
      end
    end
    while adder.alive?
      begin
        merge.add("", "empty")
      rescue Merge::DecodeError
        # (not busy at that moment: read, and refused as no profile)
      rescue RuntimeError => e
        refused << e
      end
      Thread.pass
    end
    adder.join
    refute refused.empty?, "no call found the merge busy"
    assert_match(/in use by another thread/, refused.pop.message)
  end

  def test_memory_is_reported_and_survives_gc
    paths = synthetic_paths
    merge = Merge.new(nil, nil)
    GC.stress = true
    merge.add_file(paths.first)
    GC.stress = false
    GC.compact if GC.respond_to?(:compact)
    paths.each { |path| merge.add_file(path) }
    assert_operator ObjectSpace.memsize_of(merge), :>, 100_000
    assert_equal Contprof::Report::Profiles.load(paths + [paths.first]).stacks_by_function("cpu-time"),
                 Contprof::Pprof.decode(merge.result[0]).stacks_by_function("cpu-time")
  ensure
    GC.stress = false
  end
end
