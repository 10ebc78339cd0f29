# frozen_string_literal: true

require_relative "../test_helper"
require "tmpdir"

# An output directory's limits, output_retention and output_max_bytes: the settings as
# users write them, what the file exporter deletes (and never deletes), and a profiler
# keeping a directory within its size as it writes.
class RetentionTest < Minitest::Test
  DAY = 86_400

  def setup
    @dir = Dir.mktmpdir("contprof-retention")
  end

  def teardown
    FileUtils.rm_rf(@dir)
  end

  # A file named as the exporter names them, `age` seconds old, of `size` bytes.
  def profile_file(service, pid, age, size, extension: "pprof")
    time = Time.now - age
    path = File.join(@dir, "#{service}-#{pid}-#{time.utc.strftime("%Y%m%dT%H%M%S.%6NZ")}.#{extension}")
    File.binwrite(path, "x" * size)
    File.utime(time, time, path)
    path
  end

  def names
    Dir.children(@dir).sort
  end

  def test_settings_take_units_and_off_and_refuse_the_rest_naming_what_they_accept
    resolve = ->(keywords, env = {}) { Contprof::Settings.resolve(keywords, env: env) }
    defaults = resolve.({})
    assert_equal [7 * DAY, 1024**3], [defaults.output_retention, defaults.output_max_bytes]
    assert_equal [5400, 500 * 1024**2], resolve.({ output_retention: "90m", output_max_bytes: "500M" })
                                          .then { |s| [s.output_retention, s.output_max_bytes] }
    assert_equal [2 * DAY, 2 * 1024**3], resolve.({}, { "CONTPROF_OUTPUT_RETENTION" => "2d", "CONTPROF_OUTPUT_MAX_BYTES" => "2G" })
                                           .then { |s| [s.output_retention, s.output_max_bytes] }
    assert_equal [3600, 4096], resolve.({ output_retention: 3600, output_max_bytes: "4k" })
                                      .then { |s| [s.output_retention, s.output_max_bytes] }
    assert_equal [nil, nil], resolve.({ output_retention: false, output_max_bytes: "off" })
                                    .then { |s| [s.output_retention, s.output_max_bytes] }
    { output_retention: ["7 days", 59, "1y", -1], output_max_bytes: ["2X", 1023, "1.5.0G", []] }.each do |name, values|
      values.each do |value|
        error = assert_raises(ArgumentError) { resolve.({ name => value }) }
        assert_match(/\Asetting #{name} \(#{name}\) accepts .*(90m, 12h, 7d|500M, 2G).*, or off; got /, error.message)
      end
    end
  end

  def test_old_files_then_the_oldest_go_and_nothing_else_is_touched
    expired = [profile_file("web", 11, 8 * DAY, 100), profile_file("web", 11, 8 * DAY, 100, extension: "otlp")]
    oldest = profile_file("worker", 12, 3 * DAY, 300)
    middle = profile_file("web", 13, 2 * DAY, 300)
    newest = profile_file("web", 13, DAY, 300)
    just_written = profile_file("web", 14, 9 * DAY, 300) # (its mtime made old: still kept)
    being_written = File.join(@dir, ".web-14-20261207T000000.000000Z.pprof.abcdef.tmp")
    others = [File.join(@dir, "notes.txt"), File.join(@dir, "web.pprof"), being_written]
    others.each { |path| File.write(path, "y" * 1000) }
    File.utime(Time.now - 30 * DAY, Time.now - 30 * DAY, being_written)
    File.symlink("/etc/hostname", link = File.join(@dir, "web-15-20200101T000000.000000Z.pprof"))
    File.lutime(Time.now - 30 * DAY, Time.now - 30 * DAY, link) if File.respond_to?(:lutime)

    exporter = Contprof::Exporters::File.new(@dir, retention: 7 * DAY, max_bytes: 1000)
    deleted = exporter.enforce_retention([just_written])
    # Expired: both 8-day files. Then 300 (just written) + 900 over 1,000: the oldest goes.
    assert_equal [3, 500], deleted
    remaining = names
    (expired + [oldest]).each { |path| refute_includes remaining, File.basename(path) }
    [middle, newest, just_written, link, *others].each { |path| assert_includes remaining, File.basename(path) }
    assert_equal [0, 0], exporter.enforce_retention([just_written]), "within both limits now"

    assert_equal [0, 0], Contprof::Exporters::File.new(@dir, retention: nil, max_bytes: nil).enforce_retention
    assert_equal [3, 900], Contprof::Exporters::File.new(@dir, retention: nil, max_bytes: 1).enforce_retention
    assert_equal [File.basename(link), *others.map { |path| File.basename(path) }].sort, names
  end

  def test_a_directory_that_is_gone_is_an_error_naming_it
    exporter = Contprof::Exporters::File.new(File.join(@dir, "missing"))
    error = assert_raises(Errno::ENOENT) { exporter.enforce_retention }
    assert_match(%r{missing}, error.message)
  end

  # A profiler writing a profile a second keeps the directory at its limit: the files of
  # yesterday's processes go first, and at every flush the directory is back within it.
  def test_a_profiler_keeps_its_directory_within_the_limits_as_it_writes
    old = Array.new(20) { |i| profile_file("web", 100 + i, 2 * DAY - i * 60, 20_000) }
    expired = profile_file("web", 99, 30 * DAY, 10)
    limit = 200_000
    sizes = []
    Contprof.start(output: @dir, upload_period: 1, output_max_bytes: limit, output_retention: "7d", log_level: "error")
    profiler = Contprof::Profiler.running
    deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + 4.5
    while Process.clock_gettime(Process::CLOCK_MONOTONIC) < deadline
      burn_cpu(0.05)
      sizes << Dir.children(@dir).sum { |name| File.size?(File.join(@dir, name)).to_i } if profiler.stats[:flushes] > 1
    end
    stats = profiler.stats
    Contprof.stop
    assert_operator stats[:flushes], :>=, 3
    assert_operator stats[:output_files_deleted], :>=, 2
    assert_equal 0, stats[:retention_failed]
    refute_includes names, File.basename(expired)
    refute_includes names, File.basename(old.first), "the oldest files go first"
    assert_includes names, File.basename(old.last)
    # Between flushes the directory holds at most the limit plus the profile written last.
    largest = Dir.children(@dir).map { |name| File.size(File.join(@dir, name)) }.max
    assert_operator sizes.max, :<=, limit + largest, sizes.inspect
  end
end
