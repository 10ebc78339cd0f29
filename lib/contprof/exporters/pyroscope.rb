# frozen_string_literal: true

require "json"
require "uri"
require_relative "../configuration/settings"
require_relative "exporters"
require_relative "pprof_select"

module Contprof
  module Exporters
    # Uploads to a Grafana Pyroscope server: POST /ingest with a pprof as a multipart body
    # (no `format` parameter), the name carrying the tags, from/until in nanoseconds.
    #
    # Pyroscope names each series <name>:<sample type>:<unit>:<period type>:<period unit>,
    # <name> being one value for the whole upload ("wall" when a sample type is called
    # exactly wall, "process_cpu" when one contains "cpu"). So each profile goes as two
    # uploads, derived from ours by PprofSelect: CPU (samples/count and cpu/nanoseconds,
    # period cpu/nanoseconds), landing in the standard process_cpu types that Go's, Java's
    # and Ruby's agents fill, and wall (wall/nanoseconds, period wall/nanoseconds), landing
    # in the standard wall type. With allocation profiling, a third: memory
    # (alloc_objects/count and alloc_space/bytes, with heap profiling also inuse_objects/count
    # and inuse_space/bytes; period space/bytes), the names Go's heap profiles use, which the
    # server files under its standard memory type.
    class Pyroscope
      include Upload

      # Tags sent as Pyroscope labels (the rest, per process, would explode its series).
      LABELS = %w[env version host].freeze
      # The labels Contprof itself puts on samples of a unit of work, sent under their own
      # names: Pyroscope's Ruby gem names only Rails actions (`action`, "controller/action")
      # and nothing of background jobs, so `endpoint` (Contprof::Rack) and `job`
      # (Contprof::Jobs) are ours. The server keeps a series label over a sample label of
      # the same name (grafana/pyroscope, pprofsplit), so a tag of either name would fold
      # every endpoint's or job's samples into the tag's one value: said once, at start.
      SAMPLE_LABELS = %w[endpoint job].freeze

      # Not one of the spy names the server knows: "rbspy" would make it prefix every
      # function name with its file name (its fix for rbspy's frames), which ours do not
      # need. It finds the language (ruby) from the file names all the same.
      SPY_NAME = "contprof"

      Upload = Struct.new(:name, :view, :sample_type_config, keyword_init: true)

      # Hints only (the server reads no more than `display-name`, which we leave out: it
      # would take part in naming the series).
      def self.hint(units)
        { "units" => units, "aggregation" => "sum", "cumulative" => false, "sampled" => false }
      end

      def self.uploads(period, allocation: false, heap: false)
        keep = [%w[alloc-samples alloc_objects count], %w[alloc-size alloc_space bytes]]
        keep += [%w[heap-live-samples inuse_objects count], %w[heap-live-size inuse_space bytes]] if heap
        memory = Upload.new(name: "memory", view: { keep: keep, period_type: %w[space bytes], period: 1 },
                            sample_type_config: keep.to_h { |_, type, unit| [type, hint(unit == "count" ? "objects" : unit)] })
        [
          Upload.new(name: "cpu",
                     view: { keep: [%w[cpu-samples samples count], %w[cpu-time cpu nanoseconds]],
                             period_type: %w[cpu nanoseconds], period: period },
                     sample_type_config: { "samples" => hint("samples"), "cpu" => hint("nanoseconds") }),
          Upload.new(name: "wall",
                     view: { keep: [%w[wall-time wall nanoseconds]], period_type: %w[wall nanoseconds], period: period },
                     sample_type_config: { "wall" => hint("nanoseconds") }),
          (memory if allocation),
        ].compact
      end

      # Without the credentials (of the URL or the settings).
      def inspect
        "#<#{self.class.name} url=#{HttpTransport.display_url(@url).inspect} application=#{@application_name.inspect}>"
      end
      alias to_s inspect

      # period: nanoseconds between samples (the pprof's period). tenant_id: X-Scope-OrgID.
      # basic_auth: [user, password]; auth_token: a bearer token (one or the other, or
      # user:password@ in the url).
      def initialize(url:, application_name:, user_tags: {}, timeout: Settings.default(:upload_timeout),
                     period: (Settings.default(:interval) * 1e9).round, tenant_id: nil,
                     basic_auth: nil, auth_token: nil, allocation: false, heap: false)
        @url = url
        @application_name = application_name
        @user_tags = user_tags
        @timeout = timeout
        @uploads = self.class.uploads(period, allocation: allocation, heap: heap)
        @headers = []
        @headers << ["X-Scope-OrgID", tenant_id] if tenant_id
        @headers << ["Authorization", "Basic #{[basic_auth.join(":")].pack("m0")}"] if basic_auth
        @headers << ["Authorization", "Bearer #{auth_token}"] if auth_token
        shadowed = labels_of(user_tags).keys & SAMPLE_LABELS
        return if shadowed.empty?

        Contprof.logger.warn("pyroscope: the tag(s) #{shadowed.join(", ")} hide the samples' label(s) of the same " \
                             "name (Pyroscope keeps the series label): rename the tag to tell endpoints or jobs apart")
      end

      # This exporter for `settings`, or nil when they name no Pyroscope server.
      def self.from_settings(settings)
        return unless settings.pyroscope_url

        basic_auth = settings.pyroscope_basic_auth_user &&
                     [settings.pyroscope_basic_auth_user, settings.pyroscope_basic_auth_password]
        new(url: settings.pyroscope_url, application_name: settings.pyroscope_application_name || settings.service,
            user_tags: settings.tags, timeout: settings.upload_timeout, period: (settings.interval * 1e9).round,
            tenant_id: settings.pyroscope_tenant_id, basic_auth: basic_auth, auth_token: settings.pyroscope_auth_token,
            allocation: settings.allocation?,
            heap: settings.allocation? && settings.heap? && Collectors::Allocations.heap_supported?)
      end

      def name
        "pyroscope"
      end

      # The pprof with its timeline merged, from the recorder (see Profiler#serialize): a
      # timestamp label would make each sample a series of its own.
      def serialize_extras
        { merged_timeline: true }
      end

      # timeout: seconds for both uploads together (default: the exporter's). Returns the
      # last status; raises the first error after trying both.
      def export(profile, timeout: @timeout)
        deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + timeout
        pprofs = PprofSelect.call(profile.extras&.dig(:merged_timeline) || profile.pprof, @uploads.map(&:view),
                                  label_names: :prometheus)
        errors = []
        status = nil
        @uploads.zip(pprofs).each do |upload, pprof|
          parts = [
            ["profile", pprof, "profile.pprof", "application/octet-stream"],
            ["sample_type_config", JSON.generate(upload.sample_type_config), "sample_type_config.json",
             "application/json"],
          ]
          left = [deadline - Process.clock_gettime(Process::CLOCK_MONOTONIC), 0.1].max
          status = HttpTransport.post(ingest_url(profile), parts, headers: @headers, timeout: left,
                                      target: "#{HttpTransport.display_url("#{@url}/ingest")} (#{upload.name})")
        rescue HttpTransport::Error => e
          errors << e
        end
        raise errors.first if errors.any?

        status
      end

      # The request's headers (credentials included: not for logs).
      attr_reader :headers

      def ingest_url(profile)
        query = URI.encode_www_form(
          "name" => "#{@application_name}{#{labels(profile).map { |k, v| "#{k}=#{v}" }.join(",")}}",
          # Nanoseconds (19 digits): the server reads the unit from the number of digits.
          "from" => nanoseconds(profile.start),
          "until" => nanoseconds(profile.finish),
          "spyName" => SPY_NAME,
          "sampleRate" => 1_000_000_000 / @uploads.first.view[:period],
        )
        "#{@url}/ingest?#{query}"
      end

      def nanoseconds(time)
        time.to_i * 1_000_000_000 + time.nsec
      end

      def labels(profile)
        labels_of(@user_tags.merge(profile.tags.slice(*LABELS)))
      end

      private

      # Tags as the name's labels: names made valid, values without the name's delimiters.
      def labels_of(tags)
        tags.to_h do |key, value|
          [key.to_s.gsub(/[^A-Za-z0-9_]/, "_").sub(/\A(?=\d)/, "_"), value.to_s.delete("{},=")]
        end
      end
    end
  end
end
