# frozen_string_literal: true

require "time"
require_relative "../pprof/reader"
require_relative "../pprof/endpoint_counts_comment"
require_relative "profile_format"
require_relative "../configuration/deploy_tags"
require_relative "merged_profiles"

module Contprof
  module Report
    # The profiles a report reads: pprof files and directories of them, kept to a time range,
    # merged into one Pprof::Profile, then narrowed to threads and labels. Every refusal is
    # a Report::InputError whose message names the file, option or value at fault.
    module Profiles
      TIMESTAMP_LABEL = "end_timestamp_ns"

      class << self
        # `paths`: files, or directories whose *.pprof files are read. `from`/`to`: Times;
        # a file is kept when its period (time_nanos, duration_nanos) overlaps [from, to),
        # and of its timeline samples (those with an end_timestamp_ns label), those whose
        # stretch (their wall time, ending at that timestamp) overlaps it. `aggregate`: for a
        # report that draws no timeline, the same values summed per stack and labels, read
        # by the extension (MergedProfiles) where it can.
        def load(paths, from: nil, to: nil, version: nil, aggregate: false)
          files = expand(paths)
          if aggregate && version.nil?
            merged = MergedProfiles.load(files, from && nanos(from), to && nanos(to))
            return merged if merged
          end

          profiles = of_version(files.map { |path| [path, decode(path)] }, version)
          return merge(profiles) unless from || to

          merged = merge(in_range(profiles, from, to))
          during(merged, from && nanos(from), to && nanos(to))
        end

        # Each file of `paths` whose period overlaps [from, to), as [path, Pprof::Profile],
        # decoded one at a time (for reports over more files than fit in memory at once).
        # `leaf_frames`: only that many innermost frames of each stack are needed (growth by
        # allocation site): the extension then reads the file, some 15 times faster.
        def each_file(paths, from: nil, to: nil, version: nil, leaf_frames: nil)
          unless block_given?
            return enum_for(:each_file, paths, from: from, to: to, version: version, leaf_frames: leaf_frames)
          end

          from_nanos = from && nanos(from)
          to_nanos = to && nanos(to)
          kept = 0
          expand(paths).each do |path|
            profile = (leaf_frames && MergedProfiles.load([path], nil, nil, max_frames: leaf_frames)) || decode(path)
            next unless overlaps?(profile, from_nanos, to_nanos)
            next if version && version_of(profile) != version

            kept += 1
            yield path, profile
          end
          if kept.zero?
            raise InputError, "no profile#{version ? " of version #{version.inspect}" : ""} overlaps the time range " \
                              "#{from&.iso8601 || "…"} to #{to&.iso8601 || "…"}"
          end
        end

        # The profiles ([path, profile]) of a deploy's `version` (DeployTags; all when nil).
        def of_version(profiles, version)
          return profiles unless version

          kept = profiles.select { |_, profile| version_of(profile) == version }
          return kept unless kept.empty?

          known = profiles.filter_map { |_, profile| version_of(profile) }.uniq
          raise InputError, "no profile of version #{version.inspect} (#{known.empty? ? "the profiles carry no version: " \
                            "set the `version` setting" : "versions: #{known.sort.join(", ")}"})"
        end

        # The deploy's version a profile carries (DeployTags), or nil.
        def version_of(profile)
          DeployTags.from_comments(profile.comments)["version"]
        end

        # Whether the profile has timeline samples.
        def timeline?(profile)
          profile.labels.any? { |labels| labels.key?(TIMESTAMP_LABEL) }
        end

        # Sample `i`'s stretch on the timeline, [start, end] in nanoseconds since the epoch:
        # its wall time (value `wall`, the index of wall-time or nil) ending at its
        # timestamp; nil for a sample without one.
        def stretch(profile, i, wall)
          finish = profile.labels[i][TIMESTAMP_LABEL]
          return nil unless finish.is_a?(Integer)

          [finish - (wall ? profile.values[i][wall] : 0), finish]
        end

        # Samples whose thread is one of `threads` (a name or an id, as given on the command
        # line) and that carry every `labels` pair ([key, value] Strings).
        def filter(profile, threads: [], labels: [])
          return profile if threads.empty? && labels.empty?

          keep = Array.new(profile.sample_count) do |i|
            sample_labels = profile.labels[i]
            (threads.empty? || threads.any? { |t| thread_matches?(sample_labels, t) }) &&
              labels.all? { |key, value| sample_labels.key?(key) && sample_labels[key].to_s == value }
          end
          unless keep.any?
            raise InputError, "no sample matches #{describe_filter(threads, labels)} " \
                              "(#{known_values(profile, threads, labels)})"
          end

          subset(profile, keep)
        end

        # "name (id)" of each thread in the profile's labels, by decreasing sample count.
        def thread_names(profile)
          counts = Hash.new(0)
          names = {}
          profile.labels.each do |labels|
            key = Report.thread_key(labels)
            counts[key] += 1
            names[key] ||= labels["thread name"]
          end
          counts.sort_by { |key, count| [-count, key.to_s] }.map { |key, _| Report.thread_title(key, names[key]) }
        end

        private

        def expand(paths)
          raise InputError, "report needs at least one pprof FILE or directory (see contprof report --help)" if paths.empty?

          paths.flat_map do |path|
            if File.directory?(path)
              found = Dir[File.join(path, "*.pprof")].sort
              raise InputError, "no *.pprof file in directory #{path}" if found.empty?

              found
            else
              [path]
            end
          end
        end

        # pprof or OTLP, told by content (ProfileFormat.of).
        def decode(path)
          ProfileFormat.decode_file(path)
        rescue Errno::ENOENT, Errno::EACCES => e
          raise InputError, "cannot read #{path}: #{e.message}"
        rescue Otlp::DecodeError => e
          raise InputError, "#{path} is not an OTLP profile (#{e.message})"
        rescue Pprof::DecodeError, Zlib::Error => e
          raise InputError, "#{path} is not a pprof profile (#{e.message})"
        end

        def in_range(profiles, from, to)
          from_nanos = from && nanos(from)
          to_nanos = to && nanos(to)
          kept = profiles.select { |_, profile| overlaps?(profile, from_nanos, to_nanos) }
          return kept unless kept.empty?

          first = profiles.map { |_, p| p.time_nanos }.min
          last = profiles.map { |_, p| p.time_nanos + p.duration_nanos }.max
          raise InputError, "no profile overlaps the time range #{from&.iso8601 || "…"} to #{to&.iso8601 || "…"} " \
                            "(the files span #{time_of(first).iso8601(3)} to #{time_of(last).iso8601(3)})"
        end

        def overlaps?(profile, from_nanos, to_nanos)
          start = profile.time_nanos
          finish = start + profile.duration_nanos
          (from_nanos.nil? || finish > from_nanos) && (to_nanos.nil? || start < to_nanos)
        end

        # A timeline sample partly in the range keeps that part of its values (its stretch
        # is its wall time; one without wall time is an instant).
        def during(profile, from_nanos, to_nanos)
          return profile unless timeline?(profile)

          wall = profile.sample_types.index { |t| t.type == "wall-time" }
          from_nanos ||= -Float::INFINITY
          to_nanos ||= Float::INFINITY
          values = profile.values.dup
          keep = Array.new(profile.sample_count) do |i|
            start, finish = stretch(profile, i, wall)
            next true unless finish

            length = finish - start
            next finish >= from_nanos && finish < to_nanos unless length.positive?

            overlap = [finish, to_nanos].min - [start, from_nanos].max
            next false unless overlap.positive?

            values[i] = values[i].map { |value| (value * overlap.fdiv(length)).round } if overlap < length
            true
          end
          raise InputError, "no timeline sample falls in the time range" unless keep.any?

          subset(profile, keep, values: values)
        end

        def nanos(time)
          time.to_i * 1_000_000_000 + time.nsec
        end

        def time_of(nanos)
          Time.at(nanos / 1_000_000_000, nanos % 1_000_000_000, :nsec).utc
        end

        # One profile holding every file's samples. Frames are unified by (function, file,
        # line); sample types must be the same, in the same order, in every file.
        def merge(profiles)
          first_path, first = profiles.first
          return first if profiles.size == 1

          profiles.each do |path, profile|
            next if profile.sample_types == first.sample_types

            raise InputError, "sample types differ: #{first_path} has #{describe_types(first)}, " \
                              "#{path} has #{describe_types(profile)} (merge only profiles of the same kind)"
          end
          frames = []
          frame_ids = {}
          stacks = []
          values = []
          labels = []
          profiles.each do |_, profile|
            remap = profile.frames.map do |frame|
              frame && (frame_ids[frame.to_a] ||= (frames << frame).size - 1)
            end
            profile.stacks.each { |stack| stacks << stack.map { |id| remap[id] } }
            values.concat(profile.values)
            labels.concat(profile.labels)
          end
          start = profiles.map { |_, p| p.time_nanos }.min
          finish = profiles.map { |_, p| p.time_nanos + p.duration_nanos }.max
          Pprof::Profile.new(sample_types: first.sample_types, time_nanos: start, duration_nanos: finish - start,
                             period_type: first.period_type, period: first.period,
                             comments: EndpointCountsComment.merge(profiles.flat_map { |_, p| p.comments }),
                             frames: frames, stacks: stacks, values: values, labels: labels)
        end

        def describe_types(profile)
          profile.sample_types.map { |t| "#{t.type} (#{t.unit})" }.join(", ")
        end

        # The samples `keep` says, with `values` instead of the profile's when given.
        def subset(profile, keep, values: profile.values)
          pick = ->(list) { list.select.with_index { |_, i| keep[i] } }
          Pprof::Profile.new(sample_types: profile.sample_types, time_nanos: profile.time_nanos,
                             duration_nanos: profile.duration_nanos, period_type: profile.period_type,
                             period: profile.period, comments: profile.comments, frames: profile.frames,
                             stacks: pick.(profile.stacks), values: pick.(values), labels: pick.(profile.labels))
        end

        def thread_matches?(labels, thread)
          labels["thread name"] == thread || labels["thread id"].to_s == thread
        end

        def describe_filter(threads, labels)
          parts = []
          parts << "--thread #{threads.join(" or ")}" unless threads.empty?
          parts.concat(labels.map { |key, value| "--label #{key}=#{value}" })
          parts.join(" and ")
        end

        def known_values(profile, threads, labels)
          return "threads: #{thread_names(profile).first(10).join(", ")}" unless threads.empty?

          keys = profile.labels.uniq.flat_map(&:keys).uniq.sort
          keys.empty? ? "the samples have no labels" : "label keys: #{keys.join(", ")}"
        end
      end
    end
  end
end
