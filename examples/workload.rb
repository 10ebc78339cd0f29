# frozen_string_literal: true

# The bundled example program: a small "report generator" with known hot spots, used by
# the README's demo and by end-to-end tests. Each round computes (Report#fibonacci, about
# 1 ms of CPU here; Report#checksum, about a quarter of that) and then waits for I/O
# (Report#wait_for_io: sleep 2 ms), so it spends about two thirds of its time asleep.
# It measures its own phases (monotonic and CPU clocks around each call) and prints each
# one's share of wall time and of CPU time at the end: the truth a profile must match.
class Report
  PHASES = %i[fibonacci checksum wait_for_io].freeze

  def initialize(seconds)
    @deadline = monotonic + seconds
    @wall = Hash.new(0.0)
    @cpu = Hash.new(0.0)
  end

  def run
    rounds = 0
    started = monotonic
    while monotonic < @deadline
      measure(:fibonacci) { fibonacci(21) }
      measure(:checksum) { checksum(4_000) }
      measure(:wait_for_io) { wait_for_io }
      rounds += 1
    end
    @elapsed = monotonic - started
    rounds
  end

  # Each phase's share of the run's wall time and of its CPU time, in percent.
  def shares
    cpu_total = @cpu.values.sum
    PHASES.to_h { |phase| [phase, [100 * @wall[phase] / @elapsed, 100 * @cpu[phase] / cpu_total]] }
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

  private

  def measure(phase)
    cpu_before = Process.clock_gettime(Process::CLOCK_THREAD_CPUTIME_ID)
    wall_before = monotonic
    yield
    @wall[phase] += monotonic - wall_before
    @cpu[phase] += Process.clock_gettime(Process::CLOCK_THREAD_CPUTIME_ID) - cpu_before
  end

  def monotonic
    Process.clock_gettime(Process::CLOCK_MONOTONIC)
  end
end

if $PROGRAM_NAME == __FILE__
  seconds = Float(ARGV.fetch(0, "3"))
  report = Report.new(seconds)
  puts "report rounds: #{report.run}"
  puts "measured by the program itself (share of wall time / of CPU time):"
  report.shares.each { |phase, (wall, cpu)| puts format("  Report#%-12s %5.1f%% / %5.1f%%", phase, wall, cpu) }
end
