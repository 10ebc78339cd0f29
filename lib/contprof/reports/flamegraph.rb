# frozen_string_literal: true

require "json"
require "erb"
require "time"
require_relative "report"
require_relative "call_tree"

module Contprof
  # A self-contained, interactive HTML flame graph of a profile (no network needed to
  # view it): one view per sample type, thread (from the "thread id"/"thread name"
  # labels) or all threads, with or without idle waits, callees (root at the top) or
  # callers (inverted: where time was spent at the top, then who called it); click a frame
  # to zoom into it, hover for its values, search to highlight matching functions.
  #
  # The data is two Report::CallTree's in flat arrays (no nested JSON, so any depth fits)
  # and one string table; the page (flamegraph_page.html) draws it with plain JavaScript
  # over absolutely positioned elements, walking nodes in order rather than recursively.
  module Flamegraph
    PAGE = File.join(__dir__, "flamegraph_page.html")

    class << self
      def html(profile, title: "Contprof flame graph", cutoff: Report::CallTree::DEFAULT_CUTOFF)
        data = JSON.generate(data(profile, title: title, cutoff: cutoff))
        File.read(PAGE, encoding: Encoding::UTF_8)
            .gsub("{{TITLE}}") { ERB::Util.html_escape(title) }
            .sub("{{DATA}}") { data.gsub("</", "<\\/") }
      end

      def write(profile, path, **options)
        File.write(path, html(profile, **options))
        path
      end

      # The page's data, as a Hash (JSON-ready).
      def data(profile, title:, cutoff:)
        names = []
        name_index = {}
        name_ids = profile.frames.map { |frame| frame && (name_index[frame.function_name] ||= (names << frame.function_name).size - 1) }
        thread_keys, thread_titles = threads(profile)
        idle = Report.idle_frames(profile)
        slices = Array.new(profile.sample_count) do |i|
          thread_keys.fetch(Report.thread_key(profile.labels[i])) * 2 + (Report.idle_sample?(profile, i, idle) ? 1 : 0)
        end
        trees = %i[callees callers].to_h do |direction|
          tree = Report::CallTree.new(profile, slices: slices, slice_count: thread_keys.size * 2, name_ids: name_ids,
                                               direction: direction, cutoff: cutoff)
          [direction, encode(tree)]
        end
        root = names.size
        names << "all"
        trees.each_value { |tree| tree["name"][0] = root unless tree["name"].empty? }
        { "title" => title, "start" => profile.start_time.iso8601, "duration" => profile.duration_nanos,
          "threads" => thread_titles, "names" => names, "cutoff" => cutoff,
          "idleFunctions" => Report::IDLE_WAIT_FUNCTIONS,
          "types" => profile.sample_types.map { |t| { "name" => t.type, "unit" => t.unit } }, "trees" => trees }
      end

      private

      # Thread keys (ids in increasing order, then names) => index; and each thread's title.
      def threads(profile)
        names = {}
        profile.labels.each { |labels| names[Report.thread_key(labels)] ||= labels["thread name"] }
        keys = Report.sort_thread_keys(names.keys)
        [keys.each_with_index.to_h, keys.map { |key| Report.thread_title(key, names[key]) }]
      end

      # Short JSON: each node's parent as its distance back to it (1 for a first child; 0
      # for the root), and value triples with each node as the difference from the
      # previous triple's node (mostly 0 or 1).
      def encode(tree)
        delta = lambda do |triples|
          previous = 0
          triples.each_slice(3).flat_map do |node, slice, value|
            step = node - previous
            previous = node
            [step, slice, value]
          end
        end
        parents = tree.parents.each_with_index.map { |parent, node| parent.negative? ? 0 : node - parent }
        { "parent" => parents, "name" => tree.names.dup, "totals" => tree.totals.map(&delta),
          "selfs" => tree.selfs.map(&delta) }
      end
    end
  end
end
