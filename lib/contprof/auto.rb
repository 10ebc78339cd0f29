# frozen_string_literal: true

# `require "contprof/auto"` (e.g. RUBYOPT="-rcontprof/auto") starts profiling with the
# settings of the CONTPROF_* environment variables (without a destination, into
# ./contprof-profiles, as `contprof exec` does, and says so once). A configuration error or an
# unsupported platform is logged and profiling does not start: the application runs on.
require "contprof"

begin
  if Contprof::Settings.destination?
    Contprof.start
  else
    Contprof.start(output: Contprof::Settings::DEFAULT_OUTPUT)
    # (Said once started: a configuration error is said instead.)
    Contprof.logger.warn("no destination set (CONTPROF_OUTPUT, CONTPROF_AGENT_URL, CONTPROF_API_KEY, " \
                         "CONTPROF_PYROSCOPE_URL, CONTPROF_OTLP_URL or OTEL_EXPORTER_OTLP_ENDPOINT): writing " \
                         "profiles to ./#{Contprof::Settings::DEFAULT_OUTPUT}")
  end
rescue StandardError, ScriptError => e # whatever fails at start, the application runs on
  Contprof.logger.error("not profiling: #{e.message}")
end
Contprof::Rack::Frameworks.railtie_when_rails_loads if Contprof.running?
Contprof::Jobs.install_when_loaded if Contprof.running?
