# frozen_string_literal: true

module Contprof
  # The sampling settings' defaults and bounds, each defined here only: Settings check
  # against them, the worker defaults to them, and the native collectors read them when
  # the extension loads.
  module Limits
    INTERVAL = 0.01 # seconds between samples
    INTERVALS = (0.001..60.0).freeze
    MAX_FRAMES = 400 # deepest stack kept
    MAX_FRAMES_RANGE = (5..10_000).freeze
    OVERHEAD_TARGET = 0.02 # of one core
    ALLOCATION_INTERVAL = 10_000 # mean allocations between allocation samples, at least
    ALLOCATION_INTERVALS = (1..1_000_000_000).freeze
    # An output directory's limits (see Exporters::File#enforce_retention).
    OUTPUT_RETENTION = 7 * 86_400 # seconds a profile file is kept
    OUTPUT_RETENTIONS = (60..(10 * 365 * 86_400)).freeze
    OUTPUT_MAX_BYTES = 1024**3 # bytes the directory's profiles may take
    OUTPUT_MAX_BYTES_RANGE = (1024..(1024**5)).freeze
  end
end
