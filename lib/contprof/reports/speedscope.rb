# frozen_string_literal: true

require "json"
require_relative "report"
require_relative "profiles"

module Contprof
  # speedscope's own file format (https://www.speedscope.app/file-format-schema.json), so
  # that every view of a profile is there when the file is opened: one "sampled" profile
  # per sample type and per thread (speedscope shows one profile at a time and lists the
  # others). Frames are shared; each sample is a stack of frame indices, root first, with
  # its value as weight. Stacks equal within a profile are summed into one sample.
  #
  # A profile with a timeline (samples with an end_timestamp_ns label) gets, first, one
  # "evented" profile per thread: its wall-time samples laid out in time (each spans its
  # wall time, ending at its timestamp), which speedscope draws as the thread's timeline.
  module Speedscope
    SCHEMA = "https://www.speedscope.app/file-format-schema.json"
    UNITS = { "nanoseconds" => "nanoseconds", "microseconds" => "microseconds", "milliseconds" => "milliseconds",
              "seconds" => "seconds", "bytes" => "bytes" }.freeze

    class << self
      def document(profile, name: "Contprof profile")
        frames = []
        frame_index = {}
        # speedscope frames are by (name, file, line): one per pprof frame id.
        frame_of = profile.frames.map do |frame|
          next unless frame

          frame_index[frame.to_a] ||= begin
            frames << { "name" => frame.function_name, "file" => frame.file_name, "line" => frame.line }
            frames.size - 1
          end
        end
        profiles = []
        by_thread = profile.labels.each_index.group_by { |i| Report.thread_key(profile.labels[i]) }
        by_thread = Report.sort_thread_keys(by_thread.keys).to_h { |key| [key, by_thread[key]] }
        titles = by_thread.transform_values do |indices|
          labels = profile.labels[indices.first]
          Report.thread_title(Report.thread_key(labels), labels["thread name"])
        end
        wall = profile.sample_types.index { |type| type.type == "wall-time" }
        if wall
          by_thread.each do |key, indices|
            evented = timeline(profile, indices, wall, frame_of) or next
            profiles << evented.merge("name" => "timeline — #{titles[key]}")
          end
        end
        profile.sample_types.each_with_index do |type, type_index|
          by_thread.each do |key, indices|
            stacks = Hash.new(0)
            indices.each do |i|
              value = profile.values[i][type_index]
              stacks[profile.stacks[i].reverse.map { |id| frame_of[id] }] += value unless value.zero?
            end
            next if stacks.empty?

            total = stacks.values.sum
            profiles << { "type" => "sampled", "name" => "#{type.type} — #{titles[key]}",
                          "unit" => UNITS.fetch(type.unit, "none"), "startValue" => 0, "endValue" => total,
                          "samples" => stacks.keys, "weights" => stacks.values }
          end
        end
        { "$schema" => SCHEMA, "name" => name, "exporter" => "contprof #{VERSION}", "activeProfileIndex" => 0,
          "shared" => { "frames" => frames }, "profiles" => profiles }
      end

      # The thread's wall-time samples as open/close events, in nanoseconds since the
      # profile's start; nil without timeline samples. An overlap (records of one round)
      # starts the later sample where the earlier ended.
      def timeline(profile, indices, wall, frame_of)
        spans = indices.filter_map do |i|
          start, finish = Report::Profiles.stretch(profile, i, wall)
          next unless finish && finish > start

          [start - profile.time_nanos, finish - profile.time_nanos, profile.stacks[i].reverse.map { |id| frame_of[id] }]
        end
        return nil if spans.empty?

        events = []
        open = []
        now = nil
        spans.sort_by { |start, finish, _| [finish, start] }.each do |start, finish, stack|
          start = now if now && start < now
          start = 0 if start.negative?
          close(events, open, 0, now) if now && start > now # a gap: nothing known there
          shared = 0
          shared += 1 while shared < open.size && shared < stack.size && open[shared] == stack[shared]
          close(events, open, shared, start)
          stack[shared..].each do |frame|
            events << { "type" => "O", "frame" => frame, "at" => start }
            open << frame
          end
          now = finish
        end
        close(events, open, 0, now)
        { "type" => "evented", "unit" => "nanoseconds", "startValue" => 0, "endValue" => now, "events" => events }
      end

      def close(events, open, keep, at)
        events << { "type" => "C", "frame" => open.pop, "at" => at } while open.size > keep
      end

      def write(profile, path, **options)
        File.write(path, JSON.generate(document(profile, **options)))
        path
      end
    end
  end
end
