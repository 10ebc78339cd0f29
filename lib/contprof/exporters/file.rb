# frozen_string_literal: true

module Contprof
  module Exporters
    # Writes each profile to <output>/<service>-<pid>-<start>.pprof, atomically: to a new
    # temporary file in the same directory (created with O_EXCL and O_NOFOLLOW, so never
    # through a pre-existing file or symlink), then renamed into place. Files get mode 0644
    # less the process's umask. The writing is in C, holding the GVL (see ext/contprof/transport/file_writer.c).
    class File
      MODE = 0o644

      attr_reader :directory

      # This exporter for `settings`, or nil when they name no output directory.
      def self.from_settings(settings)
        settings.output && new(settings.output)
      end

      def initialize(directory)
        @directory = ::File.expand_path(directory)
      end

      def name
        "file"
      end

      # Written here, not uploaded: the profiler writes files before it starts uploads.
      def local?
        true
      end

      # Files are written whatever the profile's length.
      def minimum_duration
        0
      end

      # A directory that went away (rotated, cleaned up) is made again, once per export: a
      # second failure is raised, never retried (a path that cannot hold files, such as
      # /proc/self, would otherwise be retried forever).
      # timeout: not used (writing is local). Returns the file's path.
      def export(profile, timeout: nil) # rubocop:disable Lint/UnusedMethodArgument -- every exporter's signature
        service = profile.tags.fetch("service", "ruby").gsub(/[^A-Za-z0-9_.-]/, "_")
        stamp = profile.start.utc.strftime("%Y%m%dT%H%M%S.%6NZ")
        path = ::File.join(@directory, "#{service}-#{profile.tags.fetch("process_id")}-#{stamp}.pprof")
        temporary = ::File.join(@directory, ".#{::File.basename(path)}.#{Random.urandom(6).unpack1("H*")}.tmp")
        made_again = false
        begin
          make_directory unless @directory_made
          @directory_made = true
          Native.write_file_atomically(temporary, path, profile.pprof, MODE)
        rescue Errno::ENOENT
          raise if made_again

          made_again = true
          @directory_made = false
          retry
        end
      end

      private

      # mkdir -p. (Not FileUtils.mkdir_p: loading fileutils, a default gem, costs about 10 ms
      # of CPU, most of Contprof's cost in a short process; see bench/startup.rb.)
      def make_directory(path = @directory)
        Dir.mkdir(path)
      rescue Errno::EEXIST
        raise unless ::File.directory?(path)
      rescue Errno::ENOENT
        parent = ::File.dirname(path)
        raise if parent == path

        make_directory(parent)
        make_directory(path)
      end
    end
  end
end
