# frozen_string_literal: true

require "zlib"
require_relative "protobuf"
require_relative "writer"

module Contprof
  # One pass over an encoded pprof (plain, not gzip-compressed) that copies it while
  # changing some of its fields: the exporters' rewrites (PprofSelect keeps some sample
  # types under new names, DatadogStates renames one label's values) are written with it.
  # Every field a rewrite has no reason to touch is copied byte for byte: locations,
  # functions, mappings, and in samples the location ids and untouched labels.
  #
  # Protobuf readers accept fields in any order and index the string table in order of
  # appearance, so a rewrite appends its new strings after the copied ones (their indices
  # start at strings.size), and the fields that use them after those.
  #
  # Every problem raises the `error` given (the rewrite's caller's exception class).
  class PprofRewrite
    W = Protobuf::Writer
    F = PprofWriter
    private_constant :W, :F

    # The gzip stream of a rewritten pprof. Level 1, as Go's runtime writes its CPU
    # profiles: three times faster than the default level for a few percent more bytes.
    def self.gzip(raw)
      Zlib.gzip(raw, level: 1)
    end

    # The string table's entries (binary Strings) that #each_field has walked past: the
    # whole table once it has walked the profile.
    attr_reader :strings

    def initialize(data, error)
      @data = data
      @error = error
      @reader = Protobuf::Reader.new(data, error)
      @strings = []
    end

    # Yields each top-level field: its number, wire type, where it starts, where its
    # value starts (after a length) and where it ends. The block may read other parts of
    # the profile (#copy_sample) meanwhile.
    def each_field
      size = @data.bytesize
      pos = 0
      while pos < size
        @reader.pos = pos
        field, wire_type, start, value_start, finish = @reader.next_field(size)
        pos = finish
        @strings << @data.byteslice(value_start, finish - value_start) if field == F::STRING_TABLE
        yield field, wire_type, start, value_start, finish
      end
    end

    # Entry `index` of the string table.
    def string(index)
      @strings.fetch(index) { raise @error, "string index #{index} out of range" }
    end

    # Appends the profile's bytes in [start, finish) (a whole field) to `out`.
    def copy(out, start, finish)
      out << @data.byteslice(start, finish - start)
    end

    # [type, unit] (string indices) of the ValueType whose value is in [start, finish).
    def value_type(start, finish)
      raw = @data.byteslice(start, finish - start)
      type = unit = 0
      Protobuf::Reader.new(raw, @error).each_field(raw) do |field, value|
        type = value if field == F::VALUE_TYPE_TYPE && value.is_a?(Integer)
        unit = value if field == F::VALUE_TYPE_UNIT && value.is_a?(Integer)
      end
      [type, unit]
    end

    # Copies the fields of the Sample whose value is in [from, finish) into `body`, but:
    # with `take_values`, its values, which it returns (an Array of Integer; nil when it
    # has none); with a block, its labels, each passed to the block as its bytes, which
    # returns the bytes to write instead, or nil to leave the label out.
    def copy_sample(body, from, finish, take_values: false)
      values = nil
      @reader.pos = from
      while @reader.pos < finish
        field, wire_type, start, value_start, field_finish = @reader.next_field(finish)
        if field == F::SAMPLE_VALUES && take_values
          values ||= []
          case wire_type
          when 2 then values.concat(@reader.packed_varints(@data.byteslice(value_start, field_finish - value_start)))
          when 0 then @reader.pos = value_start
                      values << @reader.varint
          else raise @error, "unexpected wire type #{wire_type} in a sample"
          end
        elsif field == F::SAMPLE_LABELS && wire_type == 2 && block_given?
          label = yield @data.byteslice(value_start, field_finish - value_start)
          W.length_delimited(body, F::SAMPLE_LABELS, label) if label
        else
          body << @data.byteslice(start, field_finish - start)
        end
        @reader.pos = field_finish
      end
      values
    end

    # A Label's key (a string index), when written first as every writer we know does;
    # else nil.
    def label_key(label)
      Protobuf.leading_varint(label, F::LABEL_KEY, @error)
    end

    # A Label's string value (a string index), or nil when it has none.
    def label_str(label)
      str = nil
      Protobuf::Reader.new(label, @error).each_field(label) { |field, value| str = value if field == F::LABEL_STR }
      str
    end

    # A Label's bytes with its key replaced by the block's answer (given the old key),
    # frozen; its other fields as they were.
    def with_label_key(label)
      out = String.new(encoding: Encoding::BINARY)
      Protobuf::Reader.new(label, @error).each_field(label) do |field, value|
        if value.is_a?(Integer)
          W.varint_field(out, field, field == F::LABEL_KEY ? yield(value) : value)
        else
          W.length_delimited(out, field, value)
        end
      end
      out.freeze
    end
  end
end
