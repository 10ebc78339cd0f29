# frozen_string_literal: true

require_relative "limits"
require_relative "otlp_environment"

module Contprof
  # Every setting of Contprof.start, Contprof.profile and `contprof exec`: a keyword, or the
  # environment variable CONTPROF_<NAME> (a keyword wins), or, for some, OpenTelemetry's
  # standard variables (see OtlpEnvironment). Invalid values raise ArgumentError naming the
  # setting and what it accepts; unknown keywords too.
  class Settings
    # `secret`: the value is never shown, not even in the error for a wrong one.
    Definition = Struct.new(:name, :default, :accepts, :description, :parser, :secret, keyword_init: true) do
      def env_var
        "CONTPROF_#{name.to_s.upcase}"
      end
    end

    LOG_LEVELS = %w[debug info warn error fatal].freeze
    # The settings that send profiles somewhere, and where `contprof exec` and
    # `-rcontprof/auto` write them when none is set.
    DESTINATIONS = %i[output agent_url api_key pyroscope_url otlp_url].freeze
    # Settings that OpenTelemetry's variables stand in for when not given, and the
    # OtlpEnvironment method reading them. (An OTEL endpoint stands for otlp_endpoint, the
    # URL profiles are posted to, not for otlp_url, a base URL.)
    OTEL_FALLBACKS = { service: :service, version: :version, env: :deployment_environment, otlp_headers: :headers,
                       otlp_compression: :compression, otlp_timeout: :timeout }.freeze
    DEFAULT_OUTPUT = "contprof-profiles"
    # CONTPROF_* variables that are not settings: the build's and the test suite's.
    TOOLING_VARIABLES = %w[CONTPROF_EXTRA_CFLAGS CONTPROF_EXTRA_LDFLAGS CONTPROF_WERROR CONTPROF_VM_BACKEND
                           CONTPROF_COMPRESSOR CONTPROF_VM_LAYOUT CONTPROF_VM_HIDE_INTERNAL_FRAMES
                           CONTPROF_SANITIZED CONTPROF_VALGRIND CONTPROF_LONG_TESTS CONTPROF_MATRIX
                           CONTPROF_MATRIX_STAGES CONTPROF_TEST_ALLOCATION CONTPROF_CHROOTS
                           CONTPROF_DEBIAN_MIRROR CONTPROF_MATRIX_KEEP].freeze
    DURATION_UNITS = { "" => 1, "s" => 1, "m" => 60, "h" => 3600, "d" => 86_400 }.freeze
    BYTE_UNITS = { "" => 1, "b" => 1, "k" => 1024, "m" => 1024**2, "g" => 1024**3, "t" => 1024**4, "p" => 1024**5 }.freeze
    BOOLEANS = { "true" => true, "1" => true, "yes" => true, "on" => true,
                 "false" => false, "0" => false, "no" => false, "off" => false }.freeze

    class << self
      def definitions
        DEFINITIONS
      end

      # A setting's default: the one place it is written (exporters made by hand use it too).
      def default(name)
        definition = DEFINITIONS.find { |candidate| candidate.name == name }
        raise ArgumentError, "unknown setting #{name.inspect}" unless definition

        definition.default
      end

      # Settings from keywords, falling back to environment variables, then defaults.
      def resolve(keywords = {}, env: ENV)
        unknown = keywords.keys.map(&:to_sym) - DEFINITIONS.map(&:name)
        unless unknown.empty?
          raise ArgumentError, "unknown setting #{unknown.map(&:inspect).join(", ")} " \
                               "(settings: #{DEFINITIONS.map(&:name).join(", ")})"
        end

        warn_about_unknown_variables(env)
        otel = OtlpEnvironment.new(env, warned: (@otel_warnings ||= []))
        values = DEFINITIONS.to_h do |definition|
          keyword = keywords.fetch(definition.name) { keywords[definition.name.to_s] }
          raw, source = if !keyword.nil?
                          [keyword, definition.name.to_s]
                        elsif env.key?(definition.env_var) && !env[definition.env_var].empty?
                          [env[definition.env_var], definition.env_var]
                        end
          [definition.name, raw.nil? ? otel_fallback(definition, otel) : parse(definition, raw, source)]
        end
        values[:otlp_endpoint] = otel.endpoint&.first unless values[:otlp_url]
        values[:otlp_resource_attributes] = otel.resource_attributes
        new(values)
      end

      # Whether any destination is set, by keyword or variable.
      def destination?(keywords = {}, env: ENV)
        DESTINATIONS.any? do |name|
          !keywords[name].nil? || !keywords[name.to_s].nil? || !env["CONTPROF_#{name.upcase}"].to_s.empty?
        end || OtlpEnvironment::ENDPOINT_VARIABLES.any? { |name| !env[name].to_s.strip.empty? }
      end

      private

      # The value OpenTelemetry's variables give a setting not given otherwise, else its
      # default.
      def otel_fallback(definition, otel)
        reader = OTEL_FALLBACKS[definition.name]
        value, = reader && otel.public_send(reader)
        value.nil? ? definition.default : value
      end

      # A misspelt variable (CONTPROF_INTERVALL) would otherwise be ignored without a word:
      # one warning per variable and process, with the closest setting's variable.
      def warn_about_unknown_variables(env)
        known = DEFINITIONS.map(&:env_var) + TOOLING_VARIABLES
        @warned_variables ||= []
        env.each_key do |name|
          next unless name.start_with?("CONTPROF_") && !known.include?(name) && !@warned_variables.include?(name)

          @warned_variables << name
          suggestion = DidYouMean::SpellChecker.new(dictionary: known).correct(name).first if defined?(DidYouMean)
          Contprof.logger.warn("unknown variable #{name} ignored; " \
                               "#{suggestion ? "did you mean #{suggestion}?" : "settings are listed by `contprof exec --help`"}")
        end
      end

      def parse(definition, raw, source)
        definition.parser.call(raw)
      rescue ArgumentError, TypeError, (defined?(URI::Error) ? URI::Error : ArgumentError) => e
        detail = e.message.empty? || (defined?(URI::Error) && e.is_a?(URI::Error)) ? "" : " (#{e.message})"
        got = definition.secret ? "a value of class #{raw.class} (not shown: a secret)" : raw.inspect
        raise ArgumentError, "setting #{definition.name} (#{source}) accepts #{definition.accepts}; " \
                             "got #{got}#{detail}"
      end

      # Every text setting refuses control characters: CR/LF in a value that ends up in a
      # header, a tag, a log line or a file name would forge one.
      def text(raw)
        raise ArgumentError, "" unless raw.is_a?(String) || raw.is_a?(Symbol)

        raise ArgumentError, "control characters" if raw.to_s.match?(/[\x00-\x08\x0a-\x1f\x7f]/)

        value = raw.to_s.strip
        raise ArgumentError, "empty" if value.empty?

        value
      end

      # The host name the agentless intake URL is made of (intake.profile.<site>): letters,
      # digits, dots and hyphens only. Anything else (`x@evil:1234`, a path, a port) would
      # send the API key somewhere else.
      def site(raw)
        value = text(raw)
        labels = value.split(".", -1)
        valid = value.size <= 253 && labels.size >= 2 &&
                labels.all? { |label| label.match?(/\A[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?\z/) }
        raise ArgumentError, "not a host name (letters, digits, dots and hyphens)" unless valid

        value.downcase
      end

      def number(raw, range, integer: false)
        value = case raw
                when Numeric then raw
                when String then integer ? Integer(raw.strip, 10) : Float(raw.strip)
                else raise ArgumentError, ""
                end
        raise ArgumentError, "" if integer && !value.is_a?(Integer)
        raise ArgumentError, "out of range" unless range.cover?(value)

        integer ? value : value.to_f
      end

      # An Integer amount, given as a number or as a String with one of `units`' suffixes
      # ("7d", "500M"), within `range`; nil for false or "off" (no limit).
      def scaled(raw, units, range)
        return nil if raw == false || raw.to_s.strip.casecmp?("off")

        value = case raw
                when Integer then raw
                when Float then raw.finite? ? raw.round : (raise ArgumentError, "")
                when String
                  number, unit = raw.strip.downcase.match(/\A(\d+(?:\.\d+)?)\s*([a-z]?)\z/)&.captures
                  raise ArgumentError, "" unless number && units.key?(unit)

                  (Float(number) * units.fetch(unit)).round
                else raise ArgumentError, ""
                end
        raise ArgumentError, "out of range" unless range.cover?(value)

        value
      end

      def boolean(raw)
        return raw if [true, false].include?(raw)

        BOOLEANS.fetch(raw.to_s.strip.downcase) { raise ArgumentError, "" }
      end

      def cpu_timers(raw)
        return :posix if raw.to_s.strip.downcase == "posix"

        boolean(raw)
      end

      def tags(raw)
        pairs = case raw
                when Hash then raw.map { |k, v| [k.to_s, v.to_s] }
                when String
                  raise ArgumentError, "control characters in a tag" if raw.match?(/[[:cntrl:]]/)

                  raw.split(",").map(&:strip).reject(&:empty?).map { |pair| pair.split(":", 2) }
                else raise ArgumentError, ""
                end
        pairs.each do |key, value|
          raise ArgumentError, "a tag needs key:value" if value.nil?
          raise ArgumentError, "control characters in a tag" if "#{key}#{value}".match?(/[[:cntrl:]]/)
          raise ArgumentError, "empty tag key" if key.strip.empty?
          raise ArgumentError, "tag key #{key.inspect} contains ',' or ':'" if key.match?(/[,:]/)
          raise ArgumentError, "tag value of #{key} contains ','" if value.include?(",")
        end
        pairs.to_h { |key, value| [key.strip, value.strip] }.freeze
      end

      # An http(s) URL with a host and a port from 1 to 65535, without a query or fragment
      # (the exporter appends its own path: a fragment would end up in front of it). With
      # path: false, without a path either.
      def http_url(raw, path: true)
        require "uri" # here: `require "contprof"` stays cheap
        uri = URI.parse(text(raw))
        raise ArgumentError, "" unless %w[http https].include?(uri.scheme) && uri.host && !uri.host.empty?
        raise ArgumentError, "port #{uri.port} is not from 1 to 65535" unless (1..65_535).cover?(uri.port)
        raise ArgumentError, "a query (?...) is not accepted" if uri.query
        raise ArgumentError, "a fragment (#...) is not accepted" if uri.fragment
        raise ArgumentError, "a path is not accepted" unless path || ["", "/"].include?(uri.path)

        uri.to_s.chomp("/")
      end

      def agent_url(raw)
        value = text(raw)
        if value.start_with?("unix://")
          path = value.delete_prefix("unix://")
          raise ArgumentError, "a unix:// URL needs an absolute path" unless path.start_with?("/")

          return value
        end
        http_url(value, path: false)
      end

      # RFC 7617: the user-id of Basic authentication cannot contain a colon.
      def basic_auth_user(raw)
        value = text(raw)
        raise ArgumentError, "':' is not accepted" if value.include?(":")

        value
      end

      # A Hash of header names and values, or "name=value,name=value" (OpenTelemetry's
      # format: values percent-decoded). Problems name a header by its position or name,
      # never by its value.
      def otlp_headers(raw)
        pairs = case raw
                when Hash then raw.map { |name, value| [name.to_s.strip, value.is_a?(String) ? value.strip : value] }
                when String
                  OtlpEnvironment.pairs(raw) { |problem| raise ArgumentError, problem }.map { |pair| pair.first(2) }
                else raise ArgumentError, ""
                end
        pairs.each_with_index do |(name, value), index|
          problem = OtlpEnvironment.header_problem(name, value, index + 1)
          raise ArgumentError, problem if problem
        end
        pairs.to_h.freeze
      end

      def compression(raw)
        value = text(raw).downcase
        raise ArgumentError, "" unless OtlpEnvironment::COMPRESSIONS.include?(value)

        value
      end

      def log_level(raw)
        value = text(raw).downcase
        raise ArgumentError, "" unless LOG_LEVELS.include?(value)

        value
      end
    end

    DEFINITIONS = [
      Definition.new(name: :service, default: nil, accepts: "a service name (String)",
                     description: "the service being profiled (default: the program's name)",
                     parser: method(:text)),
      Definition.new(name: :env, default: nil, accepts: "an environment name (String)",
                     description: "deployment environment, e.g. production", parser: method(:text)),
      Definition.new(name: :version, default: nil, accepts: "a version (String)",
                     description: "version of the service", parser: method(:text)),
      Definition.new(name: :tags, default: {}.freeze, accepts: 'a Hash or "key:value,key:value"',
                     description: "extra tags for every profile", parser: method(:tags)),
      Definition.new(name: :interval, default: Limits::INTERVAL,
                     accepts: "a number of seconds from #{Limits::INTERVALS.min} to #{Limits::INTERVALS.max.to_i}",
                     description: "time between samples", parser: ->(raw) { number(raw, Limits::INTERVALS) }),
      Definition.new(name: :max_frames, default: Limits::MAX_FRAMES,
                     accepts: "an Integer from #{Limits::MAX_FRAMES_RANGE.min} to #{Limits::MAX_FRAMES_RANGE.max}",
                     description: "deepest stack kept; deeper ones end with \"N frames omitted\"",
                     parser: ->(raw) { number(raw, Limits::MAX_FRAMES_RANGE, integer: true) }),
      Definition.new(name: :upload_period, default: 60.0, accepts: "a number of seconds from 1 to 86400",
                     description: "time between profile flushes", parser: ->(raw) { number(raw, 1..86_400) }),
      Definition.new(name: :output, default: nil, accepts: "a directory path (String)",
                     description: "write each profile there as a .pprof file", parser: method(:text)),
      Definition.new(name: :output_retention, default: Limits::OUTPUT_RETENTION,
                     accepts: "seconds from #{Limits::OUTPUT_RETENTIONS.min} to 10 years, a number with a unit " \
                              "(90m, 12h, 7d), or off",
                     description: "profile files in output older than this are deleted by the flushes that write " \
                                  "there (off: kept)",
                     parser: ->(raw) { scaled(raw, DURATION_UNITS, Limits::OUTPUT_RETENTIONS) }),
      Definition.new(name: :output_max_bytes, default: Limits::OUTPUT_MAX_BYTES,
                     accepts: "bytes from #{Limits::OUTPUT_MAX_BYTES_RANGE.min} to 1P, a number with a unit " \
                              "(500M, 2G: powers of 1024), or off",
                     description: "the profile files in output are kept within this size, the oldest deleted " \
                                  "first, by the flushes that write there (off: no limit)",
                     parser: ->(raw) { scaled(raw, BYTE_UNITS, Limits::OUTPUT_MAX_BYTES_RANGE) }),
      Definition.new(name: :agent_url, default: nil, accepts: "an http(s)://host:port URL (port 1-65535, no path, query " \
                                                       "or fragment) or a unix:///path URL",
                     description: "Datadog agent to upload to", parser: method(:agent_url)),
      Definition.new(name: :agentless, default: false, accepts: "true or false",
                     description: "true: upload straight to Datadog's intake (needs api_key), not through an agent",
                     parser: method(:boolean)),
      Definition.new(name: :site, default: nil, accepts: "a Datadog site, e.g. datadoghq.com",
                     description: "Datadog site for agentless uploads (default datadoghq.com)", parser: method(:site)),
      Definition.new(name: :api_key, default: nil, accepts: "a Datadog API key (String, no control characters)",
                     description: "Datadog API key for agentless uploads; never logged",
                     parser: method(:text), secret: true),
      Definition.new(name: :pyroscope_url, default: nil, accepts: "an http(s)://host:port[/path] URL (port 1-65535, no " \
                                                           "query or fragment)",
                     description: "Pyroscope server to upload to", parser: method(:http_url)),
      Definition.new(name: :pyroscope_application_name, default: nil, accepts: "an application name (String)",
                     description: "Pyroscope application name (default: the service)", parser: method(:text)),
      Definition.new(name: :pyroscope_tenant_id, default: nil, accepts: "a tenant ID (String, no control characters)",
                     description: "Pyroscope tenant (the X-Scope-OrgID header); never logged",
                     parser: method(:text), secret: true),
      Definition.new(name: :pyroscope_basic_auth_user, default: nil, accepts: "a user name (String, no control " \
                                                                       "characters or ':')",
                     description: "Pyroscope HTTP Basic user (with pyroscope_basic_auth_password); never logged",
                     parser: method(:basic_auth_user), secret: true),
      Definition.new(name: :pyroscope_basic_auth_password, default: nil, accepts: "a password (String, no control " \
                                                                           "characters)",
                     description: "Pyroscope HTTP Basic password; never logged", parser: method(:text), secret: true),
      Definition.new(name: :pyroscope_auth_token, default: nil, accepts: "a token (String, no control characters)",
                     description: "Pyroscope bearer token (Authorization: Bearer); never logged",
                     parser: method(:text), secret: true),
      Definition.new(name: :otlp_url, default: nil, accepts: "an http(s)://host:port[/path] URL (port 1-65535, no " \
                                                      "query or fragment)",
                     description: "OTLP/HTTP endpoint to upload to, e.g. an OpenTelemetry Collector (POST " \
                                  "<otlp_url>/#{OtlpEnvironment::SIGNAL_PATH}; default: " \
                                  "OTEL_EXPORTER_OTLP_PROFILES_ENDPOINT, the full URL, or OTEL_EXPORTER_OTLP_ENDPOINT)",
                     parser: method(:http_url)),
      Definition.new(name: :otlp_headers, default: {}.freeze,
                     accepts: 'a Hash or "name=value,name=value" (values percent-decoded)',
                     description: "headers of every OTLP upload, e.g. Authorization; never logged (default: " \
                                  "OTEL_EXPORTER_OTLP_PROFILES_HEADERS or OTEL_EXPORTER_OTLP_HEADERS)",
                     parser: method(:otlp_headers), secret: true),
      Definition.new(name: :otlp_compression, default: "gzip", accepts: "gzip or none",
                     description: "compression of OTLP uploads (default: OTEL_EXPORTER_OTLP_PROFILES_COMPRESSION or " \
                                  "OTEL_EXPORTER_OTLP_COMPRESSION, else gzip)",
                     parser: method(:compression)),
      Definition.new(name: :otlp_timeout, default: 10.0, accepts: "a number of seconds from 0.1 to 300",
                     description: "limit for one OTLP upload; the smaller of it and upload_timeout applies (default: " \
                                  "OTEL_EXPORTER_OTLP_PROFILES_TIMEOUT or OTEL_EXPORTER_OTLP_TIMEOUT, milliseconds)",
                     parser: ->(raw) { number(raw, 0.1..300) }),
      Definition.new(name: :output_otlp, default: false, accepts: "true or false",
                     description: "also write each profile as OTLP (an uncompressed ExportProfilesServiceRequest, " \
                                  "what an OTLP upload sends) to a .otlp file next to its .pprof; needs output",
                     parser: method(:boolean)),
      Definition.new(name: :upload_timeout, default: 10.0, accepts: "a number of seconds from 0.1 to 300",
                     description: "limit for one upload, and for the last flush at exit",
                     parser: ->(raw) { number(raw, 0.1..300) }),
      Definition.new(name: :overhead_target, default: Limits::OVERHEAD_TARGET, accepts: "a fraction of one core above 0, at most 1",
                     description: "sampling slows down to keep the profiler under this CPU share",
                     parser: ->(raw) { number(raw, (Float::EPSILON)..1.0) }),
      Definition.new(name: :signals, default: true, accepts: "true or false",
                     description: "false: never send SIGPROF (no CPU timers; for native code that " \
                                  "mishandles EINTR)",
                     parser: method(:boolean)),
      Definition.new(name: :cpu_timers, default: true, accepts: "true, false or posix",
                     description: "each thread's CPU timer places its CPU samples (a perf event where the " \
                                  "kernel allows it, else a POSIX timer; posix: POSIX timers only; false: CPU " \
                                  "read from clocks at wall samples)",
                     parser: method(:cpu_timers)),
      Definition.new(name: :allocation, default: :auto, accepts: "auto, true or false",
                     description: "sample allocations: who allocates, how many objects and bytes (the " \
                                  "alloc-samples and alloc-size types); auto: on, except on Rubies with a " \
                                  "known VM bug it could meet (see README, Allocations)",
                     parser: ->(raw) { raw.to_s.strip.downcase == "auto" ? :auto : boolean(raw) }),
      Definition.new(name: :heap, default: :auto, accepts: "auto, true or false",
                     description: "live-heap profiling: of the sampled allocations, those still alive at " \
                                  "each flush (heap-live-samples, heap-live-size); needs allocation; auto: on " \
                                  "where this Ruby can have it (3.3+) and allocations are sampled",
                     parser: ->(raw) { raw.to_s.strip.downcase == "auto" ? :auto : boolean(raw) }),
      Definition.new(name: :timeline, default: true, accepts: "true or false",
                     description: "timestamp every CPU and wall sample (the end_timestamp_ns label) instead of " \
                                  "merging equal stacks, for the HTML timeline, speedscope's per-thread view, " \
                                  "Datadog's timeline and report --from/--to (see README, Timeline)",
                     parser: method(:boolean)),
      Definition.new(name: :allocation_interval, default: :auto,
                     accepts: "auto, or an Integer from #{Limits::ALLOCATION_INTERVALS.min} to " \
                              "#{Limits::ALLOCATION_INTERVALS.max}",
                     description: "mean allocations between allocation samples (auto: at least " \
                                  "#{Limits::ALLOCATION_INTERVAL}, more when the program allocates fast, to keep " \
                                  "the cost low; see README, Allocations)",
                     parser: ->(raw) { raw.to_s.strip == "auto" ? :auto : number(raw, Limits::ALLOCATION_INTERVALS, integer: true) }),
      Definition.new(name: :rack, default: true, accepts: "true or false",
                     description: "insert Contprof::Rack (endpoint labels, request counts) into a Rails app " \
                                  "that boots while profiling is on",
                     parser: method(:boolean)),
      Definition.new(name: :log_level, default: "warn", accepts: "one of #{LOG_LEVELS.join(", ")}",
                     description: "Contprof's own log messages (to standard error)", parser: method(:log_level)),
    ].freeze

    DEFINITIONS.each { |definition| attr_reader definition.name }

    # The URL OTLP uploads go to (from otlp_url, else OpenTelemetry's endpoint variables), or
    # nil: no OTLP upload.
    attr_reader :otlp_endpoint

    # OTEL_RESOURCE_ATTRIBUTES, decoded (a Hash of Strings): the resource of OTLP profiles
    # starts from them.
    attr_reader :otlp_resource_attributes

    # values: each setting's value (a setting left out takes its default), plus
    # otlp_endpoint and otlp_resource_attributes when OpenTelemetry's variables give them.
    def initialize(values)
      values = DEFINITIONS.to_h { |definition| [definition.name, definition.default] }.merge(values)
      values.each { |name, value| instance_variable_set(:"@#{name}", value) }
      @service ||= default_service
      @otlp_endpoint = "#{@otlp_url}/#{OtlpEnvironment::SIGNAL_PATH}" if @otlp_url
      @otlp_resource_attributes ||= {}.freeze
      check_datadog
      check_pyroscope
      if @output_otlp && @output.nil?
        raise ArgumentError, "setting output_otlp (CONTPROF_OUTPUT_OTLP) needs output (CONTPROF_OUTPUT): the .otlp files " \
                             "are written next to the .pprof files"
      end
      if @heap == true && @allocation == false
        raise ArgumentError, "setting heap (CONTPROF_HEAP) needs allocation (CONTPROF_ALLOCATION) set to true: the live " \
                             "heap is made of sampled allocations"
      end
      freeze
    end

    def agentless?
      @agentless
    end

    # Whether allocations are sampled: as set, or with `auto` wherever this Ruby has no known
    # VM bug allocation profiling could meet.
    def allocation?
      @allocation == :auto ? Collectors::Allocations.on_by_default? : @allocation
    end

    # Whether the live heap is wanted: as set, or with `auto` wherever this Ruby can track it
    # (the profiler also needs allocations sampled).
    def heap?
      @heap == :auto ? Collectors::Allocations.heap_supported? : @heap
    end

    # Whether heap profiling was asked for explicitly (a warning says why it is off, if it is).
    def heap_requested?
      @heap == true
    end

    def output_otlp?
      @output_otlp
    end

    def rack?
      @rack
    end

    def timeline?
      @timeline
    end

    def signals?
      @signals
    end

    # true, false or :posix (see the cpu_timers setting).
    def cpu_timers?
      @cpu_timers
    end

    def to_h
      DEFINITIONS.to_h { |d| [d.name, public_send(d.name)] }
    end

    # Without the secrets (api_key, Pyroscope's credentials, OTLP header values) or the URLs'
    # credentials, for logs.
    def inspect
      secrets = DEFINITIONS.select(&:secret).map(&:name)
      shown = to_h.map do |key, value|
        text = if value.nil? then "nil"
               elsif key == :otlp_headers then value.transform_values { "[redacted]" }.inspect # names help, values are secrets
               elsif secrets.include?(key) then "[redacted]"
               elsif %i[agent_url pyroscope_url otlp_url].include?(key) then HttpTransport.display_url(value).inspect
               else value.inspect
               end
        "#{key}=#{text}"
      end
      shown << "otlp_endpoint=#{HttpTransport.display_url(@otlp_endpoint).inspect}" if @otlp_endpoint && !@otlp_url
      "#<Contprof::Settings #{shown.join(" ")}>"
    end
    alias to_s inspect

    private

    # As dd-trace-rb: an API key alone does not switch to agentless (with an agent, the
    # agent adds its own key). Settings that would upload nowhere, or in a way not asked
    # for, are refused rather than ignored.
    def check_datadog
      if @agentless
        raise ArgumentError, "setting agentless (CONTPROF_AGENTLESS) needs api_key (CONTPROF_API_KEY)" unless @api_key
        if @agent_url
          raise ArgumentError, "setting agentless (CONTPROF_AGENTLESS) uploads to Datadog's intake, not through " \
                               "agent_url (CONTPROF_AGENT_URL): set one of them"
        end
        @site ||= "datadoghq.com"
      elsif @site
        raise ArgumentError, "setting site (CONTPROF_SITE) is for agentless uploads: set agentless " \
                             "(CONTPROF_AGENTLESS=true) and api_key too"
      elsif @api_key && @agent_url.nil?
        raise ArgumentError, "setting api_key (CONTPROF_API_KEY) alone uploads nowhere: set agentless " \
                             "(CONTPROF_AGENTLESS=true) to upload to Datadog's intake, or agent_url to use an " \
                             "agent (which does not need the key)"
      end
    end

    def check_pyroscope
      user = @pyroscope_basic_auth_user
      password = @pyroscope_basic_auth_password
      if user.nil? != password.nil?
        given = user ? "pyroscope_basic_auth_user" : "pyroscope_basic_auth_password"
        raise ArgumentError, "setting #{given} (CONTPROF_#{given.upcase}) needs the other one: " \
                             "pyroscope_basic_auth_user and pyroscope_basic_auth_password go together"
      end
      url_credentials = @pyroscope_url&.match?(%r{\Ahttps?://[^/@]*@}i)
      if user && url_credentials
        raise ArgumentError, "setting pyroscope_basic_auth_user (CONTPROF_PYROSCOPE_BASIC_AUTH_USER) and " \
                             "credentials in pyroscope_url (user:password@): give them once"
      end
      if @pyroscope_auth_token && (user || url_credentials)
        raise ArgumentError, "setting pyroscope_auth_token (CONTPROF_PYROSCOPE_AUTH_TOKEN) and basic auth (" \
                             "pyroscope_basic_auth_user or user:password@ in pyroscope_url) exclude each other"
      end
    end

    def default_service
      name = File.basename($PROGRAM_NAME.to_s, ".*")
      name = "ruby" if name.empty? || name == "-e"
      name
    end
  end
end
