# frozen_string_literal: true

require_relative "../test_helper"
require_relative "../support/synthetic_profiles"
require "tmpdir"

# `contprof report DIR --growth`: the least-squares growth of each allocation site's live
# heap across a directory's periods. First on profiles of known values at known times (the
# arithmetic, on every Ruby), then on a program that leaks from one site among steady ones
# and counts what it leaks (Ruby 3.3+, where live heap is profiled).
class HeapGrowthTest < Minitest::Test
  EXE = File.expand_path("../../exe/contprof", __dir__)
  LIB = File.expand_path("../../lib", __dir__)
  TYPES = [%w[heap-live-samples count], %w[heap-live-size bytes]].freeze
  HOUR = 3600 * 1_000_000_000
  START = 1_796_000_000 * 1_000_000_000 # a fixed instant (late 2026), in ns
  LEAK = [["String#*", "/app/cache.rb", 6], ["Cache#remember", "/app/cache.rb", 6], ["<main>", "/app/main.rb", 1]].freeze
  STEADY = [["Array.new", "/app/pool.rb", 3], ["Pool#refill", "/app/pool.rb", 3], ["<main>", "/app/main.rb", 2]].freeze
  SHRINK = [["Hash#[]=", "/app/warm.rb", 9], ["Warm#load", "/app/warm.rb", 9], ["<main>", "/app/main.rb", 3]].freeze

  def setup
    @dir = Dir.mktmpdir("contprof-growth")
  end

  def teardown
    FileUtils.rm_rf(@dir)
  end

  def contprof(*arguments)
    Open3.capture3(RbConfig.ruby, EXE, *arguments)
  end

  # A profile of `sites` ({stack => [objects, bytes]}) written as the file exporter names
  # it, its period ending `hours` after START.
  def write_period(pid, hours, sites, klass: "String")
    recorder = Contprof::StackRecorder.new(sample_types: TYPES)
    sites.each do |stack, (objects, bytes)|
      recorder.record_sample(stack, { "heap-live-samples" => objects, "heap-live-size" => bytes }, { "allocation class" => klass })
    end
    finish = START + (hours * HOUR).round
    stamp = Time.at(finish / 1_000_000_000).utc.strftime("%Y%m%dT%H%M%S.000000Z")
    path = File.join(@dir, "shop-#{pid}-#{stamp}.pprof")
    File.binwrite(path, SyntheticProfiles.retimed(recorder.serialize.last, finish - 60_000_000_000, 60_000_000_000))
    path
  end


  # Rows of the table: [growth, error, R², rising, last, site] as printed.
  def table_rows(out)
    out.lines.drop(2).map { |line| line.strip.split(/\s+/, 6) }
  end

  def test_slopes_errors_and_steadiness_are_the_least_squares_fit_of_each_process_summed
    # Process 1: the leak grows 1,000 objects (40 kB) an hour exactly; the pool wobbles
    # around 500; the warm-up cache shrinks. Process 2, on another clock: the leak at 3,000
    # an hour with noise (the fit known in closed form below).
    [[0, 1_000, 500, 900], [1, 2_000, 480, 600], [2, 3_000, 520, 300], [3, 4_000, 500, 0]].each do |hours, leak, pool, warm|
      write_period(101, hours, { LEAK => [leak, leak * 40], STEADY => [pool, pool * 80], SHRINK => [warm, warm * 100] })
    end
    [[0.5, 0], [1.5, 3_300], [2.5, 5_700]].each do |hours, leak|
      write_period(202, hours, { LEAK => [leak, leak * 40] })
    end
    File.write(File.join(@dir, "notes.txt"), "not a profile") # only *.pprof are read

    out, err, status = contprof("report", @dir, "--growth", "--type", "heap-live-samples")
    assert status.success?, err
    assert_match(/\Aheap-live-samples growth per hour: 7 periods of 2 processes, .*; 2 of 3 sites grew\n/, out)
    rows = table_rows(out)
    assert_equal 2, rows.size, out
    # Process 2's fit: x = 0, 1, 2 h; y = 0, 3300, 5700: slope 2850, residuals 150, -300, 150,
    # SSE 135,000 (of 16,380,000 about the mean), variance of the slope 135,000 / 1 / 2.
    # Process 1: exact, no error; 5,000,000 about its mean. R² pooled: 1 - 135,000 / 21,380,000.
    leak = rows[0]
    assert_equal ["3850", Math.sqrt(135_000 / 2.0).round.to_s, "0.99", "5/5", "9700"], leak[0, 5]
    assert_match(%r{\AString#\* /app/cache.rb:6 in Cache#remember \(String\)\z}, leak[5])
    pool = rows[1]
    assert_equal "Array.new /app/pool.rb:3 in Pool#refill (String)", pool[5]
    # y = 500, 480, 520, 500 at x = 0..3: Sxy = 20, Sxx = 5; residuals 6, -18, 18, -6:
    # SSE 720 of 800, error sqrt(720 / 2 / 5) = 8.5; R² 0.10; one rise in three steps.
    assert_equal ["4", "8", "0.10", "1/3", "500"], pool[0, 5]

    bytes, err, status = contprof("report", @dir, "--growth")
    assert status.success?, err
    assert_match(/\Aheap-live-size growth per hour:/, bytes)
    assert_equal "150.39kB", table_rows(bytes)[0][0] # 3,850 × 40 B

    only_hashes, _, status = contprof("report", @dir, "--growth", "--label", "allocation class=Hash")
    assert status.success?
    assert_match(/0 of 0 sites grew\n.*\n\(no site's heap-live-size grew\)\n\z/, only_hashes)
  end

  def test_refusals_name_what_is_missing
    write_period(7, 0, { LEAK => [1, 40] })
    write_period(7, 1, { LEAK => [2, 80] })
    _, err, status = contprof("report", @dir, "--growth")
    assert_equal 2, status.exitstatus
    assert_match(/--growth needs at least 3 periods of one process \(got 2;/, err)

    write_period(7, 2, { LEAK => [3, 120] })
    _, err, status = contprof("report", @dir, "--growth", "--type", "cpu-time")
    assert_equal 2, status.exitstatus
    assert_match(/no sample type "cpu-time" in .*shop-7-.*\.pprof \(it has heap-live-samples, heap-live-size\)/, err)
    _, err, status = contprof("report", @dir, "--growth", "--thread", "1")
    assert_equal 2, status.exitstatus
    assert_match(/--growth prints a table alone: drop --thread/, err)
    _, err, status = contprof("report", @dir, "--growth", "--flamegraph", File.join(@dir, "f.html"))
    assert_equal 2, status.exitstatus
    assert_match(/drop --flamegraph/, err)
    refute File.exist?(File.join(@dir, "f.html"))

    cpu = Contprof::StackRecorder.new
    cpu.record_sample([MAIN_FRAME], { "cpu-time" => 5 })
    cpu_dir = File.join(@dir, "cpu")
    Dir.mkdir(cpu_dir)
    3.times { |i| File.binwrite(File.join(cpu_dir, "web-1-2026120#{i + 1}T000000.000000Z.pprof"), cpu.serialize.last) }
    _, err, status = contprof("report", cpu_dir, "--growth")
    assert_equal 2, status.exitstatus
    assert_match(/no sample type "heap-live-size" .*; the live heap is profiled on Ruby 3.3\+ \(heap: auto, the default\)/, err)
  end

  MAIN_FRAME = ["<main>", "/app/main.rb", 1].freeze

  # A program keeps 300 strings every 10 ms from one site (the leak) while two others
  # churn: a pool whose entries are replaced, and garbage. A full GC every 50 ms keeps
  # the garbage from piling up between flushes, so that only the leak grows (and the
  # program's own log of counts). The program records how many leaked strings were alive
  # as it went; the leak's slope must be within 3 standard errors of the least-squares
  # slope of those counts. The error has two parts: the fit's (the periods' scatter about
  # the line), and the sampling's, which the fit cannot see because every period counts
  # the same sampled objects again: the n objects sampled so far (a Poisson count, each
  # weighing the interval) estimate the count within 1/sqrt(n) of itself, and so the slope
  # (n = the last count / the interval).
  def test_a_leaking_site_ranks_first_with_its_true_slope
    skip "live heap needs Ruby 3.3+" unless Contprof::Collectors::Allocations.heap_supported?

    program = <<~RUBY
      require "contprof"
      Contprof.start(output: ARGV[0], service: "leaky", upload_period: 1, allocation: true, heap: true,
                     allocation_interval: 100)
      $kept = []
      pool = Array.new(2_000) { "p" * 40 }
      def leak_one = ($kept << ("leak" * 10))
      def churn(pool) = pool[rand(pool.size)] = ("s" * 40)
      def garbage = Array.new(8) { |i| i.to_s }
      counts = []
      started = Process.clock_gettime(Process::CLOCK_MONOTONIC)
      last_gc = started
      while (now = Process.clock_gettime(Process::CLOCK_MONOTONIC)) - started < 7.5
        300.times { leak_one }
        1_000.times { churn(pool) }
        100.times { garbage }
        (GC.start; last_gc = now) if now - last_gc > 0.05
        counts << [Process.clock_gettime(Process::CLOCK_REALTIME, :nanosecond), $kept.size]
        sleep 0.01
      end
      Contprof.stop
      File.write(ARGV[1], Marshal.dump(counts))
    RUBY
    counts_path = File.join(@dir, "counts")
    out_dir = File.join(@dir, "out")
    _, err, status = Open3.capture3(RbConfig.ruby, "-I#{LIB}", "-e", program, out_dir, counts_path)
    assert status.success?, err
    counts = Marshal.load(File.binread(counts_path)) # rubocop:disable Security/MarshalLoad

    out, err, status = contprof("report", out_dir, "--growth", "--type", "heap-live-samples")
    assert status.success?, err
    rows = table_rows(out)
    refute_empty rows, out
    leak, *others = rows
    assert_match(/\AString#\* .*:\d+ in Object#leak_one \(String\)\z/, leak[5], out)
    # The truth: the leaked count's own least-squares slope per hour (its rate).
    xs = counts.map { |t, _| (t - counts[0][0]).fdiv(HOUR) }
    ys = counts.map { |_, n| n }
    mean_x = xs.sum / xs.size
    mean_y = ys.sum.fdiv(ys.size)
    truth = xs.zip(ys).sum { |x, y| (x - mean_x) * (y - mean_y) } / xs.sum { |x| (x - mean_x)**2 }
    estimate = leak[0].to_f
    sampled = leak[4].to_f / 100
    bar = 3 * Math.sqrt(leak[1].to_f**2 + truth**2 / sampled)
    assert_in_delta truth, estimate, bar, "leak slope #{estimate}/h for #{truth.round}/h true\n#{out}"
    assert_operator leak[2].to_f, :>=, 0.95, out
    others.each { |row| assert_operator row[0].to_f, :<, estimate / 10, "a steady site grows\n#{out}" }
  end
end
