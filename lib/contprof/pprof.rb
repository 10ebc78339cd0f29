# frozen_string_literal: true

require "zlib"
require "stringio"

module Contprof
  # Reads pprof profiles (gzip-compressed or plain perftools.profiles.Profile protobuf)
  # into plain Ruby objects. Used by `contprof report` and by the tests, which check every
  # profile with this reader and with Go's reference reader (`go tool pprof`).
  #
  # Independent of the C encoder on purpose: it follows the protobuf wire format and
  # accepts packed and unpacked repeated fields alike.
  module Pprof
    class DecodeError < Contprof::Error; end

    Frame = Struct.new(:function_name, :file_name, :line) do
      def to_s
        "#{function_name} (#{file_name}:#{line})"
      end
    end

    # locations: Array of Frame, leaf first; values: Hash type => Integer;
    # labels: Hash key => String or Integer.
    Sample = Struct.new(:locations, :values, :labels)

    ValueType = Struct.new(:type, :unit)

    class Profile
      attr_reader :sample_types, :samples, :time_nanos, :duration_nanos, :period_type, :period, :comments

      def initialize(sample_types:, samples:, time_nanos:, duration_nanos:, period_type:, period:, comments:)
        @sample_types = sample_types
        @samples = samples
        @time_nanos = time_nanos
        @duration_nanos = duration_nanos
        @period_type = period_type
        @period = period
        @comments = comments
      end

      def sample_type_names
        sample_types.map(&:type)
      end

      def start_time
        Time.at(time_nanos / 1_000_000_000, time_nanos % 1_000_000_000, :nsec).utc
      end

      # Sum of one sample type over all samples (optionally those matching a block).
      def total(type)
        samples.sum { |sample| !block_given? || yield(sample) ? sample.values.fetch(type) : 0 }
      end

      # Hash of stack (Array of function names, leaf first) => summed value of `type`.
      def stacks(type)
        result = Hash.new(0)
        samples.each { |sample| result[sample.locations.map(&:function_name)] += sample.values.fetch(type) }
        result
      end
    end

    class << self
      def decode(bytes)
        bytes = bytes.b
        bytes = gunzip(bytes) if bytes.start_with?("\x1f\x8b".b)
        parse_profile(bytes)
      end

      def decode_file(path)
        decode(File.binread(path))
      end

      private

      def gunzip(bytes)
        Zlib::GzipReader.new(StringIO.new(bytes)).read
      rescue Zlib::Error => e
        raise DecodeError, "invalid gzip data: #{e.message}"
      end

      # Yields (field number, wire type, value) for each field of a message, where value
      # is an Integer for varints and a binary String for length-delimited fields.
      def each_field(data)
        reader = Reader.new(data)
        until reader.eof?
          key = reader.varint
          field = key >> 3
          wire_type = key & 7
          value =
            case wire_type
            when 0 then reader.varint
            when 1 then reader.bytes(8)
            when 2 then reader.bytes(reader.varint)
            when 5 then reader.bytes(4)
            else raise DecodeError, "unsupported protobuf wire type #{wire_type}"
            end
          yield field, wire_type, value
        end
      end

      def repeated_varints(wire_type, value)
        return [value] if wire_type.zero?

        reader = Reader.new(value)
        list = []
        list << reader.varint until reader.eof?
        list
      end

      def signed(value)
        value >= 2**63 ? value - 2**64 : value
      end

      def parse_profile(data)
        raw_sample_types = []
        raw_samples = []
        locations = {}
        functions = {}
        strings = []
        fields = { time_nanos: 0, duration_nanos: 0, period: 0, period_type: nil, comments: [] }
        each_field(data) do |field, wire_type, value|
          case field
          when 1 then raw_sample_types << parse_value_type(value)
          when 2 then raw_samples << parse_sample(value)
          when 4 then (location = parse_location(value)) && locations[location[:id]] = location
          when 5 then (function = parse_function(value)) && functions[function[:id]] = function
          when 6 then strings << value.dup.force_encoding(Encoding::UTF_8)
          when 9 then fields[:time_nanos] = signed(value)
          when 10 then fields[:duration_nanos] = signed(value)
          when 11 then fields[:period_type] = parse_value_type(value)
          when 12 then fields[:period] = signed(value)
          when 13 then fields[:comments].concat(repeated_varints(wire_type, value))
          end
        end
        raise DecodeError, "string_table[0] must be the empty string" unless strings.first == ""

        string = ->(index) { strings.fetch(index) { raise DecodeError, "string index #{index} out of range" } }
        sample_types = raw_sample_types.map { |t| ValueType.new(string.(t[0]), string.(t[1])) }
        frames = {}
        samples = raw_samples.map do |raw|
          if raw[:values].size != sample_types.size
            raise DecodeError, "a sample has #{raw[:values].size} values for #{sample_types.size} sample types"
          end

          stack = raw[:location_ids].map do |id|
            frames[id] ||= begin
              location = locations.fetch(id) { raise DecodeError, "unknown location id #{id}" }
              function = functions.fetch(location[:function_id]) { raise DecodeError, "unknown function id" }
              Frame.new(string.(function[:name]), string.(function[:filename]), location[:line]).freeze
            end
          end
          labels = raw[:labels].to_h do |key, str, num|
            [string.(key), str.zero? ? num : string.(str)]
          end
          Sample.new(stack, sample_types.map(&:type).zip(raw[:values].map { |v| signed(v) }).to_h, labels)
        end
        period_type = fields[:period_type] && ValueType.new(string.(fields[:period_type][0]), string.(fields[:period_type][1]))
        Profile.new(sample_types: sample_types, samples: samples, time_nanos: fields[:time_nanos],
                    duration_nanos: fields[:duration_nanos], period_type: period_type, period: fields[:period],
                    comments: fields[:comments].map { |i| string.(i) })
      end

      def parse_value_type(data)
        type = unit = 0
        each_field(data) do |field, _, value|
          type = value if field == 1
          unit = value if field == 2
        end
        [type, unit]
      end

      def parse_sample(data)
        sample = { location_ids: [], values: [], labels: [] }
        each_field(data) do |field, wire_type, value|
          case field
          when 1 then sample[:location_ids].concat(repeated_varints(wire_type, value))
          when 2 then sample[:values].concat(repeated_varints(wire_type, value))
          when 3
            key = str = num = 0
            each_field(value) do |label_field, _, label_value|
              case label_field
              when 1 then key = label_value
              when 2 then str = label_value
              when 3 then num = signed(label_value)
              end
            end
            sample[:labels] << [key, str, num]
          end
        end
        sample
      end

      def parse_location(data)
        location = { id: 0, function_id: 0, line: 0 }
        each_field(data) do |field, _, value|
          case field
          when 1 then location[:id] = value
          when 4
            # With inlined frames there are several Line entries; the last is the caller.
            location[:line] = 0
            each_field(value) do |line_field, _, line_value|
              location[:function_id] = line_value if line_field == 1
              location[:line] = signed(line_value) if line_field == 2
            end
          end
        end
        location
      end

      def parse_function(data)
        function = { id: 0, name: 0, filename: 0 }
        each_field(data) do |field, _, value|
          case field
          when 1 then function[:id] = value
          when 2 then function[:name] = value
          when 4 then function[:filename] = value
          end
        end
        function
      end
    end

    # A cursor over binary protobuf data.
    class Reader
      def initialize(data)
        @data = data
        @position = 0
      end

      def eof?
        @position >= @data.bytesize
      end

      def varint
        result = 0
        shift = 0
        loop do
          byte = @data.getbyte(@position) or raise DecodeError, "truncated varint"
          @position += 1
          result |= (byte & 0x7f) << shift
          return result if byte < 0x80

          shift += 7
          raise DecodeError, "varint longer than 10 bytes" if shift > 63
        end
      end

      def bytes(length)
        raise DecodeError, "truncated field (#{length} bytes wanted)" if @position + length > @data.bytesize

        slice = @data.byteslice(@position, length)
        @position += length
        slice
      end
    end
    private_constant :Reader
  end
end
