# frozen_string_literal: true

module Contprof
  # The tags every exported profile carries (the set Datadog's Ruby profiler sends),
  # plus the user's. Built-in tags win over user tags of the same name.
  module Tags
    class << self
      # A UUID identifying this process's profiling session; new after fork.
      def runtime_id
        @runtime_id = nil if @runtime_id_pid != Process.pid
        @runtime_id_pid = Process.pid
        @runtime_id ||= uuid
      end

      def build(settings)
        builtin = {
          "host" => hostname,
          "language" => "ruby",
          "process_id" => Process.pid.to_s,
          "profiler_version" => Contprof::VERSION,
          "runtime" => "ruby",
          "runtime_engine" => RUBY_ENGINE,
          "runtime-id" => runtime_id,
          "runtime_platform" => RUBY_PLATFORM,
          "runtime_version" => RUBY_VERSION,
          "service" => settings.service,
          "env" => settings.env,
          "version" => settings.version,
        }.compact
        settings.tags.merge(builtin)
      end

      # Reads now what the tags need from the system (the host name), so that building
      # them later never waits: at exit, a wait hands the GVL to every busy thread in turn.
      def prepare
        hostname
      end

      private

      # A random (version 4) UUID. (SecureRandom.uuid, without loading securerandom for it.)
      def uuid
        bytes = Random.urandom(16).bytes
        bytes[6] = (bytes[6] & 0x0f) | 0x40
        bytes[8] = (bytes[8] & 0x3f) | 0x80
        hex = bytes.pack("C*").unpack1("H*")
        [hex[0, 8], hex[8, 4], hex[12, 4], hex[16, 4], hex[20, 12]].join("-")
      end

      # Linux's node name (what gethostname returns), without loading socket for it.
      def hostname
        @hostname ||= File.read("/proc/sys/kernel/hostname").strip
      rescue SystemCallError
        "unknown"
      end
    end
  end
end
