# frozen_string_literal: true

require "zlib"
require_relative "../configuration/settings"
require_relative "exporters"

module Contprof
  module Exporters
    # Uploads to an OpenTelemetry Protocol endpoint over HTTP (an OpenTelemetry Collector,
    # or any backend taking OTLP profiles): POST <endpoint> with an
    # ExportProfilesServiceRequest (opentelemetry.proto.collector.profiles.v1development)
    # as its body, application/x-protobuf, gzip-compressed unless otlp_compression is none.
    #
    # The request is encoded in C by the recorder, from the same samples as the pprof
    # (StackRecorder#serialize with `otlp:`), with the resource Resource builds; the
    # profiler asks for it only when an exporter answers #otlp_encoding.
    class Otlp
      include Upload

      CONTENT_TYPE = "application/x-protobuf"
      # The instrumentation scope of every profile: the profiler that made it.
      SCOPE_NAME = "contprof"
      GZIP_MAGIC = "\x1f\x8b".b.freeze

      # The resource of the profiles (who sends them), in the semantic conventions' names.
      # Built once at start; #attributes is called at each serialize, so that a forked
      # child sends its own pid and instance id.
      class Resource
        def initialize(settings)
          host = Tags.build(settings)["host"]
          # Lowest precedence first: what is detected, then OTEL_RESOURCE_ATTRIBUTES, the
          # tags setting, what Contprof knows for certain, and the service settings (which
          # already fell back on OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES).
          @detected = { "host.name" => host }.freeze
          @configured = settings.otlp_resource_attributes.merge(settings.tags).freeze
          @known = {
            "process.runtime.name" => RUBY_ENGINE,
            "process.runtime.version" => RUBY_VERSION,
            "process.runtime.description" => RUBY_DESCRIPTION,
            "telemetry.sdk.name" => SCOPE_NAME,
            "telemetry.sdk.language" => "ruby",
            "telemetry.sdk.version" => Contprof::VERSION,
          }.freeze
          @service = { "service.name" => settings.service, "service.version" => settings.version,
                       "deployment.environment.name" => settings.env }.compact.freeze
        end

        # [[key, String or Integer value], ...] for StackRecorder#serialize.
        def attributes
          # service.instance.id: Tags' runtime-id, a UUID new in each process (and after fork).
          instance = { "service.instance.id" => Tags.runtime_id }
          process = { "process.pid" => Process.pid }
          @detected.merge(instance, @configured, @known, process, @service).to_a
        end
      end

      class << self
        # This exporter for `settings`, or nil when they name no OTLP endpoint.
        def from_settings(settings)
          return unless settings.otlp_endpoint

          new(endpoint: settings.otlp_endpoint, headers: settings.otlp_headers, compression: settings.otlp_compression,
              timeout: [settings.otlp_timeout, settings.upload_timeout].min)
        end

        # The `otlp:` options of StackRecorder#serialize: `resource` (a Resource), gzip or not.
        def serialize_options(resource, gzip:)
          { resource: resource.attributes, scope_name: SCOPE_NAME, scope_version: Contprof::VERSION, gzip: gzip }
        end

        # `bytes` (an ExportProfilesServiceRequest, gzip-compressed or not: the recorder
        # compresses it when every exporter wants it so) as asked. A gzip stream is told by
        # its magic bytes: no protobuf message starts with them (0x1f would be field 3 of
        # wire type 7, which does not exist).
        def encoded(bytes, gzip:)
          compressed = bytes.start_with?(GZIP_MAGIC)
          return bytes if compressed == gzip

          gzip ? Zlib.gzip(bytes) : Zlib.gunzip(bytes)
        end
      end

      # endpoint: the URL posted to; sent_bytes: the size of the last request's body (for the log).
      attr_reader :endpoint, :sent_bytes

      # endpoint: the URL posted to (the signal's, path included). headers: {name => value},
      # credentials among them. compression: "gzip" or "none". timeout: seconds, the most
      # an upload may take (the profiler may give less).
      def initialize(endpoint:, headers: {}, compression: Settings.default(:otlp_compression),
                     timeout: Settings.default(:upload_timeout))
        @endpoint = endpoint
        @headers = headers.to_a
        @gzip = compression == "gzip"
        @timeout = timeout
      end

      def name
        "otlp"
      end

      # The OTLP encoding this exporter needs from the recorder.
      def otlp_encoding
        @gzip ? :gzip : :plain
      end

      # Without credentials: the URL's user:password@ and the headers' values.
      def inspect
        "#<#{self.class.name} url=#{HttpTransport.display_url(@endpoint).inspect} " \
          "compression=#{@gzip ? "gzip" : "none"} headers=#{@headers.map(&:first).inspect}>"
      end
      alias to_s inspect

      # The request's headers (credentials included: not for logs).
      def headers
        [["Content-Type", CONTENT_TYPE], *(@gzip ? [["Content-Encoding", "gzip"]] : []), *@headers]
      end

      # timeout: seconds for this upload, at most the exporter's own. Returns the status;
      # raises HttpTransport::Error on failure.
      def export(profile, timeout: @timeout)
        raise Error, "no OTLP encoding in this profile (StackRecorder#serialize was not asked for it)" unless profile.otlp

        body = self.class.encoded(profile.otlp, gzip: @gzip)
        @sent_bytes = body.bytesize
        HttpTransport.post(@endpoint, body, headers: headers, timeout: [timeout, @timeout].min,
                                            target: HttpTransport.display_url(@endpoint))
      end
    end
  end
end
