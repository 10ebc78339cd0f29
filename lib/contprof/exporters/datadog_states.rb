# frozen_string_literal: true

require "zlib"
require_relative "../reports/protobuf"

module Contprof
  # The "thread state" label as Datadog's profiler sends it: key `state`, with its values
  # ("had cpu", "sleeping", "waiting", "network", "waiting for gvl", "unknown"), which
  # Datadog's timeline colours. Everything else of the pprof is copied byte for byte: its
  # samples are re-emitted with that one label rewritten, and the new strings go after the
  # string table's (readers index strings in order of appearance). A profile without the
  # label is returned as it is.
  module DatadogStates
    class Error < Contprof::Error; end

    W = Protobuf::Writer
    private_constant :W

    OURS = "thread state".b.freeze
    KEY = "state"
    # Ours => Datadog's. Native code without the GVL has no Datadog state: "unknown", as
    # Datadog's own profiler says of what it cannot tell.
    VALUES = {
      "running" => "had cpu", "waiting for gvl" => "waiting for gvl", "native" => "unknown",
      "sleeping" => "sleeping", "waiting" => "waiting", "io" => "network"
    }.freeze
    # The same rewrite done by the recorder while it serializes (StackRecorder#serialize's
    # relabel:), without the GVL: this module's Ruby pass is for pprofs from elsewhere.
    RELABEL = [OURS, KEY, VALUES.to_a.freeze].freeze

    class << self
      # bytes: a gzip-compressed pprof. Returns one.
      def call(bytes)
        data = Zlib.gunzip(bytes).b
        return bytes unless data.include?(OURS)

        rewritten = rewrite(data)
        rewritten ? Zlib.gzip(rewritten, level: 1) : bytes
      rescue Zlib::Error => e
        raise Error, "cannot read the pprof: #{e.message}"
      end

      private

      def rewrite(data)
        reader = Protobuf::Reader.new(data, Error)
        strings = []
        fields = [] # [field number, start, value start, end]
        while reader.pos < data.bytesize
          field, _, start, value_start, finish = reader.next_field(data.bytesize)
          strings << data.byteslice(value_start, finish - value_start) if field == 6
          fields << [field, start, value_start, finish]
        end
        ours = strings.index(OURS) or return nil
        added = [KEY, *VALUES.values.uniq]
        index = ->(text) { strings.size + added.index(text) }
        new_values = VALUES.to_h { |value, theirs| [strings.index(value.b), index.(theirs)] }
        new_values.delete(nil)
        labels = {}
        out = String.new(capacity: data.bytesize + 128, encoding: Encoding::BINARY)
        fields.each do |field, start, value_start, finish|
          if field == 2
            W.length_delimited(out, 2, sample(reader, data, value_start, finish, ours, index.(KEY), new_values, labels))
          else
            out << data.byteslice(start, finish - start)
          end
        end
        added.each { |text| W.length_delimited(out, 6, text.b) }
        out
      end

      # A Sample's bytes with its "thread state" label rewritten.
      def sample(reader, data, from, finish, ours, key, new_values, labels)
        body = String.new(encoding: Encoding::BINARY)
        reader.pos = from
        while reader.pos < finish
          field, wire_type, start, value_start, field_finish = reader.next_field(finish)
          if field == 3 && wire_type == 2
            label = data.byteslice(value_start, field_finish - value_start)
            # (Only the state's are remembered: a timeline's timestamps are one per sample.)
            label = labels[label] ||= label(label, key, new_values) if Protobuf.leading_varint(label, 1, Error) == ours
            W.length_delimited(body, 3, label)
          else
            body << data.byteslice(start, field_finish - start)
          end
          reader.pos = field_finish
        end
        body
      end

      def label(bytes, key, new_values)
        str = nil
        Protobuf::Reader.new(bytes, Error).each_field(bytes) { |field, value| str = value if field == 2 }
        return bytes unless new_values.key?(str)

        out = String.new(encoding: Encoding::BINARY)
        W.varint_field(out, 1, key)
        W.varint_field(out, 2, new_values.fetch(str))
        out.freeze
      end
    end
  end
end
