# frozen_string_literal: true

# A Rails (6.1+) app with two endpoints of known CPU cost, for test/requests/requests_test.rb. Run
# under `contprof exec -- puma`: Contprof::Railtie inserts Contprof::Rack.
require_relative "endpoint_truth"
require "action_controller/railtie"

class EndpointsApp < Rails::Application
  config.eager_load = true
  config.logger = Logger.new(nil)
  config.secret_key_base = "contprof-test"
  config.hosts.clear if config.respond_to?(:hosts)
  routes.append do
    get "/heavy/:id", to: "burn#heavy"
    get "/light", to: "burn#light"
  end
end

class BurnController < ActionController::API
  def heavy
    EndpointTruth.burn(EndpointTruth::HEAVY_SECONDS)
    render json: { id: params[:id] }
  end

  def light
    EndpointTruth.burn(EndpointTruth::LIGHT_SECONDS)
    render json: {}
  end
end

EndpointsApp.initialize!
use EndpointTruth::Middleware
run EndpointsApp
