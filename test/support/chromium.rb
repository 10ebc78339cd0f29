# frozen_string_literal: true

require "cgi"
require "json"
require "open3"

# Pages driven in headless Chromium (the flame graph, the viewer): a script added to a copy
# of the page fills `result`, which is read back from the DOM Chromium dumps, with any page
# error in result.errors. Needs @dir, a scratch directory.
module Chromium
  FLAGS = %w[--headless --no-sandbox --disable-gpu --disable-quic --no-first-run
             --disable-background-networking --disable-component-update --disable-sync
             --virtual-time-budget=10000].freeze
  ERROR_HOOK = '<script>window.pageErrors = []; window.addEventListener("error", function (e) { ' \
               'window.pageErrors.push(String(e.message)); });</script>'

  # Helpers for scripts on the flame graph page (its frames are .frame elements, each
  # with data-name and data-value, drawn in #graph, whose data-total is the view's total).
  FLAME_GRAPH_HELPERS = <<~JS
    function frames(name) { return Array.prototype.filter.call(document.querySelectorAll(".frame"), function (el) { return el.dataset.name === name; }); }
    function width(name) { var f = frames(name).filter(function (el) { return !el.classList.contains("dim"); }); return f.length ? parseFloat(f[0].style.width) : null; }
    function value(name) { var f = frames(name).filter(function (el) { return !el.classList.contains("dim"); }); return f.length ? Number(f[0].dataset.value) : null; }
    function total() { return Number(document.getElementById("graph").dataset.total); }
    function row(top) { return Array.prototype.filter.call(document.querySelectorAll(".frame"), function (el) { return el.style.top === top + "px"; }).map(function (el) { return el.dataset.name; }); }
  JS

  # Runs `script` (JavaScript that fills `result`, which starts as { errors: [...] }) in the
  # page at `html` (a file), opened with `fragment` (such as "#type=wall-time"); returns
  # `result`.
  def run_in_chromium(html, script, fragment: "")
    chromium = %w[chromium chromium-browser].find { |c| system("command -v #{c} >/dev/null 2>&1") }
    flunk "Chromium is needed to check the pages (Debian package chromium; bin/setup installs it)" unless chromium
    driven = File.join(@dir, "driven.html")
    test_script = "<script>(function () { var result = { errors: window.pageErrors };\n#{script}\n" \
                  'var out = document.createElement("pre"); out.id = "test-result"; ' \
                  "out.textContent = JSON.stringify(result); document.body.appendChild(out); })();</script>"
    File.write(driven, File.read(html).sub("<head>", "<head>#{ERROR_HOOK}").sub(%r{</body>(?!.*</body>)}m, "#{test_script}</body>"))
    dom, err, = Open3.capture3(chromium, *FLAGS, "--user-data-dir=#{File.join(@dir, "chromium")}",
                               "--dump-dom", "file://#{driven}#{fragment}")
    json = dom[%r{<pre id="test-result">(.*?)</pre>}m, 1]
    assert json, "the test script ran (Chromium: #{err.lines.last(3).join})"
    JSON.parse(CGI.unescapeHTML(json))
  end
end
