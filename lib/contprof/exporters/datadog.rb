# frozen_string_literal: true

require "zlib"

module Contprof
  module Exporters
    # Uploads to Datadog: to an agent (http://host:port or unix:///path), or straight to the
    # intake with an API key (agentless). Multipart protocol version 3 (see
    # ../shared/docs/protocols.md §2), with code-provenance.json.
    class Datadog
      AGENT_PATH = "/profiling/v1/input"

      attr_reader :url, :unix_socket

      # intake_url replaces the agentless intake's address (a proxy, or a test server).
      def initialize(agent_url: nil, site: nil, api_key: nil, timeout: 10.0, intake_url: nil)
        @timeout = timeout
        @api_key = api_key
        if api_key
          @url = intake_url || "https://intake.profile.#{site}/v1/input"
          @unix_socket = nil
        elsif agent_url.start_with?("unix://")
          @url = "http://localhost#{AGENT_PATH}"
          @unix_socket = agent_url.delete_prefix("unix://")
        else
          @url = "#{agent_url}#{AGENT_PATH}"
          @unix_socket = nil
        end
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

      # Profiles shorter than this are not uploaded (too short to be useful).
      def minimum_duration
        1.0
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
        list = []
        list << ["DD-API-KEY", @api_key] if @api_key
        container_id = self.class.container_id
        list << ["Datadog-Container-ID", container_id] if container_id
        list
      end

      def parts(profile)
        [
          ["version", "3", nil, nil],
          ["family", "ruby", nil, nil],
          ["start", self.class.rfc3339(profile.start), nil, nil],
          ["end", self.class.rfc3339(profile.finish), nil, nil],
          *profile.tags.map { |key, value| ["tags[]", "#{key}:#{value}", nil, nil] },
          ["data[rubyprofile.pprof]", profile.pprof, "rubyprofile.pprof", "application/octet-stream"],
          ["data[code-provenance.json]", Zlib.gzip(CodeProvenance.json), "code-provenance.json",
           "application/octet-stream"],
        ]
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
