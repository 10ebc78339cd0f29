# frozen_string_literal: true

# Contprof: a continuous CPU and wall-time profiler for MRI Ruby.
#
# This file loads the native extension and reports whether this Ruby can be profiled.
# Everything that samples, aggregates and encodes is in C (ext/contprof); the Ruby files
# under lib/contprof hold configuration, lifecycle, scheduling and the CLI.
require_relative "contprof/version"

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
  end
end
require_relative "contprof/pprof"
require_relative "contprof/collectors/cpu_and_wall_time_worker" if defined?(Contprof::Collectors::CpuAndWallTime)
