# frozen_string_literal: true

module Contprof
  module Collectors
    # Allocation profiling's Ruby side: which Rubies can have it, and the sample types it
    # adds to a profile. The sampling is in C (ext/contprof/sampling/allocation_sampler.c).
    module Allocations
      # The recorder's sample types for allocations (names as dd-trace-rb's stack_recorder.h
      # reserves them): alloc-samples is the estimated number of objects, alloc-size their
      # estimated bytes.
      SAMPLE_TYPES = [%w[alloc-samples count].freeze, %w[alloc-size bytes].freeze].freeze
      TIME_SAMPLE_TYPES = [%w[cpu-time nanoseconds].freeze, %w[cpu-samples count].freeze,
                           %w[wall-time nanoseconds].freeze].freeze

      # Why this Ruby cannot sample allocations, or nil when it can.
      def self.unsupported_reason(version = RUBY_VERSION)
        if Gem::Version.new(version).between?(Gem::Version.new("3.2.0"), Gem::Version.new("3.2.2"))
          "Ruby #{version}'s NEWOBJ tracepoint can crash the VM (Ruby bug #19482, fixed in 3.2.3)"
        end
      end

      # A known VM bug that allocation profiling may meet on this Ruby, for a warning, or nil.
      def self.caveat(version = RUBY_VERSION)
        return unless Gem::Version.new(version) < Gem::Version.new("3.1.4")

        "Ruby #{version} can crash in the GC of a Ractor while a tracepoint is on (Ruby bug #18464, fixed in " \
          "3.1.4): with allocation profiling on, do not create Ractors (programs without Ractors are unaffected)"
      end

      def self.check_ruby!
        reason = unsupported_reason
        raise Error, "allocation profiling is not available: #{reason}" if reason
      end

      # The recorder's sample types with or without allocations.
      def self.sample_types(allocation)
        allocation ? TIME_SAMPLE_TYPES + SAMPLE_TYPES : TIME_SAMPLE_TYPES
      end
    end
  end
end
