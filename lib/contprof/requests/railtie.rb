# frozen_string_literal: true

require_relative "rack"

module Contprof
  # Inserts Contprof::Rack first in a Rails app's middleware when profiling is on as the
  # app boots (started by `contprof exec`, CONTPROF_* with contprof/auto, or an initializer),
  # unless the rack setting is false.
  class Railtie < ::Rails::Railtie
    initializer "contprof.rack", before: :build_middleware_stack do |app|
      app.middleware.insert(0, Contprof::Rack) if Contprof.running? && Profiler.running.settings.rack?
    end
  end
end
