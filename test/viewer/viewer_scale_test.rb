# frozen_string_literal: true

require_relative "../test_helper"
require_relative "../support/synthetic_profiles"
require_relative "../support/chromium"
require "tmpdir"
require "contprof/viewer/viewer"

# Contprof::Viewer at scale, in headless Chromium: a directory of 10,000 one-minute
# profiles of 8 processes (the page's time axis, an hour chosen by a drag and its flame
# graph, the whole span refused with its reason, filters, the page's URL state, two hours
# compared) and a stack 10,000 frames deep through the viewer. Each expected total is
# summed from what the test wrote, not read back from the viewer.
class ViewerScaleTest < Minitest::Test
  include Chromium

  MINUTE = 60 * 1_000_000_000
  START = 1_796_000_000 * 1_000_000_000
  PROCESSES = 8
  FILES = 10_000
  # No process wrote during these minutes (an outage): the axis has nothing there.
  GAP = (600...660).freeze
  # Each minute's profile is one of a few: its process's, in the phase of the day the
  # minute falls in (PHASE minutes each), so that two hours compare with a difference.
  PHASE = 300
  FUNCTIONS = %w[App#parse App#render App#cache].freeze

  # The big directory, written once for every test of the class (and its index built
  # once: later viewers read the index file).
  class BigDirectory
    attr_reader :dir, :files

    def initialize
      @dir = Dir.mktmpdir("contprof-viewer-scale")
      minutes = (0..).lazy.reject { |minute| GAP.cover?(minute) }.first(FILES / PROCESSES)
      templates = {}
      @files = minutes.flat_map do |minute|
        Array.new(PROCESSES) do |process|
          phase = minute / PHASE
          start = START + minute * MINUTE
          bytes = templates[[process, phase]] ||= profile(process, phase)
          stamp = Time.at(start / 1_000_000_000).utc.strftime("%Y%m%dT%H%M%S.000000Z")
          File.binwrite(File.join(@dir, "web-#{1000 + process}-#{stamp}.pprof"), SyntheticProfiles.retimed(bytes, start, MINUTE))
          [start, process, phase]
        end
      end
      Contprof::Viewer::ProfileIndex.new(@dir).entries
    end

    # A stack per function, on thread 1 or 2 and labelled with its endpoint: threads and
    # endpoints cross, so a thread filter and a label filter choose different samples.
    def self.stacks(process, phase)
      FUNCTIONS.each_with_index.map do |name, k|
        cpu = (k == 2 ? 10 * (phase + 1) : 20 + 5 * k + process) * 1_000_000
        { name: name, thread: (k % 2) + 1, endpoint: "GET /#{name[/#(\w+)/, 1]}", cpu: cpu }
      end
    end

    def profile(process, phase)
      recorder = Contprof::StackRecorder.new
      self.class.stacks(process, phase).each do |stack|
        recorder.record_sample([[stack[:name], "/app/app.rb", 1], ["<main>", "/app/main.rb", 1]],
                               { "cpu-time" => stack[:cpu], "cpu-samples" => stack[:cpu] / 10_000_000, "wall-time" => 2 * stack[:cpu] },
                               { "thread id" => stack[:thread], "endpoint" => stack[:endpoint] })
      end
      recorder.serialize.last
    end

    # cpu-time per function of the files whose minute overlaps [from, to) (nanoseconds),
    # of the samples on `thread` (an id) with `endpoint`, when given.
    def cpu(from, to, thread: nil, endpoint: nil)
      sums = Hash.new(0)
      @files.each do |start, process, phase|
        next unless start + MINUTE > from && start < to

        self.class.stacks(process, phase).each do |stack|
          next if (thread && stack[:thread] != thread) || (endpoint && stack[:endpoint] != endpoint)

          sums[stack[:name]] += stack[:cpu]
        end
      end
      sums
    end
  end

  def self.big
    @big ||= BigDirectory.new.tap { |big| Minitest.after_run { FileUtils.rm_rf(big.dir) } }
  end

  def setup
    @dir = Dir.mktmpdir("contprof-viewer-scale-page") # (the pages Chromium opens)
  end

  def teardown
    FileUtils.rm_rf(@dir)
  end

  def big = self.class.big

  # The answer to a link (its "#..." part stays in the browser).
  def get(app, link)
    route, query = link.split("#", 2).first.split("?", 2)
    status, headers, body = app.call("REQUEST_METHOD" => "GET", "PATH_INFO" => route, "QUERY_STRING" => query.to_s)
    [status, headers["content-type"], body.join]
  end

  # The page a link of `app` names, in Chromium (opened with the link's "#..." part and
  # `query`, as a browser would with that address), after `script`; it must answer 200.
  def in_chromium(app, link, script, query: "")
    path, view = link.split("#", 2)
    fragment = "#{query.empty? ? "" : "?#{query}"}#{view ? "##{view}" : ""}"
    status, _, body = get(app, path)
    assert_equal 200, status, "#{link}: #{body[0, 300]}"
    html = File.join(@dir, "page.html")
    File.write(html, body)
    result = run_in_chromium(html, "#{FLAME_GRAPH_HELPERS}\n#{script}", fragment: fragment)
    assert_empty result["errors"], path
    result
  end

  def nanos(iso)
    time = Time.iso8601(iso)
    time.to_i * 1_000_000_000 + time.nsec
  end

  def query_of(link)
    URI.decode_www_form(link.split("?", 2)[1].to_s.split("#", 2)[0]).to_h
  end

  # The last minute's end: the time axis spans START to it.
  def last
    big.files.map(&:first).max + MINUTE
  end

  # The script for a drag on the home page's axis, from fraction `from` to `to` of its width.
  DRAG = <<~JS
    var chart = document.getElementById("chart");
    function drag(from, to) {
      var box = chart.getBoundingClientRect();
      chart.dispatchEvent(new MouseEvent("mousedown", { clientX: box.left + from * box.width, bubbles: true }));
      window.dispatchEvent(new MouseEvent("mouseup", { clientX: box.left + to * box.width, bubbles: true }));
    }
    function field(name) { return document.getElementById(name).value; }
    function link(name) { return document.getElementById("link-" + name).getAttribute("href"); }
  JS

  # The fraction of the axis at `minute` minutes after START.
  def at(minute)
    (minute * MINUTE).fdiv(last - START)
  end

  # The axis: a bar per time bucket holding profiles, its height the bucket's cpu-time (its
  # hover text says it); every minute written is in a bar and the outage has none. A drag
  # over an hour chooses it, and the flame graph its link names shows the hour's cpu-time;
  # a drag over the whole span names more profiles than one view reads: a 413 with its reason.
  def test_the_axis_draws_10000_files_and_a_drag_chooses_an_hour_or_is_refused_the_whole_span
    limit = [Contprof::Viewer::MAX_FILES, FILES - 1].min
    app = Contprof::Viewer.new(big.dir, max_files: limit)
    result = in_chromium(app, "/", <<~JS)
      #{DRAG}
      result.summary = document.getElementById("summary").textContent;
      result.bars = Array.prototype.map.call(chart.querySelectorAll(".bar"), function (bar) {
        return [bar.title, parseFloat(bar.style.left), parseFloat(bar.style.width)];
      });
      result.ticks = Array.prototype.map.call(document.querySelectorAll("#ticks .tick"), function (tick) {
        return [tick.title, parseFloat(tick.style.left), tick.textContent];
      });
      result.width = chart.clientWidth;
      drag(#{at(120)}, #{at(180)});
      result.hour = [field("from"), field("to"), link("flamegraph")];
      drag(0, 1);
      result.all = link("flamegraph");
      result.note = document.getElementById("note").textContent;
    JS
    assert_match(/\A10000 profiles \(/, result["summary"])

    # (Buckets of whole minutes, the profiles' period: here 3 minutes for 1,310.)
    width = (last - START).fdiv(Contprof::Viewer::HomePage::BUCKETS * MINUTE).ceil * MINUTE
    assert_equal 3 * MINUTE, width
    expected = Hash.new(0)
    big.files.each do |start, process, phase|
      bucket = START + (start - START) / width * width
      expected[Time.at(bucket / 1_000_000_000, bucket % 1_000_000_000, :nsec).utc.iso8601(3)] +=
        BigDirectory.stacks(process, phase).sum { |stack| stack[:cpu] }
    end
    drawn = result["bars"].to_h do |title, left, _|
      time, value = title.split(": ")
      assert_in_delta 100 * (nanos(time) - START).fdiv(last - START), left, 1e-3, "#{title}: placed at its time"
      [Time.iso8601(time).utc.iso8601(3), Integer(value)]
    end
    assert_equal expected.size, result["bars"].size, "one bar per bucket"
    assert_equal expected, drawn
    # Each process wrote the same profile every minute of its first phase: bars as flat.
    flat = drawn.select { |time, _| nanos(time) + width <= START + PHASE * MINUTE }
    assert_equal [PHASE / 3, 1], [flat.size, flat.values.uniq.size]
    # The outage: bars only at its edges, in buckets that hold minutes written.
    bucket = 100 * width.fdiv(last - START)
    gap = (100 * at(GAP.first) + bucket)...(100 * at(GAP.last + 1) - bucket)
    assert_operator gap.last - gap.first, :>, 3
    assert_empty result["bars"].select { |_, left, bar_width| left + bar_width > gap.first && left < gap.last }

    # Marks on the axis at a round step, each placed at its time, labelled with its time of
    # day (its date at midnight).
    times = result["ticks"].map { |title, _, _| nanos(title) }
    assert_includes 5..(result["width"] / 80 + 1), times.size
    steps = times.each_cons(2).map { |a, b| b - a }.uniq
    assert_equal 1, steps.size
    assert_includes [60, 120, 180, 360].map { |m| m * MINUTE }, steps.first
    result["ticks"].each do |title, left, text|
      assert_in_delta 100 * (nanos(title) - START).fdiv(last - START), left, 1e-3, title
      assert_equal (nanos(title) % (1440 * MINUTE)).zero? ? title[5, 5] : title[11, 5], text
    end

    from, to, flamegraph = result["hour"]
    assert_in_delta START + 120 * MINUTE, nanos(from), 2 * width
    assert_in_delta 60 * MINUTE, nanos(to) - nanos(from), 2 * width
    expected_hour = big.cpu(nanos(from), nanos(to))
    page = in_chromium(app, flamegraph, <<~JS)
      result.total = total();
      result.values = #{FUNCTIONS.to_json}.map(value);
    JS
    assert_equal expected_hour.values.sum, page["total"]
    assert_equal FUNCTIONS.map { |name| expected_hour[name] }, page["values"]

    assert_equal [START, last], query_of(result["all"]).values_at("from", "to").map { |time| nanos(time) }
    status, type, body = get(app, result["all"])
    assert_equal [413, "text/plain; charset=utf-8"], [status, type]
    assert_match(/\Athe range holds 10000 profiles \(\d+ bytes\); at most #{limit} .* narrow the range/, body)
    assert_match(/reads at most #{limit} profiles/, result["note"])
  end

  # On a span where an hour is a few pixels wide, "Zoom to the range" draws the axis over
  # the chosen range (and a tenth either side): the server sends that span's buckets, of
  # its files only, and a drag there chooses minutes; "Whole span" goes back.
  def test_zooming_in_on_a_range_of_10000_files
    app = Contprof::Viewer.new(big.dir)
    result = in_chromium(app, "/", <<~JS)
      #{DRAG}
      result.zoomHidden = document.getElementById("zoom").style.display;
      drag(#{at(900)}, #{at(960)});
      result.range = [field("from"), field("to")];
      result.zoom = document.getElementById("zoom").getAttribute("href");
      result.unzoom = document.getElementById("unzoom").style.display;
    JS
    assert_equal ["none", "none"], [result["zoomHidden"], result["unzoom"]], "nothing to zoom to yet; not zoomed"
    from, to = result["range"].map { |time| nanos(time) }
    span = query_of(result["zoom"])
    margin = (to - from) / 10
    assert_in_delta from - margin, nanos(span["span_from"]), 1_000_000
    assert_in_delta to + margin, nanos(span["span_to"]), 1_000_000
    assert_equal [from, to], span.values_at("from", "to").map { |time| nanos(time) }, "the range is kept"

    zoomed = in_chromium(app, "/#{result["zoom"]}", <<~JS, query: result["zoom"].delete_prefix("?"))
      #{DRAG}
      result.summary = document.getElementById("summary").textContent;
      result.bars = chart.querySelectorAll(".bar").length;
      result.heights = Array.prototype.map.call(chart.querySelectorAll(".bar"), function (bar) { return bar.title.split(": ")[1]; });
      result.ranges = chart.querySelectorAll(".range").length;
      drag(0.5, 0.5 + 1 / 12);
      result.range = [field("from"), field("to")];
      result.unzoom = [document.getElementById("unzoom").style.display, document.getElementById("unzoom").getAttribute("href")];
      result.own = location.search;
    JS
    in_span = big.files.count { |start, _, _| start + MINUTE > nanos(span["span_from"]) && start < nanos(span["span_to"]) }
    assert_match(/\A#{in_span} profiles .* \(zoomed: of 10000 profiles\)/, zoomed["summary"])
    assert_operator zoomed["bars"], :>=, 60, "a bar per minute or so, where the whole span drew a bar per 3 minutes"
    # Two phases of the day meet in the span: two bar heights, no bucket holding an extra
    # profile at the span's edge.
    assert_equal 2, zoomed["heights"].uniq.size, zoomed["heights"].tally.inspect
    assert_equal 1, zoomed["ranges"]
    lo, hi = zoomed["range"].map { |time| nanos(time) }
    width = nanos(span["span_to"]) - nanos(span["span_from"])
    assert_in_delta nanos(span["span_from"]) + width / 2, lo, width / 200.0
    assert_in_delta width / 12, hi - lo, width / 100.0, "a drag of a twelfth of the axis is a twelfth of the span"
    assert_equal "", zoomed["unzoom"][0]
    refute_includes query_of(zoomed["unzoom"][1]).keys, "span_from"
    assert_includes zoomed["own"], "span_from=", "the page's address keeps the zoom"
    status, _, body = get(app, "/?span_from=2000-01-01T00:00:00Z&span_to=2000-01-02T00:00:00Z")
    assert_equal 200, status
    assert_match(/"empty":true,.*"allFiles":10000/, body)
  end

  # The page opened with a state in its address (as a link or a reload gives it) shows that
  # state and its links carry it: range, type, thread, label. The views they name keep only
  # the samples of that thread and label, over the 10,000 files' index.
  def test_filters_and_the_state_in_the_address_on_10000_files
    app = Contprof::Viewer.new(big.dir)
    from = Time.at((START + 200 * MINUTE) / 1_000_000_000).utc.iso8601
    to = Time.at((START + 230 * MINUTE) / 1_000_000_000).utc.iso8601
    state = { "from" => from, "to" => to, "type" => "wall-time", "thread" => "1", "label" => "endpoint=GET /cache" }
    result = in_chromium(app, "/", <<~JS, query: URI.encode_www_form(state))
      #{DRAG}
      result.fields = ["from", "to", "thread", "label"].map(field);
      result.type = document.querySelector("#types button.selected").textContent;
      result.ranges = chart.querySelectorAll(".range").length;
      result.flamegraph = link("flamegraph");
      result.top = link("top");
      var thread = document.getElementById("thread"), label = document.getElementById("label");
      thread.value = "2";
      thread.dispatchEvent(new Event("change"));
      label.value = "";
      label.dispatchEvent(new Event("change"));
      result.threadTwo = link("top");
    JS
    assert_equal [from, to, "1", "endpoint=GET /cache"], result["fields"]
    assert_equal ["wall-time", 1], [result["type"], result["ranges"]]
    assert_equal state, query_of(result["top"])
    assert_equal state.except("type"), query_of(result["flamegraph"])
    assert_equal "type=wall-time", result["flamegraph"].split("#", 2)[1]

    expected = big.cpu(nanos(from), nanos(to), thread: 1, endpoint: "GET /cache")
    assert_equal ["App#cache"], expected.keys
    page = in_chromium(app, result["flamegraph"], <<~JS)
      result.type = document.querySelector("#types button.selected").textContent;
      result.total = total();
      result.values = #{FUNCTIONS.to_json}.map(value);
    JS
    assert_equal "wall-time", page["type"]
    assert_equal 2 * expected["App#cache"], page["total"], "wall-time is twice the cpu-time in every stack"
    assert_equal [nil, nil, 2 * expected["App#cache"]], page["values"]

    assert_equal state.except("label").merge("thread" => "2"), query_of(result["threadTwo"])
    status, _, text = get(app, result["threadTwo"])
    assert_equal 200, status, text
    rows = text.lines.grep(/App#/).map { |line| line.split.last }
    assert_equal ["App#render"], rows, "thread 2 runs App#render only"
  end

  # Two hours compared (a drag with "base" ticked chooses the base): the differential flame
  # graph's widths are the range's, each frame's change of share is against the base's.
  def test_two_hours_of_10000_files_compared
    app = Contprof::Viewer.new(big.dir)
    result = in_chromium(app, "/", <<~JS)
      #{DRAG}
      drag(#{at(120)}, #{at(180)});
      document.getElementById("choose-base").checked = true;
      drag(#{at(960)}, #{at(1020)});
      result.ranges = ["from", "to", "base_from", "base_to"].map(field);
      result.flamegraph = link("flamegraph");
    JS
    from, to, base_from, base_to = result["ranges"].map { |time| nanos(time) }
    assert_equal %w[base_from base_to from to], query_of(result["flamegraph"]).keys.sort
    now = big.cpu(from, to)
    base = big.cpu(base_from, base_to)
    page = in_chromium(app, result["flamegraph"], <<~JS)
      result.total = total();
      result.details = document.getElementById("details").textContent;
      result.changes = #{FUNCTIONS.to_json}.map(function (name) {
        return Number(frames(name).filter(function (el) { return !el.classList.contains("dim"); })[0].dataset.change);
      });
    JS
    assert_equal now.values.sum, page["total"]
    assert_match(/compared with the base/, page["details"])
    FUNCTIONS.each_with_index do |name, i|
      change = now[name].fdiv(now.values.sum) - base[name].fdiv(base.values.sum)
      assert_in_delta change, page["changes"][i], 1e-9, name
    end
    assert_operator page["changes"][2], :<, -0.1, "App#cache's share is smaller in the earlier hour"
  end

  # A stack 10,000 frames deep, through the viewer: its flame graph draws every frame and
  # zooms to the leaf (as the report's page does, test/reports/flamegraph_browser_test.rb).
  def test_a_stack_10000_frames_deep_through_the_viewer
    deep = File.join(@dir, "profiles")
    Dir.mkdir(deep)
    File.binwrite(File.join(deep, "deep-1-20261130T101320.000000Z.pprof"),
                  SyntheticProfiles.retimed(SyntheticProfiles.deep(depth: 10_000), START, MINUTE))
    result = in_chromium(Contprof::Viewer.new(deep), "/flamegraph", <<~JS)
      result.drawn = document.querySelectorAll(".frame").length;
      result.leaf = width("Deep#leaf");
      result.shallow = width("Shallow#work");
      result.total = total();
      frames("Deep#leaf")[0].click();
      result.zoomedLeaf = width("Deep#leaf");
      result.dimmed = document.querySelectorAll(".frame.dim").length;
      result.zoomedShallow = frames("Shallow#work").length;
    JS
    assert_equal 10_002, result["drawn"], "all, Deep#level_0..9998, Deep#leaf, Shallow#work"
    assert_in_delta 90.0, result["leaf"], 1e-9
    assert_in_delta 10.0, result["shallow"], 1e-9
    assert_in_delta 100.0, result["zoomedLeaf"], 1e-9
    assert_equal 10_000, result["dimmed"], "all and the 9,999 frames above the leaf"
    assert_equal 0, result["zoomedShallow"]
    assert_equal 100_000_000, result["total"]
  end
end
