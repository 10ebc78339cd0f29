# frozen_string_literal: true

require_relative "protobuf"

module Contprof
  # Writes the messages of a perftools.profiles.Profile (profile.proto) that the rewrites
  # add to a profile (PprofRewrite): strings, sample types, the period, samples and labels.
  # The C encoder writes whole profiles; these are the pieces a Ruby pass needs. Field
  # numbers are named here once, for the writer and the rewrites.
  module PprofWriter
    # Profile's fields.
    SAMPLE_TYPE = 1
    SAMPLE = 2
    STRING_TABLE = 6
    PERIOD_TYPE = 11
    PERIOD = 12
    DEFAULT_SAMPLE_TYPE = 14
    # Sample's fields.
    SAMPLE_VALUES = 2
    SAMPLE_LABELS = 3
    # Label's and ValueType's first two fields: the key and the string value, the type and
    # the unit (string indices, all four).
    LABEL_KEY = 1
    LABEL_STR = 2
    VALUE_TYPE_TYPE = 1
    VALUE_TYPE_UNIT = 2

    W = Protobuf::Writer
    private_constant :W

    module_function

    # An entry of the string table (its index is the number of entries before it).
    def string(out, text)
      W.length_delimited(out, STRING_TABLE, text.b)
    end

    # A sample type of these string indices.
    def sample_type(out, type, unit)
      W.length_delimited(out, SAMPLE_TYPE, value_type(type, unit))
    end

    # The period type (string indices) and the period.
    def period(out, type, unit, period)
      W.length_delimited(out, PERIOD_TYPE, value_type(type, unit))
      W.varint_field(out, PERIOD, period)
    end

    # A Sample: `body`, its fields already encoded (locations, labels), then `values`
    # packed when given (else `body` has them). The length is counted rather than the body
    # copied.
    def sample(out, body, values = nil)
      return W.length_delimited(out, SAMPLE, body) unless values

      packed = String.new(encoding: Encoding::BINARY)
      values.each { |value| W.varint(packed, value) }
      W.varint(out, (SAMPLE << 3) | 2)
      W.varint(out, body.bytesize + 1 + W.varint_size(packed.bytesize) + packed.bytesize)
      out << body
      W.length_delimited(out, SAMPLE_VALUES, packed)
    end

    # The bytes of a Label of a string value (both string indices), frozen.
    def label(key, str)
      out = String.new(encoding: Encoding::BINARY)
      W.varint_field(out, LABEL_KEY, key)
      W.varint_field(out, LABEL_STR, str)
      out.freeze
    end

    def value_type(type, unit)
      bytes = String.new(encoding: Encoding::BINARY)
      W.varint_field(bytes, VALUE_TYPE_TYPE, type)
      W.varint_field(bytes, VALUE_TYPE_UNIT, unit)
      bytes
    end
  end
end
