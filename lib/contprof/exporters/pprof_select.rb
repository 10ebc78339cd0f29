# frozen_string_literal: true

require "zlib"
require_relative "../reports/protobuf"

module Contprof
  # Derives from an encoded pprof one with only some of its sample types, renamed, and
  # another period type: what Pyroscope needs, which names a series after the pprof's
  # sample type and period type strings (see Exporters::Pyroscope).
  #
  # With label_names: :prometheus, a label key that is not a valid Prometheus label name
  # (`thread id`, `allocation class`) is renamed with `_` for each other character
  # (`thread_id`): Pyroscope 1.x turns sample labels into series labels and refuses a whole
  # upload with one such key in it (Pyroscope 2 accepts any UTF-8 name). The new keys are
  # new strings, so a function or file that happens to have the same text is untouched.
  # Timeline timestamps (end_timestamp_ns) are dropped then too: as series labels they
  # would make one series per sample; the samples they kept apart sum up the same.
  #
  # It works on the encoded bytes and leaves every field it has no reason to touch as it
  # is: locations, functions, mappings and label sets are copied byte for byte, only each
  # sample's values are re-encoded. Protobuf readers accept fields in any order and the
  # string table is indexed in order of appearance, so the new strings go after the old
  # ones and the new sample types and period type after them. Samples left with only zero
  # values are dropped (a wall-only sample has nothing to say in a CPU profile).
  module PprofSelect
    class Error < Contprof::Error; end

    W = Protobuf::Writer
    private_constant :W

    class << self
      # bytes: a pprof (gzip-compressed or not). views: Array of Hashes, each with keep:
      # (Array of [source sample type name, new type, new unit]), period_type: ([type,
      # unit]) and period:. Returns one gzip-compressed pprof per view; the input is read
      # once for all of them.
      def call(bytes, views, label_names: :any)
        data = bytes.b
        data = Zlib.gunzip(data).b if data.start_with?("\x1f\x8b".b)
        # Level 1, as Go's runtime writes its CPU profiles: three times faster than the
        # default level for a few percent more bytes.
        rewrite(data, views, label_names == :prometheus).map { |raw| Zlib.gzip(raw, level: 1) }
      rescue Zlib::Error => e
        raise Error, "cannot read the pprof: #{e.message}"
      end

      private

      PROMETHEUS_LABEL_NAME = /\A[a-zA-Z_][a-zA-Z0-9_]*\z/.freeze
      TIMESTAMP_LABEL = "end_timestamp_ns".b.freeze
      private_constant :PROMETHEUS_LABEL_NAME, :TIMESTAMP_LABEL

      def rewrite(data, views, prometheus_names)
        reader = Protobuf::Reader.new(data, Error)
        common = String.new(capacity: data.bytesize, encoding: Encoding::BINARY)
        sample_types = [] # [type string index, unit string index]
        samples = [] # start and end of each sample's message
        strings = []
        while reader.pos < data.bytesize
          field, wire_type, start, value_start, finish = reader.next_field(data.bytesize)
          raise Error, "unexpected wire type #{wire_type} for field #{field}" if [1, 2, 6].include?(field) && wire_type != 2

          case field
          when 1 then sample_types << value_type(data.byteslice(value_start, finish - value_start))
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
        renames = prometheus_names ? LabelRenames.new(strings) : nil
        rewrite_samples(reader, data, samples, indices, names.size, outs, renames)
        added = renames ? renames.added : []
        outs.each { |out| added.each { |text| W.length_delimited(out, 6, text) } }
        views.each_with_index { |view, i| append_types(outs[i], strings.size + added.size, view) }
        outs
      end

      # New strings, one per distinct name, after the existing table; then the sample
      # types and the period that use them.
      def append_types(out, string_count, view)
        keep = view.fetch(:keep)
        period_type = view.fetch(:period_type)
        new_strings = (keep.flat_map { |_, type, unit| [type, unit] } + period_type).uniq
        new_strings.each { |text| W.length_delimited(out, 6, text.b) }
        index = ->(text) { string_count + new_strings.index(text) }
        keep.each { |_, type, unit| W.length_delimited(out, 1, value_type_bytes(index.(type), index.(unit))) }
        W.length_delimited(out, 11, value_type_bytes(index.(period_type[0]), index.(period_type[1])))
        W.varint_field(out, 12, view.fetch(:period))
      end

      # Label keys renamed to Prometheus names: the new strings (after the table's), and each
      # label's bytes rewritten once however many samples carry it.
      class LabelRenames
        attr_reader :added

        def initialize(strings)
          @strings = strings
          @added = []
          @key_index = {} # old key index => new index, or itself
          @labels = {} # label bytes => rewritten label bytes
        end

        # The label rewritten, or nil when it is dropped.
        def label(bytes)
          return nil if Protobuf.leading_varint(bytes, 1, Error) == timestamp_key

          @labels[bytes] ||= rewrite(bytes)
        end

        private

        def timestamp_key
          @timestamp_key ||= @strings.index(TIMESTAMP_LABEL) || -1
        end

        def rewrite(bytes)
          out = String.new(encoding: Encoding::BINARY)
          Protobuf::Reader.new(bytes, Error).each_field(bytes) do |field, value|
            if value.is_a?(Integer)
              W.varint_field(out, field, field == 1 ? key(value) : value)
            else
              W.length_delimited(out, field, value)
            end
          end
          out.freeze
        end

        def key(index)
          @key_index[index] ||= new_key(index)
        end

        def new_key(index)
          text = @strings.fetch(index) { raise Error, "string index #{index} out of range" }
          return index if text.match?(PROMETHEUS_LABEL_NAME)

          renamed = text.b.gsub(/[^a-zA-Z0-9_]/n, "_")
          renamed = "_#{renamed}" if renamed.empty? || renamed.match?(/\A[0-9]/)
          position = @added.index(renamed) || (@added << renamed).size - 1
          @strings.size + position
        end
      end
      private_constant :LabelRenames

      def rewrite_samples(reader, data, samples, view_indices, type_count, outs, renames)
        body = String.new(encoding: Encoding::BINARY)
        merged = {} # sample body (locations, labels) => values
        i = 0
        while i < samples.size
          reader.pos = samples[i]
          finish = samples[i + 1]
          i += 2
          body.clear
          values = nil
          while reader.pos < finish
            field, wire_type, start, value_start, field_finish = reader.next_field(finish)
            if field == 2
              values ||= []
              case wire_type
              when 2 then values.concat(reader.packed_varints(data.byteslice(value_start, field_finish - value_start)))
              when 0 then reader.pos = value_start
                          values << reader.varint
              else raise Error, "unexpected wire type #{wire_type} in a sample"
              end
            elsif field == 3 && renames && wire_type == 2
              label = renames.label(data.byteslice(value_start, field_finish - value_start))
              W.length_delimited(body, 3, label) if label
            else
              body << data.byteslice(start, field_finish - start)
            end
            reader.pos = field_finish
          end
          values ||= []
          raise Error, "a sample has #{values.size} values for #{type_count} sample types" if values.size != type_count

          # Samples a dropped timestamp kept apart are one again.
          if (summed = merged[body])
            summed.each_index { |v| summed[v] += values[v] }
          else
            merged[body.dup] = values
          end
        end
        merged.each do |sample_body, values|
          view_indices.each_with_index do |indices, view|
            kept = indices.map { |index| values[index] }
            next if kept.all?(&:zero?)

            packed = String.new(encoding: Encoding::BINARY)
            kept.each { |value| W.varint(packed, value) }
            out = outs[view]
            W.varint(out, (2 << 3) | 2)
            W.varint(out, sample_body.bytesize + 1 + W.varint_size(packed.bytesize) + packed.bytesize)
            out << sample_body
            W.length_delimited(out, 2, packed)
          end
        end
      end

      def value_type(raw)
        type = unit = 0
        Protobuf::Reader.new(raw, Error).each_field(raw) do |field, value|
          type = value if field == 1 && value.is_a?(Integer)
          unit = value if field == 2 && value.is_a?(Integer)
        end
        [type, unit]
      end

      def value_type_bytes(type, unit)
        bytes = String.new(encoding: Encoding::BINARY)
        W.varint_field(bytes, 1, type)
        W.varint_field(bytes, 2, unit)
        bytes
      end
    end
  end
end
