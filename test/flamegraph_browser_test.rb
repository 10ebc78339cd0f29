# frozen_string_literal: true

require_relative "test_helper"
require_relative "support/synthetic_profiles"
require "tmpdir"
require "json"
require "cgi"
require "contprof/reports/report"

# The HTML flame graph, opened in headless Chromium: a stack 10,000 frames deep and a
# profile of 20,000 stacks render without page errors and show the expected frames, and
# zoom, search, the thread selector, the idle-wait toggle and the callers view work. The
# page is driven by a script added to a copy of it, whose findings (and any page error)
# are read back from the DOM Chromium dumps.
class FlamegraphBrowserTest < Minitest::Test
  EXE = File.expand_path("../exe/contprof", __dir__)
  CHROMIUM_FLAGS = %w[--headless --no-sandbox --disable-gpu --disable-quic --no-first-run
                      --disable-background-networking --disable-component-update --disable-sync
                      --virtual-time-budget=10000].freeze
  ERROR_HOOK = '<script>window.pageErrors = []; window.addEventListener("error", function (e) { ' \
               'window.pageErrors.push(String(e.message)); });</script>'
  # Helpers for the scripts of the tests below.
  PRELUDE = <<~JS
    var result = { errors: window.pageErrors };
    function frames(name) { return Array.prototype.filter.call(document.querySelectorAll(".frame"), function (el) { return el.dataset.name === name; }); }
    function width(name) { var f = frames(name).filter(function (el) { return !el.classList.contains("dim"); }); return f.length ? parseFloat(f[0].style.width) : null; }
    function value(name) { var f = frames(name).filter(function (el) { return !el.classList.contains("dim"); }); return f.length ? Number(f[0].dataset.value) : null; }
    function total() { return Number(document.getElementById("graph").dataset.total); }
    function row(top) { return Array.prototype.filter.call(document.querySelectorAll(".frame"), function (el) { return el.style.top === top + "px"; }).map(function (el) { return el.dataset.name; }); }
  JS

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

  # Runs `script` (JavaScript that fills `result`) in the page; returns `result`.
  def in_chromium(html, script)
    chromium = %w[chromium chromium-browser].find { |c| system("command -v #{c} >/dev/null 2>&1") }
    flunk "Chromium is needed to check the flame graph (Debian package chromium; bin/setup installs it)" unless chromium
    driven = File.join(@dir, "driven.html")
    test_script = "<script>(function () { #{PRELUDE}\n#{script}\n" \
                  'var out = document.createElement("pre"); out.id = "test-result"; ' \
                  "out.textContent = JSON.stringify(result); document.body.appendChild(out); })();</script>"
    File.write(driven, File.read(html).sub("<head>", "<head>#{ERROR_HOOK}").sub(%r{</body>(?!.*</body>)}m, "#{test_script}</body>"))
    dom, err, = Open3.capture3(chromium, *CHROMIUM_FLAGS, "--user-data-dir=#{File.join(@dir, "chromium")}",
                               "--dump-dom", "file://#{driven}")
    json = dom[%r{<pre id="test-result">(.*?)</pre>}m, 1]
    assert json, "the test script ran (Chromium: #{err.lines.last(3).join})"
    JSON.parse(CGI.unescapeHTML(json))
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
    profile.samples.each { |s| below[s.locations[-3].function_name] += s.values["cpu-time"] if s.locations.size >= 3 }
    widest, widest_cpu = below.max_by { |_, v| v }
    cpu_total = profile.total("cpu-time")
    thread_two = profile.total("cpu-time") { |s| s.labels["thread id"] == 2 }
    wall_total = profile.total("wall-time")
    idle = profile.total("wall-time") { |s| Contprof::Report::IDLE_WAIT_FUNCTIONS.include?(s.locations.first.function_name) }
    assert_operator idle, :>, 0
    result = in_chromium(html, <<~JS)
      result.total = total();
      result.widest = width(#{widest.to_json});
      result.widestValue = value(#{widest.to_json});
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
end
