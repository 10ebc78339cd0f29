# frozen_string_literal: true

require "zlib"
require_relative "../pprof/rewrite"

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
  # A PprofRewrite: only each sample's values are re-encoded, and the new strings, sample
  # types and period type go after the copied fields. Samples left with only zero values
  # are dropped (a wall-only sample has nothing to say in a CPU profile).
  module PprofSelect
    class Error < Contprof::Error; end

    F = PprofWriter
    private_constant :F

    class << self
      # bytes: a pprof (gzip-compressed or not). views: Array of Hashes, each with keep:
      # (Array of [source sample type name, new type, new unit]), period_type: ([type,
      # unit]) and period:. Returns one gzip-compressed pprof per view; the input is read
      # once for all of them.
      def call(bytes, views, label_names: :any)
        data = bytes.b
        data = Zlib.gunzip(data).b if data.start_with?("\x1f\x8b".b)
        rewrite(data, views, label_names == :prometheus).map { |raw| PprofRewrite.gzip(raw) }
      rescue Zlib::Error => e
        raise Error, "cannot read the pprof: #{e.message}"
      end

      private

      PROMETHEUS_LABEL_NAME = /\A[a-zA-Z_][a-zA-Z0-9_]*\z/.freeze
      TIMESTAMP_LABEL = "end_timestamp_ns".b.freeze
      private_constant :PROMETHEUS_LABEL_NAME, :TIMESTAMP_LABEL

      def rewrite(data, views, prometheus_names)
        profile = PprofRewrite.new(data, Error)
        common = String.new(capacity: data.bytesize, encoding: Encoding::BINARY)
        sample_types = [] # [type string index, unit string index]
        samples = [] # start and end of each sample's message
        profile.each_field do |field, wire_type, start, value_start, finish|
          if [F::SAMPLE_TYPE, F::SAMPLE, F::STRING_TABLE].include?(field) && wire_type != 2
            raise Error, "unexpected wire type #{wire_type} for field #{field}"
          end

          case field
          when F::SAMPLE_TYPE then sample_types << profile.value_type(value_start, finish)
          when F::SAMPLE then samples << value_start << finish
          when F::PERIOD_TYPE, F::PERIOD, F::DEFAULT_SAMPLE_TYPE then nil # replaced, or no longer meaningful
          else profile.copy(common, start, finish)
          end
        end
        names = sample_types.map { |type, _| profile.string(type) }
        indices = views.map do |view|
          view.fetch(:keep).map do |source, _, _|
            names.index(source) or raise Error, "no sample type #{source.inspect} (the profile has #{names.join(", ")})"
          end
        end
        outs = views.map { common.dup }
        renames = prometheus_names ? LabelRenames.new(profile) : nil
        rewrite_samples(profile, samples, indices, names.size, outs, renames)
        added = renames ? renames.added : []
        outs.each { |out| added.each { |text| F.string(out, text) } }
        views.each_with_index { |view, i| append_types(outs[i], profile.strings.size + added.size, view) }
        outs
      end

      # New strings, one per distinct name, after the existing table; then the sample
      # types and the period that use them.
      def append_types(out, string_count, view)
        keep = view.fetch(:keep)
        period_type = view.fetch(:period_type)
        new_strings = (keep.flat_map { |_, type, unit| [type, unit] } + period_type).uniq
        new_strings.each { |text| F.string(out, text) }
        index = ->(text) { string_count + new_strings.index(text) }
        keep.each { |_, type, unit| F.sample_type(out, index.(type), index.(unit)) }
        F.period(out, index.(period_type[0]), index.(period_type[1]), view.fetch(:period))
      end

      # Label keys renamed to Prometheus names: the new strings (after the table's), and each
      # label's bytes rewritten once however many samples carry it.
      class LabelRenames
        attr_reader :added

        def initialize(profile)
          @profile = profile
          @strings = profile.strings
          @added = []
          @key_index = {} # old key index => new index, or itself
          @labels = {} # label bytes => rewritten label bytes
        end

        # The label rewritten, or nil when it is dropped.
        def label(bytes)
          return nil if @profile.label_key(bytes) == timestamp_key

          @labels[bytes] ||= @profile.with_label_key(bytes) { |index| key(index) }
        end

        private

        def timestamp_key
          @timestamp_key ||= @strings.index(TIMESTAMP_LABEL) || -1
        end

        def key(index)
          @key_index[index] ||= new_key(index)
        end

        def new_key(index)
          text = @profile.string(index)
          return index if text.match?(PROMETHEUS_LABEL_NAME)

          renamed = text.b.gsub(/[^a-zA-Z0-9_]/n, "_")
          renamed = "_#{renamed}" if renamed.empty? || renamed.match?(/\A[0-9]/)
          position = @added.index(renamed) || (@added << renamed).size - 1
          @strings.size + position
        end
      end
      private_constant :LabelRenames

      def rewrite_samples(profile, samples, view_indices, type_count, outs, renames)
        body = String.new(encoding: Encoding::BINARY)
        relabel = renames&.method(:label)
        merged = {} # sample body (locations, labels) => values
        i = 0
        while i < samples.size
          body.clear
          values = profile.copy_sample(body, samples[i], samples[i + 1], take_values: true, &relabel) || []
          i += 2
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

            F.sample(outs[view], sample_body, kept)
          end
        end
      end
    end
  end
end
