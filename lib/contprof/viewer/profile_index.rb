# frozen_string_literal: true

require "json"
require "etc"
require_relative "../reports/profiles"
require_relative "../reports/merged_profiles"
require_relative "../configuration/deploy_tags"
require_relative "parallel"

module Contprof
  class Viewer
    # What a profile directory holds, without reading every profile at every request: per
    # .pprof file, its period, service, process, deploy (version, env: see DeployTags) and
    # total per sample type. Kept in memory
    # and in a small file beside the profiles (INDEX_FILE, hidden, so neither retention nor
    # `contprof report DIR` reads it), rebuilt from the files when missing, unreadable or
    # stale: a file whose name, size or modification time changed is read again, one that
    # is gone is dropped. The index is never the only copy of anything.
    #
    # The directory is listed again when its own modification time says a file was added,
    # removed or renamed in (as the profiler and retention do), and at least every
    # RELIST_SECONDS (a file rewritten in place changes only its own); a week of one-minute
    # files from 8 processes takes about 0.2 s to list, more than a request should pay. Files are read by
    # the extension (Native.pprof_summary, without the GVL) where it can, else in Ruby.
    class ProfileIndex
      INDEX_FILE = ".contprof-index.json"
      VERSION = 3
      RELIST_SECONDS = 10
      READERS = 4
      # A directory's time that close to its listing may hide a change made in the same tick
      # of the file system's clock (a few ms): it is not trusted (listed again next time).
      RACY_SECONDS = 1.0
      # `reach`: the time its timeline samples cover ([first stretch's start, last
      # timestamp]; a stretch can begin before the file's period), [] when it has none, nil
      # when not known (read in Ruby).
      Entry = Struct.new(:name, :mtime, :size, :start, :duration, :service, :pid, :totals, :version, :env, :reach,
                         keyword_init: true) do
        def finish = start + duration

        # Whether every sample lies in [from, to) (nanoseconds; nil: open), so that the
        # range takes the file whole.
        def within?(from, to)
          return false if reach.nil?

          earliest = reach.empty? ? start : [start, reach[0]].min
          latest = reach.empty? ? finish : [finish, reach[1] + 1].max
          (from.nil? || earliest >= from) && (to.nil? || latest <= to)
        end
      end
      NAME = /\A(?<service>.+)-(?<pid>\d+)-\d{8}T\d{6}\.\d{6}Z\.pprof\z/.freeze

      attr_reader :directory, :unreadable

      def initialize(directory)
        @directory = ::File.expand_path(directory)
        @entries = nil
        @sorted = nil
        @listed = nil # [the directory's mtime, when listed], while trusted
        @unreadable = [] # names of files that are not profiles (left out, said on the page)
      end

      # The entries, sorted by start, after bringing the index up to date with the directory.
      def entries
        refresh if stale?
        @sorted ||= @entries.values.sort_by { |entry| [entry.start, entry.name] }.freeze
      end

      def path_of(entry)
        ::File.join(@directory, entry.name)
      end

      private

      def stale?
        return true unless @listed

        mtime, listed_at = @listed
        Process.clock_gettime(Process::CLOCK_MONOTONIC) - listed_at >= RELIST_SECONDS || directory_mtime != mtime
      end

      def directory_mtime
        ::File.mtime(@directory)
      rescue SystemCallError
        nil
      end

      def refresh
        @entries ||= load_index
        listed_at = Process.clock_gettime(Process::CLOCK_MONOTONIC)
        listed = Native.profile_files(@directory).select { |name, _, _| name.end_with?(".pprof") }
        seen = {}
        @unreadable = []
        to_read = listed.reject do |name, mtime, size|
          seen[name] = true
          (known = @entries[name]) && known.mtime == mtime && known.size == size
        end
        changed = !to_read.empty?
        read_entries(to_read).each do |(name, _, _), entry|
          if entry
            @entries[name] = entry
          else
            @entries.delete(name)
            @unreadable << name
          end
        end
        gone = @entries.keys.reject { |name| seen[name] }
        gone.each { |name| @entries.delete(name) }
        if changed || !gone.empty?
          @sorted = nil
          save_index
        end
        mtime = directory_mtime
        @listed = mtime && Time.now - mtime >= RACY_SECONDS ? [mtime, listed_at] : nil
      end

      # [[name, mtime, size], entry or nil] for each file of `files`: many are read by
      # READERS threads at once (the extension reads a file without the GVL, so they run in
      # parallel: a week of files from 8 processes is some 80,000).
      def read_entries(files)
        return files.map { |file| [file, read_entry(*file)] } if files.size < 64 || !Report::MergedProfiles.available?

        Parallel.map(files, [READERS, Etc.nprocessors].min) { |file| [file, read_entry(*file)] }
      end

      def read_entry(name, mtime, size)
        summary, reach = summarize(::File.join(@directory, name))
        match = NAME.match(name)
        deploy = DeployTags.from_comments(summary.comments)
        Entry.new(name: name, mtime: mtime, size: size, start: summary.time_nanos, duration: summary.duration_nanos,
                  service: match ? match[:service] : "(unnamed)", pid: match ? Integer(match[:pid]) : 0,
                  totals: summary.totals, version: deploy["version"], env: deploy["env"], reach: reach)
      rescue Pprof::DecodeError, SystemCallError
        nil
      end

      # A file's Pprof::Summary and its timeline's reach (Entry); read in Ruby where the
      # extension cannot (which then says why when the file is no profile).
      def summarize(path)
        if Report::MergedProfiles.available?
          begin
            types, time, duration, totals, comments, reach = Native.pprof_summary(path)
            summary = Pprof::Summary.new(types.map { |type, unit| Pprof::ValueType.new(type, unit) }, time, duration,
                                         types.each_with_index.to_h { |(type, _), t| [type, totals[t]] }, comments)
            return [summary, reach]
          rescue Native::PprofMerge::DecodeError
            nil
          end
        end
        [Pprof.summary(::File.binread(path)), nil]
      end

      def load_index
        data = JSON.parse(::File.read(::File.join(@directory, INDEX_FILE)))
        fields = Entry.members.map(&:to_s)
        return {} unless data.is_a?(Hash) && data["version"] == VERSION && data["fields"] == fields && data["entries"].is_a?(Array)

        data["entries"].to_h do |row|
          raise ArgumentError unless row.is_a?(Array) && row.size == fields.size

          entry = Entry.new(**Entry.members.zip(row).to_h)
          [entry.name, entry]
        end
      rescue SystemCallError, JSON::ParserError, ArgumentError, TypeError, NoMethodError
        {} # (missing or damaged: rebuilt from the files)
      end

      # Written to a temporary file and renamed into place; a directory that cannot be
      # written to keeps the index in memory only.
      def save_index
        # (A row per file, its fields named once: a week of one-minute files from 8
        # processes is some 80,000 rows.)
        json = JSON.generate({ "version" => VERSION, "fields" => Entry.members.map(&:to_s),
                               "entries" => @entries.values.map(&:to_a) })
        temporary = ::File.join(@directory, ".#{INDEX_FILE}.#{Process.pid}.tmp")
        ::File.write(temporary, json)
        ::File.rename(temporary, ::File.join(@directory, INDEX_FILE))
      rescue SystemCallError
        begin
          ::File.unlink(temporary) if temporary
        rescue SystemCallError
          nil
        end
      end
    end
  end
end
