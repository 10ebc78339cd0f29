# frozen_string_literal: true

require "etc"
require "json"
require "zlib"
require_relative "../configuration/settings"
require_relative "exporters"
require_relative "code_provenance" # loaded with the exporter: never in the middle of a flush
require_relative "datadog_states"

module Contprof
  module Exporters
    # Uploads to Datadog: to an agent (http://host:port or unix:///path), or straight to the
    # intake with an API key (agentless). Intake version 4, as Datadog's current clients
    # send it: a JSON `event` part naming the attachments, then the attachments as parts
    # named after themselves (see the README, "Where profiles go", for every field).
    class Datadog
      include Upload

      AGENT_PATH = "/profiling/v1/input"
      AGENTLESS_PATH = "/api/v2/profile"
      # DD-EVP-ORIGIN names the client library (Datadog's own say dd-trace-rb, dd-trace-go):
      # ours, not one we are not.
      ORIGIN = "contprof"
      PPROF_NAME = "profile.pprof"
      CODE_PROVENANCE_NAME = "code-provenance.json"

      attr_reader :url, :unix_socket

      # With agent_url, uploads through that agent (the API key, if any, is not sent: the
      # agent adds its own); without, straight to the intake of `site` with `api_key`.
      # intake_url replaces the agentless intake's address (a proxy, or a test server).
      # info and internal: the event's objects of those names (see .info).
      def initialize(agent_url: nil, site: nil, api_key: nil, timeout: Settings.default(:upload_timeout), intake_url: nil, info: {}, internal: {})
        raise ArgumentError, "Datadog exporter: agent_url or api_key is needed" unless agent_url || api_key

        @timeout = timeout
        @info = info
        @internal = internal
        @api_key = agent_url ? nil : api_key
        if @api_key
          @url = intake_url || "https://intake.profile.#{site}#{AGENTLESS_PATH}"
          @unix_socket = nil
        elsif agent_url.start_with?("unix://")
          @url = "http://localhost#{AGENT_PATH}"
          @unix_socket = agent_url.delete_prefix("unix://")
        else
          @url = "#{agent_url}#{AGENT_PATH}"
          @unix_socket = nil
        end
      end

      # This exporter for `settings`, or nil when they name neither an agent nor agentless
      # uploads. (Settings refuse an api_key that would go nowhere; with an agent it is not
      # sent.)
      def self.from_settings(settings)
        return unless settings.agentless? || settings.agent_url

        new(agent_url: settings.agentless? ? nil : settings.agent_url, site: settings.site,
            api_key: settings.agentless? ? settings.api_key : nil, timeout: settings.upload_timeout,
            info: info(settings), internal: internal(settings))
      end

      # The labels Datadog reads on a background job's samples (see Contprof::Jobs): its
      # profiler puts the root span's resource in `trace endpoint` for a worker's span as for
      # a web request's, and its Sidekiq and ActiveJob integrations make that resource the
      # job's class, the name Jobs gives. (Without the tracer, the label is ours to set.)
      def self.job_labels(name)
        { Rack::DATADOG_ENDPOINT_KEY => name }
      end

      def name
        @api_key ? "datadog-agentless" : "datadog-agent"
      end

      # Without the API key (Profiler#inspect, pp and error reports show exporters).
      def inspect
        url = HttpTransport.display_url(@url)
        "#<#{self.class.name} #{name} url=#{url.inspect}#{" unix_socket=#{@unix_socket.inspect}" if @unix_socket}>"
      end
      alias to_s inspect

      # The pprof with Datadog's thread states, from the recorder (see Profiler#serialize).
      def serialize_extras
        { relabel: DatadogStates::RELABEL }
      end

      # timeout: seconds for this upload (default: the exporter's).
      def export(profile, timeout: @timeout)
        target = HttpTransport.display_url(@url)
        target = "#{target} (via #{@unix_socket})" if @unix_socket
        HttpTransport.post(@url, parts(profile), headers: headers, unix_socket: @unix_socket, timeout: timeout,
                           target: target)
      rescue HttpTransport::Error
        problem = @unix_socket && self.class.socket_problem(@unix_socket)
        raise unless problem

        # libcurl says "Failed to connect to localhost port 80" for a socket it cannot use.
        raise HttpTransport::Error, "POST #{HttpTransport.display_url(@url)} via unix://#{@unix_socket}: #{problem}", cause: nil
      end

      def headers
        list = [["DD-EVP-ORIGIN", ORIGIN], ["DD-EVP-ORIGIN-VERSION", Contprof::VERSION]]
        list << ["DD-API-KEY", @api_key] if @api_key
        container_id = self.class.container_id
        list << ["Datadog-Container-ID", container_id] if container_id
        entity_id = self.class.entity_id
        list << ["Datadog-Entity-ID", entity_id] if entity_id
        list
      end

      # The intake reads the attachments as raw bytes and recognises their compression by
      # its magic bytes: both go gzip-compressed (as dd-trace-go's do).
      def parts(profile)
        [
          ["event", JSON.generate(event(profile)), "event.json", "application/json"],
          [CODE_PROVENANCE_NAME, Zlib.gzip(CodeProvenance.json), CODE_PROVENANCE_NAME, "application/octet-stream"],
          [PPROF_NAME, profile.extras&.dig(:relabeled) || DatadogStates.call(profile.pprof), PPROF_NAME,
           "application/octet-stream"],
        ]
      end

      def event(profile)
        {
          "attachments" => [CODE_PROVENANCE_NAME, PPROF_NAME],
          "tags_profiler" => profile.tags.map { |key, value| "#{key}:#{value}" }.join(","),
          "start" => self.class.rfc3339(profile.start),
          "end" => self.class.rfc3339(profile.finish),
          "family" => "ruby",
          "version" => "4",
          # Endpoint name => requests served (Contprof::Rack), as the `trace endpoint` labels name them.
          "endpoint_counts" => profile.endpoint_counts.nil? || profile.endpoint_counts.empty? ? nil : profile.endpoint_counts,
          "process_tags" => nil,
          "internal" => @internal,
          "info" => @info,
        }
      end

      class << self
        # Why the agent's socket at `path` cannot be connected to, or nil when it looks usable
        # (the failure was elsewhere).
        def socket_problem(path)
          require "socket" # only on this error path
          stat = ::File.stat(path)
          return "#{path} is a #{stat.ftype == "file" ? "regular file" : stat.ftype}, not a socket" unless stat.socket?

          UNIXSocket.new(path).close
          nil
        rescue Errno::ENOENT
          "no socket at #{path} (is the agent running, and is this its socket path?)"
        rescue Errno::ECONNREFUSED
          "nothing listens on the socket #{path} (is the agent running?)"
        rescue SystemCallError => e
          "cannot use the socket #{path}: #{e.message}"
        end

        # RFC 3339, UTC, exactly 9 fractional digits.
        def rfc3339(time)
          time.utc.strftime("%Y-%m-%dT%H:%M:%S.%9NZ")
        end

        # The event's `info` object: what the Datadog profile page shows about the process.
        def info(settings)
          uname = Etc.respond_to?(:uname) ? Etc.uname : {}
          {
            "platform" => {
              "container_id" => container_id, "hostname" => Tags.build(settings)["host"],
              "kernel_name" => uname[:sysname], "kernel_release" => uname[:release], "kernel_version" => uname[:version]
            },
            "runtime" => { "engine" => RUBY_ENGINE, "version" => RUBY_ENGINE_VERSION, "platform" => RUBY_PLATFORM },
            "application" => { "start_time" => Time.now.utc.strftime("%Y-%m-%dT%H:%M:%SZ"), "env" => settings.env, "service" => settings.service,
                               "version" => settings.version },
            "profiler" => {
              "version" => Contprof::VERSION,
              # Only the settings that shape the profiles: no destination, nothing secret.
              "settings" => settings.to_h.slice(:interval, :max_frames, :upload_period, :overhead_target, :signals,
                                                :cpu_timers).transform_keys(&:to_s),
            },
          }
        end

        # The event's `internal` object (dd-trace-rb's name for the same switch).
        def internal(settings)
          { "no_signals_workaround_enabled" => !settings.signals? }
        end

        # Datadog-Entity-ID: "ci-<container id>", else "in-<inode of this process's cgroup>"
        # (cgroup v2), else nil; the agent resolves either to the container's tags.
        def entity_id
          return "ci-#{container_id}" if container_id
          return @cgroup_entity_id if defined?(@cgroup_entity_id)

          @cgroup_entity_id = begin
            path = ::File.foreach("/proc/self/cgroup").map { |line| line.chomp[/\A0::(.*)\z/, 1] }.compact.first
            path && "in-#{::File.stat(::File.join("/sys/fs/cgroup", path)).ino}"
          rescue SystemCallError
            nil
          end
        end

        # The container this process runs in, from /proc/self/cgroup, or nil.
        def container_id
          return @container_id if defined?(@container_id)

          @container_id = begin
            ::File.foreach("/proc/self/cgroup").lazy.map do |line|
              line[%r{[/-]([0-9a-f]{64})(?:\.scope)?$}, 1] ||
                line[/([0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12})/, 1]
            end.find(&:itself)
          rescue SystemCallError
            nil
          end
        end
      end
    end
  end
end
