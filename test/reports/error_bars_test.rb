# frozen_string_literal: true

require_relative "../test_helper"
require "tmpdir"

# The error bars `contprof report --top` prints (samples behind each row, the standard
# error of its share) against the truth a program measures itself: the CPU each function
# burnt (its thread's CPU clock around it) and the objects each site allocated (counted
# by the program; the VM's counter for the total). Each share must be within 3.5 of its
# printed standard errors of the truth (five shares a run, each tested: 3.5 keeps a false
# alarm under 1 in 400 runs for errors that are right): an error bar that is too small
# fails here.
class ErrorBarsTest < Minitest::Test
  EXE = File.expand_path("../../exe/contprof", __dir__)
  BAR = 3.5 # standard errors
  LIB = File.expand_path("../../lib", __dir__)

  # Three functions burn CPU in loops of their own (each is its samples' leaf) in the
  # ratio 9:3:1 (the last one time in ten), and two sites allocate: Integer#to_s 300
  # Strings a call, and a block 100 Arrays.
  PROGRAM = <<~RUBY
    require "contprof"
    Contprof.start(output: ARGV[0], upload_period: 60, allocation: true, allocation_interval: 500)
    def clock = Process.clock_gettime(Process::CLOCK_THREAD_CPUTIME_ID, :nanosecond)
    def burn_big = (x = 0; i = 0; while i < 90_000; x += i; i += 1; end; x)
    def burn_small = (x = 0; i = 0; while i < 30_000; x += i; i += 1; end; x)
    def burn_rare = (x = 0; i = 0; while i < 100_000; x += i; i += 1; end; x)
    def make_strings = Array.new(300) { |i| i.to_s }
    def make_arrays = Array.new(100) { [] }
    cpu = Hash.new(0)
    calls = 0
    started_cpu = clock
    started_objects = GC.stat(:total_allocated_objects)
    until clock - started_cpu > 3_000_000_000
      before = clock; burn_big; cpu[:burn_big] += clock - before
      before = clock; burn_small; cpu[:burn_small] += clock - before
      (before = clock; burn_rare; cpu[:burn_rare] += clock - before) if (calls % 10).zero?
      make_strings
      make_arrays
      calls += 1
    end
    cpu[:all] = clock - started_cpu
    objects = { "Integer#to_s" => 300 * calls, "block in Object#make_arrays" => 100 * calls,
                all: GC.stat(:total_allocated_objects) - started_objects }
    Contprof.stop
    File.write(ARGV[1], Marshal.dump([cpu, objects]))
  RUBY

  # Rows of a --top table: function name => [flat share (%), samples, standard error (points)].
  def rows_of(table)
    table.lines.drop(2).to_h do |line|
      fields = line.split
      [fields[7..].join(" "), [Float(fields[1].delete("%")), Integer(fields[5]), Float(fields[6].delete("±%"))]]
    end
  end

  # The error Report.share_error prints for a share (%) of n of all samples: the Poisson
  # count of each side, at its mean weight, through the delta method.
  def printed_error(share, n, all)
    p = share / 100
    100 * p * (1 - p) * Math.sqrt(1.0 / n + 1.0 / (all - n))
  end

  def top(dir, type)
    out, err, status = Open3.capture3(RbConfig.ruby, EXE, "report", dir, "--top", "50", "--type", type)
    assert status.success?, err
    [rows_of(out), out]
  end

  def test_each_share_is_within_three_of_its_standard_errors_of_the_truth
    Dir.mktmpdir("contprof-error-bars") do |dir|
      truth_path = File.join(dir, "truth")
      out_dir = File.join(dir, "out")
      _, err, status = Open3.capture3(RbConfig.ruby, "-I#{LIB}", "-e", PROGRAM, out_dir, truth_path)
      assert status.success?, err
      cpu, objects = Marshal.load(File.binread(truth_path)) # rubocop:disable Security/MarshalLoad

      rows, out = top(out_dir, "cpu-time")
      counts, = top(out_dir, "cpu-samples")
      total = counts.sum { |_, (_, samples, _)| samples }
      assert_operator total, :>=, 150, out
      %w[burn_big burn_small burn_rare].each do |name|
        share, samples, error = rows.fetch("Object##{name}")
        assert_equal counts.fetch("Object##{name}")[1], samples, "the samples behind a row are its CPU samples"
        assert_in_delta printed_error(share, samples, total), error, [0.051 * error, 0.0051].max, out
        truth = 100.0 * cpu[name.to_sym] / cpu[:all]
        assert_in_delta truth, share, BAR * error, "#{name}: true share #{truth.round(2)}%\n#{out}"
      end

      rows, out = top(out_dir, "alloc-samples")
      sampled = rows.sum { |_, (_, samples, _)| samples }
      objects.each do |site, count|
        next if site == :all

        share, samples, error = rows.fetch(site)
        assert_operator samples, :>=, 30, out
        assert_in_delta printed_error(share, samples, sampled), error, [0.051 * error, 0.0051].max, out
        truth = 100.0 * count / objects[:all]
        assert_in_delta truth, share, BAR * error, "#{site}: true share #{truth.round(2)}%\n#{out}"
      end
    end
  end
end
