# frozen_string_literal: true

module Contprof
  module Report
    # The call trees behind the HTML flame graph, in a flat encoding that any depth fits in
    # (no nesting: nodes in pre-order with their parent's index) and whose size follows
    # what can be drawn, not the number of samples or stacks.
    #
    # Stacks are merged into a tree by function name, top down, and a node is kept when it
    # is at least `cutoff` of the total in one of the views the page offers: all threads or
    # one thread, with or without idle waits, for any sample type. Narrower nodes, and all
    # below them, are left out; their time stays in their parent's total (the page shows
    # it as the parent's "hidden callees"). Built breadth by breadth over the samples'
    # indices, so samples stop costing anything below the last level where they are visible.
    #
    # A sample's "slice" is its thread's index * 2, plus 1 when it is an idle wait
    # (Report::IDLE_WAIT_FUNCTIONS): views are sums of slices.
    #
    # Built in C by the extension's Native.call_tree (ext/contprof/reports/call_tree.c) when
    # it is loaded: the same tree, node for node. The Ruby code below is the fallback and
    # the reference the tests compare the C tree with; it also builds the trees whose values
    # do not fit int64 (the C code sums as int64 and declines those).
    class CallTree
      DEFAULT_CUTOFF = 0.001

      attr_reader :parents, :names, :totals, :selfs
      # With track_samples: per sample, the deepest node it reached (-1: none, a sample
      # without values), and whether it ends there (its self value is that node's).
      attr_reader :sample_nodes, :sample_ends

      # `direction`: :callees (root = program entry, the flame graph) or :callers (root =
      # the functions where time was spent, then who called them: the inverted view).
      # `slices`: per sample, its slice; `name_ids`: per frame id, its function's index
      # in the shared string table. `native: false` builds it with the Ruby code.
      def initialize(profile, slices:, slice_count:, name_ids:, direction:, cutoff: DEFAULT_CUTOFF, track_samples: false,
                     native: true)
        @profile = profile
        @sample_nodes = track_samples ? Array.new(profile.sample_count, -1) : nil
        @sample_ends = track_samples ? Array.new(profile.sample_count, false) : nil
        @slices = slices
        @slice_count = slice_count
        @name_ids = name_ids
        @callers = direction == :callers
        @cutoff = cutoff
        @parents = []
        @names = []
        # Per type: a flat list of [node, slice, value] triples (totals), and the same for
        # nonzero self values.
        @totals = Array.new(profile.sample_types.size) { [] }
        @selfs = Array.new(profile.sample_types.size) { [] }
        build unless native && build_natively(track_samples)
      end

      def size
        @parents.size
      end

      def callers?
        @callers
      end

      private

      # True when Native.call_tree built the tree (false: no extension, or values beyond int64).
      def build_natively(track_samples)
        return false unless defined?(Native) && Native.respond_to?(:call_tree)

        built = Native.call_tree(@profile.stacks, @profile.values, @slices, @slice_count, @name_ids, @profile.sample_types.size,
                                 @callers ? :callers : :callees, @cutoff, track_samples)
        return false unless built

        @parents, @names, @totals, @selfs, nodes, ends = built
        @sample_nodes, @sample_ends = nodes, ends if track_samples
        true
      end

      def build
        samples = (0...@profile.sample_count).reject { |i| @profile.values[i].all?(&:zero?) }
        return if samples.empty?

        @thresholds = view_thresholds(slice_sums(samples))
        work = [[-1, -1, samples, 0, slice_sums(samples)]] # [parent node, name id, samples, depth, their sums]
        until work.empty?
          parent, name, group, depth, sums = work.pop
          node = @parents.size
          @parents << parent
          @names << name
          self_sums, children = split(group, depth, node)
          record(node, sums, @totals)
          record(node, self_sums, @selfs)
          kept = children.filter_map do |child_name, child_group|
            child_sums = slice_sums(child_group)
            [child_name, child_group, child_sums] if visible?(child_sums)
          end
          # Popped last-pushed first: push in reverse display order (widest first).
          kept.sort_by! { |child_name, _, child_sums| [-child_sums[0].sum, child_name] }
          kept.reverse_each { |child_name, child_group, child_sums| work << [node, child_name, child_group, depth + 1, child_sums] }
        end
      end

      # The slice sums of a node's samples that end at it (self), and its children's
      # samples by function name.
      def split(group, depth, node)
        ending = []
        children = Hash.new { |hash, key| hash[key] = [] }
        stacks = @profile.stacks
        name_ids = @name_ids
        group.each { |i| @sample_nodes[i] = node } if @sample_nodes
        group.each do |i|
          stack = stacks[i]
          if depth >= stack.size
            ending << i
            @sample_ends[i] = true if @sample_ends
          else
            children[name_ids[@callers ? stack[depth] : stack[stack.size - 1 - depth]]] << i
          end
        end
        [slice_sums(ending), children]
      end

      # sums[type][slice] over the samples.
      def slice_sums(group)
        type_count = @profile.sample_types.size
        sums = Array.new(type_count) { Array.new(@slice_count, 0) }
        values = @profile.values
        slices = @slices
        group.each do |i|
          row = values[i]
          slice = slices[i]
          type = 0
          while type < type_count
            sums[type][slice] += row[type]
            type += 1
          end
        end
        sums
      end

      # Per type, the smallest visible value in each view: all threads with and without
      # idle waits, then each thread with and without (at 2 + slice and 3 + slice).
      def view_thresholds(sums)
        sums.map do |by_slice|
          views = [by_slice.sum, by_slice.each_slice(2).sum { |busy, _| busy }]
          by_slice.each_slice(2) { |busy, idle| views << busy + idle << busy }
          views.map { |total| @cutoff * total }
        end
      end

      # True when the sums reach the threshold of some view of some type. Loops rather
      # than iterators: this runs for every child of every node kept.
      def visible?(sums)
        type = 0
        while type < sums.size
          by_slice = sums[type]
          thresholds = @thresholds[type]
          all = busy_all = 0
          slice = 0
          while slice < @slice_count
            busy = by_slice[slice]
            both = busy + by_slice[slice + 1]
            return true if (both.positive? && both >= thresholds[2 + slice]) || (busy.positive? && busy >= thresholds[3 + slice])

            all += both
            busy_all += busy
            slice += 2
          end
          return true if (all.positive? && all >= thresholds[0]) || (busy_all.positive? && busy_all >= thresholds[1])

          type += 1
        end
        false
      end

      def record(node, sums, into)
        type = 0
        while type < sums.size
          by_slice = sums[type]
          list = into[type]
          slice = 0
          while slice < @slice_count
            value = by_slice[slice]
            list.push(node, slice, value) unless value.zero?
            slice += 1
          end
          type += 1
        end
      end
    end
  end
end
