# frozen_string_literal: true

require_relative "../test_helper"
require_relative "../support/synthetic_profiles"
require_relative "../support/chromium"
require "tmpdir"
require "json"
require "cgi"
require "uri"
require "contprof/reports/report"

# The HTML flame graph, opened in headless Chromium: a stack 10,000 frames deep and a
# profile of 20,000 stacks render without page errors and show the expected frames, and
# zoom, search, the thread selector, the idle-wait toggle and the callers view work. The
# page is driven by a script added to a copy of it, whose findings (and any page error)
# are read back from the DOM Chromium dumps.
class FlamegraphBrowserTest < Minitest::Test
  include Chromium

  EXE = File.expand_path("../../exe/contprof", __dir__)

  def setup
    @dir = Dir.mktmpdir("contprof-flamegraph")
  end

  def teardown
    FileUtils.rm_rf(@dir)
  end

  def flamegraph_of(bytes)
    pprof = File.join(@dir, "profile.pprof")
    File.binwrite(pprof, bytes)
    html = File.join(@dir, "flame.html")
    out, err, status = Open3.capture3(RbConfig.ruby, EXE, "report", pprof, "--flamegraph", html)
    assert status.success?, err
    assert_equal "wrote #{html}\n", out
    page = File.read(html)
    refute_match(%r{<script[^>]+src=|<link[^>]+href=|https?://(?!www\.speedscope)}, page, "self-contained: nothing to fetch")
    html
  end

  def in_chromium(html, script, fragment: "")
    run_in_chromium(html, "#{FLAME_GRAPH_HELPERS}\n#{script}", fragment: fragment)
  end

  def test_a_stack_10000_frames_deep_renders_zooms_and_searches
    html = flamegraph_of(SyntheticProfiles.deep(depth: 10_000))
    result = in_chromium(html, <<~JS)
      result.drawn = document.querySelectorAll(".frame").length;
      result.leaf = width("Deep#leaf");
      result.leafTop = frames("Deep#leaf")[0].style.top;
      result.shallow = width("Shallow#work");
      frames("Deep#level_5000")[0].click();
      result.zoomed = width("Deep#level_5000");
      result.dimmed = document.querySelectorAll(".frame.dim").length;
      result.zoomedLeaf = width("Deep#leaf");
      result.zoomedShallow = frames("Shallow#work").length;
      var search = document.getElementById("search");
      search.value = "shallow";
      search.dispatchEvent(new Event("input"));
      result.matched = document.getElementById("matched").textContent;
      document.getElementById("reset").click();
      result.matches = Array.prototype.map.call(document.querySelectorAll(".frame.match"), function (el) { return el.dataset.name; });
      document.getElementById("callers").click();
      result.callersFirstRow = row(18).sort();
    JS
    assert_empty result["errors"]
    # all, 9,999 Deep#level_N, Deep#leaf, Shallow#work.
    assert_equal 10_002, result["drawn"]
    assert_in_delta 90.0, result["leaf"], 1e-9
    assert_equal "#{10_000 * 18}px", result["leafTop"], "the leaf on row 10,000 (the root 'all' on row 0)"
    assert_in_delta 10.0, result["shallow"], 1e-9
    assert_in_delta 100.0, result["zoomed"], 1e-9
    assert_equal 5_001, result["dimmed"], "all and Deep#level_0..4999 above the zoomed frame"
    assert_in_delta 100.0, result["zoomedLeaf"], 1e-9
    assert_equal 0, result["zoomedShallow"]
    assert_equal "matched: 10.00%", result["matched"]
    assert_equal ["Shallow#work"], result["matches"]
    assert_equal ["Deep#leaf", "Shallow#work"], result["callersFirstRow"]
  end

  def test_a_profile_of_20000_stacks_shows_its_widest_frames_per_thread_and_without_idle_waits
    bytes = SyntheticProfiles.wide(stacks: 20_000)
    profile = Contprof::Pprof.decode(bytes)
    html = flamegraph_of(bytes)
    assert_operator File.size(html), :<, 5_000_000
    # Expected: the widest frame below Puma::ThreadPool#spawn_thread, in cpu-time.
    below = Hash.new(0)
    below_samples = Hash.new(0)
    profile.samples.each do |s|
      next if s.locations.size < 3

      below[s.locations[-3].function_name] += s.values["cpu-time"]
      below_samples[s.locations[-3].function_name] += s.values["cpu-samples"]
    end
    widest, widest_cpu = below.max_by { |_, v| v }
    cpu_total = profile.total("cpu-time")
    # Its hover text: its share with its standard error, from the CPU samples below it and
    # the others (as Report.share_error computes it).
    share = widest_cpu.fdiv(cpu_total)
    inside = below_samples[widest]
    error = 100 * share * (1 - share) * Math.sqrt(1.0 / inside + 1.0 / (profile.total("cpu-samples") - inside))
    error = error >= 1 ? format("%.1f", error) : format("%.2g", error)
    expected_title = format("(%.2f%% ±%s%%, %d samples of the view;", 100 * share, error, below_samples[widest])
    thread_two = profile.total("cpu-time") { |s| s.labels["thread id"] == 2 }
    wall_total = profile.total("wall-time")
    idle = profile.total("wall-time") { |s| Contprof::Report::IDLE_WAIT_FUNCTIONS.include?(s.locations.first.function_name) }
    assert_operator idle, :>, 0
    result = in_chromium(html, <<~JS)
      result.total = total();
      result.widest = width(#{widest.to_json});
      result.widestValue = value(#{widest.to_json});
      result.widestTitle = frames(#{widest.to_json}).filter(function (el) { return !el.classList.contains("dim"); })[0].title;
      result.spawn = width("Puma::ThreadPool#spawn_thread");
      result.threads = Array.prototype.map.call(document.querySelectorAll("#thread option"), function (o) { return o.textContent; });
      var select = document.getElementById("thread");
      select.value = "1";
      select.dispatchEvent(new Event("change"));
      result.threadTwoTotal = total();
      select.value = "-1";
      select.dispatchEvent(new Event("change"));
      Array.prototype.filter.call(document.querySelectorAll("#types button"), function (b) { return b.textContent === "wall-time"; })[0].click();
      result.wallTotal = total();
      document.getElementById("callers").click();
      result.callersFirstRow = row(18);
      document.getElementById("exclude-idle").click();
      result.wallBusyTotal = total();
      result.busyCallersFirstRow = row(18);
      document.getElementById("callers").click();
      var search = document.getElementById("search");
      search.value = "step_";
      search.dispatchEvent(new Event("input"));
      result.matched = document.getElementById("matched").textContent;
    JS
    assert_empty result["errors"]
    assert_equal cpu_total, result["total"]
    assert_equal widest_cpu, result["widestValue"], widest
    assert_includes result["widestTitle"], expected_title
    assert_in_delta 100.0 * widest_cpu / cpu_total, result["widest"], 1e-3, widest
    assert_in_delta 100.0, result["spawn"], 1e-9
    assert_equal ["All threads (4)"] + (1..4).map { |i| format("puma srv tp %03d (%d)", i, i) }, result["threads"].sort
    assert_equal thread_two, result["threadTwoTotal"], "the thread whose option value is 1 is the second seen: id 2"
    assert_equal wall_total, result["wallTotal"]
    assert_equal wall_total - idle, result["wallBusyTotal"]
    # Where wall time went, widest first: the three idle waits (a third of it each), gone
    # with the idle waits excluded (the rest is spread over thousands of functions, each
    # too narrow to draw).
    assert_equal SyntheticProfiles::IDLE_LEAVES.map(&:first).sort, result["callersFirstRow"].sort
    assert_empty result["busyCallersFirstRow"] & result["callersFirstRow"]
    assert_equal "matched: 100.00%", result["matched"], "every busy stack goes through App::Layer0#step_N"
  end

  # A differential flame graph (`report --base`): the widths are the new profile's, each
  # frame's colour and hover say how its share changed against the base, and a thread's
  # view (threads differ from run to run) says it has no comparison.
  def test_a_comparison_colours_frames_by_change_of_share
    main = ["<main>", "/app/main.rb", 1]
    record = lambda do |shares|
      recorder = Contprof::StackRecorder.new
      shares.each do |name, cpu|
        recorder.record_sample([[name, "/app/a.rb", 1], main], { "cpu-time" => cpu, "cpu-samples" => cpu / 10 },
                               { "thread id" => 1 })
      end
      path = File.join(@dir, "#{shares.keys.join("-")}.pprof")
      File.binwrite(path, recorder.serialize.last)
      path
    end
    base = record.({ "App#parse" => 600, "App#render" => 400 })
    new = record.({ "App#parse" => 300, "App#render" => 500, "App#cache" => 200 })
    html = File.join(@dir, "diff.html")
    _, err, status = Open3.capture3(RbConfig.ruby, EXE, "report", new, "--base", base, "--flamegraph", html)
    assert status.success?, err
    result = in_chromium(html, <<~JS)
      function frame(name) { return frames(name).filter(function (el) { return !el.classList.contains("dim"); })[0]; }
      result.frames = ["App#parse", "App#render", "App#cache", "<main>"].map(function (name) {
        var el = frame(name);
        return { name: name, width: parseFloat(el.style.width), title: el.title, change: Number(el.dataset.change),
                 colour: getComputedStyle(el).backgroundColor };
      });
      result.details = document.getElementById("details").textContent;
      var select = document.getElementById("thread");
      select.value = "0";
      select.dispatchEvent(new Event("change"));
      result.threadDetails = document.getElementById("details").textContent;
      result.threadChange = frame("App#cache").dataset.change;
    JS
    assert_empty result["errors"]
    frames = result["frames"].to_h { |f| [f["name"], f] }
    { "App#parse" => [30, 60], "App#render" => [50, 40], "App#cache" => [20, 0], "<main>" => [100, 100] }.each do |name, (share, base_share)|
      found = frames.fetch(name)
      assert_in_delta share, found["width"], 1e-6, name
      assert_in_delta (share - base_share) / 100.0, found["change"], 1e-9, name
      assert_includes found["title"], format("base %.2f%%, change %+.2f pts", base_share, share - base_share), name
      red, green, blue = found["colour"].scan(/\d+/).map(&:to_i)
      if share > base_share then assert_operator red, :>, blue, "#{name} grew: red"
      elsif share < base_share then assert_operator blue, :>, red, "#{name} shrank: blue"
      else assert_equal [red, red], [green, blue], "#{name} unchanged: grey"
      end
    end
    assert_match(/compared with the base \(1\.0 us\): red grew, blue shrank/, result["details"])
    assert_match(/no comparison in this view/, result["threadDetails"])
    assert_equal "", result["threadChange"]
  end

  # The view is kept in the page's address: what the controls and a click change is written
  # after "#", and a page opened with such an address shows that view.
  def test_the_view_is_kept_in_the_address
    bytes = SyntheticProfiles.wide(stacks: 2_000)
    profile = Contprof::Pprof.decode(bytes)
    html = flamegraph_of(bytes)
    result = in_chromium(html, <<~JS)
      document.getElementById("callers").click();
      var select = document.getElementById("thread");
      select.value = "1";
      select.dispatchEvent(new Event("change"));
      document.querySelectorAll(".frame")[2].click();
      result.hash = location.hash;
    JS
    assert_empty result["errors"]
    view = URI.decode_www_form(result["hash"].delete_prefix("#")).to_h
    assert_equal %w[callers thread type zoom], view.keys.sort
    assert_equal ["cpu-time", "1", "1"], view.values_at("type", "thread", "callers")
    assert_operator view["zoom"].to_i, :>, 0

    wall_busy = profile.total("wall-time") do |s|
      !Contprof::Report::IDLE_WAIT_FUNCTIONS.include?(s.locations.first.function_name)
    end
    opened = in_chromium(html, <<~JS, fragment: "#type=wall-time&idle=excluded&search=step_&zoom=999999999")
      result.selected = document.querySelector("#types button.selected").textContent;
      result.idle = document.getElementById("exclude-idle").checked;
      result.search = document.getElementById("search").value;
      result.total = total();
      result.hash = location.hash;
    JS
    assert_empty opened["errors"]
    assert_equal ["wall-time", true, "step_"], opened.values_at("selected", "idle", "search")
    assert_equal wall_busy, opened["total"], "a zoom out of the tree shows the whole view"
    assert_match(/type=wall-time/, opened["hash"])
  end

  def slow_request = sleep(0.3)
  def fast_request = burn_cpu(0.01)

  # A profile with a timeline: one lane per thread, and a range brushed over the slow
  # request narrows the flame graph to it.
  def test_the_timeline_lanes_and_a_brushed_range
    skip Contprof.unsupported_reason unless Contprof.supported?
    began = nil
    slow = nil
    exported = Contprof.profile(interval: 0.01, allocation: false, timeline: true) do
      began = Process.clock_gettime(Process::CLOCK_REALTIME, :nanosecond)
      10.times { fast_request }
      slow = [Process.clock_gettime(Process::CLOCK_REALTIME, :nanosecond)]
      slow_request
      slow << Process.clock_gettime(Process::CLOCK_REALTIME, :nanosecond)
      10.times { fast_request }
      Thread.new { Thread.current.name = "helper"; sleep 0.05 }.join
    end
    profile = exported.decode
    html = flamegraph_of(exported.pprof)
    from_us = (slow[0] - profile.time_nanos) / 1000 + 20_000
    to_us = (slow[1] - profile.time_nanos) / 1000 - 20_000
    result = in_chromium(html, <<~JS)
      var lanes = document.getElementById("lanes");
      result.visible = document.getElementById("timeline").style.display;
      result.lanes = Number(lanes.dataset.lanes);
      result.drawn = Number(lanes.dataset.drawn);
      Array.prototype.filter.call(document.querySelectorAll("#types button"), function (b) { return b.textContent === "wall-time"; })[0].click();
      result.wholeTotal = total();
      window.contprofTimeline.select(#{from_us}, #{to_us});
      result.rangeTotal = total();
      result.slow = value("FlamegraphBrowserTest#slow_request");
      result.rangeText = document.getElementById("range").textContent;
      document.getElementById("clear-range").click();
      result.clearedTotal = total();
      // A drag across the left half of the lanes, as a user does it.
      var box = lanes.getBoundingClientRect();
      lanes.dispatchEvent(new MouseEvent("mousedown", { clientX: box.left + box.width * 0.5, clientY: box.top + 5, bubbles: true }));
      window.dispatchEvent(new MouseEvent("mouseup", { clientX: box.left + box.width * 0.9, clientY: box.top + 5, bubbles: true }));
      result.draggedText = document.getElementById("range").textContent;
      result.draggedTotal = total();
    JS
    assert_empty result["errors"]
    assert_equal "block", result["visible"]
    assert_operator result["lanes"], :>=, 2 # (the test process may have other threads)
    assert_operator result["drawn"], :>, 5
    assert_equal profile.total("wall-time"), result["wholeTotal"]
    assert_equal result["wholeTotal"], result["clearedTotal"]
    # Every thread's wall time in the range: each sample for the part of its stretch there.
    in_range = profile.samples.sum do |sample|
      finish = sample.labels["end_timestamp_ns"] or next 0
      wall = sample.values["wall-time"]
      start = finish - wall
      overlap = [finish, profile.time_nanos + to_us * 1000].min - [start, profile.time_nanos + from_us * 1000].max
      overlap.positive? && wall.positive? ? wall * overlap.fdiv(wall) : 0
    end
    assert_in_delta in_range, result["rangeTotal"], 1_000_000, "the range holds its wall time"
    assert_in_delta (to_us - from_us) * 1000, result["slow"], 2_000_000, "the slow request fills the range"
    assert_match(/\ARange /, result["rangeText"])
    assert_match(/\ARange /, result["draggedText"])
    assert_operator result["draggedTotal"], :<, result["wholeTotal"]
  end
end
