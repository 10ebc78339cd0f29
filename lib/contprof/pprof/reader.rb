# frozen_string_literal: true

require "zlib"
require "stringio"
require_relative "protobuf"
require_relative "profile"

module Contprof
  # Reads pprof profiles (gzip-compressed or plain perftools.profiles.Profile protobuf)
  # into the plain Ruby objects of profile.rb (Pprof::Profile). Used by `contprof report` and by the tests, which check every
  # profile with this reader and with Go's reference reader (`go tool pprof`).
  #
  # Independent of the C encoder on purpose: it follows the protobuf wire format and
  # accepts packed and unpacked repeated fields alike.
  #
  # Written for speed in plain Ruby (`contprof report` reads profiles of tens of thousands
  # of stacks): fields are read by loops over byte positions rather than by nested
  # iterators, and samples are kept compact (frame ids, value arrays, shared label Hashes);
  # the Sample objects of #samples are built only when asked for.
  module Pprof
    GZIP_MAGIC = "\x1f\x8b".b.freeze

    class << self
      def decode(bytes)
        Decoder.new(gunzip(bytes.b)).profile
      end

      def decode_file(path)
        decode(File.binread(path))
      end

      # A profile's period, sample types and total per type, without its stacks, frames or
      # labels (what an index of many files needs: about a third of a decoding's time).
      def summary(bytes)
        Decoder.new(gunzip(bytes.b)).summary
      end

      # `bytes` gunzipped when they are a gzip stream, else as they are (the OTLP reader's
      # too); a bad stream raises `error`.
      def gunzip(bytes, error = DecodeError)
        return bytes unless bytes.start_with?(GZIP_MAGIC)

        Zlib::GzipReader.new(StringIO.new(bytes)).read.b
      rescue Zlib::Error => e
        raise error, "invalid gzip data: #{e.message}"
      end
    end

    # One decoding: the top-level message is read once; samples keep their raw location
    # ids until the locations (which follow them in the file) are known. Functions and
    # locations are kept as positions in the buffer and read in place later.
    class Decoder < Protobuf::Reader
      def initialize(data)
        super(data, DecodeError)
      end

      def profile
        fields = read_fields
        strings = @strings
        raise DecodeError, "string_table[0] must be the empty string" unless strings.first == ""

        string = ->(index) { strings.fetch(index) { raise DecodeError, "string index #{index} out of range" } }
        sample_types = @sample_types.map { |type, unit| ValueType.new(string.(type), string.(unit)) }
        frames, id_to_frame = build_frames(string)
        type_count = sample_types.size
        label_sets = {}
        values = Array.new(@sample_values.size)
        stacks = Array.new(@sample_values.size)
        labels = Array.new(@sample_values.size)
        @sample_values.each_with_index do |row, i|
          if row.size != type_count
            raise DecodeError, "a sample has #{row.size} values for #{type_count} sample types"
          end

          row.map! { |v| v >= 0x8000000000000000 ? v - 0x10000000000000000 : v } if row.any? { |v| v >= 0x8000000000000000 }
          values[i] = row
          stacks[i] = remap_stack(@sample_locations[i], frames, id_to_frame)
          labels[i] = label_sets[@sample_labels[i]] ||= decode_labels(@sample_labels[i], string)
        end
        period_type = fields[:period_type] && ValueType.new(string.(fields[:period_type][0]), string.(fields[:period_type][1]))
        Profile.new(sample_types: sample_types, time_nanos: fields[:time_nanos], duration_nanos: fields[:duration_nanos],
                    period_type: period_type, period: fields[:period], comments: fields[:comments].map { |i| string.(i) },
                    frames: frames, stacks: stacks, values: values, labels: labels)
      end

      def summary
        fields = read_fields
        strings = @strings
        string = ->(index) { strings.fetch(index) { raise DecodeError, "string index #{index} out of range" } }
        sample_types = @sample_types.map { |type, unit| ValueType.new(string.(type), string.(unit)) }
        totals = Array.new(sample_types.size, 0)
        @sample_values.each do |row|
          raise DecodeError, "a sample has #{row.size} values for #{totals.size} sample types" if row.size != totals.size

          row.each_with_index { |value, t| totals[t] += signed(value) }
        end
        Summary.new(sample_types, fields[:time_nanos], fields[:duration_nanos],
                    sample_types.each_with_index.to_h { |type, t| [type.type, totals[t]] },
                    fields[:comments].map { |i| string.(i) })
      end

      private

      # Reads the top-level message. Samples are split into their parts right away
      # (the bulk of a profile); locations and functions are noted as [start, end) spans.
      def read_fields
        data = @data
        size = data.bytesize
        fields = { time_nanos: 0, duration_nanos: 0, period: 0, period_type: nil, comments: [] }
        @sample_types = []
        @sample_locations = []
        @sample_values = []
        @sample_labels = []
        @location_spans = []
        @function_spans = []
        strings = @strings = []
        utf8 = Encoding::UTF_8
        while @pos < size
          key = varint(data)
          wire_type = key & 7
          if wire_type == 2
            length = varint(data)
            pos = @pos
            raise DecodeError, "truncated field (#{length} bytes wanted)" if pos + length > size

            case key >> 3
            when 2 then read_sample(data, pos + length)
            when 6 then strings << data.byteslice(pos, length).force_encoding(utf8)
            when 4 then @location_spans << pos << pos + length
            when 5 then @function_spans << pos << pos + length
            when 1 then @sample_types << read_value_type(data.byteslice(pos, length))
            when 11 then fields[:period_type] = read_value_type(data.byteslice(pos, length))
            when 13 then fields[:comments].concat(packed_varints(data.byteslice(pos, length)))
            end
            @pos = pos + length
          else
            value = skip_or_read(data, wire_type)
            case key >> 3
            when 9 then fields[:time_nanos] = signed(value)
            when 10 then fields[:duration_nanos] = signed(value)
            when 12 then fields[:period] = signed(value)
            when 13 then fields[:comments] << value
            end
          end
        end
        fields
      end

      # A sample from @pos to `finish`.
      def read_sample(data, finish)
        location_ids = []
        values = []
        labels = nil
        while @pos < finish
          key = varint(data)
          field = key >> 3
          if (key & 7) == 2
            length = varint(data)
            pos = @pos
            raise DecodeError, "truncated field (#{length} bytes wanted)" if pos + length > finish

            case field
            when 1 then location_ids.concat(packed_varints(data.byteslice(pos, length)))
            when 2 then values.concat(packed_varints(data.byteslice(pos, length)))
            when 3 then (labels ||= []) << data.byteslice(pos, length)
            end
            @pos = pos + length
          else
            value = skip_or_read(data, key & 7)
            location_ids << value if field == 1
            values << value if field == 2
          end
        end
        raise DecodeError, "truncated sample" if @pos > finish

        @sample_locations << location_ids
        @sample_values << values
        @sample_labels << (labels ? labels.freeze : EMPTY)
      end
      EMPTY = [].freeze

      def decode_labels(raw_labels, string)
        raw_labels.to_h do |raw|
          key = str = num = 0
          each_field(raw) do |field, value|
            case field
            when 1 then key = value
            when 2 then str = value
            when 3 then num = signed(value)
            end
          end
          [string.(key), str.zero? ? num : string.(str)]
        end.freeze
      end

      # Frames by id: an Array indexed by location id when ids are dense enough (as every
      # writer we know makes them), so that stacks need no translation.
      def build_frames(string)
        data = @data
        functions = {}
        each_span(@function_spans) do |finish|
          id = name = filename = 0
          while @pos < finish
            key = varint(data)
            if (key & 7) == 0
              value = varint(data)
              case key >> 3
              when 1 then id = value
              when 2 then name = value
              when 4 then filename = value
              end
            else
              skip_field(data, key & 7, finish)
            end
          end
          functions[id] = [string.(name), string.(filename)]
        end
        by_id = {}
        each_span(@location_spans) do |finish|
          id = function_id = line = 0
          while @pos < finish
            key = varint(data)
            if key == 8 # field 1, varint: the id
              id = varint(data)
            elsif key == 34 # field 4, a Line message
              length = varint(data)
              line_end = @pos + length
              raise DecodeError, "truncated field (#{length} bytes wanted)" if line_end > finish

              # With inlined frames there are several Line entries; the last is the caller.
              line = 0
              while @pos < line_end
                line_key = varint(data)
                if (line_key & 7) == 0
                  value = varint(data)
                  function_id = value if line_key == 8
                  line = signed(value) if line_key == 16
                else
                  skip_field(data, line_key & 7, line_end)
                end
              end
            else
              skip_field(data, key & 7, finish)
            end
          end
          function = functions.fetch(function_id) { raise DecodeError, "unknown function id #{function_id}" }
          by_id[id] = Frame.new(function[0], function[1], line).freeze
        end
        max_id = by_id.keys.max || 0
        if max_id <= 4 * by_id.size + 1024
          frames = Array.new(max_id + 1)
          by_id.each { |id, frame| frames[id] = frame }
          @dense = by_id.size == max_id
          [frames, nil]
        else
          ids = by_id.keys
          [ids.map { |id| by_id[id] }, ids.each_with_index.to_h]
        end
      end

      # Yields the end of each [start, end) span of `spans` (pairs, flat), with @pos at its
      # start.
      def each_span(spans)
        (0...spans.size).step(2) do |i|
          @pos = spans[i]
          yield spans[i + 1]
        end
      end

      # Checks a sample's location ids against the frames (translating them when ids are
      # sparse). The common case costs one minmax: ids 1..n with no hole.
      def remap_stack(location_ids, frames, id_to_frame)
        return location_ids.map { |id| id_to_frame.fetch(id) { raise DecodeError, "unknown location id #{id}" } } if id_to_frame

        low, high = location_ids.minmax
        return location_ids if low.nil? || (@dense && low >= 1 && high < frames.size)

        location_ids.each { |id| raise DecodeError, "unknown location id #{id}" unless id >= 0 && frames[id] }
        location_ids
      end

      def read_value_type(raw)
        type = unit = 0
        each_field(raw) do |field, value|
          type = value if field == 1
          unit = value if field == 2
        end
        [type, unit]
      end
    end
    private_constant :Decoder
  end
end
