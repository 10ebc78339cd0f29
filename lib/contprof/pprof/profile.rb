# frozen_string_literal: true

module Contprof
  # A pprof profile as plain Ruby objects: what the pprof reader (Pprof.decode) and the
  # OTLP reader (Otlp.decode) make, and what every report reads, merges and filters.
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
    # Pprof.summary's answer: totals maps each sample type's name to its sum.
    Summary = Struct.new(:sample_types, :time_nanos, :duration_nanos, :totals, :comments)

    # A decoded profile. The compact form, which the report code reads: `frames` (Array of
    # Frame indexed by frame id; some entries may be nil), and per sample, at the same index
    # in each: `stacks` (frame ids, leaf first), `values` (one Integer per sample type, in
    # sample_types order) and `labels` (frozen Hash, shared by samples with equal labels).
    class Profile
      attr_reader :sample_types, :time_nanos, :duration_nanos, :period_type, :period, :comments,
                  :frames, :stacks, :values, :labels

      def initialize(sample_types:, time_nanos:, duration_nanos:, period_type:, period:, comments:,
                     frames:, stacks:, values:, labels:)
        @sample_types = sample_types
        @time_nanos = time_nanos
        @duration_nanos = duration_nanos
        @period_type = period_type
        @period = period
        @comments = comments
        @frames = frames
        @stacks = stacks
        @values = values
        @labels = labels
      end

      def sample_type_names
        sample_types.map(&:type)
      end

      def sample_count
        stacks.size
      end

      # Samples as Sample objects (built on first use).
      def samples
        @samples ||= begin
          names = sample_type_names
          Array.new(stacks.size) do |i|
            Sample.new(stacks[i].map { |id| frames[id] }, names.zip(values[i]).to_h, labels[i])
          end
        end
      end

      def start_time
        Time.at(time_nanos / 1_000_000_000, time_nanos % 1_000_000_000, :nsec).utc
      end

      # Index of a sample type in each sample's values; raises KeyError naming the types.
      def type_index(type)
        sample_type_names.index(type) or
          raise KeyError, "no sample type #{type.inspect} (the profile has #{sample_type_names.join(", ")})"
      end

      # Sum of one sample type over all samples (optionally those matching a block).
      def total(type)
        return values.sum { |row| row[type_index(type)] } unless block_given?

        samples.sum { |sample| yield(sample) ? sample.values.fetch(type) : 0 }
      end

      # Hash of stack (Array of function names, leaf first) => summed value of `type`.
      def stacks_by_function(type)
        index = type_index(type)
        result = Hash.new(0)
        stacks.each_with_index { |stack, i| result[stack.map { |id| frames[id].function_name }] += values[i][index] }
        result
      end
    end
  end
end
