# frozen_string_literal: true

require_relative "../pprof/protobuf"
require_relative "../pprof/reader"

module Contprof
  # Reads OpenTelemetry profiles (OTLP, opentelemetry-proto 1.11's
  # opentelemetry.proto.profiles.v1development: an ExportProfilesServiceRequest body as an
  # OTLP exporter sends it, or a ProfilesData file; gzip-compressed or not) into the
  # Pprof::Profile the pprof reader makes, so that every report (`contprof report`, flame
  # graph, speedscope, top lists) reads .otlp files unchanged.
  #
  # OTLP keeps one sample type per Profile and its tables (strings, functions, locations,
  # stacks, attributes) in one dictionary shared by every profile of the request. The
  # Profiles of a request are merged back into pprof's shape: one row per (stack,
  # attributes, timestamp) with one value per sample type.
  #
  # Like the pprof reader, it follows the wire format rather than generated code (packed and
  # unpacked repeated fields alike, unknown fields skipped), reads by loops over byte
  # positions, and raises only DecodeError on malformed input.
  module Otlp
    # Malformed OTLP. A Pprof::DecodeError, so that code catching the pprof reader's errors
    # catches these too.
    class DecodeError < Pprof::DecodeError; end

    # The label Contprof's timeline reads (Report::Profiles::TIMESTAMP_LABEL, not required
    # here: profiles.rb requires this file).
    TIMESTAMP_LABEL = "end_timestamp_ns"

    # OpenTelemetry's semantic-convention attribute keys that Contprof's own labels stand
    # for: the reports' --thread filters and thread lanes read Contprof's names.
    LABEL_KEYS = { "thread.id" => "thread id", "thread.name" => "thread name", "thread.state" => "thread state" }.freeze

    class << self
      # The Pprof::Profile of an OTLP body (gzip-compressed or not).
      def decode(bytes)
        Decoder.new(Pprof.gunzip(bytes.b, DecodeError)).profile
      end

      def decode_file(path)
        decode(File.binread(path))
      end

      # The attributes of the body's resources (of all of them, a later resource's value
      # winning): key => String, Integer, true/false, Float, Array or Hash, as OTLP types them.
      def resource_attributes(bytes)
        Decoder.new(Pprof.gunzip(bytes.b, DecodeError)).resource_attributes
      end
    end

    # One decoding. The top level is read first for where its resource profiles and
    # dictionary are (either may come first); the dictionary's strings are read at once,
    # its other tables noted as spans and each entry read when first used; then each
    # Profile's samples are folded into rows.
    class Decoder < Protobuf::Reader
      EMPTY = [].freeze
      UINT64 = 0xffff_ffff_ffff_ffff
      MAX_NESTING = 16 # AnyValue arrays and lists in attributes: deeper is malformed

      def initialize(data)
        super(data, DecodeError)
        @size = data.bytesize
      end

      def profile
        read_top_level
        read_dictionary
        profiles = profile_spans
        @type_count = profiles.size
        @rows = {}
        @row_values = []
        sample_types = []
        times = []
        period_type = period = nil
        profiles.each_with_index do |(start, finish), type|
          header = read_profile(start, finish, type)
          sample_types << header[:sample_type]
          times << [header[:time], header[:duration]]
          next if period_type || period

          period_type = header[:period_type]
          period = header[:period] if period_type || header[:period].nonzero?
        end
        time_nanos, duration_nanos = covering(times)
        frames, stacks, labels = build_rows
        Pprof::Profile.new(sample_types: sample_types, time_nanos: time_nanos, duration_nanos: duration_nanos,
                           period_type: period_type, period: period || 0, comments: [],
                           frames: frames, stacks: stacks, values: @row_values, labels: labels)
      end

      def resource_attributes
        read_top_level
        read_dictionary
        attributes = {}
        @resource_spans.each_slice(2) do |start, finish|
          each_field_between(start, finish) do |field, wire, value, length|
            next unless field == 1 # Resource

            message!("ResourceProfiles.resource", wire)
            each_field_between(value, value + length) do |f, w, v, l|
              next unless f == 1 # Resource.attributes: KeyValue

              message!("Resource.attributes", w)
              key, any = key_value(v, v + l)
              attributes[key] = any
            end
          end
        end
        attributes
      end

      private

      def message!(name, wire)
        raise DecodeError, "#{name} has wire type #{wire}, not 2 (a length-delimited message)" unless wire == 2
      end

      def varint!(name, wire)
        raise DecodeError, "#{name} has wire type #{wire}, not 0 (a varint)" unless wire.zero?
      end

      # A varint read as unsigned, as the int64 (or int32) it stands for (a negative int32
      # is written as its 64-bit two's complement, in 10 bytes).
      def int64(value)
        value &= UINT64
        value >= 0x8000000000000000 ? value - 0x10000000000000000 : value
      end

      # The values of a repeated integer field, packed (wire type 2) or one per field (0).
      def repeated_varints(name, wire, value, length)
        return [value] if wire.zero?
        raise DecodeError, "#{name} has wire type #{wire}, not 0 or 2 (a varint, or packed varints)" unless wire == 2

        packed_varints(@data.byteslice(value, length))
      end

      def read_top_level
        @resource_spans = []
        @dictionary_spans = []
        each_field_between(0, @size) do |field, wire, value, length|
          case field
          when 1 then message!("resource_profiles", wire)
                      @resource_spans << value << value + length
          when 2 then message!("dictionary", wire)
                      @dictionary_spans << value << value + length
          end
        end
      end

      # The strings now; the other tables as [start, end) spans, read when first used
      # (a Profile's samples use only some of them). Several dictionary fields, as
      # protobuf merges them, append to each table.
      def read_dictionary
        @strings = []
        @location_spans = []
        @function_spans = []
        @attribute_spans = []
        @stack_spans = []
        utf8 = Encoding::UTF_8
        @dictionary_spans.each_slice(2) do |start, finish|
          each_field_between(start, finish) do |field, wire, value, length|
            next unless field.between?(2, 7) && field != 4 # mappings and links are not read

            message!("ProfilesDictionary field #{field}", wire)
            case field
            when 5 then @strings << @data.byteslice(value, length).force_encoding(utf8)
            when 2 then @location_spans << value << value + length
            when 3 then @function_spans << value << value + length
            when 6 then @attribute_spans << value << value + length
            when 7 then @stack_spans << value << value + length
            end
          end
        end
        return if @strings.empty? || @strings[0].empty?

        raise DecodeError, "string_table[0] must be the empty string (it is #{@strings[0][0, 40].inspect})"
      end

      # Entry `index` of the string table, checked. Index 0 of an empty table (here and in
      # `span`) is the zero value all the same: a writer may leave out a table whose
      # entries it does not use.
      def string(index)
        return @strings[index] if index >= 0 && index < @strings.size
        return "" if index.zero?

        raise DecodeError, "string index #{index} out of range (string_table has #{@strings.size})"
      end

      # [start, end) of entry `index` of a table of messages, checked.
      def span(spans, index, table)
        return [spans[2 * index], spans[2 * index + 1]] if index >= 0 && 2 * index < spans.size
        return [0, 0] if index.zero? # an empty message: every field at its zero value

        raise DecodeError, "#{table} index #{index} out of range (the table has #{spans.size / 2})"
      end

      # [start, end) of every Profile, in order, across resources and scopes.
      def profile_spans
        spans = []
        @resource_spans.each_slice(2) do |start, finish|
          each_field_between(start, finish) do |field, wire, value, length|
            next unless field == 2 # ScopeProfiles

            message!("ResourceProfiles.scope_profiles", wire)
            each_field_between(value, value + length) do |f, w, v, l|
              next unless f == 2 # ScopeProfiles.profiles

              message!("ScopeProfiles.profiles", w)
              spans << [v, v + l]
            end
          end
        end
        spans
      end

      # Reads one Profile, the `type`th sample type, folding its samples into the rows;
      # returns its header.
      def read_profile(start, finish, type)
        header = { sample_type: nil, time: 0, duration: 0, period_type: nil, period: 0 }
        each_field_between(start, finish) do |field, wire, value, length|
          case field
          when 1 then message!("Profile.sample_type", wire)
                      header[:sample_type] = value_type(value, value + length)
          when 2 then message!("Profile.samples", wire)
                      read_sample(value, value + length, type)
          when 3
            raise DecodeError, "Profile.time_unix_nano has wire type #{wire}, not 1 (fixed64)" unless wire == 1 || wire.zero?

            header[:time] = value & UINT64
          when 4 then varint!("Profile.duration_nano", wire)
                      header[:duration] = value & UINT64
          when 5 then message!("Profile.period_type", wire)
                      header[:period_type] = value_type(value, value + length)
          when 6 then varint!("Profile.period", wire)
                      header[:period] = int64(value)
          end
        end
        header[:sample_type] ||= Pprof::ValueType.new("", "")
        header
      end

      def value_type(start, finish)
        type = unit = 0
        each_field_between(start, finish) do |field, wire, value, _|
          case field
          when 1 then varint!("ValueType.type_strindex", wire)
                      type = int64(value)
          when 2 then varint!("ValueType.unit_strindex", wire)
                      unit = int64(value)
          end
        end
        Pprof::ValueType.new(string(type), string(unit))
      end

      # A Sample from `start` to `finish`, added to its row(s). The bulk of a body: read by
      # its own loop, as the pprof reader reads its samples.
      def read_sample(start, finish, type)
        data = @data
        @pos = start
        stack = 0
        attributes = values = timestamps = nil
        while @pos < finish
          key = varint
          wire = key & 7
          if wire == 2
            length = varint
            pos = @pos
            raise DecodeError, "truncated Sample field (#{length} bytes wanted)" if pos + length > finish

            case key >> 3
            when 2 then (attributes ||= []).concat(packed_varints(data.byteslice(pos, length)))
            when 4 then (values ||= []).concat(packed_varints(data.byteslice(pos, length)))
            when 5
              raise DecodeError, "packed Sample.timestamps_unix_nano of #{length} bytes" unless (length % 8).zero?

              (timestamps ||= []).concat(data.byteslice(pos, length).unpack("Q<*"))
            when 1, 3 then raise DecodeError, "Sample field #{key >> 3} has wire type 2, not 0 (a varint)"
            end
            @pos = pos + length
          elsif wire.zero?
            value = varint
            case key >> 3
            when 1 then stack = value
            when 2 then (attributes ||= []) << value
            when 4 then (values ||= []) << value
            when 5 then raise DecodeError, "Sample.timestamps_unix_nano has wire type 0, not 1 (fixed64)"
            end
          elsif wire == 1 && key >> 3 == 5
            raise DecodeError, "truncated Sample.timestamps_unix_nano" if @pos + 8 > finish

            (timestamps ||= []) << data.unpack1("Q<", offset: @pos)
            @pos += 8
          else
            skip_or_read(data, wire)
          end
        end
        raise DecodeError, "truncated Sample" if @pos > finish

        stack = int64(stack)
        attributes = attributes ? attributes.map { |i| int64(i) }.sort!.freeze : EMPTY
        values&.map! { |v| int64(v) }
        if timestamps && !timestamps.empty?
          if values && values.size != timestamps.size
            raise DecodeError, "a Sample has #{values.size} values for #{timestamps.size} timestamps"
          end

          timestamps.each_with_index { |time, i| add(stack, attributes, time, type, values ? values[i] : 1) }
        else
          add(stack, attributes, nil, type, values ? values.sum : 0)
        end
      end

      # Adds `value` of sample type `type` to the row of (stack, attributes, timestamp).
      def add(stack, attributes, time, type, value)
        row = (@rows[[stack, attributes, time]] ||= @row_values.size)
        values = (@row_values[row] ||= Array.new(@type_count, 0))
        values[type] += value
      end

      # The earliest start and the span covering every Profile's [start, start + duration)
      # (Profiles with no start time are left out of the start, not of the span's length).
      def covering(times)
        timed = times.reject { |time, _| time.zero? }
        return [0, times.map(&:last).max || 0] if timed.empty?

        start = timed.map(&:first).min
        [start, timed.map { |time, duration| time + duration }.max - start]
      end

      # The rows' frames, stacks and labels: each stack and label set built once and shared
      # by its rows, as the pprof reader shares them.
      def build_rows
        @frames = []
        @location_frames = {}
        @line_frames = {}
        @function_names = {}
        @attribute_pairs = {}
        stacks_by_index = {}
        labels_by_attributes = {}
        label_sets = {}
        stacks = Array.new(@row_values.size)
        labels = Array.new(@row_values.size)
        @rows.each do |(stack, attributes, time), row|
          stacks[row] = stacks_by_index[stack] ||= stack_frames(stack)
          base = labels_by_attributes[attributes] ||= begin
            set = attributes.to_h { |index| attribute(index) }.freeze
            label_sets[set] ||= set
          end
          labels[row] = if time
                          set = base.merge(TIMESTAMP_LABEL => time).freeze
                          label_sets[set] ||= set
                        else
                          base
                        end
        end
        [@frames, stacks, labels]
      end

      # Frame ids of a stack, leaf first: each location's lines, innermost first.
      def stack_frames(index)
        start, finish = span(@stack_spans, index, "stack_table")
        ids = []
        each_field_between(start, finish) do |field, wire, value, length|
          next unless field == 1

          repeated_varints("Stack.location_indices", wire, value, length).each do |location|
            ids.concat(@location_frames[location] ||= location_frames(int64(location)))
          end
        end
        ids.freeze
      end

      # Frame ids of a location: one per line, innermost first. There are as many
      # locations as distinct frames in the body, so this reads by its own loops rather
      # than by each_field_between (as the pprof reader reads its locations).
      def location_frames(index)
        start, finish = span(@location_spans, index, "location_table")
        data = @data
        @pos = start
        address = 0
        ids = []
        while @pos < finish
          key = varint
          if key == 26 # field 3, length-delimited: a Line
            length = varint
            line_end = @pos + length
            raise DecodeError, "truncated Location.lines" if line_end > finish

            function = line = 0
            while @pos < line_end
              line_key = varint
              if (line_key & 7).zero?
                value = varint
                function = int64(value) if line_key == 8 # field 1: function_index
                line = int64(value) if line_key == 16 # field 2: line
              elsif line_key >> 3 <= 2
                raise DecodeError, "Line field #{line_key >> 3} has wire type #{line_key & 7}, not 0 (a varint)"
              else
                skip_field(data, line_key & 7, line_end)
              end
            end
            raise DecodeError, "truncated Line" if @pos > line_end

            # (A function's first frame reads the function table, moving @pos.)
            saved = @pos
            ids << line_frame(function, line)
            @pos = saved
          elsif key == 16 # field 2, varint: address
            address = varint & UINT64
          elsif key >> 3 == 2 || key >> 3 == 3
            raise DecodeError, "Location field #{key >> 3} has wire type #{key & 7}"
          else
            skip_field(data, key & 7, finish)
          end
        end
        raise DecodeError, "truncated Location" if @pos > finish

        # A location without lines (native code, unsymbolized) is named by its address.
        ids << new_frame(format("0x%x", address), "", 0) if ids.empty?
        ids.freeze
      end

      # The frame id of a line, one per (function index, line). (Two function entries of
      # the same name and file would make two equal frames; every report groups frames by
      # name, and Report::Profiles.merge unifies them.)
      def line_frame(function, line)
        key = line >= 0 && line <= 0xffffffff ? (function << 32) | line : [function, line] # one Integer, mostly
        @line_frames[key] ||= begin
          name, file = @function_names[function] ||= function_names(function)
          new_frame(name, file, line)
        end
      end

      # [name, file name] of a function; its system name when it has no name.
      def function_names(index)
        start, finish = span(@function_spans, index, "function_table")
        name = system_name = file = 0
        each_field_between(start, finish) do |field, wire, value, _|
          next unless field.between?(1, 3)

          varint!("Function field #{field}", wire)
          case field
          when 1 then name = int64(value)
          when 2 then system_name = int64(value)
          when 3 then file = int64(value)
          end
        end
        name = string(name)
        [(name.empty? ? string(system_name) : name), string(file)].freeze
      end

      def new_frame(name, file, line)
        (@frames << Pprof::Frame.new(name, file, line).freeze).size - 1
      end

      # [label key, label value] of an attribute_table entry: Contprof's name for
      # semantic-convention keys; Strings and Integers as they are, other values as Strings
      # (pprof labels are one or the other). The thread id is a String, as Contprof's pprof
      # profiles write it.
      def attribute(index)
        @attribute_pairs[index] ||= begin
          start, finish = span(@attribute_spans, index, "attribute_table")
          key = 0
          any = ""
          each_field_between(start, finish) do |field, wire, value, length|
            case field
            when 1 then varint!("KeyValueAndUnit.key_strindex", wire)
                        key = int64(value)
            when 2 then message!("KeyValueAndUnit.value", wire)
                        any = any_value(value, value + length, 0)
            end
          end
          key = string(key)
          key = LABEL_KEYS.fetch(key, key)
          any = any.to_s if key == "thread id" || !(any.is_a?(String) || any.is_a?(Integer))
          [key, any.freeze].freeze
        end
      end

      # A KeyValue (a resource's attribute, or an entry of a kvlist AnyValue): [key, value].
      def key_value(start, finish, depth = 0)
        key = nil
        key_index = 0
        any = ""
        each_field_between(start, finish) do |field, wire, value, length|
          case field
          when 1 then message!("KeyValue.key", wire)
                      key = @data.byteslice(value, length).force_encoding(Encoding::UTF_8)
          when 2 then message!("KeyValue.value", wire)
                      any = any_value(value, value + length, depth)
          when 3 then varint!("KeyValue.key_strindex", wire)
                      key_index = int64(value)
          end
        end
        [key || string(key_index), any]
      end

      # An AnyValue as a Ruby value (String, true/false, Integer, Float, binary String, Array
      # or Hash); an empty one (no value set) as "".
      def any_value(start, finish, depth)
        raise DecodeError, "AnyValue nested more than #{MAX_NESTING} deep" if depth > MAX_NESTING

        result = ""
        each_field_between(start, finish) do |field, wire, value, length|
          result = case field
                   when 1 then message!("AnyValue.string_value", wire)
                               @data.byteslice(value, length).force_encoding(Encoding::UTF_8)
                   when 2 then varint!("AnyValue.bool_value", wire)
                               !value.zero?
                   when 3 then varint!("AnyValue.int_value", wire)
                               int64(value)
                   when 4
                     raise DecodeError, "AnyValue.double_value has wire type #{wire}, not 1 (fixed64)" unless wire == 1

                     [value].pack("Q<").unpack1("E")
                   when 5 then message!("AnyValue.array_value", wire)
                               list_values(value, value + length) { |s, f| any_value(s, f, depth + 1) }
                   when 6 then message!("AnyValue.kvlist_value", wire)
                               list_values(value, value + length) { |s, f| key_value(s, f, depth + 1) }.to_h
                   when 7 then message!("AnyValue.bytes_value", wire)
                               @data.byteslice(value, length)
                   when 8 then varint!("AnyValue.string_value_strindex", wire)
                               string(int64(value))
                   else result
                   end
        end
        result
      end

      # The `values` (field 1) of an ArrayValue or KeyValueList, each read by the block.
      def list_values(start, finish)
        list = []
        each_field_between(start, finish) do |field, wire, value, length|
          next unless field == 1

          message!("list value", wire)
          list << yield(value, value + length)
        end
        list
      end
    end
    private_constant :Decoder
  end
end
