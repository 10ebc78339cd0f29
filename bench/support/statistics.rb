# frozen_string_literal: true

# What the benchmarks summarize their repeated measurements with.
module BenchStatistics
  module_function

  # The middle value (the mean of the two middle ones for an even count).
  def median(values)
    sorted = values.sort
    sorted.size.odd? ? sorted[sorted.size / 2] : (sorted[sorted.size / 2 - 1] + sorted[sorted.size / 2]) / 2
  end
end
