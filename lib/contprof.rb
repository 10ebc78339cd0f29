# frozen_string_literal: true

# Contprof: a continuous CPU and wall-time profiler for MRI Ruby.
#
#   Contprof.start(service: "web", output: "/var/tmp/profiles")   # or CONTPROF_* variables
#   Contprof.profile(output: "tmp") { work }                       # profile one block
#
# Everything that samples, aggregates and encodes is in C (ext/contprof); the Ruby files
# under lib/contprof hold configuration, lifecycle, scheduling, exporters and the CLI.
require "logger"
require_relative "contprof/version"
require_relative "contprof/runtime/lifecycle"
require_relative "contprof/configuration/limits" # before the extension, which reads it

module Contprof
  # Raised for failures that are not caused by the caller's arguments.
  class Error < StandardError; end

  NATIVE_LOAD_ERROR =
    begin
      require "contprof/contprof_native"
      nil
    rescue LoadError => e
      e
    end
  private_constant :NATIVE_LOAD_ERROR


  class << self
    # true when this Ruby, machine and build can be profiled.
    def supported?
      unsupported_reason.nil?
    end

    # Why Contprof cannot profile here, or nil when it can.
    def unsupported_reason
      if NATIVE_LOAD_ERROR
        "Contprof's native extension is not available (#{NATIVE_LOAD_ERROR.message}); " \
          "it is built by `rake compile` from a checkout, or by `gem install` on Linux with MRI Ruby and a C compiler"
      elsif !RUBY_PLATFORM.include?("linux")
        "Contprof supports Linux only (this is #{RUBY_PLATFORM})"
      elsif RUBY_ENGINE != "ruby"
        "Contprof needs MRI Ruby (this is #{RUBY_ENGINE})"
      else
        Native.unsupported_reason
      end
    end

    # Contprof's own log (standard error by default; level from the log_level setting).
    def logger
      @logger ||= Logger.new($stderr, progname: "contprof", level: Logger::WARN)
    end

    attr_writer :logger

    # Starts continuous profiling with the given settings (see Contprof::Settings; each
    # also read from CONTPROF_<NAME>). Profiles are flushed every upload_period and once
    # more at Contprof.stop, which also runs at exit.
    def start(**settings)
      raise Error, "Contprof.start cannot run in a trap handler (start it before, or from a thread)" if Lifecycle.trap_context?

      profiler = Lifecycle::LOCK.synchronize do
        profiler = new_profiler(settings)
        profiler.start
      end
      register_at_exit
      profiler
    end

    # Stops profiling and flushes what is left. Returns the last profile, or nil. Waits
    # at most about upload_timeout for uploads. Also works in a trap handler (see
    # Lifecycle.locked).
    def stop
      Lifecycle.locked(Lifecycle::LOCK) { Profiler.running&.stop }
    end

    def running?
      defined?(Profiler) ? !Profiler.running.nil? : false # (no Profiler without the extension)
    end

    # Profiles the block. Returns the profile (a Contprof::ExportedProfile: #pprof,
    # #start, #finish, #decode, and #paths when written to `output`), exported to every
    # configured destination.
    #
    # Under continuous profiling (Contprof.start, `contprof exec`), the block's samples go
    # to both: the running profiler keeps them, and a copy makes the block's profile
    # (sampled with the running profiler's settings; the destinations are the block's).
    def profile(**settings, &block)
      raise Error, "Contprof.profile cannot run in a trap handler" if Lifecycle.trap_context?

      running = nil
      profiler = Lifecycle::LOCK.synchronize do
        running = Profiler.running
        if running
          Profiler.new(Settings.resolve(settings), logger: logger, recorder_only: true,
                                                  sample_types: running.recorder.sample_types)
        else
          new_profiler(settings).start(periodic: false)
        end
      end
      return running.profile_block_into(profiler, &block) if running

      begin
        yield
      ensure
        result = profiler.stop
      end
      result
    end

    private

    def new_profiler(keywords)
      settings = Settings.resolve(keywords)
      raise Error, "cannot profile: #{unsupported_reason}" unless supported?
      raise Error, "Contprof is already running (Contprof.stop first)" if running?

      logger.level = Logger.const_get(settings.log_level.upcase)
      Profiler.new(settings, logger: logger)
    end

    def register_at_exit
      return if @at_exit_registered

      @at_exit_registered = true
      at_exit { Lifecycle.stop_at_exit }
    end
  end
end

# Loaded when first used, so that `require "contprof"` costs little: what only reading
# profiles, or only a destination that is not configured, needs. (Exporters are built at
# start: what they need is loaded then, never in the middle of a flush.)
Contprof.autoload :Pprof, File.expand_path("contprof/pprof/reader", __dir__)
require_relative "contprof/configuration/settings"
if defined?(Contprof::Collectors::ThreadContext)
  # The profiler's own frames (Contprof.profile under a profiled block, the fork and exec
  # hooks, the at-exit stop) are left out of every profile.
  Contprof::Native.hide_frames_from(File.expand_path("contprof", __dir__), File.expand_path(__FILE__))
  require_relative "contprof/collectors/cpu_and_wall_time_worker"
  require_relative "contprof/collectors/allocations"
  require_relative "contprof/configuration/tags"
  require_relative "contprof/configuration/deploy_tags"
  require_relative "contprof/exporters/http_transport"
  require_relative "contprof/exporters/exporters"
  require_relative "contprof/exporters/file"
  module Contprof
    autoload :CodeProvenance, ::File.expand_path("contprof/exporters/code_provenance", __dir__)
    module Exporters
      autoload :Datadog, ::File.expand_path("contprof/exporters/datadog", __dir__)
      autoload :Pyroscope, ::File.expand_path("contprof/exporters/pyroscope", __dir__)
      autoload :Otlp, ::File.expand_path("contprof/exporters/otlp", __dir__)
    end
  end
  require_relative "contprof/runtime/profiler"
  require_relative "contprof/runtime/process_hooks"
end
require_relative "contprof/requests/rack"
require_relative "contprof/requests/jobs"
require_relative "contprof/requests/trace_context"
require_relative "contprof/requests/opentelemetry"
require_relative "contprof/requests/railtie" if defined?(::Rails::Railtie)
