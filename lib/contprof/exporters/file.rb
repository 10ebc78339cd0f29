# frozen_string_literal: true

module Contprof
  module Exporters
    # Writes each profile to <output>/<service>-<pid>-<start>.pprof, atomically: to a new
    # temporary file in the same directory (created with O_EXCL and O_NOFOLLOW, so never
    # through a pre-existing file or symlink), then renamed into place. Files get mode 0644
    # less the process's umask. The writing is in C, holding the GVL (see ext/contprof/transport/file_writer.c).
    # With output_otlp, also <same name>.otlp: the profile as an OTLP upload sends it (an
    # ExportProfilesServiceRequest, uncompressed), for `contprof report` and protoc.
    class File
      MODE = 0o644

      attr_reader :directory

      # This exporter for `settings`, or nil when they name no output directory.
      def self.from_settings(settings)
        settings.output && new(settings.output, otlp: settings.output_otlp?)
      end

      # otlp: also write the .otlp file.
      def initialize(directory, otlp: false)
        @directory = ::File.expand_path(directory)
        @otlp = otlp
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

      # The OTLP encoding the recorder should add to profiles (see Otlp), or nil.
      def otlp_encoding
        @otlp ? :plain : nil
      end

      # A directory that went away (rotated, cleaned up) is made again, once per export: a
      # second failure is raised, never retried (a path that cannot hold files, such as
      # /proc/self, would otherwise be retried forever).
      # timeout: not used (writing is local). Returns the file's path; with output_otlp,
      # [the .pprof's path, the .otlp's path] (the .pprof is written first: without an OTLP
      # encoding in the profile, it is there and the error is raised after).
      def export(profile, timeout: nil) # rubocop:disable Lint/UnusedMethodArgument -- every exporter's signature
        service = profile.tags.fetch("service", "ruby").gsub(/[^A-Za-z0-9_.-]/, "_")
        stamp = profile.start.utc.strftime("%Y%m%dT%H%M%S.%6NZ")
        path = ::File.join(@directory, "#{service}-#{profile.tags.fetch("process_id")}-#{stamp}.pprof")
        write(path, profile.pprof)
        return path unless @otlp
        raise Error, "no OTLP encoding in this profile: #{::File.basename(path, ".pprof")}.otlp not written" unless profile.otlp

        otlp_path = path.sub(/\.pprof\z/, ".otlp")
        write(otlp_path, Otlp.encoded(profile.otlp, gzip: false))
        [path, otlp_path]
      end

      private

      def write(path, bytes)
        temporary = ::File.join(@directory, ".#{::File.basename(path)}.#{Random.urandom(6).unpack1("H*")}.tmp")
        made_again = false
        begin
          make_directory unless @directory_made
          @directory_made = true
          Native.write_file_atomically(temporary, path, bytes, MODE)
        rescue Errno::ENOENT
          raise if made_again

          made_again = true
          @directory_made = false
          retry
        end
      end

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
