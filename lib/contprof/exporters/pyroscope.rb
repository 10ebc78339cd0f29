# frozen_string_literal: true

require "json"
require "uri"

module Contprof
  module Exporters
    # Uploads to a Grafana Pyroscope server: POST /ingest with the pprof as a multipart
    # body (no `format` parameter), the name carrying the tags, from/until in seconds
    # (see ../shared/docs/protocols.md §3).
    class Pyroscope
      # Tags sent as Pyroscope labels (the rest, per process, would explode its series).
      LABELS = %w[env version host].freeze

      SAMPLE_TYPE_CONFIG = {
        "cpu-time" => { "units" => "nanoseconds", "display-name" => "cpu_time", "aggregation" => "sum",
                        "cumulative" => false, "sampled" => false },
        "cpu-samples" => { "units" => "samples", "display-name" => "cpu_samples", "aggregation" => "sum",
                           "cumulative" => false, "sampled" => false },
        "wall-time" => { "units" => "nanoseconds", "display-name" => "wall_time", "aggregation" => "sum",
                         "cumulative" => false, "sampled" => false },
      }.freeze

      # Without the credentials of the URL (user:password@ is how Pyroscope authenticates).
      def inspect
        "#<#{self.class.name} url=#{HttpTransport.display_url(@url).inspect} application=#{@application_name.inspect}>"
      end
      alias to_s inspect

      def initialize(url:, application_name:, user_tags: {}, timeout: 10.0)
        @url = url
        @application_name = application_name
        @user_tags = user_tags
        @timeout = timeout
      end

      def name
        "pyroscope"
      end

      def minimum_duration
        1.0
      end

      # timeout: seconds for this upload (default: the exporter's).
      def export(profile, timeout: @timeout)
        url = ingest_url(profile)
        parts = [
          ["profile", profile.pprof, "profile.pprof", "application/octet-stream"],
          ["sample_type_config", JSON.generate(SAMPLE_TYPE_CONFIG), "sample_type_config.json", "application/json"],
        ]
        HttpTransport.post(url, parts, timeout: timeout, target: HttpTransport.display_url("#{@url}/ingest"))
      end

      def ingest_url(profile)
        query = URI.encode_www_form(
          "name" => "#{@application_name}{#{labels(profile).map { |k, v| "#{k}=#{v}" }.join(",")}}",
          "from" => profile.start.to_i,
          "until" => profile.finish.to_i,
          "spyName" => "contprof",
          "sampleRate" => 100,
        )
        "#{@url}/ingest?#{query}"
      end

      def labels(profile)
        tags = @user_tags.merge(profile.tags.slice(*LABELS))
        tags.to_h do |key, value|
          [key.gsub(/[^A-Za-z0-9_]/, "_").sub(/\A(?=\d)/, "_"), value.to_s.delete("{},=")]
        end
      end
    end
  end
end
