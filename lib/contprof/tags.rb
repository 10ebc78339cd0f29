# frozen_string_literal: true

require "securerandom"
require "socket"

module Contprof
  # The tags every exported profile carries (the set Datadog's Ruby profiler sends),
  # plus the user's. Built-in tags win over user tags of the same name.
  module Tags
    class << self
      # A UUID identifying this process's profiling session; new after fork.
      def runtime_id
        @runtime_id = nil if @runtime_id_pid != Process.pid
        @runtime_id_pid = Process.pid
        @runtime_id ||= SecureRandom.uuid
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

      private

      def hostname
        @hostname ||= Socket.gethostname
      rescue SystemCallError
        "unknown"
      end
    end
  end
end
