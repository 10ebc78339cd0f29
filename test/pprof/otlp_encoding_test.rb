# frozen_string_literal: true

require_relative "../test_helper"
require_relative "../support/otlp_protoc"
require "zlib"

# Known answers for the OTLP request the StackRecorder encodes (pprof/pprof_otlp.c), read by
# the reference reader (protoc against OpenTelemetry's .proto files): its totals per
# function and per sample type are exactly those of the pprof of the same samples, with the
# timeline on and off; labels arrive as attributes under the semantic conventions' names.
class OtlpEncodingTest < Minitest::Test
  include CpuHelpers

  Worker = Contprof::Collectors::CpuAndWallTimeWorker
  RESOURCE = [["service.name", "otlp-test"], ["process.pid", Process.pid], ["telemetry.sdk.name", "contprof"]].freeze

  def setup
    skip Contprof.unsupported_reason unless Contprof.supported?
    why = OtlpProtoc.why_not
    skip "OTLP reference reader unavailable: #{why}" if why
  end

  def teardown
    @worker&.stop
  end

  def otlp_options
    { resource: RESOURCE, scope_name: "contprof", scope_version: Contprof::VERSION, gzip: false }
  end

  def otlp_spin(seconds)
    burn_cpu(seconds)
  end

  def otlp_nap(seconds)
    sleep(seconds)
  end

  # Samples of a program with a known shape: a named thread burning CPU, another sleeping.
  def record(timeline:)
    recorder = Contprof::StackRecorder.new
    @worker = Worker.new(recorder: recorder, interval: 0.005, timeline: timeline)
    @worker.start
    threads = [Thread.new { Thread.current.name = "spinner"; otlp_spin(0.3) },
               Thread.new { Thread.current.name = "napper"; otlp_nap(0.3) }]
    threads.each(&:join)
    @worker.stop
    recorder.serialize(otlp: otlp_options)
  end

  # Totals per leaf function and per sample type, and inclusive ones, from our pprof reader.
  def pprof_totals(pprof)
    profile = Contprof::Pprof.decode(pprof)
    totals = Hash.new { |h, k| h[k] = Hash.new(0) }
    inclusive = Hash.new { |h, k| h[k] = Hash.new(0) }
    profile.samples.each do |sample|
      names = sample.locations.map(&:function_name)
      sample.values.each do |type, value|
        next if value.zero?

        totals[type][names.first] += value if names.first
        names.uniq.each { |name| inclusive[type][name] += value }
      end
    end
    [totals, inclusive]
  end

  [false, true].each do |timeline|
    define_method(:"test_totals_per_function_equal_the_pprof_#{timeline ? "with" : "without"}_the_timeline") do
      _start, _finish, pprof, otlp = record(timeline: timeline)
      summary = OtlpProtoc.summary(otlp)
      expected, expected_inclusive = pprof_totals(pprof)
      assert_equal expected.keys.sort, summary["totals"].keys.sort
      expected.each { |type, by_function| assert_equal by_function, summary["totals"][type], type }
      expected_inclusive.each { |type, by_function| assert_equal by_function, summary["inclusive"][type], type }
      assert_operator summary["inclusive"]["cpu-time"]["OtlpEncodingTest#otlp_spin"], :>, 0.1e9
      assert_operator summary["inclusive"]["wall-time"]["OtlpEncodingTest#otlp_nap"], :>, 0.1e9
      if timeline
        assert_operator summary["timestamps"], :>, 0, "timeline samples carry their timestamps"
      else
        assert_equal 0, summary["timestamps"]
      end
      assert_equal({ "service.name" => "otlp-test", "process.pid" => Process.pid, "telemetry.sdk.name" => "contprof" },
                   summary["resource"])
      assert_equal ["contprof"], summary["scope"]["name"]
      assert_includes summary["attributes"], "thread.id"
      assert_includes summary["attributes"], "thread.name"
      assert_includes summary["attributes"], "thread.state"
      refute_includes summary["attributes"], "thread id"
    end
  end

  def test_a_gzipped_request_is_the_same_request
    recorder = Contprof::StackRecorder.new
    Contprof::Collectors::Stack.sample(Thread.current, recorder, { "cpu-time" => 7, "wall-time" => 9 }, { "thread name" => "t" })
    _start, _finish, _pprof, otlp = recorder.serialize(otlp: otlp_options.merge(gzip: true))
    assert otlp.start_with?("\x1f\x8b".b)
    plain = Zlib.gunzip(otlp)
    summary = OtlpProtoc.summary(plain)
    assert_equal 7, summary["totals"]["cpu-time"].values.sum
    assert_equal 9, summary["totals"]["wall-time"].values.sum
  end

  def test_bad_otlp_options_raise_argument_errors_and_lose_no_samples
    recorder = Contprof::StackRecorder.new
    Contprof::Collectors::Stack.sample(Thread.current, recorder, { "wall-time" => 5 }, {})
    assert_raises(TypeError) { recorder.serialize(otlp: "yes") }
    error = assert_raises(ArgumentError) { recorder.serialize(otlp: { resource: [["k", 1.5]] }) }
    assert_match(/String or Integer value/, error.message)
    error = assert_raises(ArgumentError) { recorder.serialize(otlp: { resource: [], colour: "red" }) }
    assert_match(/resource, scope_name, scope_version and gzip/, error.message)
    _start, _finish, pprof = recorder.serialize
    assert_equal 5, Contprof::Pprof.decode(pprof).total("wall-time"), "the samples are still there"
  end
end
