# frozen_string_literal: true

require_relative "labels"
require_relative "endpoint_counts"

module Contprof
  # Rack middleware: every sample taken while a request is served carries the label
  # `endpoint`, and requests are counted per endpoint (Contprof.endpoint_counts).
  #
  #   use Contprof::Rack          # config.ru; Rails gets it from Contprof::Railtie
  #
  # The endpoint is the route: Rails' `Controller#action` (from ActiveSupport's
  # start_processing.action_controller event), Sinatra's route pattern (`GET /items/:id`).
  # For any other app it is the method and the normalised path: no query string, and
  # segments that look like ids (numbers, UUIDs, long hexadecimal or digit-laden tokens)
  # replaced by `:id`, so that the number of endpoints stays bounded.
  #
  # A framework names the route only once its router ran, inside the app, after the
  # middleware before it already took samples. So the middleware remembers which route each
  # normalised path led to (at most MAX_ROUTES of them) and labels the next request to that
  # path with the route from its start: only a path's first request has its first moments
  # under the normalised name. When the running profiler uploads to Datadog, the name is
  # also put in `trace endpoint`, the label its backend reads.
  class Rack
    ENDPOINT_KEY = :endpoint
    DATADOG_ENDPOINT_KEY = :"trace endpoint"
    METHODS = %w[GET HEAD POST PUT PATCH DELETE OPTIONS TRACE CONNECT].freeze
    MAX_SEGMENTS = 8
    MAX_ROUTES = 2000
    ID_SEGMENT = /\A(?:\d+|\h{8}-\h{4}-\h{4}-\h{4}-\h{12}|(?=[^\/]*\d)\h{12,}|(?=(?:[^\/]*\d){3})[\w.~-]{16,})\z/.freeze
    ROUTES = {} # normalised path => route (read and written under the GVL; never iterated)
    private_constant :METHODS, :MAX_SEGMENTS, :ID_SEGMENT, :ROUTES

    # The endpoint name for a request without a route: "GET /items/:id".
    def self.normalised_endpoint(method, path)
      method = METHODS.include?(method) ? method : "OTHER"
      segments = path.to_s.split("?", 2).first.to_s.split("/").reject(&:empty?)
      named = segments.first(MAX_SEGMENTS).map { |segment| segment.match?(ID_SEGMENT) ? ":id" : segment }
      named << "…" if segments.size > MAX_SEGMENTS
      "#{method} /#{named.join("/")}"
    end

    # Called by the framework hooks once the route is known.
    def self.route_found(endpoint)
      return unless (request = Thread.current[:__contprof_request])

      ROUTES[request[1]] = endpoint if ROUTES.size < MAX_ROUTES || ROUTES.key?(request[1])
      return if request[0] == endpoint

      request[0] = endpoint
      Contprof.relabel(**endpoint_labels(endpoint))
    end

    def self.endpoint_labels(endpoint)
      if Profiler.running&.uploads_to_datadog?
        { ENDPOINT_KEY => endpoint, DATADOG_ENDPOINT_KEY => endpoint }
      else
        { ENDPOINT_KEY => endpoint }
      end
    end

    def initialize(app)
      @app = app
      Frameworks.instrument
    end

    def call(env)
      return @app.call(env) unless Contprof.running?

      thread = Thread.current
      enclosing = thread[:__contprof_request]
      path = self.class.normalised_endpoint(env["REQUEST_METHOD"], env["PATH_INFO"])
      request = [ROUTES[path] || path, path] # the endpoint so far, and the normalised path
      thread[:__contprof_request] = request
      begin
        Contprof.with_labels(**self.class.endpoint_labels(request[0])) { @app.call(env) }
      ensure
        thread[:__contprof_request] = enclosing
        Contprof.endpoint_counts.add(request[0])
      end
    end

    # Where each framework says which route a request took.
    module Frameworks
      class << self
        # `contprof exec` loads Contprof before the program loads Rails: the Railtie is
        # defined when the application's class is (Rails is complete by then, and reads
        # its railties only when the application initializes). A :class TracePoint runs
        # only when a class body opens, and is turned off once found.
        def railtie_when_rails_loads
          return require_relative("railtie") if defined?(::Rails::Railtie)

          watch = TracePoint.new(:class) do |point|
            next unless defined?(::Rails::Application) && point.self.is_a?(Class) && point.self < ::Rails::Application

            watch.disable
            require_relative "railtie"
          end
          watch.enable
        end

        def instrument
          instrument_rails if defined?(::ActiveSupport::Notifications) && defined?(::ActionController)
          instrument_sinatra if defined?(::Sinatra::Base)
        end

        private

        def instrument_rails
          return if @rails

          @rails = ::ActiveSupport::Notifications.subscribe("start_processing.action_controller") do |*, payload|
            Rack.route_found("#{payload[:controller]}##{payload[:action]}")
          end
        end

        # For bench/rack_overhead.rb: the Rails app without the hook.
        def uninstrument_rails
          ::ActiveSupport::Notifications.unsubscribe(@rails) if @rails
          @rails = nil
        end

        def instrument_sinatra
          return if @sinatra

          @sinatra = true
          ::Sinatra::Base.prepend(SinatraRoute)
        end
      end

      # Sinatra sets env["sinatra.route"] ("GET /items/:id") once a route matched, before
      # its block runs in route_eval.
      module SinatraRoute
        private

        def route_eval
          route = env["sinatra.route"]
          Rack.route_found(route) if route
          super
        end
      end
    end
  end

end
