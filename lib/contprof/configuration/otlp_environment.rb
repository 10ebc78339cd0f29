# frozen_string_literal: true

module Contprof
  # OpenTelemetry's standard environment variables, read as its specification defines them
  # (its pages "Environment Variable Specification", "OpenTelemetry Protocol Exporter" and
  # "Resource SDK"):
  # the fallbacks of Contprof's OTLP settings and of service, version and env, used when
  # the Contprof keyword or CONTPROF_* variable is not given.
  #
  # Unlike CONTPROF_* variables, a value the specification's rules reject is warned about
  # and ignored (treated as unset), as the specification asks: these variables belong to
  # every OpenTelemetry component of the process, not to Contprof alone. Warnings never
  # show a header's value, nor the entry it came from.
  class OtlpEnvironment
    # Where profiles go under an OTLP/HTTP base URL (OTLP 1.10+: the profiles signal).
    SIGNAL_PATH = "v1development/profiles"
    # The full URL of the signal (used as it is), then the base URL (SIGNAL_PATH appended).
    ENDPOINT_VARIABLES = %w[OTEL_EXPORTER_OTLP_PROFILES_ENDPOINT OTEL_EXPORTER_OTLP_ENDPOINT].freeze
    HEADERS_VARIABLES = %w[OTEL_EXPORTER_OTLP_PROFILES_HEADERS OTEL_EXPORTER_OTLP_HEADERS].freeze
    COMPRESSION_VARIABLES = %w[OTEL_EXPORTER_OTLP_PROFILES_COMPRESSION OTEL_EXPORTER_OTLP_COMPRESSION].freeze
    TIMEOUT_VARIABLES = %w[OTEL_EXPORTER_OTLP_PROFILES_TIMEOUT OTEL_EXPORTER_OTLP_TIMEOUT].freeze
    PROTOCOL_VARIABLES = %w[OTEL_EXPORTER_OTLP_PROFILES_PROTOCOL OTEL_EXPORTER_OTLP_PROTOCOL].freeze
    COMPRESSIONS = %w[gzip none].freeze
    # RFC 9110's token: what a header name may be.
    TOKEN = /\A[!#$%&'*+\-.^_`|~0-9A-Za-z]+\z/.freeze
    CONTROL = /[\x00-\x08\x0a-\x1f\x7f]/.freeze
    # Headers the exporter sets itself (a second Content-Type or Content-Length would make
    # the request unreadable).
    RESERVED_HEADERS = %w[content-type content-encoding content-length transfer-encoding host expect].freeze

    class << self
      # `text` ("key1=value1, key2=value2", W3C Baggage without properties) as [key, value,
      # position] triples, percent-decoded, whitespace around keys and values trimmed, empty
      # entries skipped. A malformed entry is left out and `problem` is called with what is
      # wrong, naming the entry by its position only (it may hold a secret).
      def pairs(text, &problem)
        text.split(",").each_with_index.filter_map do |entry, index|
          next if entry.strip.empty?

          key, separator, value = entry.partition("=")
          key = percent_decode(key.strip)
          value = percent_decode(value.strip)
          wrong = if separator.empty? then "is not key=value"
                  elsif key.nil? || value.nil? then "is not valid percent-encoded UTF-8"
                  elsif key.empty? then "has an empty key"
                  end
          next [key, value, index + 1] unless wrong

          problem.call("entry #{index + 1} #{wrong}")
          nil
        end
      end

      # What is wrong with a header, or nil. The value is never part of the answer, nor is
      # a name that is no HTTP token (a misplaced "Bearer <token>" would be one).
      def header_problem(name, value, position)
        return "header #{position}: the name is not an HTTP token" unless name.is_a?(String) && name.match?(TOKEN)
        return "header #{name}: the value is not a String" unless value.is_a?(String)
        return "header #{name}: control characters in the value" if value.match?(CONTROL)
        return "header #{name} is set by Contprof" if RESERVED_HEADERS.include?(name.downcase)

        nil
      end

      # RFC 3986 percent-decoding (a "+" stays a "+"), or nil when `text` is not valid
      # percent-encoded UTF-8.
      def percent_decode(text)
        return nil if text.match?(/%(?!\h\h)/)

        decoded = text.b.gsub(/%(\h\h)/n) { Regexp.last_match(1).hex.chr }.force_encoding(Encoding::UTF_8)
        decoded.valid_encoding? ? decoded : nil
      end
    end

    # env: the environment (ENV, or a Hash). warned: the warnings already given, shared by
    # the instances of a process so that each is said once.
    def initialize(env, warned: [])
      @env = env
      @warned = warned
    end

    # [the URL profiles go to, the variable it comes from], or nil. The per-signal variable
    # is the signal's full URL; the other one the base, under which SIGNAL_PATH is appended.
    def endpoint
      ENDPOINT_VARIABLES.each do |name|
        url = checked_url(name)
        next unless url

        warn_about_protocol
        return [url, name] if name == ENDPOINT_VARIABLES.first

        return ["#{url.chomp("/")}/#{SIGNAL_PATH}", name]
      end
      nil
    end

    # [{name => value}, variable] or nil. Malformed or refused entries are left out (with a
    # warning); the per-signal variable replaces the general one as a whole.
    def headers
      name = HEADERS_VARIABLES.find { |variable| value(variable) }
      return nil unless name

      headers = self.class.pairs(value(name)) { |problem| warn("#{name}: #{problem}; skipped") }
      headers = headers.reject do |key, text, position|
        problem = self.class.header_problem(key, text, position)
        warn("#{name}: #{problem}; skipped") if problem
        problem
      end
      [headers.to_h { |key, text, _| [key, text] }.freeze, name]
    end

    # ["gzip" or "none", variable] or nil.
    def compression
      first_valid(COMPRESSION_VARIABLES, "gzip or none") do |text|
        text.downcase if COMPRESSIONS.include?(text.downcase)
      end
    end

    # [seconds, variable] or nil: the variable holds milliseconds; 0 means no limit
    # (Float::INFINITY: upload_timeout then applies alone).
    def timeout
      first_valid(TIMEOUT_VARIABLES, "a whole number of milliseconds, 0 or more") do |text|
        next unless text.match?(/\A\d+\z/)

        text.to_i.zero? ? Float::INFINITY : text.to_i / 1000.0
      end
    end

    # [service name, variable] or nil: OTEL_SERVICE_NAME, else service.name of
    # OTEL_RESOURCE_ATTRIBUTES.
    def service
      from_variable = first_valid(%w[OTEL_SERVICE_NAME], "a service name without control characters") do |text|
        text unless text.match?(CONTROL)
      end
      from_variable || resource_attribute("service.name")
    end

    # [version, variable] or nil: service.version of OTEL_RESOURCE_ATTRIBUTES.
    def version
      resource_attribute("service.version")
    end

    # [environment, variable] or nil: deployment.environment.name of
    # OTEL_RESOURCE_ATTRIBUTES (or deployment.environment, its name before semantic
    # conventions 1.27).
    def deployment_environment
      resource_attribute("deployment.environment.name") || resource_attribute("deployment.environment")
    end

    # OTEL_RESOURCE_ATTRIBUTES as a Hash of Strings (empty when unset). On any error the
    # whole variable is discarded, with a warning, as the specification says.
    def resource_attributes
      @resource_attributes ||= begin
        text = value("OTEL_RESOURCE_ATTRIBUTES")
        problems = []
        pairs = text ? self.class.pairs(text) { |problem| problems << problem } : []
        pairs.each do |key, attribute, position|
          problems << "entry #{position} has control characters" if "#{key}#{attribute}".match?(CONTROL)
        end
        unless problems.empty?
          warn("OTEL_RESOURCE_ATTRIBUTES ignored: #{problems.first}")
          pairs = []
        end
        pairs.to_h { |key, attribute, _| [key, attribute] }.freeze
      end
    end

    private

    # The variable's value, stripped; nil when unset or empty (the specification: an empty
    # value is an unset one).
    def value(name)
      text = @env[name].to_s.strip
      text.empty? ? nil : text
    end

    def resource_attribute(key)
      attribute = resource_attributes[key]
      attribute.nil? || attribute.empty? ? nil : [attribute, "OTEL_RESOURCE_ATTRIBUTES"]
    end

    # [the block's answer, variable] for the first of `names` that is set and which the
    # block accepts (a non-nil answer); a value it refuses is warned about and ignored.
    def first_valid(names, accepted)
      names.each do |name|
        text = value(name)
        next unless text

        answer = yield(text)
        return [answer, name] unless answer.nil?

        warn("#{name} accepts #{accepted}; got #{text.inspect}; ignored")
      end
      nil
    end

    # An http(s) URL with a host (a query is kept in the per-signal URL, used as it is, but
    # refused in the base, which a path is appended to), or nil with a warning.
    def checked_url(name)
      text = value(name)
      return nil unless text

      require "uri"
      uri = URI.parse(text)
      problem = if !%w[http https].include?(uri.scheme) || uri.host.to_s.empty? then "an http(s):// URL with a host"
                elsif uri.fragment || (uri.query && name != ENDPOINT_VARIABLES.first) then "a URL without a query or fragment"
                elsif text.match?(CONTROL) then "a URL without control characters"
                end
      return text unless problem

      warn("#{name} accepts #{problem}; got #{text.sub(%r{\A([a-z][a-z0-9+.-]*://)[^/@]*@}i, '\1[redacted]@').inspect}; ignored")
      nil
    rescue URI::Error
      warn("#{name} accepts an http(s):// URL; got something that is not a URL; ignored")
      nil
    end

    # Contprof sends OTLP as protobuf over HTTP only (no gRPC, no JSON).
    def warn_about_protocol
      name = PROTOCOL_VARIABLES.find { |variable| value(variable) }
      return if name.nil? || value(name) == "http/protobuf"

      warn("#{name}=#{value(name).inspect}: Contprof sends profiles as http/protobuf only (the endpoint must be an " \
           "OTLP/HTTP one, port 4318 by convention)")
    end

    def warn(message)
      return if @warned.include?(message)

      @warned << message
      Contprof.logger.warn(message)
    end
  end
end
