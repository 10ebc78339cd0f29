# frozen_string_literal: true

require "fileutils"
require "securerandom"

module Contprof
  module Exporters
    # Writes each profile to <output>/<service>-<pid>-<start>.pprof, atomically: to a new
    # temporary file in the same directory (created with O_EXCL and O_NOFOLLOW, so never
    # through a pre-existing file or symlink), then renamed into place. Files get mode 0644
    # less the process's umask.
    class File
      MODE = 0o644

      attr_reader :directory

      def initialize(directory)
        @directory = ::File.expand_path(directory)
      end

      def name
        "file"
      end

      # Files are written whatever the profile's length.
      def minimum_duration
        0
      end

      def export(profile)
        FileUtils.mkdir_p(@directory)
        service = profile.tags.fetch("service", "ruby").gsub(/[^A-Za-z0-9_.-]/, "_")
        stamp = profile.start.utc.strftime("%Y%m%dT%H%M%S.%6NZ")
        path = ::File.join(@directory, "#{service}-#{profile.tags.fetch("process_id")}-#{stamp}.pprof")
        temporary = ::File.join(@directory, ".#{::File.basename(path)}.#{SecureRandom.hex(6)}.tmp")
        flags = ::File::WRONLY | ::File::CREAT | ::File::EXCL | ::File::NOFOLLOW | ::File::BINARY
        begin
          ::File.open(temporary, flags, MODE) { |file| file.write(profile.pprof) }
          ::File.rename(temporary, path)
        ensure
          ::File.unlink(temporary) if ::File.exist?(temporary)
        end
        path
      end
    end
  end
end
