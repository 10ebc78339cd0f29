# frozen_string_literal: true

require_relative "labels"
require_relative "endpoint_counts"

module Contprof
  # Rack middleware: every sample taken while a request is served carries the label
  # `endpoint`, and requests are counted per endpoint (Contprof.endpoint_counts).
  #
  #   use Contprof::Rack          # config.ru; Rails gets it from Contprof::Railtie
  #
  # The endpoint is the route: Rails' `Controller#action` (when the router dispatches to the
  # controller), Sinatra's route pattern (`GET /items/:id`).
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
    # Read and written under the GVL, never iterated: normalised path => route; endpoint =>
    # its label set, without and with Datadog's label.
    ROUTES = {}
    LABEL_SETS = {}
    DATADOG_LABEL_SETS = {}
    private_constant :METHODS, :MAX_SEGMENTS, :ID_SEGMENT, :ROUTES, :LABEL_SETS, :DATADOG_LABEL_SETS

    # The endpoint name for a request without a route: "GET /items/:id".
    def self.normalised_endpoint(method, path)
      method = METHODS.include?(method) ? method : "OTHER"
      path = path.to_s
      # Most paths have no id and few segments: taken as they are (no split, no regex).
      if !path.match?(/[0-9?]|\/\/|\/\z/) && path.count("/") <= MAX_SEGMENTS && path.start_with?("/")
        return "#{method} #{path}"
      end

      segments = path.split("?", 2).first.to_s.split("/").reject(&:empty?)
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
      Thread.current[LabelSet::FIBER_LOCAL] = label_set(endpoint, request[2])
    end

    def self.endpoint_labels(endpoint)
      if Profiler.running&.uploads_to_datadog?
        { ENDPOINT_KEY => endpoint, DATADOG_ENDPOINT_KEY => endpoint }
      else
        { ENDPOINT_KEY => endpoint }
      end
    end

    # The label set of a request to `endpoint` inside `enclosing` (the labels in force
    # outside the middleware, usually none). Sets are immutable: one per endpoint is kept
    # and reused, so that a request allocates no label set.
    def self.label_set(endpoint, enclosing)
      return LabelSet.new(enclosing, endpoint_labels(endpoint)) if enclosing

      sets = Profiler.running&.uploads_to_datadog? ? DATADOG_LABEL_SETS : LABEL_SETS
      set = sets[endpoint]
      return set if set

      set = LabelSet.new(nil, endpoint_labels(endpoint))
      sets[endpoint.frozen? ? endpoint : endpoint.dup.freeze] = set if sets.size < MAX_ROUTES * 2
      set
    end

    def initialize(app)
      @app = app
      Frameworks.instrument
    end

    def call(env)
      return @app.call(env) unless Contprof.running?

      thread = Thread.current
      enclosing_request = thread[:__contprof_request]
      enclosing_labels = thread[LabelSet::FIBER_LOCAL]
      path = self.class.normalised_endpoint(env["REQUEST_METHOD"], env["PATH_INFO"])
      endpoint = ROUTES[path] || path
      # The endpoint so far, the normalised path, and the labels outside this middleware.
      request = [endpoint, path, enclosing_labels]
      thread[:__contprof_request] = request
      thread[LabelSet::FIBER_LOCAL] = self.class.label_set(endpoint, enclosing_labels)
      begin
        @app.call(env)
      ensure
        thread[LabelSet::FIBER_LOCAL] = enclosing_labels
        thread[:__contprof_request] = enclosing_request
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
          instrument_rails if defined?(::ActionController::Metal)
          instrument_sinatra if defined?(::Sinatra::Base)
        end

        # Whether Rails' controllers name the route (false only while bench/rails_features.rb
        # measures the app without the hook).
        def rails?
          @rails
        end

        private

        # Rails: each controller's dispatch (the router calls it once it found the route).
        # A prepended method costs a call; ActiveSupport's start_processing event would cost
        # its instrumentation (timestamps, payload) on every request.
        def instrument_rails
          @rails = true
          return if @rails_prepended

          @rails_prepended = true
          ::ActionController::Metal.prepend(RailsDispatch)
        end

        # For bench/rails_features.rb: the Rails app without the hook.
        def uninstrument_rails
          @rails = false
        end

        def instrument_sinatra
          return if @sinatra

          @sinatra = true
          ::Sinatra::Base.prepend(SinatraRoute)
        end
      end

      # Controller#action, each name built once.
      module RailsDispatch
        NAMES = {} # controller class => { action => "Controller#action" }

        def dispatch(name, request, response)
          if Frameworks.rails? && Thread.current[:__contprof_request]
            actions = NAMES[self.class] ||= {}
            Rack.route_found(actions[name] || (actions[name] = "#{self.class.name}##{name}".freeze))
          end
          super
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
