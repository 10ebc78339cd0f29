# frozen_string_literal: true

# `require "contprof/auto"` (e.g. RUBYOPT="-rcontprof/auto") starts profiling with the
# settings of the CONTPROF_* environment variables. A configuration error or an
# unsupported platform is logged and profiling does not start: the application runs on.
require "contprof"

begin
  Contprof.start
rescue ArgumentError, Contprof::Error => e
  Contprof.logger.error("not profiling: #{e.message}")
end
