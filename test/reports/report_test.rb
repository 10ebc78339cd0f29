# frozen_string_literal: true

require_relative "../test_helper"
require_relative "../support/synthetic_profiles"
require "tmpdir"
require "json"
require "time"
require "contprof/reports/report"

# `contprof report` on several files: merging, filters, time ranges, --top against
# `go tool pprof -top`, and the speedscope file. Run as users run it, as a separate process.
class ReportTest < Minitest::Test
  EXE = File.expand_path("../../exe/contprof", __dir__)
  MAIN = ["<main>", "/app/main.rb", 1].freeze

  def setup
    @dir = Dir.mktmpdir("contprof-report")
  end

  def teardown
    FileUtils.rm_rf(@dir)
  end

  def contprof(*arguments)
    Open3.capture3(RbConfig.ruby, EXE, *arguments)
  end

  # Writes a profile of the given samples ([stack leaf first, values, labels]) and returns its path.
  def write_profile(name, samples, sample_types: nil)
    recorder = sample_types ? Contprof::StackRecorder.new(sample_types: sample_types) : Contprof::StackRecorder.new
    samples.each { |stack, values, labels| recorder.record_sample(stack, values, labels || {}) }
    path = File.join(@dir, name)
    File.binwrite(path, recorder.serialize.last)
    path
  end

  def web_samples(thread_id, scale)
    labels = { "thread id" => thread_id, "thread name" => "web-#{thread_id}" }
    [[[["Shop#checkout", "/app/shop.rb", 12], ["Router#call", "/app/router.rb", 5], MAIN],
      { "cpu-time" => 30_000_000 * scale, "cpu-samples" => 3 * scale, "wall-time" => 31_000_000 * scale }, labels],
     [[["Shop#render", "/app/shop.rb", 40], ["Router#call", "/app/router.rb", 5], MAIN],
      { "cpu-time" => 12_345_678 * scale, "cpu-samples" => scale, "wall-time" => 12_400_000 * scale }, labels],
     [[["Kernel#sleep", "<internal:kernel>", 0], ["Router#call", "/app/router.rb", 6], MAIN],
      { "wall-time" => 500_000_000 * scale, "cpu-samples" => 0 }, labels.merge("request" => "slow")]]
  end

  # The rows of `go tool pprof -top` (without -nodefraction, Go drops small functions).
  def go_top_rows(type, *paths)
    out, err, status = Open3.capture3({ "HOME" => Dir.tmpdir }, go_command, "tool", "pprof", "-top", "-nodefraction=0",
                                      "-sample_index=#{type}", *paths)
    assert status.success?, err
    out.lines.drop_while { |line| !line.include?("flat%") }
  end

  def test_top_of_two_files_equals_go_tool_pprof_top_of_both
    a = write_profile("a.pprof", web_samples(1, 1))
    b = write_profile("b.pprof", web_samples(2, 3) + [[[["Cache#fetch", "/app/cache.rb", 9], MAIN], { "cpu-time" => 7 }]])
    [a, b].each { |path| decode_profile(File.binread(path)) } # Go and we read the same samples
    %w[cpu-time cpu-samples wall-time].each do |type|
      out, err, status = contprof("report", a, b, "--top", "1000", "--type", type)
      assert status.success?, err
      ours = without_error_bars(out.lines.drop(1))
      assert_equal go_top_rows(type, a, b), ours, "#{type}: contprof report --top against go tool pprof -top"
      assert_match(/Shop#checkout\n/, ours[1]) if type == "cpu-time"
    end
    out, = contprof("report", a, b, "--top", "2", "--type", "cpu-time")
    assert_equal go_top_rows("cpu-time", a, b).first(3), without_error_bars(out.lines.drop(1))
  end

  # Our --top rows without the columns Go has not: samples and the share's standard error
  # (right after cum%, when the profile counts its samples).
  def without_error_bars(lines)
    lines.map { |line| line.sub(/ +samples +± flat%$/, "").sub(/ +\d+ +(?:±\S+%|-)(?=  )/, "") }
  end

  def test_a_directory_is_its_pprof_files_and_merging_sums_them
    write_profile("one.pprof", web_samples(1, 1))
    write_profile("two.pprof", web_samples(1, 2))
    File.write(File.join(@dir, "notes.txt"), "not a profile")
    out, err, status = contprof("report", @dir, "--folded")
    assert status.success?, err
    assert_includes out.lines, "<main>;Router#call;Shop#checkout #{30_000_000 * 3}\n"
    _, err, status = contprof("report", File.join(@dir, "empty-dir-that-is-missing"))
    assert_equal 2, status.exitstatus
    assert_match(/cannot read .*empty-dir-that-is-missing/, err)
  end

  def test_sample_types_must_match_and_the_error_names_both_files
    a = write_profile("a.pprof", web_samples(1, 1))
    b = write_profile("alloc.pprof", [[[MAIN], { "alloc-size" => 10 }]], sample_types: [["alloc-size", "bytes"]])
    _, err, status = contprof("report", a, b)
    assert_equal 2, status.exitstatus
    assert_equal "contprof: sample types differ: #{a} has cpu-time (nanoseconds), cpu-samples (count), " \
                 "wall-time (nanoseconds), wall-samples (count), #{b} has alloc-size (bytes) (merge only profiles of the same kind)\n", err
  end

  # On a timeline, the nanoseconds of one stack's samples are carried between neighbours on the
  # grid (pprof_timeline.c): a sample may keep its count and give its time to the next. The
  # samples behind a row are every count of its function, whatever the value beside it.
  def test_samples_behind_a_row_count_samples_whose_time_went_to_a_neighbour
    work = [["Work#run", "/app/work.rb", 3], MAIN]
    other = [["Other#run", "/app/other.rb", 9], MAIN]
    path = write_profile("grid.pprof", [
                           [work, { "cpu-time" => 0, "cpu-samples" => 1, "wall-time" => 0 }, { "thread id" => "1" }],
                           [work, { "cpu-time" => 9_000_000, "cpu-samples" => 0, "wall-time" => 9_000_000 }, { "thread id" => "2" }],
                           [other, { "cpu-time" => 3_000_000, "cpu-samples" => 1, "wall-time" => 3_000_000 }, { "thread id" => "1" }]
                         ])
    out, err, status = contprof("report", path, "--top", "10", "--type", "cpu-time")
    assert status.success?, err
    row = out.lines.find { |line| line.include?("Work#run") }.split
    assert_equal ["75.00%", "1"], [row[1], row[5]], out
    refute_equal "-", row[6], out
  end

  def test_thread_and_label_filters
    path = write_profile("threads.pprof", web_samples(1, 1) + web_samples(2, 10))
    by_name, = contprof("report", path, "--thread", "web-2", "--folded", "--type", "wall-time")
    by_id, = contprof("report", path, "--thread", "2", "--folded", "--type", "wall-time")
    assert_equal by_name, by_id
    assert_includes by_name.lines, "<main>;Router#call;Kernel#sleep 5000000000\n"
    refute_includes by_name.lines, "<main>;Router#call;Kernel#sleep 500000000\n"
    slow, = contprof("report", path, "--label", "request=slow", "--folded", "--type", "wall-time")
    assert_equal ["<main>;Router#call;Kernel#sleep 5500000000\n"], slow.lines
    _, err, status = contprof("report", path, "--thread", "web-9")
    assert_equal 2, status.exitstatus
    assert_match(/\Acontprof: no sample matches --thread web-9 \(threads: web-[12] \([12]\), web-[12] \([12]\)\)\n\z/, err)
    _, err, status = contprof("report", path, "--label", "request")
    assert_equal 2, status.exitstatus
    assert_match(/--label takes KEY=VALUE/, err)
  end

  def test_time_range_keeps_the_files_that_overlap_it
    recorder = Contprof::StackRecorder.new
    recorder.record_sample([["Early#work", "/app/e.rb", 1], MAIN], { "cpu-time" => 5 })
    _, early_end, early = recorder.serialize
    recorder.record_sample([["Late#work", "/app/l.rb", 1], MAIN], { "cpu-time" => 7 })
    late_start, late_end, late = recorder.serialize
    File.binwrite(File.join(@dir, "early.pprof"), early)
    File.binwrite(File.join(@dir, "late.pprof"), late)
    out, err, status = contprof("report", @dir, "--folded", "--from", late_start.iso8601(9))
    assert status.success?, err
    assert_equal ["<main>;Late#work 7\n"], out.lines
    out, = contprof("report", @dir, "--folded", "--to", early_end.iso8601(9))
    assert_equal ["<main>;Early#work 5\n"], out.lines
    _, err, status = contprof("report", @dir, "--from", (late_end + 3600).iso8601)
    assert_equal 2, status.exitstatus
    assert_match(/no profile overlaps the time range .* \(the files span .* to .*\)/, err)
    _, err, status = contprof("report", @dir, "--from", "yesterday")
    assert_equal 2, status.exitstatus
    assert_match(/--from takes an ISO 8601 time/, err)
  end

  # --base: per function, the flat value in each profile, the change, the shares and the
  # change of share with its standard error (the two shares' errors combined), by change.
  def test_comparison_with_a_base_ranks_functions_by_change_of_share
    parse = [["App#parse", "/app/a.rb", 1], MAIN]
    render = [["App#render", "/app/a.rb", 2], MAIN]
    cache = [["App#cache", "/app/a.rb", 3], MAIN]
    base = write_profile("base.pprof", [[parse, { "cpu-time" => 600, "cpu-samples" => 60 }],
                                        [render, { "cpu-time" => 400, "cpu-samples" => 40 }]])
    new = write_profile("new.pprof", [[parse, { "cpu-time" => 600, "cpu-samples" => 60 }],
                                      [render, { "cpu-time" => 1000, "cpu-samples" => 100 }],
                                      [cache, { "cpu-time" => 400, "cpu-samples" => 40 }]])
    out, err, status = contprof("report", new, "--base", base, "--type", "cpu-time")
    assert status.success?, err
    assert_match(/\Acpu-time: 2us in all, base 1us \(\+100\.0%\); new: 3 records, .*; base: 2 records, /, out.lines[0])
    rows = out.lines.drop(2).map(&:split)
    # Shares: parse 60% -> 30%, render 40% -> 50%, cache 0 -> 20%. Errors: p (1 - p)
    # sqrt(1/n + 1/m) in each profile, combined; a share of 0 from 0 samples has none.
    error = lambda do |p, n, all|
      return 0.0 if p.zero?

      p * (1 - p) * Math.sqrt(1.0 / n + 1.0 / (all - n))
    end
    expected = [["App#parse", 0.30, 0.60, error.(0.3, 60, 200), error.(0.6, 60, 100)],
                ["App#cache", 0.20, 0.0, error.(0.2, 40, 200), 0.0],
                ["App#render", 0.50, 0.40, error.(0.5, 100, 200), error.(0.4, 40, 100)]]
    assert_equal expected.map(&:first), rows.map(&:last)
    expected.zip(rows).each do |(name, share, base_share, mine, theirs), row|
      assert_equal format("%.2f%%", 100 * share), row[3], name
      assert_equal format("%.2f%%", 100 * base_share), row[4], name
      assert_equal format("%+.2fpt", 100 * (share - base_share)), row[5], name
      combined = 100 * Math.sqrt(mine**2 + theirs**2)
      assert_equal Contprof::Report.format_error(combined, "pt"), row[6], name
    end
    assert_equal %w[600ns 600ns 0], rows[0][0, 3]
    assert_equal %w[400ns 0 +400ns], rows[1][0, 3]

    _, err, status = contprof("report", new, "--base", base, "--folded")
    assert_equal 2, status.exitstatus
    assert_match(/--base compares with --top and --flamegraph only \(not --folded\)/, err)
    _, err, status = contprof("report", new, "--base", File.join(@dir, "missing.pprof"))
    assert_equal 2, status.exitstatus
    assert_match(/cannot read .*missing\.pprof/, err)
  end

  def test_output_modes_are_never_chosen_silently
    path = write_profile("a.pprof", web_samples(1, 1))
    _, err, status = contprof("report", path, "--top", "3", "--folded")
    assert_equal 2, status.exitstatus
    assert_match(/choose one of --top and --folded/, err)
    html = File.join(@dir, "flame.html")
    out, err, status = contprof("report", path, "--folded", "--flamegraph", html)
    assert status.success?, err
    assert_equal "wrote #{html}\n", err
    assert_match(/\A<main>;/, out)
    _, err, status = contprof("report", path, "--flamegraph", "--", "x")
    assert_equal 2, status.exitstatus
    assert_match(/--flamegraph needs a file name/, err)
  end

  def test_speedscope_has_one_profile_per_type_and_thread_with_the_pprof_totals
    path = write_profile("a.pprof", web_samples(1, 1) + web_samples(2, 5))
    profile = decode_profile(File.binread(path))
    file = File.join(@dir, "a.speedscope.json")
    out, err, status = contprof("report", path, "--speedscope", file)
    assert status.success?, err
    assert_equal "wrote #{file}\n", out
    document = JSON.parse(File.read(file))
    assert_equal "https://www.speedscope.app/file-format-schema.json", document["$schema"]
    frames = document.dig("shared", "frames")
    names = %w[cpu-time cpu-samples wall-time].product(["web-1 (1)", "web-2 (2)"]).map { |t, th| "#{t} — #{th}" }
    assert_equal names, document["profiles"].map { |p| p["name"] }
    document["profiles"].each do |speedscope|
      type, thread = speedscope["name"].split(" — ")
      thread_id = Integer(thread[/\((\d+)\)/, 1])
      expected = profile.total(type) { |sample| sample.labels["thread id"] == thread_id }
      assert_equal expected, speedscope["weights"].sum, speedscope["name"]
      assert_equal [0, expected], [speedscope["startValue"], speedscope["endValue"]]
      assert_equal "sampled", speedscope["type"]
      assert_equal type == "cpu-samples" ? "none" : "nanoseconds", speedscope["unit"]
      speedscope["samples"].each { |stack| assert_equal "<main>", frames.fetch(stack.first)["name"], "root first" }
    end
    checkout = frames.index { |f| f["name"] == "Shop#checkout" }
    assert_equal({ "name" => "Shop#checkout", "file" => "/app/shop.rb", "line" => 12 }, frames[checkout])
  end

  def test_a_big_profile_reads_the_same_through_our_reader_and_go
    bytes = SyntheticProfiles.wide(stacks: 2_000)
    profile = decode_profile(bytes)
    assert_equal 2_000, profile.sample_count
    path = File.join(@dir, "wide.pprof")
    File.binwrite(path, bytes)
    out, err, status = contprof("report", path, "--top", "100000", "--type", "wall-time")
    assert status.success?, err
    assert_equal go_top_rows("wall-time", path), out.lines.drop(1)
  end
end
