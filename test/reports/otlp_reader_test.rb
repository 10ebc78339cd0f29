# frozen_string_literal: true

# The OTLP profiles reader (Contprof::Otlp): bodies built here by a small protobuf writer
# of our own (independent of the reader and of Contprof::Protobuf) decode to the
# Pprof::Profile the pprof reader would make of the same samples; `contprof report` on a
# .otlp file prints what it prints for the same samples written as pprof.

require_relative "../test_helper"
require "tmpdir"
require "zlib"
require "contprof/reports/otlp"
require "contprof/reports/report"
require "contprof/reports/profiles"

class OtlpReaderTest < Minitest::Test
  EXE = File.expand_path("../../exe/contprof", __dir__)
  T0 = 1_767_225_600_000_000_000 # 2026-01-01T00:00:00Z in nanoseconds

  # Protocol Buffers' wire format, written by hand.
  module Wire
    module_function

    # (Negative int32 and int64: 10 bytes of two's complement.)
    def varint(value) = Contprof::Protobuf::Writer.varint(+"".b, value)

    def key(field, wire) = varint((field << 3) | wire)
    def int(field, value) = key(field, 0) + varint(value)
    def bytes(field, data) = key(field, 2) + varint(data.bytesize) + data.b
    def fixed64(field, value) = key(field, 1) + [value].pack("Q<")
    def double(field, value) = key(field, 1) + [value].pack("E")

    # A repeated integer field, packed or as one field per value.
    def ints(field, values, packed)
      return "".b if values.empty?

      packed ? bytes(field, values.map { |v| varint(v) }.join) : values.map { |v| int(field, v) }.join
    end

    def fixed64s(field, values, packed)
      return "".b if values.empty?

      packed ? bytes(field, values.pack("Q<*")) : values.map { |v| fixed64(field, v) }.join
    end
  end

  # Builds an OTLP ExportProfilesServiceRequest: profiles are added with their samples as
  # readable values (frames, attribute Hashes) and the dictionary's tables are made from
  # them, each entry once, index 0 the zero value.
  class Body
    include Wire

    Profile = Struct.new(:type, :unit, :time, :duration, :period, :samples, :resource)

    def initialize(packed: true, dictionary_first: false)
      @packed = packed
      @dictionary_first = dictionary_first
      @profiles = []
      @strings = { "" => 0 }
      @functions = { [0, 0] => 0 }
      @locations = { [] => 0 }
      @stacks = { [] => 0 }
      @attributes = { nil => 0 }
    end

    # `period`: [type, unit, period] or nil. `resource`: the index of its ResourceProfiles.
    def profile(type, unit, time: T0, duration: 10_000_000_000, period: nil, resource: 0)
      profile = Profile.new(type, unit, time, duration, period, [], resource)
      @profiles << profile
      yield SampleAdder.new(self, profile)
      self
    end

    # Adds to `profile` a sample of `stack` (leaf first; a location is a frame [name, file,
    # line] or an Array of frames, its inlined lines innermost first).
    SampleAdder = Struct.new(:body, :profile) do
      def sample(stack, attributes: {}, values: nil, timestamps: nil, link: nil)
        profile.samples << body.sample_bytes(stack, attributes, values, timestamps, link)
      end

      # A Sample message's bytes as given (for malformed ones).
      def raw(bytes)
        profile.samples << bytes
      end
    end

    def sample_bytes(stack, attributes, values, timestamps, link)
      out = int(1, stack_index(stack))
      out << ints(2, attributes.map { |key, value| attribute_index(key, value) }, @packed)
      out << int(3, link) if link
      out << ints(4, values, @packed) if values
      out << fixed64s(5, timestamps, @packed) if timestamps
      out
    end

    def encode(resource_attributes: {})
      resources = @profiles.group_by(&:resource).sort.map do |_, profiles|
        scope = bytes(1, bytes(1, "contprof") + bytes(2, "1.0")) +
                profiles.map { |p| bytes(2, profile_bytes(p)) }.join
        resource = resource_attributes.map { |key, value| bytes(1, bytes(1, key) + bytes(2, any_value(value))) }.join
        bytes(1, resource) + bytes(2, scope) + bytes(3, "https://opentelemetry.io/schemas/1.30.0")
      end
      parts = resources.map { |r| bytes(1, r) }
      dictionary = bytes(2, dictionary_bytes)
      @dictionary_first ? dictionary + parts.join : parts.join + dictionary
    end

    private

    def profile_bytes(profile)
      out = bytes(1, int(1, string(profile.type)) + int(2, string(profile.unit)))
      profile.samples.each { |sample| out << bytes(2, sample) }
      out << fixed64(3, profile.time) << int(4, profile.duration)
      if profile.period
        type, unit, period = profile.period
        out << bytes(5, int(1, string(type)) + int(2, string(unit))) << int(6, period)
      end
      out << bytes(7, "\x01".b * 16) << bytes(9, "pprof") # fields the reader skips
    end

    # Every table, entry 0 (the zero value) included; a mapping and a link the reader skips.
    def dictionary_bytes
      out = bytes(1, "".b) + bytes(1, int(1, 0x400000) + int(2, 0x500000) + int(4, string("/usr/bin/ruby")))
      @locations.each_key do |lines|
        location = lines.empty? ? "".b : int(1, 1) + int(2, 0x401000)
        lines.each { |function, line| location << bytes(3, int(1, function) + int(2, line) + int(3, 7)) }
        out << bytes(2, location)
      end
      @functions.each_key do |name, file|
        out << bytes(3, name.zero? ? "".b : int(1, name) + int(2, name) + int(3, file) + int(4, 1))
      end
      out << bytes(4, "".b)
      @strings.each_key { |s| out << bytes(5, s) }
      @attributes.each_key do |key, value|
        out << bytes(6, key ? int(1, @strings.fetch(key)) + bytes(2, any_value(value)) : "".b)
      end
      @stacks.each_key { |locations| out << bytes(7, ints(1, locations, @packed)) }
      out
    end

    def any_value(value)
      case value
      when String then bytes(1, value)
      when true, false then int(2, value ? 1 : 0)
      when Integer then int(3, value)
      when Float then double(4, value)
      when Array then bytes(5, value.map { |v| bytes(1, any_value(v)) }.join)
      end
    end

    def string(text) = @strings[text] ||= @strings.size

    def stack_index(stack)
      locations = stack.map do |location|
        frames = location.first.is_a?(String) ? [location] : location
        lines = frames.map { |name, file, line| [@functions[[string(name), string(file)]] ||= @functions.size, line] }
        @locations[lines] ||= @locations.size
      end
      @stacks[locations] ||= @stacks.size
    end

    def attribute_index(key, value)
      string(key) # interned now: the string table is written before the attribute table
      @attributes[[key, value]] ||= @attributes.size
    end
  end

  MAIN = ["<main>", "/app/main.rb", 1].freeze
  ROUTER = ["Router#call", "/app/router.rb", 5].freeze
  CHECKOUT = [["Shop#checkout", "/app/shop.rb", 12], ROUTER, MAIN].freeze
  RENDER = [["Shop#render", "/app/shop.rb", 40], ROUTER, MAIN].freeze
  SLEEP = [["Kernel#sleep", "<internal:kernel>", 0], ["Router#call", "/app/router.rb", 6], MAIN].freeze
  THREAD1 = { "thread.id" => 1, "thread.name" => "web-1" }.freeze
  THREAD2 = { "thread.name" => "web-2", "thread.id" => 2 }.freeze

  # Two sample types, each its own OTLP Profile, in two resources; the same (stack,
  # attributes) in both make one row. Attributes given in another order are the same set.
  def two_type_body(packed: true, dictionary_first: false)
    body = Body.new(packed: packed, dictionary_first: dictionary_first)
    body.profile("cpu-time", "nanoseconds", time: T0 + 1_000, duration: 10_000_000_000,
                                            period: ["cpu-time", "nanoseconds", 10_000_000]) do |p|
      p.sample(CHECKOUT, attributes: THREAD1, values: [30_000_000])
      p.sample(RENDER, attributes: THREAD1, values: [10_000_000, 2_345_678]) # aggregated: summed
      p.sample(CHECKOUT, attributes: THREAD2, values: [5_000_000], link: 0)
      p.sample(CHECKOUT, attributes: THREAD1, values: [1]) # the same row again
    end
    body.profile("wall-time", "nanoseconds", time: T0, duration: 10_000_000_500, resource: 1) do |p|
      p.sample(CHECKOUT, attributes: THREAD1, values: [31_000_000])
      p.sample(SLEEP, attributes: THREAD1.merge("thread.state" => "sleeping"), values: [500_000_000])
      p.sample(CHECKOUT, attributes: THREAD2.to_a.reverse.to_h, values: [6_000_000])
    end
    body.encode(resource_attributes: { "service.name" => "shop", "process.pid" => 42 })
  end

  def rows(profile)
    Array.new(profile.sample_count) do |i|
      [profile.stacks[i].map { |id| profile.frames[id].to_a }, profile.values[i], profile.labels[i]]
    end
  end

  def names(stack) = stack.map(&:first)

  def test_two_sample_types_merge_into_one_row_per_stack_and_attributes
    profile = Contprof::Otlp.decode(two_type_body)
    assert_equal [%w[cpu-time nanoseconds], %w[wall-time nanoseconds]], profile.sample_types.map(&:to_a)
    assert_equal T0, profile.time_nanos
    assert_equal 10_000_001_000, profile.duration_nanos # cpu-time's profile ends last
    assert_equal %w[cpu-time nanoseconds], profile.period_type.to_a
    assert_equal 10_000_000, profile.period
    assert_equal [], profile.comments
    t1 = { "thread id" => "1", "thread name" => "web-1" }
    t2 = { "thread id" => "2", "thread name" => "web-2" }
    expected = [[CHECKOUT, [30_000_001, 31_000_000], t1], [RENDER, [12_345_678, 0], t1],
                [CHECKOUT, [5_000_000, 6_000_000], t2],
                [SLEEP, [0, 500_000_000], t1.merge("thread state" => "sleeping")]]
    assert_equal expected.sort, rows(profile).sort
    assert_equal({ %w[Shop#checkout Router#call <main>] => 35_000_001, %w[Shop#render Router#call <main>] => 12_345_678,
                   %w[Kernel#sleep Router#call <main>] => 0 }, profile.stacks_by_function("cpu-time"))
    assert_equal 47_345_679, profile.total("cpu-time")
    assert_equal 537_000_000, profile.total("wall-time")
    # Equal label sets are one frozen Hash; equal stacks one Array.
    checkout_t1 = rows(profile).index { |stack, values, _| stack == CHECKOUT && values[1] == 31_000_000 }
    render_t1 = rows(profile).index { |stack, _, _| stack == RENDER }
    assert_same profile.labels[checkout_t1], profile.labels[render_t1]
    assert profile.labels.all?(&:frozen?)
    checkout_t2 = rows(profile).index { |stack, values, _| stack == CHECKOUT && values[0] == 5_000_000 }
    assert_same profile.stacks[checkout_t1], profile.stacks[checkout_t2]
    # The top list, exactly: flat per function and type.
    top = Contprof::Report.top(profile, "wall-time", limit: 10).map { |row| [row.name, row.flat, row.cumulative] }
    assert_equal [["Kernel#sleep", 500_000_000, 500_000_000], ["Shop#checkout", 37_000_000, 37_000_000],
                  ["<main>", 0, 537_000_000], ["Router#call", 0, 537_000_000]], top # (no zero rows, as Go's)
  end

  def test_packed_and_unpacked_fields_and_field_order_read_the_same
    packed = Contprof::Otlp.decode(two_type_body)
    [two_type_body(packed: false), two_type_body(dictionary_first: true)].each do |body|
      other = Contprof::Otlp.decode(body)
      assert_equal rows(packed).sort, rows(other).sort
      assert_equal packed.sample_types, other.sample_types
    end
  end

  def test_gzip_body_and_resource_attributes
    body = two_type_body
    assert_equal rows(Contprof::Otlp.decode(body)), rows(Contprof::Otlp.decode(Zlib.gzip(body)))
    assert_equal({ "service.name" => "shop", "process.pid" => 42 }, Contprof::Otlp.resource_attributes(Zlib.gzip(body)))
  end

  def test_timestamps_make_one_row_per_event_with_end_timestamp_ns
    body = Body.new
    body.profile("wall-time", "nanoseconds") do |p|
      p.sample(CHECKOUT, attributes: THREAD1, values: [10_000, 20_000], timestamps: [T0 + 10, T0 + 20])
      p.sample(CHECKOUT, attributes: THREAD1, values: [70_000]) # no timestamp: the aggregated row
    end
    body.profile("cpu-samples", "count") do |p|
      p.sample(CHECKOUT, attributes: THREAD1, timestamps: [T0 + 20, T0 + 30, T0 + 30]) # each counts 1
    end
    profile = Contprof::Otlp.decode(body.encode)
    t1 = { "thread id" => "1", "thread name" => "web-1" }
    at = ->(time) { t1.merge("end_timestamp_ns" => time) }
    assert_equal [[[10_000, 0], at.(T0 + 10)], [[20_000, 1], at.(T0 + 20)], [[70_000, 0], t1],
                  [[0, 2], at.(T0 + 30)]].sort_by(&:to_s),
                 rows(profile).map { |_, values, labels| [values, labels] }.sort_by(&:to_s)
    assert Contprof::Report::Profiles.timeline?(profile)
    i = profile.labels.index { |labels| labels["end_timestamp_ns"] == T0 + 20 }
    assert_equal [T0 + 20 - 20_000, T0 + 20], Contprof::Report::Profiles.stretch(profile, i, 0)
  end

  def test_attribute_values_and_semantic_convention_keys
    attributes = { "thread.id" => 7, "thread.name" => "worker", "thread.state" => "running", "span id" => 123,
                   "trace endpoint" => "GET /", "sampled" => true, "ratio" => 0.5, "negative" => -3, "tags" => %w[a b] }
    body = Body.new
    body.profile("cpu-time", "nanoseconds") { |p| p.sample(CHECKOUT, attributes: attributes, values: [-5, 8]) }
    profile = Contprof::Otlp.decode(body.encode)
    assert_equal [{ "thread id" => "7", "thread name" => "worker", "thread state" => "running", "span id" => 123,
                    "trace endpoint" => "GET /", "sampled" => "true", "ratio" => "0.5", "negative" => -3,
                    "tags" => '["a", "b"]' }], profile.labels
    assert_equal [[3]], profile.values # -5 (a 10-byte varint) + 8
    assert_equal ["worker (7)"], Contprof::Report::Profiles.thread_names(profile)
    assert_equal 1, Contprof::Report::Profiles.filter(profile, threads: ["7"]).sample_count
  end

  def test_inlined_lines_are_frames_innermost_first
    inlined = [["Array#sum", "<internal:array>", 3], ["Cart#total", "/app/cart.rb", 8]]
    body = Body.new
    body.profile("cpu-time", "nanoseconds") { |p| p.sample([inlined, ROUTER, MAIN], values: [9]) }
    profile = Contprof::Otlp.decode(body.encode)
    assert_equal [[inlined[0], inlined[1], ROUTER, MAIN]], rows(profile).map(&:first)
    assert_equal [{}], profile.labels
  end

  def test_format_of_tells_pprof_from_otlp_by_content
    otlp = two_type_body
    pprof = pprof_bytes([[CHECKOUT, { "cpu-time" => 1 }, {}]])
    assert_equal :otlp, Contprof::ProfileFormat.of(otlp)
    assert_equal :otlp, Contprof::ProfileFormat.of(two_type_body(dictionary_first: true))
    assert_equal :pprof, Contprof::ProfileFormat.of(Zlib.gunzip(pprof))
    assert_equal :pprof, Contprof::ProfileFormat.of(File.binread(__FILE__))
    assert_nil Contprof::ProfileFormat.of("".b)
    assert_nil Contprof::ProfileFormat.of("\x0a\x05\x0a".b) # field 1 cut short
    # A pprof Profile with an empty first ValueType is still told by its string table.
    assert_equal :pprof, Contprof::ProfileFormat.of("\x0a\x00\x12\x02\x08\x01\x32\x00".b)
    # ProfileFormat.decode reads both, gzip-compressed or not; the hint decides only what content does not.
    assert_equal rows(Contprof::Pprof.decode(pprof)), rows(Contprof::ProfileFormat.decode(pprof, otlp_hint: true))
    assert_equal rows(Contprof::Otlp.decode(otlp)), rows(Contprof::ProfileFormat.decode(Zlib.gzip(otlp)))
    assert_equal [], Contprof::Otlp.decode("".b).sample_types # a valid, empty request
    error = assert_raises(Contprof::Otlp::DecodeError) { Contprof::ProfileFormat.decode("".b, otlp_hint: true) }
    assert_equal "the body holds no Profile", error.message
    error = assert_raises(Contprof::Pprof::DecodeError) { Contprof::ProfileFormat.decode("".b) }
    assert_match(/string_table\[0\]/, error.message) # read as pprof
    error = assert_raises(Contprof::Otlp::DecodeError) { Contprof::ProfileFormat.decode("\x0b".b, otlp_hint: true) }
    assert_equal "nor a pprof profile: unsupported protobuf wire type 3", error.message
  end

  def test_malformed_bodies_raise_decode_errors_that_say_why
    bad = ->(bytes) { assert_raises(Contprof::Otlp::DecodeError) { Contprof::Otlp.decode(bytes) }.message }
    with_sample = lambda do |sample|
      Body.new.profile("cpu-time", "nanoseconds") do |p|
        p.sample(CHECKOUT, attributes: THREAD1, values: [1])
        p.raw(sample)
      end.encode
    end
    assert_match(/stack_table index -1 out of range/, bad.(with_sample.(Wire.int(1, -1))))
    assert_match(/stack_table index 9 out of range/, bad.(with_sample.(Wire.int(1, 9))))
    assert_match(/attribute_table index 99 out of range/, bad.(with_sample.(Wire.int(1, 1) + Wire.int(2, 99))))
    assert_match(/Sample field 1 has wire type 2/, bad.(with_sample.(Wire.bytes(1, "x"))))
    three_values_two_timestamps = Wire.ints(4, [1, 2, 3], true) + Wire.fixed64s(5, [5, 6], true)
    assert_match(/3 values for 2 timestamps/, bad.(with_sample.(three_values_two_timestamps)))
    assert_match(/packed Sample.timestamps_unix_nano of 7 bytes/, bad.(with_sample.(Wire.bytes(5, "1234567"))))
    assert_match(/truncated varint/, bad.("\x0a\x80".b))
    assert_match(/truncated field/, bad.("\x0a\x05\x0a".b))
    assert_match(/resource_profiles has wire type 0/, bad.("\x08\x01".b))
    assert_match(/wire type 3/, bad.("\x0b".b))
    assert_match(/string_table\[0\] must be the empty string/, bad.(Wire.bytes(2, Wire.bytes(5, "x"))))
    assert_match(/invalid gzip data/, bad.("\x1f\x8b\x08garbage".b))
    deep = Wire.bytes(1, "x")
    40.times { deep = Wire.bytes(5, Wire.bytes(1, deep)) }
    attribute = Wire.bytes(6, Wire.int(1, 1) + Wire.bytes(2, deep))
    sample = Wire.bytes(2, Wire.bytes(2, Wire.int(1, 0) + Wire.int(2, 1) + Wire.int(4, 1)))
    nested = Wire.bytes(1, Wire.bytes(2, Wire.bytes(2, sample))) +
             Wire.bytes(2, Wire.bytes(5, "") + Wire.bytes(5, "k") + Wire.bytes(6, "") + attribute)
    assert_match(/nested more than 16 deep/, bad.(nested))
  end

  # Truncations, bit flips and random bytes raise DecodeError and nothing else, quickly.
  def test_garbage_raises_only_decode_error
    body = two_type_body(packed: false) + Body.new.profile("wall-time", "ns") do |p|
      p.sample(SLEEP, attributes: THREAD2, values: [1, 2], timestamps: [3, 4])
    end.encode
    random = Random.new(1234)
    inputs = (0...body.bytesize).step(3).map { |n| body.byteslice(0, n) }
    inputs += Array.new(1500) do
      bytes = body.dup
      random.rand(1..4).times { bytes.setbyte(random.rand(bytes.bytesize), random.rand(256)) }
      bytes
    end
    inputs += Array.new(500) { random.bytes(random.rand(1..200)) }
    inputs.each do |bytes|
      profile = Contprof::Otlp.decode(bytes)
      assert_kind_of Contprof::Pprof::Profile, profile # what decodes is well formed:
      assert_equal profile.sample_count, profile.values.size
      profile.stacks.each { |stack| stack.each { |id| assert profile.frames.fetch(id) } }
    rescue Contprof::Otlp::DecodeError
      # expected for most
    end
  end

  def test_contprof_report_on_an_otlp_file_prints_what_it_prints_for_the_same_pprof
    Dir.mktmpdir("contprof-otlp") do |dir|
      otlp = File.join(dir, "profile.otlp")
      File.binwrite(otlp, Zlib.gzip(three_type_body))
      t1 = { "thread id" => "1", "thread name" => "web-1" }
      t2 = { "thread id" => "2", "thread name" => "web-2" }
      pprof = File.join(dir, "profile.pprof")
      File.binwrite(pprof, pprof_bytes(
        [[CHECKOUT, { "cpu-time" => 30_000_000, "cpu-samples" => 3, "wall-time" => 31_000_000 }, t1],
         [RENDER, { "cpu-time" => 12_345_678, "cpu-samples" => 1, "wall-time" => 12_400_000 }, t1],
         [CHECKOUT, { "cpu-time" => 5_000_000, "wall-time" => 6_000_000 }, t2],
         [SLEEP, { "wall-time" => 500_000_000 }, t1]]
      ))
      out, err, status = Open3.capture3(RbConfig.ruby, EXE, "report", otlp)
      assert status.success?, err
      assert_equal "cpu-time: 47.35ms in all, 4 records, 2026-01-01T00:00:00Z + 10.00s\n", out.lines.first
      # (CPU shares with their samples and standard errors: p (1 - p) sqrt(1/3 + 1/1) of 3
      # and 1 CPU samples; the wall time has no count of its samples here, so no error bar.)
      assert_equal <<~TOP, out.lines.grep_v(/ in all, /).join
        \s     flat  flat%   sum%        cum   cum%  samples  ± flat%
        \s     35ms 73.92% 73.92%       35ms 73.92%        3   ±22.3%  Shop#checkout
        \s  12.35ms 26.08%   100%    12.35ms 26.08%        1   ±22.3%  Shop#render
        \s        0     0%   100%    47.35ms   100%        0      ±0%  <main>
        \s        0     0%   100%    47.35ms   100%        0      ±0%  Router#call

        \s     flat  flat%   sum%        cum   cum%  samples  ± flat%
        \s        3 75.00% 75.00%          3 75.00%        3   ±21.7%  Shop#checkout
        \s        1 25.00%   100%          1 25.00%        1   ±21.7%  Shop#render
        \s        0     0%   100%          4   100%        0      ±0%  <main>
        \s        0     0%   100%          4   100%        0      ±0%  Router#call

        \s     flat  flat%   sum%        cum   cum%
        \s    500ms 91.01% 91.01%      500ms 91.01%  Kernel#sleep
        \s     37ms  6.73% 97.74%       37ms  6.73%  Shop#checkout
        \s  12.40ms  2.26%   100%    12.40ms  2.26%  Shop#render
        \s        0     0%   100%   549.40ms   100%  <main>
        \s        0     0%   100%   549.40ms   100%  Router#call
      TOP
      # The same report of the same samples in pprof, but for the header (the recorder's own time).
      [%w[--top 10], %w[--thread 2], %w[--folded --thread web-1], %w[--by thread\ name]].each do |options|
        ours, err, status = Open3.capture3(RbConfig.ruby, EXE, "report", otlp, *options)
        assert status.success?, err
        theirs, err, status = Open3.capture3(RbConfig.ruby, EXE, "report", pprof, *options)
        assert status.success?, err
        header = /\d+ records, \S+Z \+ [\d.]+s/
        assert_equal theirs.gsub(header, ""), ours.gsub(header, ""), "contprof report #{options.join(" ")}"
      end
      # Told by content, whatever the name; refused with the reason when cut short.
      File.binwrite(unnamed = File.join(dir, "profile.bin"), File.binread(otlp))
      same, err, status = Open3.capture3(RbConfig.ruby, EXE, "report", unnamed)
      assert status.success?, err
      assert_equal out, same
      File.binwrite(otlp, three_type_body.byteslice(0, 200))
      _, err, status = Open3.capture3(RbConfig.ruby, EXE, "report", otlp)
      assert_equal 2, status.exitstatus
      assert_match(/\Acontprof: #{Regexp.escape(otlp)} is not an OTLP profile \(truncated field \(\d+ bytes wanted/, err)
    end
  end

  # Contprof's own OTLP encoding (StackRecorder#serialize with `otlp:`, written in C) reads
  # as the same samples as the pprof written alongside it.
  def test_the_recorders_otlp_reads_as_its_pprof
    recorder = Contprof::StackRecorder.new
    random = Random.new(42)
    frame = -> { ["m#{random.rand(30)}", "/app/f#{random.rand(5)}.rb", random.rand(99)] }
    stacks = Array.new(50) { Array.new(random.rand(1..12)) { frame.() } << MAIN }
    600.times do |i|
      labels = { "thread id" => (i % 4).to_s, "thread name" => "t#{i % 4}" }
      labels["end_timestamp_ns"] = T0 + i * 1000 if i.odd?
      labels["span id"] = 7 + i % 3 if i % 5 == 0
      values = { "cpu-time" => random.rand(10**6), "cpu-samples" => 1, "wall-time" => random.rand(10**7) }
      recorder.record_sample(stacks[random.rand(stacks.size)], values, labels)
    end
    begin
      _, _, pprof, otlp = recorder.serialize(otlp: { resource: [["service.name", "shop"]], scope_name: "contprof",
                                                     scope_version: Contprof::VERSION, gzip: true })
    rescue ArgumentError
      skip "StackRecorder#serialize takes no otlp: (the C side of the OTLP exporter)"
    end
    skip "StackRecorder#serialize returned no OTLP body" unless otlp.is_a?(String)

    from_pprof = Contprof::Pprof.decode(pprof)
    from_otlp = Contprof::ProfileFormat.decode(otlp)
    sample_rows = lambda do |profile|
      profile.samples.map { |s| [s.locations.map(&:to_a), s.values, s.labels] }.sort_by(&:inspect)
    end
    assert_equal sample_rows.(from_pprof), sample_rows.(from_otlp)
    assert_equal [from_pprof.sample_types, from_pprof.time_nanos, from_pprof.duration_nanos],
                 [from_otlp.sample_types, from_otlp.time_nanos, from_otlp.duration_nanos]
    assert_equal "shop", Contprof::Otlp.resource_attributes(otlp)["service.name"]
  end

  private

  def three_type_body
    body = Body.new
    body.profile("cpu-time", "nanoseconds") do |p|
      p.sample(CHECKOUT, attributes: THREAD1, values: [30_000_000])
      p.sample(RENDER, attributes: THREAD1, values: [12_345_678])
      p.sample(CHECKOUT, attributes: THREAD2, values: [5_000_000])
    end
    body.profile("cpu-samples", "count") do |p|
      p.sample(CHECKOUT, attributes: THREAD1, values: [3])
      p.sample(RENDER, attributes: THREAD1, values: [1])
    end
    body.profile("wall-time", "nanoseconds") do |p|
      p.sample(CHECKOUT, attributes: THREAD1, values: [31_000_000])
      p.sample(RENDER, attributes: THREAD1, values: [12_400_000])
      p.sample(CHECKOUT, attributes: THREAD2, values: [6_000_000])
      p.sample(SLEEP, attributes: THREAD1, values: [500_000_000])
    end
    body.encode
  end

  # A pprof profile (gzip-compressed, as the recorder writes it) of [stack, values, labels].
  # A pprof of the samples, with the types of three_type_body.
  def pprof_bytes(samples)
    recorder = Contprof::StackRecorder.new(sample_types: [%w[cpu-time nanoseconds], %w[cpu-samples count], %w[wall-time nanoseconds]])
    samples.each { |stack, values, labels| recorder.record_sample(stack, values, labels) }
    recorder.serialize.last
  end
end
