# frozen_string_literal: true

require_relative "../pprof/reader"
require_relative "../pprof/endpoint_counts_comment"

module Contprof
  module Report
    # Profiles merged by the extension's pprof reader (Native::PprofMerge): files read,
    # decompressed, cut to a time range and summed per stack and labels in C, without the
    # GVL, then decoded once. What Profiles.load gives, but aggregated: timeline samples lose
    # their timestamps (after the cut), so the result holds one record per distinct stack and
    # labels rather than one per sample. For the views that do not draw a timeline (top, by
    # label, a comparison, a long range's flame graph), where reading each file in Ruby
    # costs about 15 ms and merging it in C about 1 ms (bench/pprof_merge.rb).
    #
    # A merge can be kept and merged again (Part): the viewer keeps each hour's, so a range
    # over many hours reads only the files at its edges.
    module MergedProfiles
      # A merge's result: the gzipped pprof (without comments), the comments of the files
      # merged (each once; endpoint counts not yet summed), and its number of records.
      Part = Struct.new(:pprof, :comments, :records, :name) do
        def bytesize = pprof.bytesize + comments.sum(&:bytesize)
      end

      class << self
        # Whether this build merges in C (a build without a decompressor reads in Ruby).
        def available?
          defined?(Native::PprofMerge) ? true : false
        end

        # The files `paths` and the kept parts `parts` merged over [from, to) (nanoseconds
        # since the epoch, nil for open), as a Pprof::Profile; nil when the C reader could
        # not (a file it does not read, such as OTLP, or nothing in the range), for the
        # caller to read them in Ruby, which says why if anything is wrong.
        # `max_frames`: only that many innermost frames of each stack are kept (a report by
        # allocation site reads the leaf and its caller).
        def load(paths, from_nanos, to_nanos, parts: [], max_frames: nil)
          part = merge(paths, from_nanos, to_nanos, parts: parts, name: "merged", max_frames: max_frames) or return nil
          return nil if part.records.zero?

          profile(part)
        end

        # The same merge as a Part, to be kept and given to a later #load; nil as for #load.
        def merge(paths, from_nanos, to_nanos, parts: [], name: "merged", max_frames: nil)
          return nil unless available?

          merger = Native::PprofMerge.new(from_nanos, to_nanos, max_frames)
          comments = []
          merged = 0
          parts.each do |part|
            merged += 1 if merger.add(part.pprof, part.name)
            comments.concat(part.comments)
          end
          paths.each { |path| merged += 1 if merger.add_file(path) }
          return nil if merged.zero?

          pprof, own_comments, records = merger.result
          Part.new(pprof, (comments + own_comments).uniq, records, name)
        rescue Native::PprofMerge::TypesDiffer => e
          raise InputError, e.message
        rescue Native::PprofMerge::DecodeError, SystemCallError
          nil
        end

        def profile(part)
          decoded = Pprof.decode(part.pprof)
          Pprof::Profile.new(sample_types: decoded.sample_types, time_nanos: decoded.time_nanos,
                             duration_nanos: decoded.duration_nanos, period_type: decoded.period_type,
                             period: decoded.period, comments: EndpointCountsComment.merge(part.comments),
                             frames: decoded.frames, stacks: decoded.stacks, values: decoded.values,
                             labels: decoded.labels)
        end
      end
    end
  end
end
