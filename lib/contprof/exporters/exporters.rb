# frozen_string_literal: true

module Contprof
  # Where profiles go. Every exporter answers:
  #
  #   Exporter.from_settings(settings)  # the exporter these settings ask for, or nil
  #   exporter.name                     # for logs and statistics ("file", "pyroscope"...)
  #   exporter.local?                   # writes here (files) rather than uploading
  #   exporter.minimum_duration         # seconds: shorter profiles are not exported
  #   exporter.export(profile, timeout:) # one profile (an ExportedProfile); raises on failure
  #
  # and keeps credentials out of #inspect. An exporter that needs the profile's OTLP
  # encoding (profile.otlp) also answers `otlp_encoding`: :gzip or :plain (nil: not
  # needed). The profiler (lib/contprof/runtime/profiler.rb) decides when to export and
  # what a failure costs (nothing to the application).
  module Exporters
    # Each exporter, and whether `settings` ask for it: checked before the exporter's file
    # is loaded (the uploaders and what they need load only when configured).
    KINDS = [
      [:File, ->(settings) { settings.output }],
      [:Datadog, ->(settings) { settings.agentless? || settings.agent_url }],
      [:Pyroscope, ->(settings) { settings.pyroscope_url }],
      [:Otlp, ->(settings) { settings.otlp_endpoint }],
    ].freeze

    # What every upload shares (included by the uploaders).
    module Upload
      def local?
        false
      end

      # Profiles shorter than this are not uploaded (too short to be useful).
      def minimum_duration
        1.0
      end
    end

    # The exporters `settings` ask for.
    def self.for(settings)
      KINDS.filter_map { |name, wanted| const_get(name).from_settings(settings) if wanted.call(settings) }
    end
  end
end
