# frozen_string_literal: true

# The bundled example program: a small "report generator" with known hot spots, used by
# the README's demo and by end-to-end tests. Roughly: 60% of its time in
# Report#fibonacci (CPU), 25% in Report#checksum (CPU), 15% asleep in Report#wait_for_io.
class Report
  def initialize(seconds)
    @deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + seconds
  end

  def run
    rounds = 0
    while Process.clock_gettime(Process::CLOCK_MONOTONIC) < @deadline
      fibonacci(21)
      checksum(4_000)
      wait_for_io
      rounds += 1
    end
    rounds
  end

  def fibonacci(n)
    n < 2 ? n : fibonacci(n - 1) + fibonacci(n - 2)
  end

  def checksum(size)
    (1..size).reduce(0) { |sum, i| (sum * 31 + i) % 1_000_003 }
  end

  def wait_for_io
    sleep 0.002
  end
end

if $PROGRAM_NAME == __FILE__
  seconds = Float(ARGV.fetch(0, "3"))
  puts "report rounds: #{Report.new(seconds).run}"
end
