# frozen_string_literal: true

require "json"
require "erb"
require "time"
require_relative "report"
require_relative "call_tree"
require_relative "profiles"

module Contprof
  # A self-contained, interactive HTML flame graph of a profile (no network needed to
  # view it): one view per sample type, thread (from the "thread id"/"thread name"
  # labels) or all threads, with or without idle waits, callees (root at the top) or
  # callers (inverted: where time was spent at the top, then who called it); click a frame
  # to zoom into it, hover for its values, search to highlight matching functions. A
  # profile with a timeline also gets one lane per thread, its wall time coloured by thread
  # state and GC marked, where a brushed range narrows the flame graph to that time. With a
  # base profile (`contprof report --base`), frames are coloured by how their share changed
  # against it (a differential flame graph: the widths are the profile's).
  #
  # The data is two Report::CallTree's in flat arrays (no nested JSON, so any depth fits)
  # and one string table; the page (flamegraph_page.html) draws it with plain JavaScript
  # over absolutely positioned elements, walking nodes in order rather than recursively.
  module Flamegraph
    PAGE = File.join(__dir__, "flamegraph_page.html")

    class << self
      def html(profile, title: "Contprof flame graph", cutoff: Report::CallTree::DEFAULT_CUTOFF, base: nil)
        data = JSON.generate(data(profile, title: title, cutoff: cutoff, base: base))
        File.read(PAGE, encoding: Encoding::UTF_8)
            .gsub("{{TITLE}}") { ERB::Util.html_escape(title) }
            .sub("{{DATA}}") { data.gsub("</", "<\\/") }
      end

      def write(profile, path, **options)
        File.write(path, html(profile, **options))
        path
      end

      # The page's data, as a Hash (JSON-ready).
      def data(profile, title:, cutoff:, base: nil)
        names = []
        name_index = {}
        name_ids = profile.frames.map { |frame| frame && (name_index[frame.function_name] ||= (names << frame.function_name).size - 1) }
        thread_keys, thread_titles = threads(profile)
        idle = Report.idle_frames(profile)
        slices = Array.new(profile.sample_count) do |i|
          thread_keys.fetch(Report.thread_key(profile.labels[i])) * 2 + (Report.idle_sample?(profile, i, idle) ? 1 : 0)
        end
        timeline = Report::Profiles.timeline?(profile)
        built = %i[callees callers].to_h do |direction|
          [direction, Report::CallTree.new(profile, slices: slices, slice_count: thread_keys.size * 2, name_ids: name_ids,
                                                    direction: direction, cutoff: cutoff, track_samples: timeline)]
        end
        trees = built.transform_values { |tree| encode(tree) }
        base_values = base && built.transform_values { |tree| base_node_values(tree, profile, base, name_index) }
        root = names.size
        names << "all"
        trees.each_value { |tree| tree["name"][0] = root unless tree["name"].empty? }
        { "title" => title, "start" => profile.start_time.iso8601, "duration" => profile.duration_nanos,
          "threads" => thread_titles, "names" => names, "cutoff" => cutoff,
          "idleFunctions" => Report::IDLE_WAIT_FUNCTIONS,
          "types" => profile.sample_types.map { |t| { "name" => t.type, "unit" => t.unit } }, "trees" => trees,
          "sampleCounts" => sample_counts(profile),
          "timeline" => timeline && timeline_data(profile, built, thread_keys, slices), "base" => base_values }
      end

      TIMELINE_STATES = ["running", "waiting for gvl", "native", "sleeping", "waiting", "io", "gc", "other"].freeze

      # The timeline samples, flat: per sample its thread, start and duration (microseconds
      # since the profile's start; the duration is its wall time), state, its node and
      # whether it ends there in each tree, whether it is an idle wait, then its values.
      def timeline_data(profile, trees, thread_keys, slices)
        wall = profile.sample_types.index { |t| t.type == "wall-time" }
        gc_frames = profile.frames.map { |frame| frame&.function_name == "Garbage Collection" }
        callees = trees[:callees]
        callers = trees[:callers]
        flat = []
        profile.sample_count.times do |i|
          start, finish = Report::Profiles.stretch(profile, i, wall)
          next unless finish && callees.sample_nodes[i] >= 0

          state = profile.stacks[i].any? { |id| gc_frames[id] } ? "gc" : profile.labels[i]["thread state"]
          flat.push(slices[i] >> 1, (start - profile.time_nanos) / 1000, (finish - start) / 1000,
                    TIMELINE_STATES.index(state) || TIMELINE_STATES.size - 1,
                    callees.sample_nodes[i], callees.sample_ends[i] ? 1 : 0,
                    callers.sample_nodes[i], callers.sample_ends[i] ? 1 : 0, slices[i] & 1, *profile.values[i])
        end
        { "states" => TIMELINE_STATES, "samples" => flat, "width" => 9 + profile.sample_types.size,
          "duration" => profile.duration_nanos / 1000 }
      end

      private

      # The base profile's value at each node of `tree` (the same path of function names from
      # the root), per sample type of the profile (nil for a type the base has not), with
      # idle waits and without: [type][0 with, 1 without][node]. A base stack stops adding
      # where the tree has no such child (a path the profile never took, or too narrow to draw).
      def base_node_values(tree, profile, base, name_index)
        return nil if tree.size.zero?

        children = Array.new(tree.size) { {} }
        tree.parents.each_with_index { |parent, node| children[parent][tree.names[node]] = node if parent >= 0 }
        base_names = base.frames.map { |frame| frame && name_index[frame.function_name] }
        base_types = profile.sample_type_names.map { |type| base.sample_type_names.index(type) }
        values = base_types.map { |index| index && [Array.new(tree.size, 0), Array.new(tree.size, 0)] }
        idle = Report.idle_frames(base)
        base.stacks.each_with_index do |stack, i|
          row = base.values[i]
          busy = !Report.idle_sample?(base, i, idle)
          path = [0]
          node = 0
          (tree.callers? ? stack : stack.reverse).each do |frame|
            node = children[node][base_names[frame]]
            break unless node

            path << node
          end
          base_types.each_with_index do |index, t|
            next unless index && !row[index].zero?

            with, without = values[t]
            path.each do |visited|
              with[visited] += row[index]
              without[visited] += row[index] if busy
            end
          end
        end
        values
      end

      # Per type, the index of the type counting its samples (for the hover's error bar), or
      # -1 when the profile has none or it is empty.
      def sample_counts(profile)
        profile.sample_type_names.map do |type|
          index = Report.sample_count_index(profile, type)
          index && profile.values.any? { |row| row[index].positive? } ? index : -1
        end
      end

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
