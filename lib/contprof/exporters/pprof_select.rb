# frozen_string_literal: true

require "zlib"

module Contprof
  # Derives from an encoded pprof one with only some of its sample types, renamed, and
  # another period type: what Pyroscope needs, which names a series after the pprof's
  # sample type and period type strings (see Exporters::Pyroscope).
  #
  # It works on the encoded bytes and leaves every field it has no reason to touch as it
  # is: locations, functions, mappings and label sets are copied byte for byte, only each
  # sample's values are re-encoded. Protobuf readers accept fields in any order and the
  # string table is indexed in order of appearance, so the new strings go after the old
  # ones and the new sample types and period type after them. Samples left with only zero
  # values are dropped (a wall-only sample has nothing to say in a CPU profile).
  module PprofSelect
    class Error < Contprof::Error; end

    HIGH_BIT = /[\x80-\xff]/n.freeze

    class << self
      # bytes: a pprof (gzip-compressed or not). views: Array of Hashes, each with keep:
      # (Array of [source sample type name, new type, new unit]), period_type: ([type,
      # unit]) and period:. Returns one gzip-compressed pprof per view; the input is read
      # once for all of them.
      def call(bytes, views)
        data = bytes.b
        data = Zlib.gunzip(data).b if data.start_with?("\x1f\x8b".b)
        # Level 1, as Go's runtime writes its CPU profiles: three times faster than the
        # default level for a few percent more bytes.
        rewrite(data, views).map { |raw| Zlib.gzip(raw, level: 1) }
      rescue Zlib::Error => e
        raise Error, "cannot read the pprof: #{e.message}"
      end

      private

      def rewrite(data, views)
        common = String.new(capacity: data.bytesize, encoding: Encoding::BINARY)
        sample_types = [] # [type string index, unit string index]
        samples = [] # start and end of each sample's message
        strings = []
        each_field(data, 0, data.bytesize) do |field, wire_type, start, value_start, finish|
          raise Error, "unexpected wire type #{wire_type} for field #{field}" if [1, 2, 6].include?(field) && wire_type != 2

          case field
          when 1 then sample_types << value_type(data, value_start, finish)
          when 2 then samples << value_start << finish
          when 6 then strings << data.byteslice(value_start, finish - value_start)
                      common << data.byteslice(start, finish - start)
          when 11, 12, 14 then nil # replaced (period) or no longer meaningful (default type)
          else common << data.byteslice(start, finish - start)
          end
        end
        names = sample_types.map { |type, _| strings.fetch(type) { raise Error, "string index #{type} out of range" } }
        indices = views.map do |view|
          view.fetch(:keep).map do |source, _, _|
            names.index(source) or raise Error, "no sample type #{source.inspect} (the profile has #{names.join(", ")})"
          end
        end
        outs = views.map { common.dup }
        rewrite_samples(data, samples, indices, names.size, outs)
        views.each_with_index { |view, i| append_types(outs[i], strings.size, view) }
        outs
      end

      # New strings, one per distinct name, after the existing table; then the sample
      # types and the period that use them.
      def append_types(out, string_count, view)
        keep = view.fetch(:keep)
        period_type = view.fetch(:period_type)
        new_strings = (keep.flat_map { |_, type, unit| [type, unit] } + period_type).uniq
        new_strings.each { |text| length_delimited(out, 6, text.b) }
        index = ->(text) { string_count + new_strings.index(text) }
        keep.each { |_, type, unit| length_delimited(out, 1, value_type_bytes(index.(type), index.(unit))) }
        length_delimited(out, 11, value_type_bytes(index.(period_type[0]), index.(period_type[1])))
        varint_field(out, 12, view.fetch(:period))
      end

      def rewrite_samples(data, samples, view_indices, type_count, outs)
        body = String.new(encoding: Encoding::BINARY)
        i = 0
        while i < samples.size
          start = samples[i]
          finish = samples[i + 1]
          i += 2
          body.clear
          values = nil
          pos = start
          # (A loop rather than each_field: this runs once per field of every sample.)
          while pos < finish
            field_start = pos
            key, pos = read_varint(data, pos)
            if (key & 7) == 2
              length, pos = read_varint(data, pos)
              field_finish = pos + length
            elsif (key & 7).zero?
              value, field_finish = read_varint(data, pos)
            else
              raise Error, "unexpected wire type #{key & 7} in a sample"
            end
            raise Error, "truncated sample" if field_finish > finish

            if key >> 3 == 2
              values ||= []
              if (key & 7) == 2
                values.concat(packed_varints(data.byteslice(pos, length)))
              else
                values << value
              end
            else
              body << data.byteslice(field_start, field_finish - field_start)
            end
            pos = field_finish
          end
          values ||= []
          raise Error, "a sample has #{values.size} values for #{type_count} sample types" if values.size != type_count

          view_indices.each_with_index do |indices, view|
            kept = indices.map { |index| values[index] }
            next if kept.all?(&:zero?)

            packed = String.new(encoding: Encoding::BINARY)
            kept.each { |value| write_varint(packed, value) }
            out = outs[view]
            write_varint(out, (2 << 3) | 2)
            write_varint(out, body.bytesize + 1 + varint_size(packed.bytesize) + packed.bytesize)
            out << body
            length_delimited(out, 2, packed)
          end
        end
      end

      # Yields (field, wire type, start of the field, start of its value, end) for each
      # field between `pos` and `finish`. For a length-delimited field the value starts
      # after the length; for a varint at the varint.
      def each_field(data, pos, finish)
        while pos < finish
          start = pos
          key, pos = read_varint(data, pos)
          wire_type = key & 7
          case wire_type
          when 0 then value_start = pos
                      _, value_end = read_varint(data, pos)
          when 1 then value_start = pos
                      value_end = pos + 8
          when 2 then length, value_start = read_varint(data, pos)
                      value_end = value_start + length
          when 5 then value_start = pos
                      value_end = pos + 4
          else raise Error, "unsupported protobuf wire type #{wire_type}"
          end
          raise Error, "truncated field" if value_end > finish

          yield key >> 3, wire_type, start, value_start, value_end
          pos = value_end
        end
      end

      def value_type(data, pos, finish)
        type = unit = 0
        each_field(data, pos, finish) do |field, wire_type, _, value_start, _|
          next unless wire_type.zero?

          type = read_varint(data, value_start)[0] if field == 1
          unit = read_varint(data, value_start)[0] if field == 2
        end
        [type, unit]
      end

      def value_type_bytes(type, unit)
        bytes = String.new(encoding: Encoding::BINARY)
        varint_field(bytes, 1, type)
        varint_field(bytes, 2, unit)
        bytes
      end

      def varint_field(out, field, value)
        write_varint(out, field << 3)
        write_varint(out, value)
      end

      def length_delimited(out, field, bytes)
        write_varint(out, (field << 3) | 2)
        write_varint(out, bytes.bytesize)
        out << bytes
      end

      # Values are kept as read: unsigned, so that a negative int64 (read as its 64-bit
      # two's complement) is written back as the same 10 bytes.
      def write_varint(out, value)
        value += 0x10000000000000000 if value.negative?
        while value >= 0x80
          out << ((value & 0x7f) | 0x80)
          value >>= 7
        end
        out << value
      end

      def varint_size(value)
        size = 1
        size += 1 while (value >>= 7).positive?
        size
      end

      def read_varint(data, pos)
        value = 0
        shift = 0
        loop do
          byte = data.getbyte(pos) or raise Error, "truncated varint"
          pos += 1
          value |= (byte & 0x7f) << shift
          return [value, pos] if byte < 0x80

          shift += 7
          raise Error, "varint longer than 10 bytes" if shift > 63
        end
      end

      def packed_varints(bytes)
        return bytes.unpack("C*") unless bytes.match?(HIGH_BIT)

        list = []
        pos = 0
        while pos < bytes.bytesize
          value, pos = read_varint(bytes, pos)
          list << value
        end
        list
      end
    end
  end
end
