# frozen_string_literal: true

require "json"
require "erb"
require "time"

module Contprof
  # A self-contained, interactive HTML flame graph of a profile (no network needed to
  # view it): one view per sample type, click a frame to zoom into it, hover for its
  # value, search to highlight matching functions. The call tree comes from
  # Contprof::Report.call_tree; the drawing is plain JavaScript over absolutely
  # positioned elements, root at the top.
  module Flamegraph
    class << self
      def html(profile, title: "Contprof flame graph")
        types = profile.sample_types.filter_map do |type|
          tree = Report.call_tree(profile, type.type)
          next if tree["v"].zero?

          { "name" => type.type, "unit" => type.unit, "root" => tree }
        end
        data = JSON.generate({ "title" => title, "start" => profile.start_time.iso8601, "types" => types })
        TEMPLATE.result_with_hash(title: ERB::Util.html_escape(title), data: data.gsub("</", "<\\/"))
      end

      def write(profile, path, **options)
        File.write(path, html(profile, **options))
        path
      end
    end

    TEMPLATE = ERB.new(<<~'HTML')
      <!DOCTYPE html>
      <html lang="en">
      <head>
      <meta charset="utf-8">
      <title><%= title %></title>
      <style>
        body { font: 12px/1.3 -apple-system, "Segoe UI", Helvetica, Arial, sans-serif; margin: 0; color: #222; }
        header { padding: 8px 12px; background: #f4f4f4; border-bottom: 1px solid #ddd; display: flex; gap: 12px;
                 align-items: center; flex-wrap: wrap; }
        header h1 { font-size: 14px; margin: 0 12px 0 0; }
        button { font: inherit; padding: 2px 8px; cursor: pointer; }
        button.selected { background: #333; color: #fff; }
        #details { padding: 4px 12px; min-height: 16px; font-family: monospace; }
        #graph { position: relative; margin: 0 12px 12px; }
        .frame { position: absolute; height: 17px; box-sizing: border-box; border: 1px solid #fff; overflow: hidden;
                 white-space: nowrap; text-overflow: ellipsis; padding: 1px 3px; cursor: pointer; font-size: 11px; }
        .frame.dim { opacity: 0.35; }
        .frame.match { outline: 2px solid #c0f; z-index: 1; }
      </style>
      </head>
      <body>
      <header>
        <h1><%= title %></h1>
        <span id="types"></span>
        <button id="reset">Reset zoom</button>
        <input id="search" type="search" placeholder="Search functions">
        <span id="matched"></span>
      </header>
      <div id="details"></div>
      <div id="graph"></div>
      <script id="profile-data" type="application/json"><%= data %></script>
      <script>
      (function () {
        "use strict";
        var data = JSON.parse(document.getElementById("profile-data").textContent);
        var graph = document.getElementById("graph");
        var details = document.getElementById("details");
        var search = document.getElementById("search");
        var current = 0, zoomed = null, ROW = 18, MIN_WIDTH = 0.001;

        function formatValue(value, unit) {
          if (unit !== "nanoseconds") return String(value);
          var s = value / 1e9;
          if (s >= 1) return s.toFixed(2) + " s";
          if (s >= 1e-3) return (s * 1e3).toFixed(2) + " ms";
          return (s * 1e6).toFixed(1) + " us";
        }
        function color(name) {
          var h = 0;
          for (var i = 0; i < name.length; i++) h = (h * 31 + name.charCodeAt(i)) >>> 0;
          return "hsl(" + (10 + h % 45) + "," + (65 + h % 25) + "%," + (60 + (h >> 8) % 15) + "%)";
        }
        // Frames on the path from the root to the zoomed frame, each at full width.
        function pathTo(node, target, path) {
          if (node === target) return path.concat([node]);
          for (var i = 0; i < node.c.length; i++) {
            var found = pathTo(node.c[i], target, path.concat([node]));
            if (found) return found;
          }
          return null;
        }
        function draw() {
          var type = data.types[current];
          if (!type) { graph.textContent = "This profile has no samples."; return; }
          var root = type.root, focus = zoomed || root, total = focus.v;
          var query = search.value.toLowerCase(), matched = 0;
          graph.textContent = "";
          var ancestors = zoomed ? pathTo(root, zoomed, []) : [root];
          var depth = 0, rows = 0;
          function add(node, x, width, dim) {
            var el = document.createElement("div");
            el.className = "frame" + (dim ? " dim" : "");
            el.style.left = (x * 100) + "%";
            el.style.width = (width * 100) + "%";
            el.style.top = (depth * ROW) + "px";
            el.style.background = color(node.n);
            el.textContent = node.n;
            el.dataset.name = node.n;
            el.dataset.value = node.v;
            var pct = (100 * node.v / root.v).toFixed(2);
            el.title = node.n + " — " + formatValue(node.v, type.unit) + " (" + pct + "% of all; self " +
              formatValue(node.s, type.unit) + ")";
            el.onmouseover = function () { details.textContent = el.title; };
            el.onclick = function (event) { event.stopPropagation(); zoomed = node === root ? null : node; draw(); };
            if (query && node.n.toLowerCase().indexOf(query) >= 0) { el.classList.add("match"); }
            graph.appendChild(el);
          }
          for (var a = 0; a < ancestors.length - 1; a++) { add(ancestors[a], 0, 1, true); depth++; }
          function layout(node, x, d) {
            var width = node.v / total;
            if (width < MIN_WIDTH) return;
            depth = d;
            add(node, x, width, false);
            rows = Math.max(rows, d + 1);
            var childX = x;
            for (var i = 0; i < node.c.length; i++) {
              layout(node.c[i], childX, d + 1);
              childX += node.c[i].v / total;
            }
          }
          layout(focus, 0, depth);
          graph.style.height = (rows * ROW + 4) + "px";
          if (query) {
            (function count(node, counted) {
              var hit = node.n.toLowerCase().indexOf(query) >= 0;
              if (hit && !counted) matched += node.v;
              node.c.forEach(function (child) { count(child, counted || hit); });
            })(root, false);
            document.getElementById("matched").textContent =
              "matched: " + (100 * matched / root.v).toFixed(2) + "%";
          } else {
            document.getElementById("matched").textContent = "";
          }
          details.textContent = type.name + ": " + formatValue(root.v, type.unit) + " in all";
        }
        var buttons = document.getElementById("types");
        data.types.forEach(function (type, i) {
          var b = document.createElement("button");
          b.textContent = type.name;
          b.onclick = function () { current = i; zoomed = null; select(); draw(); };
          buttons.appendChild(b);
        });
        function select() {
          Array.prototype.forEach.call(buttons.children, function (b, i) { b.className = i === current ? "selected" : ""; });
        }
        document.getElementById("reset").onclick = function () { zoomed = null; draw(); };
        search.oninput = draw;
        select();
        draw();
      })();
      </script>
      </body>
      </html>
    HTML
  end
end
