# frozen_string_literal: true

require "json"
require "erb"

module Contprof
  class Viewer
    # The viewer's first page: the directories' profiles on a time axis (each sample type's
    # total per time bucket, summed over processes), where a drag chooses the range and a
    # second one, with "base" ticked, the range to compare it with; the links to the views
    # of that range carry it in their query. The page gets buckets, not files: its size
    # follows BUCKETS, not the number of profiles.
    class HomePage
      BUCKETS = 600
      PAGE = File.join(__dir__, "home_page.html")

      # entries: the indexes' entries, as the request read them; span: [from, to] in
      # nanoseconds (nil: open), the part of the time axis to draw (zoomed in on).
      def initialize(indexes, entries:, max_files:, mounted_at: "", span: [nil, nil])
        @indexes = indexes
        @entries = entries
        @span = span
        @max_files = max_files
        @mounted_at = mounted_at
      end

      def html
        data = JSON.generate(data(@entries))
        File.read(PAGE, encoding: Encoding::UTF_8).sub("{{DATA}}") { data.gsub("</", "<\\/") }
      end

      private

      def data(all)
        from, to = @span
        entries = all.select { |entry| (from.nil? || entry.finish > from) && (to.nil? || entry.start < to) }
        return { "empty" => true, "directories" => @indexes.map(&:directory), "spanned" => !(from.nil? && to.nil?),
                                     "allFiles" => all.size } if entries.empty?

        earliest = entries.map(&:start).min
        first = from || earliest
        last = to || entries.map(&:finish).max
        width = bucket_width(entries, last - first)
        # (Zoomed: the axis starts on a bucket boundary of the profiles' own grid at or before
        # span_from, so that no bucket holds a profile more than its neighbours.)
        first = earliest + (from - earliest).div(width) * width if from
        types = entries.flat_map { |entry| entry.totals.keys }.uniq
        sums = types.to_h { |type| [type, Array.new(((last - first) / width) + 1, 0)] }
        entries.each do |entry|
          bucket = [(entry.start - first) / width, 0].max
          entry.totals.each { |type, total| sums[type][bucket] += total }
        end
        services = entries.group_by(&:service).transform_values { |list| [list.size, list.map(&:pid).uniq.size] }
        versions = entries.select(&:version).group_by(&:version).transform_values { |list| [list.size, list.map(&:start).min] }
        { "directories" => @indexes.map(&:directory), "files" => entries.size, "bytes" => entries.sum(&:size),
          "first" => first, "last" => last, "spanned" => !(from.nil? && to.nil?), "allFiles" => all.size, "bucket" => width, "sums" => sums, "services" => services, "versions" => versions,
          "unreadable" => @indexes.sum { |index| index.unreadable.size },
          "maxFiles" => @max_files, "mountedAt" => @mounted_at } # (links are absolute paths under it)
      end

      # At most BUCKETS buckets over the span, each a whole number of the profiles' usual
      # period (the median, at least a second): a bucket shorter than a profile would leave
      # empty buckets between full ones, and one of a period and a half would hold one
      # profile or two by turns, either drawing a comb where the load was flat.
      def bucket_width(entries, span)
        durations = entries.map(&:duration).sort
        period = [durations[durations.size / 2], 1_000_000_000].max
        [span.fdiv(BUCKETS * period).ceil, 1].max * period
      end
    end
  end
end
