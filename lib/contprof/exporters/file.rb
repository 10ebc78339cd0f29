# frozen_string_literal: true

module Contprof
  module Exporters
    # Writes each profile to <output>/<service>-<pid>-<start>.pprof, atomically: to a new
    # temporary file in the same directory (created with O_EXCL and O_NOFOLLOW, so never
    # through a pre-existing file or symlink), then renamed into place. Files get mode 0644
    # less the process's umask. The writing is in C, holding the GVL (see ext/contprof/transport/file_writer.c).
    # With output_otlp, also <same name>.otlp: the profile as an OTLP upload sends it (an
    # ExportProfilesServiceRequest, uncompressed), for `contprof report` and protoc.
    # After each periodic flush, the directory's profile files are kept within
    # output_retention and output_max_bytes (enforce_retention).
    class File
      MODE = 0o644
      # Bytes of the service's name kept in file names: a file name has at most 255 bytes,
      # and a longer service (a setting of any length) would fail every write.
      SERVICE_BYTES = 100
      # The files retention may delete: those this exporter names (any service and process),
      # never another program's files, nor one still being written (a hidden temporary).
      PROFILE_FILE = /\A[A-Za-z0-9_.-]+-\d+-\d{8}T\d{6}\.\d{6}Z\.(?:pprof|otlp)\z/.freeze

      attr_reader :directory

      # This exporter for `settings`, or nil when they name no output directory.
      def self.from_settings(settings)
        settings.output && new(settings.output, otlp: settings.output_otlp?, retention: settings.output_retention,
                                                max_bytes: settings.output_max_bytes)
      end

      # otlp: also write the .otlp file. retention (seconds) and max_bytes: the directory's
      # limits (nil: none), as Settings defaults them.
      def initialize(directory, otlp: false, retention: Settings.default(:output_retention),
                     max_bytes: Settings.default(:output_max_bytes))
        @directory = self.class.absolute(directory)
        @otlp = otlp
        @retention = retention
        @max_bytes = max_bytes
      end

      # `directory` made absolute (an application that changes directory later still writes
      # where it asked at start), ~ expanded. Under a current directory that was removed it
      # stays as given: its writes fail and are logged, the application runs on. A ~user
      # that does not exist is a wrong setting.
      def self.absolute(directory)
        ::File.expand_path(directory)
      rescue ArgumentError => e
        raise ArgumentError, "setting output (CONTPROF_OUTPUT) accepts a directory path (String); got " \
                             "#{directory.inspect} (#{e.message})"
      rescue SystemCallError
        directory
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
      # /proc/self, would otherwise be retried forever). Failures raise SystemCallError
      # (Errno::ENOSPC, Errno::EACCES...) naming what was done to which path.
      # timeout: not used (writing is local). Returns the file's path; with output_otlp,
      # [the .pprof's path, the .otlp's path] (the .pprof is written first: without an OTLP
      # encoding in the profile, it is there and the error is raised after).
      def export(profile, timeout: nil) # rubocop:disable Lint/UnusedMethodArgument -- every exporter's signature
        service = profile.tags.fetch("service", "ruby").to_s.b.gsub(/[^A-Za-z0-9_.-]/n, "_")[0, SERVICE_BYTES]
        stamp = profile.start.utc.strftime("%Y%m%dT%H%M%S.%6NZ")
        path = ::File.join(@directory, "#{service}-#{profile.tags.fetch("process_id")}-#{stamp}.pprof")
        write(path, profile.pprof)
        return path unless @otlp
        raise Error, "no OTLP encoding in this profile: #{::File.basename(path, ".pprof")}.otlp not written" unless profile.otlp

        otlp_path = path.sub(/\.pprof\z/, ".otlp")
        write(otlp_path, Otlp.encoded(profile.otlp, gzip: false))
        [path, otlp_path]
      end

      # At start: the directory is made now, while the program runs, not at its exit, when
      # every call that waits (mkdir, stat) hands the GVL to each busy thread in turn (a
      # time slice each: 40 busy threads made the last profile of a process take 8 s more).
      # A failure here is not raised: the first export meets it, and says it.
      def prepare
        make_directory
        @directory_made = true
      rescue SystemCallError
        @directory_made = false
      end

      # Deletes the directory's profile files (PROFILE_FILE, whichever process wrote them)
      # older than the retention (by modification time), then the oldest until the rest fit
      # in max_bytes; never one of `keep` (the files just written). A file another process
      # deleted meanwhile is skipped. Returns [files deleted, their bytes]. Raises
      # SystemCallError when the directory cannot be read or a file cannot be deleted.
      # Called after periodic flushes, not the last one at exit (see Profiler#flush).
      def enforce_retention(keep = [])
        return [0, 0] unless @retention || @max_bytes

        kept = keep.map { |path| ::File.basename(path) }
        files = Native.profile_files(@directory).select { |name, _, _| PROFILE_FILE.match?(name) && !kept.include?(name) }
        total = files.sum { |_, _, size| size } + keep.sum { |path| ::File.size?(path).to_i }
        cutoff = @retention && Process.clock_gettime(Process::CLOCK_REALTIME, :nanosecond) - @retention * 1_000_000_000
        # (Mostly nothing is due: then no sorting, the longest step on a big directory.)
        return [0, 0] if (@max_bytes.nil? || total <= @max_bytes) && (cutoff.nil? || files.none? { |_, mtime, _| mtime < cutoff })

        files.sort_by! { |_, mtime, _| mtime }
        doomed = cutoff ? files.take_while { |_, mtime, _| mtime < cutoff } : []
        total -= doomed.sum { |_, _, size| size }
        if @max_bytes
          files.drop(doomed.size).each do |file|
            break if total <= @max_bytes

            doomed << file
            total -= file[2]
          end
        end
        deleted = doomed.select { |name, _, _| delete(name) }
        [deleted.size, deleted.sum { |_, _, size| size }]
      end

      private

      def delete(name)
        ::File.unlink(::File.join(@directory, name))
        true
      rescue Errno::ENOENT
        false # (another process's flush deleted it first)
      end

      def write(path, bytes)
        within_file_size_limit(path, bytes)
        temporary = ::File.join(@directory, ".#{::File.basename(path)}.#{Random.urandom(6).unpack1("H*")}.tmp")
        made_again = false
        begin
          make_directory unless @directory_made
          @directory_made = true
          begin
            Native.write_file_atomically(temporary, path, bytes, MODE)
          rescue SystemCallError => e
            # (The native error names the temporary file when it could not be created.)
            raise SystemCallError.new("writing #{path}", e.errno), cause: nil
          end
        rescue Errno::ENOENT
          raise if made_again

          made_again = true
          @directory_made = false
          retry
        end
      end

      def for_output(directory)
        directory == @directory ? "" : " (making the output directory #{@directory})"
      end

      # A file size limit (`ulimit -f`) below the file's size: the kernel would stop the
      # write at the limit and send SIGXFSZ, whose default action (Ruby keeps it) kills the
      # process. Refused before writing instead.
      def within_file_size_limit(path, bytes)
        return unless defined?(Process::RLIMIT_FSIZE)

        limit = Process.getrlimit(Process::RLIMIT_FSIZE).first
        return if limit == Process::RLIM_INFINITY || bytes.bytesize <= limit

        raise Errno::EFBIG, "writing #{path}: #{bytes.bytesize} bytes, over this process's file size limit " \
                            "(#{limit} bytes, ulimit -f)"
      end

      # mkdir -p: the missing directories, from the deepest one that exists down. Each is
      # tried once: an error is raised as it is, whatever the parent (procfs answers ENOENT
      # under a directory that exists, as does a parent removed meanwhile). (Not
      # FileUtils.mkdir_p: loading fileutils, a default gem, costs about 10 ms of CPU, most
      # of Contprof's cost in a short process; see bench/startup.rb.)
      def make_directory
        missing = []
        path = @directory
        until ::File.directory?(path)
          missing << path
          parent = ::File.dirname(path)
          break if parent == path

          path = parent
        end
        missing.reverse_each do |directory|
          Dir.mkdir(directory)
        rescue Errno::EEXIST
          next if ::File.directory?(directory) # made meanwhile, by another process

          raise Errno::ENOTDIR, "mkdir #{directory}: something that is not a directory is there#{for_output(directory)}"
        rescue SystemCallError => e
          raise SystemCallError.new("mkdir #{directory}#{for_output(directory)}", e.errno), cause: nil
        end
      end
    end
  end
end
