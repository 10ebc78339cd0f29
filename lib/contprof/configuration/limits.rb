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
  end
end
