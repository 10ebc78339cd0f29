# frozen_string_literal: true

require_relative "../test_helper"
require_relative "../support/synthetic_profiles"
require "tmpdir"
require "open3"
require "contprof/viewer/viewer"

# The viewer over ranges of several hours: the files wholly in the range come from each
# hour's kept merge (Contprof::Report::MergedProfiles, merged by the extension), the files
# at its edges are cut to it, and the views equal `contprof report` on the same files and
# range, and the pure-Ruby reading (Profiles.load without aggregation), value for value,
# whatever the range's alignment. Timeline samples here reach back before their file's
# period, as a stretch recorded just after a flush does.
class ViewerHoursTest < Minitest::Test
  EXE = File.expand_path("../../exe/contprof", __dir__)
  MINUTE = 60 * 1_000_000_000
  START = 1_796_000_000 * 1_000_000_000 - (1_796_000_000 % 3600) * 1_000_000_000 # on the hour
  MS = 1_000_000

  def setup
    skip "this build reads profiles in Ruby only" unless Contprof::Report::MergedProfiles.available?
    @dir = Dir.mktmpdir("contprof-viewer-hours")
  end

  def teardown
    FileUtils.rm_rf(@dir) if @dir
  end

  # Minute `minute` of process `pid`: a stretch in `Wait` that began 15 ms before the
  # file's period, CPU in `Work` on a few timeline samples, an instant sample, and a
  # sample without a timestamp.
  def write_minute(pid, minute)
    start = START + minute * MINUTE
    recorder = Contprof::StackRecorder.new
    thread = { "thread id" => pid, "thread name" => "worker #{pid}" }
    sample = lambda do |name, timestamp, cpu, wall|
      labels = timestamp ? thread.merge("end_timestamp_ns" => timestamp) : thread
      recorder.record_sample([[name, "/app/#{name.downcase}.rb", 3], ["<main>", "/app/main.rb", 1]],
                             { "cpu-time" => cpu, "cpu-samples" => cpu.positive? ? 1 : 0,
                               "wall-time" => wall, "wall-samples" => 1 }, labels)
    end
    sample.("Wait", start + 5 * MS, 0, 20 * MS)
    [7, 19, 31, 43, 55].each { |second| sample.("Work", start + second * 1000 * MS, (10 + minute % 7) * MS, 40 * MS) }
    sample.("Tick", start + 30_000 * MS + 1, 2 * MS, 0)
    sample.("Flush", nil, 3 * MS, 3 * MS)
    stamp = Time.at(start / 1_000_000_000).utc.strftime("%Y%m%dT%H%M%S.000000Z")
    File.binwrite(File.join(@dir, "svc-#{pid}-#{stamp}.pprof"), SyntheticProfiles.retimed(recorder.serialize.last, start, MINUTE))
  end

  def get(app, path)
    route, query = path.split("?", 2)
    status, _, body = app.call("REQUEST_METHOD" => "GET", "PATH_INFO" => route, "QUERY_STRING" => query.to_s)
    assert_equal 200, status, body.join
    body.join
  end

  def at(nanos)
    Time.at(nanos / 1_000_000_000, nanos % 1_000_000_000, :nsec).utc
  end

  def test_ranges_over_hours_equal_the_reports_of_their_files
    [1, 2].each { |pid| 180.times { |minute| write_minute(pid, minute) } } # three hours
    app = Contprof::Viewer.new(@dir)
    files = Dir[File.join(@dir, "*.pprof")].sort
    ranges = [
      [START + 60 * MINUTE, START + 180 * MINUTE], # two whole hours, on minutes (edges reach out)
      [START + 37 * MINUTE + 30_000 * MS, START + 151 * MINUTE + 30_000 * MS + 1], # mid-minute, mid-sample
      [START + 59 * MINUTE + 7_000 * MS, START + 120 * MINUTE + 7_000 * MS] # an edge on a stretch's end
    ]
    ranges.each do |from, to|
      query = "from=#{at(from).iso8601(9)}&to=#{at(to).iso8601(9)}&type=cpu-time&limit=10"
      view = get(app, "/top?#{query}")
      report, err, = Open3.capture3(RbConfig.ruby, EXE, "report", *files, "--from", at(from).iso8601(9),
                                    "--to", at(to).iso8601(9), "--type", "cpu-time", "--top", "10")
      assert_empty err
      assert_equal report, view, "the view of #{query} is the report of its files"

      ruby = Contprof::Report::Profiles.load(files, from: at(from), to: at(to))
      merged = Contprof::Report::Profiles.load(files, from: at(from), to: at(to), aggregate: true)
      %w[cpu-time cpu-samples wall-time wall-samples].each do |type|
        assert_equal ruby.stacks_by_function(type), merged.stacks_by_function(type), "#{type} of #{query}"
      end
      wall = get(app, "/top?#{query.sub("cpu-time", "wall-time")}")
      wait = wall.lines.find { |line| line.end_with?(" Wait\n") }
      assert wait, wall
      assert_equal get(app, "/top?#{query}"), view, "a view again (its hours kept) says the same"
    end
    parts = app.instance_variable_get(:@hour_parts)
    refute_empty parts, "hours wholly in a range were kept"
    assert parts.keys.all? { |_, _, entries| entries.size.between?(1, 120) }
  end

  # Live-heap growth over more files than the view reads: every k-th file of each process
  # stands for the range, and a site growing steadily keeps its slope.
  def test_growth_over_more_files_than_it_reads_takes_every_kth_file
    [1, 2].each do |pid|
      30.times do |minute|
        start = START + minute * MINUTE
        recorder = Contprof::StackRecorder.new(sample_types: [%w[heap-live-samples count], %w[heap-live-size bytes]])
        recorder.record_sample([["Leak#grow", "/app/leak.rb", 5]], { "heap-live-samples" => 1 + minute, "heap-live-size" => 1000 * (1 + minute) },
                               { "allocation class" => "String" })
        recorder.record_sample([["Cache#fill", "/app/cache.rb", 9]], { "heap-live-samples" => 5, "heap-live-size" => 7000 },
                               { "allocation class" => "Hash" })
        stamp = Time.at(start / 1_000_000_000).utc.strftime("%Y%m%dT%H%M%S.000000Z")
        File.binwrite(File.join(@dir, "svc-#{pid}-#{stamp}.pprof"), SyntheticProfiles.retimed(recorder.serialize.last, start, MINUTE))
      end
    end
    every = get(Contprof::Viewer.new(@dir), "/growth")
    require "contprof/reports/growth"
    whole = Contprof::Report::Profiles.each_file(Dir[File.join(@dir, "*.pprof")].sort).map { |path, profile| [File.basename(path), profile] }
    assert_equal Contprof::Report::Growth.format(whole, "heap-live-size", limit: 50), every,
                 "read by the extension with only each stack's leaf and caller, as read whole in Ruby"
    sampled = get(Contprof::Viewer.new(@dir, growth_files: 20), "/growth")
    assert_match(/\A\(one profile in 3 of each process read: at most 20 for this view\)\n/, sampled)
    assert_match(/20 periods of 2 processes/, sampled)
    assert_match(/60 periods of 2 processes/, every)
    # 1,000 bytes a minute in each of two processes: 120 kB an hour, in both.
    [every, sampled].each { |text| assert_match(%r{^ +117\.19kB .* Leak#grow /app/leak\.rb:5 \(String\)$}, text) }
    refute_match(/Cache#fill/, sampled, "a steady site does not grow")
  end

  # A flame graph of more files than TIMELINE_FILES is summed per stack: no lanes, and its
  # title says how to get them.
  def test_a_long_range_s_flame_graph_has_no_lanes_and_says_why
    [1, 2].each { |pid| 20.times { |minute| write_minute(pid, minute) } }
    app = Contprof::Viewer.new(@dir)
    short = get(app, "/flamegraph?from=#{at(START).iso8601}&to=#{at(START + 4 * MINUTE).iso8601}")
    long = get(app, "/flamegraph?from=#{at(START).iso8601}&to=#{at(START + 20 * MINUTE).iso8601}")
    data = ->(html) { JSON.parse(html[%r{<script id="profile-data" type="application/json">(.*?)</script>}m, 1].gsub("<\\/", "</")) }
    refute_nil data.(short)["timeline"], "8 files: the lanes are drawn"
    refute data.(long)["timeline"]
    assert_match(/timeline lanes for at most #{Contprof::Viewer::TIMELINE_FILES} files/, long)
    # (The root's values, one triple per thread and idleness: node as a step from the last.)
    cpu = lambda do |html|
      node = 0
      data.(html)["trees"]["callees"]["totals"][0].each_slice(3).sum { |step, _, value| (node += step).zero? ? value : 0 }
    end
    expected = 2 * 20.times.sum { |minute| 5 * (10 + minute % 7) * MS + 2 * MS + 3 * MS }
    assert_equal expected, cpu.(long), "every file's CPU, summed per stack"
  end
end
