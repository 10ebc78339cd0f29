# frozen_string_literal: true

require_relative "../test_helper"
require "contprof/exporters/pprof_select"

# Contprof::PprofSelect (the pprofs Pyroscope gets) against the profile it comes from,
# every output read by our decoder and by `go tool pprof`.
class PprofSelectTest < Minitest::Test
  CPU = { keep: [%w[cpu-samples samples count], %w[cpu-time cpu nanoseconds]], period_type: %w[cpu nanoseconds],
          period: 10_000_000 }.freeze
  WALL = { keep: [%w[wall-time wall nanoseconds]], period_type: %w[wall nanoseconds], period: 10_000_000 }.freeze

  def recorded
    recorder = Contprof::StackRecorder.new
    frames = [["Work#run", "/app/work.rb", 3], ["<main>", "/app/main.rb", 1]]
    recorder.record_sample(frames, { "cpu-time" => 7_000_000, "cpu-samples" => 2, "wall-time" => 8_000_000 },
                           { "thread id" => "1", "thread name" => "main" })
    recorder.record_sample([["Kernel#sleep", "<internal:kernel>", 0], *frames], { "wall-time" => 50_000_000 },
                           { "thread id" => "2" })
    recorder.record_sample(frames, { "cpu-time" => -5, "cpu-samples" => 1, "wall-time" => 0 }, { "thread id" => "3" })
    recorder.serialize[2]
  end

  def test_values_labels_and_stacks_survive_and_only_the_chosen_types_remain
    bytes = recorded
    source = decode_profile(bytes)
    cpu, wall = Contprof::PprofSelect.call(bytes, [CPU, WALL]).map { |bytes| decode_profile(bytes) }
    assert_equal %w[samples cpu], cpu.sample_type_names
    assert_equal %w[count nanoseconds], cpu.sample_types.map(&:unit)
    assert_equal ["cpu", "nanoseconds", 10_000_000], [cpu.period_type.type, cpu.period_type.unit, cpu.period]
    assert_equal source.total("cpu-time"), cpu.total("cpu")
    assert_equal 7_000_000 - 5, cpu.total("cpu"), "a negative value is carried as it is"
    assert_equal source.total("cpu-samples"), cpu.total("samples")
    assert_equal %w[wall], wall.sample_type_names
    assert_equal "wall", wall.period_type.type
    assert_equal source.total("wall-time"), wall.total("wall")
    assert_equal source.stacks_by_function("wall-time"), wall.stacks_by_function("wall")
    # The sleeping sample has no CPU: it is not in the CPU profile; the zero-wall one not in wall.
    assert_equal 2, cpu.sample_count
    assert_equal 2, wall.sample_count
    assert_equal [{ "thread id" => "1", "thread name" => "main" }, { "thread id" => "3" }], cpu.labels
    assert_equal source.time_nanos, wall.time_nanos
    assert_equal source.duration_nanos, wall.duration_nanos
  end

  def test_a_big_profile_keeps_its_totals
    require_relative "../support/synthetic_profiles"
    bytes = SyntheticProfiles.wide(stacks: 2_000)
    source = Contprof::Pprof.decode(bytes)
    cpu, wall = Contprof::PprofSelect.call(bytes, [CPU, WALL]).map { |out| decode_profile(out) }
    assert_equal source.stacks_by_function("cpu-time").reject { |_, v| v.zero? }, cpu.stacks_by_function("cpu")
    assert_equal source.stacks_by_function("wall-time").reject { |_, v| v.zero? }, wall.stacks_by_function("wall")
  end

  # Pyroscope's labels: Prometheus names, and no timeline timestamps (one series per sample).
  def test_prometheus_names_without_timestamps
    recorder = Contprof::StackRecorder.new
    frames = [["Work#run", "/app/work.rb", 3]]
    3.times do |i|
      recorder.record_sample(frames, { "cpu-time" => 1_000, "cpu-samples" => 1, "wall-time" => 2_000 },
                             { "thread id" => "1", "thread state" => "running", "end_timestamp_ns" => 1_000_000 + i })
    end
    bytes = recorder.serialize[2]
    assert_equal 3, decode_profile(bytes).sample_count
    wall = decode_profile(Contprof::PprofSelect.call(bytes, [WALL], label_names: :prometheus).first)
    assert_equal [{ "thread_id" => "1", "thread_state" => "running" }], wall.labels.uniq
    assert_equal 6_000, wall.total("wall")
  end

  def test_bad_input_is_an_error_naming_the_problem
    error = assert_raises(Contprof::PprofSelect::Error) do
      Contprof::PprofSelect.call(recorded, [{ keep: [%w[alloc-bytes x y]], period_type: %w[a b], period: 1 }])
    end
    assert_match(/no sample type "alloc-bytes" \(the profile has cpu-time, cpu-samples, wall-time, wall-samples\)/, error.message)
    assert_raises(Contprof::PprofSelect::Error) { Contprof::PprofSelect.call("\x1f\x8bnot gzip".b, [CPU]) }
    truncated = Zlib.gunzip(recorded)[0, 40]
    assert_raises(Contprof::PprofSelect::Error) { Contprof::PprofSelect.call(truncated, [CPU]) }
  end
end
