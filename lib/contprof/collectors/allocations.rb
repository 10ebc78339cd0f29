# frozen_string_literal: true

module Contprof
  module Collectors
    # Allocation profiling's Ruby side: which Rubies can have it, and the sample types it
    # adds to a profile. The sampling is in C (ext/contprof/sampling/allocation_sampler.c).
    module Allocations
      # The recorder's sample types for allocations (names as dd-trace-rb's stack_recorder.h
      # reserves them): alloc-samples is the estimated number of objects, alloc-size their
      # estimated bytes, alloc-samples-unscaled the samples behind them (their error bar).
      SAMPLE_TYPES = [%w[alloc-samples count].freeze, %w[alloc-size bytes].freeze,
                      %w[alloc-samples-unscaled count].freeze].freeze
      # Live-heap profiling's: of the sampled objects, those alive when the profile is
      # serialized (the count they stand for, their size then, and how many they are).
      HEAP_SAMPLE_TYPES = [%w[heap-live-samples count].freeze, %w[heap-live-size bytes].freeze,
                           %w[heap-live-samples-unscaled count].freeze].freeze
      # Time profiling's, which every profile has (the recorder's defaults).
      TIME_SAMPLE_TYPES = StackRecorder::DEFAULT_SAMPLE_TYPES

      # Why this Ruby cannot sample allocations, or nil when it can.
      def self.unsupported_reason(version = RUBY_VERSION)
        if Gem::Version.new(version).between?(Gem::Version.new("3.2.0"), Gem::Version.new("3.2.2"))
          "Ruby #{version}'s NEWOBJ tracepoint can crash the VM (Ruby bug #19482, fixed in 3.2.3)"
        end
      end

      # Why this build cannot track the live heap, or nil when it can (the extension asks
      # what this Ruby's GC offers: see ext/contprof/collectors/heap_tracker.c).
      def self.heap_unsupported_reason
        return "the native extension is not available" unless defined?(Native.heap_unsupported_reason)

        reason = Native.heap_unsupported_reason
        reason && "live-heap profiling is not available: #{reason}"
      end

      def self.heap_supported? = heap_unsupported_reason.nil?

      # A known VM bug that allocation profiling may meet on this Ruby, for a warning, or nil.
      def self.caveat(version = RUBY_VERSION)
        return unless Gem::Version.new(version) < Gem::Version.new("3.1.4")

        "Ruby #{version} can crash in the GC of a Ractor while a tracepoint is on (Ruby bug #18464, fixed in " \
          "3.1.4): with allocation profiling on, do not create Ractors (programs without Ractors are unaffected)"
      end

      # Whether `allocation: auto` (the default) turns allocation profiling on here: where no
      # known VM bug can meet it.
      def self.on_by_default?(version = RUBY_VERSION)
        unsupported_reason(version).nil? && caveat(version).nil?
      end

      def self.check_ruby!
        reason = unsupported_reason
        raise Error, "allocation profiling is not available: #{reason}" if reason
      end

      # The recorder's sample types with or without allocations (and the live heap).
      def self.sample_types(allocation, heap = false)
        types = TIME_SAMPLE_TYPES
        types += SAMPLE_TYPES if allocation
        types += HEAP_SAMPLE_TYPES if allocation && heap && heap_supported?
        types
      end
    end
  end
end
