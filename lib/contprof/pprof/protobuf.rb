# frozen_string_literal: true

module Contprof
  # Protocol Buffers' wire format in plain Ruby: varints, keys, length-delimited and fixed
  # fields, read and written. The one place that knows the encoding: the pprof reader
  # (Pprof.decode), the pprof rewrites (Pprof::Rewrite, which the exporters use), the pprof
  # writer (Pprof::Writer) and the OTLP reader (Otlp) all read and write through it.
  module Protobuf
    # Reads varints and fields at a position, @pos, which moves past what is read. (A
    # cursor rather than returned [value, position] pairs: no Array per varint, which at
    # a few million varints per big profile was a good part of the time and most of the
    # garbage.) Every problem raises `error` (the caller's exception class).
    class Reader
      HIGH_BIT = /[\x80-\xff]/n.freeze

      attr_accessor :pos

      def initialize(data, error)
        @data = data
        @pos = 0
        @error = error
      end

      # The varint at @pos in `data` (the whole message by default).
      def varint(data = @data)
        pos = @pos
        byte = data.getbyte(pos) || truncated_varint
        if byte < 0x80
          @pos = pos + 1
          return byte
        end

        value = byte & 0x7f
        shift = 7
        while (byte = data.getbyte(pos += 1) || truncated_varint) >= 0x80
          value |= (byte & 0x7f) << shift
          shift += 7
          raise @error, "varint longer than 10 bytes" if shift > 63
        end
        @pos = pos + 1
        value | (byte << shift)
      end

      # The field at @pos, ending no later than `finish`: [field number, wire type, where
      # it starts, where its value starts (after a length), where it ends]. @pos moves past.
      def next_field(finish, data = @data)
        start = @pos
        key = varint(data)
        wire_type = key & 7
        value_start = @pos
        case wire_type
        when 0 then varint(data)
        when 1 then @pos += 8
        when 2 then length = varint(data)
                    value_start = @pos
                    @pos += length
        when 5 then @pos += 4
        else raise @error, "unsupported protobuf wire type #{wire_type}"
        end
        raise @error, "truncated field" if @pos > finish || @pos > data.bytesize

        [key >> 3, wire_type, start, value_start, @pos]
      end

      # Skips a field of `wire_type` at @pos that must end by `finish`.
      def skip_field(data, wire_type, finish)
        if wire_type == 2
          length = varint(data)
          raise @error, "truncated field (#{length} bytes wanted)" if @pos + length > finish

          @pos += length
        else
          skip_or_read(data, wire_type)
        end
      end

      # The varint at @pos (nil for fixed-size fields, which are skipped).
      def skip_or_read(data, wire_type)
        case wire_type
        when 0 then varint(data)
        when 1 then @pos + 8 <= data.bytesize ? (@pos += 8) && nil : raise(@error, "truncated field (8 bytes wanted)")
        when 5 then @pos + 4 <= data.bytesize ? (@pos += 4) && nil : raise(@error, "truncated field (4 bytes wanted)")
        else raise @error, "unsupported protobuf wire type #{wire_type}"
        end
      end

      # Yields (field number, value) for each field of a small message; value is an
      # Integer for varints and a binary String for length-delimited fields.
      def each_field(raw)
        saved = @pos
        @pos = 0
        size = raw.bytesize
        while @pos < size
          key = varint(raw)
          if (key & 7) == 2
            length = varint(raw)
            pos = @pos
            raise @error, "truncated field (#{length} bytes wanted)" if pos + length > size

            @pos = pos + length
            yield key >> 3, raw.byteslice(pos, length)
          else
            yield key >> 3, skip_or_read(raw, key & 7)
          end
        end
      ensure
        @pos = saved
      end

      # Fields of the message in [start, finish): yields (field number, wire type, value,
      # length) where value is the varint (wire type 0), the unsigned fixed64 or fixed32 (1,
      # 5) or where the bytes start (2, with their length). Uses @pos as its cursor between
      # fields only, so that blocks may read nested messages with it.
      def each_field_between(start, finish)
        pos = start
        while pos < finish
          @pos = pos
          key = varint
          wire = key & 7
          length = nil
          case wire
          when 0 then value = varint
          when 2
            length = varint
            value = @pos
            raise @error, "truncated field (#{length} bytes wanted, #{finish - value} left)" if value + length > finish

            @pos = value + length
          when 1
            raise @error, "truncated fixed64 field" if @pos + 8 > finish

            value = @data.unpack1("Q<", offset: @pos)
            @pos += 8
          when 5
            raise @error, "truncated fixed32 field" if @pos + 4 > finish

            value = @data.unpack1("L<", offset: @pos)
            @pos += 4
          else raise @error, "unsupported protobuf wire type #{wire}"
          end
          raise @error, "truncated field" if @pos > finish

          pos = @pos
          yield key >> 3, wire, value, length
        end
      end

      # The varints of a packed repeated field: a plain byte unpacking when every value
      # is below 128, else one loop over the bytes (no block, no method call per value:
      # this loop reads most of a profile's bytes).
      def packed_varints(bytes)
        return bytes.unpack("C*") unless bytes.match?(HIGH_BIT)

        list = []
        pos = 0
        size = bytes.bytesize
        while pos < size
          byte = bytes.getbyte(pos)
          pos += 1
          if byte < 0x80
            list << byte
          else
            value = byte & 0x7f
            shift = 7
            while (byte = bytes.getbyte(pos) || truncated_varint) >= 0x80
              value |= (byte & 0x7f) << shift
              pos += 1
              shift += 7
              raise @error, "varint longer than 10 bytes" if shift > 63
            end
            pos += 1
            list << (value | (byte << shift))
          end
        end
        list
      end

      # A varint read as unsigned, as the int64 it stands for.
      def signed(value)
        value >= 0x8000000000000000 ? value - 0x10000000000000000 : value
      end

      private

      def truncated_varint
        raise @error, "truncated varint"
      end
    end

    # The value of `bytes`' first field when that is field `field`, a varint (a pprof Label's
    # key, which writers put first), else nil.
    def self.leading_varint(bytes, field, error)
      return nil unless bytes.getbyte(0) == field << 3

      reader = Reader.new(bytes, error)
      reader.pos = 1
      reader.varint
    end

    # Writes into a binary String.
    module Writer
      module_function

      # Values are written as they were read: unsigned, so that a negative int64 (read as
      # its 64-bit two's complement) is written back as the same 10 bytes.
      def varint(out, value)
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

      def varint_field(out, field, value)
        varint(out, field << 3)
        varint(out, value)
      end

      def length_delimited(out, field, bytes)
        varint(out, (field << 3) | 2)
        varint(out, bytes.bytesize)
        out << bytes
      end
    end
  end
end
