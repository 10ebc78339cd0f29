# frozen_string_literal: true

require_relative "../test_helper"
require_relative "../support/synthetic_profiles"
require "tmpdir"
require "net/http"
require "contprof/viewer/viewer"
require_relative "../support/chromium"

# Contprof::Viewer and `contprof serve`: the views of a range against `contprof report` on
# the same files, the index beside the profiles (built, kept, brought up to date, rebuilt
# when damaged), bad input (a 4xx with its reason; nothing read outside the directory,
# nothing written but the index), and the page in headless Chromium.
class ViewerTest < Minitest::Test
  include Chromium

  EXE = File.expand_path("../../exe/contprof", __dir__)
  MAIN = ["<main>", "/app/main.rb", 1].freeze
  MINUTE = 60 * 1_000_000_000
  START = 1_796_000_000 * 1_000_000_000

  def setup
    @dir = Dir.mktmpdir("contprof-viewer")
  end

  def teardown
    FileUtils.rm_rf(@dir)
  end

  # A one-minute profile of `pid` starting `minute` minutes after START, its CPU in
  # `functions` ({name => ms}).
  def write_minute(pid, minute, functions, service: "shop", version: nil)
    recorder = Contprof::StackRecorder.new
    recorder.add_comment(Contprof::DeployTags.comment(Struct.new(:version, :env).new(version, "prod"))) if version
    functions.each do |name, ms|
      recorder.record_sample([[name, "/app/a.rb", 1], MAIN], { "cpu-time" => ms * 1_000_000, "cpu-samples" => ms / 10,
                                                               "wall-time" => ms * 1_000_000, "wall-samples" => ms / 10 },
                             { "thread id" => "1", "endpoint" => "GET /#{name.downcase}" })
    end
    start = START + minute * MINUTE
    stamp = Time.at(start / 1_000_000_000).utc.strftime("%Y%m%dT%H%M%S.000000Z")
    path = File.join(@dir, "#{service}-#{pid}-#{stamp}.pprof")
    File.binwrite(path, SyntheticProfiles.retimed(recorder.serialize.last, start, MINUTE))
    path
  end


  def get(app, path, method: "GET")
    path, query = path.split("?", 2)
    status, headers, body = app.call("REQUEST_METHOD" => method, "PATH_INFO" => path, "QUERY_STRING" => query.to_s)
    [status, headers["content-type"], body.join]
  end

  def iso(minute)
    Time.at((START + minute * MINUTE) / 1_000_000_000).utc.iso8601
  end

  def ten_minutes(versions: false)
    10.times do |minute|
      version = versions ? (minute < 5 ? "1.0" : "2.0") : nil
      write_minute(1, minute, { "Parse" => 300, "Render" => minute < 5 ? 200 : 600 }, version: version)
      write_minute(2, minute, { "Parse" => 100 }, service: "worker", version: version)
    end
  end

  # Before and after a deploy: each profile carries the `version` it was written under
  # (DeployTags, a comment of the pprof); `version` and `base_version` choose the files of
  # each, in the viewer as in `contprof report DIR --version --base-version`.
  def test_two_deploys_are_compared_by_their_versions
    ten_minutes(versions: true)
    app = Contprof::Viewer.new(@dir)
    status, _, body = get(app, "/top?version=2.0&base_version=1.0&service=shop&type=cpu-time&limit=5")
    assert_equal 200, status, body
    render = body.lines.find { |line| line.end_with?("Render\n") }
    assert_match(/ 66\.67% +40\.00% +\+26\.67pt /, render) # as the two ranges of the same files
    expected, err, = Open3.capture3(RbConfig.ruby, EXE, "report", *Dir[File.join(@dir, "shop-*.pprof")], "--version", "2.0",
                                    "--base-version", "1.0", "--type", "cpu-time", "--top", "5")
    assert_empty err
    assert_equal expected.lines.drop(1), body.lines.drop(1)

    status, _, body = get(app, "/top?version=3.0")
    assert_equal 404, status
    assert_match(/no profile in from\.\.to of version "3\.0"/, body)
    _, err, status = Open3.capture3(RbConfig.ruby, EXE, "report", @dir, "--version", "3.0")
    refute status.success?
    assert_match(/no profile of version "3\.0" \(versions: 1\.0, 2\.0\)/, err)

    _, _, body = get(app, "/")
    home = JSON.parse(body[/var data = (\{.*?\});\n/m, 1])
    assert_equal({ "1.0" => [10, START], "2.0" => [10, START + 5 * MINUTE] }, home["versions"])
    # On the page: the versions listed, and the two fields carried by the comparing links.
    html = File.join(@dir, "home.html")
    File.write(html, body)
    result = run_in_chromium(html, <<~JS)
      result.versions = document.getElementById("version-list").textContent;
      result.options = document.querySelectorAll("#versions option").length;
      [["version", "2.0"], ["base_version", "1.0"]].forEach(function (field) {
        var input = document.getElementById(field[0]);
        input.value = field[1];
        input.dispatchEvent(new Event("change"));
      });
      result.top = document.getElementById("link-top").getAttribute("href");
      result.label = document.getElementById("link-top").textContent;
      result.by = document.getElementById("link-by").getAttribute("href");
    JS
    assert_empty result["errors"]
    assert_match(/1\.0: 10 profiles from .*; 2\.0: 10 profiles from /, result["versions"])
    assert_equal 2, result["options"]
    top = URI.decode_www_form(result["top"].split("?", 2)[1]).to_h
    assert_equal({ "version" => "2.0", "base_version" => "1.0" }, top.slice("version", "base_version"))
    assert_match(/compared with the base/, result["label"])
    assert_match(/version=2\.0/, result["by"])
    refute_match(/base_version/, result["by"], "a table by endpoint compares nothing")
    status, _, text = get(app, result["top"])
    assert_equal 200, status, text
  end

  def test_views_of_a_range_are_the_reports_of_its_files
    ten_minutes
    app = Contprof::Viewer.new(@dir)
    status, type, body = get(app, "/top?from=#{iso(5)}&to=#{iso(10)}&service=shop&type=cpu-time")
    assert_equal [200, "text/plain; charset=utf-8"], [status, type], body
    files = Dir[File.join(@dir, "shop-*.pprof")].sort.last(5)
    expected, err, = Open3.capture3(RbConfig.ruby, EXE, "report", *files, "--type", "cpu-time", "--top", "50")
    assert_empty err
    assert_equal expected.lines.drop(1), body.lines.drop(1), "the rows of contprof report on the same files"
    assert_match(/\Acpu-time: 4\.50s in all, 2 records/, body) # 5 x (300 + 600) ms, summed per stack

    status, _, body = get(app, "/top?from=#{iso(5)}&base_to=#{iso(5)}&service=shop&type=cpu-time&limit=5")
    assert_equal 200, status, body
    render = body.lines.find { |line| line.end_with?("App#render\n") || line.end_with?("Render\n") }
    # Render: 600 of 900 ms a minute after, 200 of 500 before.
    assert_match(/ 66\.67% +40\.00% +\+26\.67pt /, render)

    status, _, body = get(app, "/by?key=endpoint&service=worker")
    assert_equal 200, status, body
    assert_match(%r{ 1s +100% .* GET /parse$}, body)

    status, type, body = get(app, "/flamegraph?from=#{iso(0)}&to=#{iso(2)}&base_from=#{iso(8)}")
    assert_equal [200, "text/html; charset=utf-8"], [status, type]
    data = JSON.parse(body[%r{<script id="profile-data" type="application/json">(.*?)</script>}m, 1].gsub("<\\/", "</"))
    assert_equal 2 * (300 + 200 + 100) * 1_000_000, data["trees"]["callees"]["totals"][0].each_slice(3).first[2]
    refute_nil data["base"], "a base range makes a differential flame graph"

    status, type, body = get(app, "/")
    assert_equal [200, "text/html; charset=utf-8"], [status, type]
    home = JSON.parse(body[/var data = (\{.*?\});\n/m, 1])
    assert_equal [20, { "shop" => [10, 1], "worker" => [10, 1] }], [home["files"], home["services"]]
    assert_equal 10 * (300 + 100) * 1_000_000 + 5 * 200 * 1_000_000 + 5 * 600 * 1_000_000, home["sums"]["cpu-time"].sum
    # Mounted in an app (SCRIPT_NAME), its links start where it is mounted.
    _, _, mounted = app.call("REQUEST_METHOD" => "GET", "SCRIPT_NAME" => "/profiles", "PATH_INFO" => "", "QUERY_STRING" => "")
    assert_equal "/profiles", JSON.parse(mounted.join[/var data = (\{.*?\});\n/m, 1])["mountedAt"]
  end

  def test_bad_requests_get_a_reason_and_nothing_outside_is_read_or_anything_written_but_the_index
    ten_minutes
    before = Dir.children(@dir).sort
    app = Contprof::Viewer.new(@dir, max_files: 12)
    {
      "/etc/passwd" => [404, /no such page: "\/etc\/passwd"/],
      "/../#{File.basename(@dir)}/x.pprof" => [404, /no such page/],
      "/top?path=/etc/passwd" => [400, /unknown parameter "path"/],
      "/top?from=yesterday" => [400, /from takes an ISO 8601 time/],
      "/top?from=1&from=2" => [400, /from is given 2 times/],
      "/top?limit=0" => [400, /limit takes a number of rows from 1 to 10000/],
      "/top?label=nokey" => [400, /label takes KEY=VALUE/],
      "/top?type=bogus&service=shop&from=#{iso(9)}" => [400, /no sample type "bogus"/],
      "/top?%zz" => [400, /unknown parameter "%zz"/],
      "/top?from=%ff%fe" => [400, /from takes an ISO 8601 time .*got "\?+"/],
      "/top" => [413, /the range holds 20 profiles .* at most 12 .* narrow the range/],
      "/top?from=#{iso(100)}" => [404, /no profile in from..to/],
      "/top?service=shop&from=#{iso(8)}&thread=nobody" => [422, /no sample matches --thread nobody/],
      "/growth?service=shop&from=#{iso(8)}" => [422, /no sample type "heap-live-size"/],
    }.each do |path, (status, message)|
      got, type, body = get(app, path)
      assert_equal [status, "text/plain; charset=utf-8"], [got, type], "#{path}: #{body}"
      assert_match message, body, path
    end
    assert_equal 405, get(app, "/top", method: "POST").first
    assert_equal (before + [Contprof::Viewer::ProfileIndex::INDEX_FILE]).sort, Dir.children(@dir).sort
  end

  def test_the_index_is_kept_beside_the_profiles_brought_up_to_date_and_rebuilt_when_damaged
    ten_minutes
    index_file = File.join(@dir, Contprof::Viewer::ProfileIndex::INDEX_FILE)
    index = Contprof::Viewer::ProfileIndex.new(@dir)
    assert_equal 20, index.entries.size
    # Each entry's totals and period are the profile's (read by Pprof.summary, not decoded whole).
    index.entries.each do |entry|
      profile = Contprof::Pprof.decode_file(index.path_of(entry))
      assert_equal profile.sample_type_names.to_h { |type| [type, profile.total(type)] }, entry.totals
      assert_equal [profile.time_nanos, profile.duration_nanos], [entry.start, entry.duration]
    end
    assert_equal 20, JSON.parse(File.read(index_file))["entries"].size
    # A new process's index reads the file, not the profiles: a profile it would fail to
    # read is not read again while unchanged.
    File.write(File.join(@dir, "notes.pprof"), "not a profile")
    fresh = Contprof::Viewer::ProfileIndex.new(@dir)
    assert_equal 20, fresh.entries.size
    assert_equal ["notes.pprof"], fresh.unreadable
    added = write_minute(3, 11, { "Late" => 100 })
    File.unlink(Dir[File.join(@dir, "worker-*.pprof")].min)
    entries = fresh.entries
    assert_equal 20, entries.size
    assert_equal [11 * MINUTE + START, 3], entries.last.then { |e| [e.start, e.pid] }
    assert_includes entries.map(&:name), File.basename(added)
    File.write(index_file, "{ damaged")
    assert_equal 20, Contprof::Viewer::ProfileIndex.new(@dir).entries.size
    assert_equal 20, JSON.parse(File.read(index_file))["entries"].size
  end

  # The page in Chromium: the time axis draws a bar per minute with profiles, a drag
  # chooses the range and, with "base" ticked, the base; the links carry both, and the
  # page's own URL keeps its state.
  def test_the_page_draws_the_time_axis_and_a_drag_chooses_the_ranges
    ten_minutes
    _, _, body = get(Contprof::Viewer.new(@dir), "/")
    html = File.join(@dir, "home.html")
    File.write(html, body)
    result = run_in_chromium(html, <<~JS)
      var chart = document.getElementById("chart"), box = chart.getBoundingClientRect();
      function drag(from, to) {
        chart.dispatchEvent(new MouseEvent("mousedown", { clientX: box.left + from * box.width, bubbles: true }));
        window.dispatchEvent(new MouseEvent("mouseup", { clientX: box.left + to * box.width, bubbles: true }));
      }
      result.bars = chart.querySelectorAll(".bar").length;
      drag(0.55, 0.99);
      result.from = document.getElementById("from").value;
      result.top = document.getElementById("link-top").getAttribute("href");
      document.getElementById("choose-base").checked = true;
      drag(0.01, 0.45);
      result.compare = document.getElementById("link-top").getAttribute("href");
      result.by = document.getElementById("link-by").getAttribute("href");
      result.ranges = chart.querySelectorAll(".range").length;
      result.summary = document.getElementById("summary").textContent;
    JS
    assert_empty result["errors"]
    assert_operator result["bars"], :>=, 10
    assert_equal 2, result["ranges"]
    from = Time.iso8601(result["from"]).to_i * 1_000_000_000
    assert_in_delta START + 5.5 * MINUTE, from, 0.2 * MINUTE
    top = URI.decode_www_form(result["top"].split("?", 2)[1]).to_h
    assert_equal %w[from to type], top.keys.sort
    compare = URI.decode_www_form(result["compare"].split("?", 2)[1]).to_h
    assert_equal %w[base_from base_to from to type], compare.keys.sort
    refute_match(/base_/, result["by"], "a table by endpoint compares nothing")
    assert_match(/\A20 profiles /, result["summary"])
    # The views those links name answer as the test above expects.
    status, _, text = get(Contprof::Viewer.new(@dir), result["compare"])
    assert_equal 200, status, text
    assert_match(/base/, text.lines.first)
  end

  def test_contprof_serve_answers_over_http_and_stops_at_sigterm
    ten_minutes
    reader, writer = IO.pipe
    pid = Process.spawn(RbConfig.ruby, EXE, "serve", @dir, "--port", "0", out: writer, err: writer)
    writer.close
    line = reader.gets
    port = Integer(line[%r{http://127\.0\.0\.1:(\d+)/}, 1])
    response = Net::HTTP.get_response(URI("http://127.0.0.1:#{port}/top?service=worker"))
    assert_equal "200", response.code
    assert_match(/App#parse|Parse/, response.body)
    assert_equal "404", Net::HTTP.get_response(URI("http://127.0.0.1:#{port}/nothing")).code
    Process.kill("TERM", pid)
    _, status = Process.wait2(pid)
    assert status.success?, status.inspect
    _, err, status = Open3.capture3(RbConfig.ruby, EXE, "serve")
    assert_equal [2, "contprof: serve needs at least one profile directory (see contprof serve --help)\n"], [status.exitstatus, err]
  ensure
    reader&.close
  end
end
