# frozen_string_literal: true

# A Rails app with two endpoints of known CPU cost (3:1), for the forking servers of
# test/runtime/production_servers_test.rb (puma in cluster mode, unicorn). It knows nothing of
# Contprof: under `contprof exec`, Contprof::Railtie inserts Contprof::Rack. Each request's
# CPU is measured around the whole app and written to $TRUTH_DIR (test/apps/forking_truth.rb).
require_relative "forking_truth"
require "action_controller/railtie"

class ForkingApp < Rails::Application
  config.eager_load = true
  # Only errors, in the server's log: what made a request fail is read there.
  config.logger = ActiveSupport::Logger.new($stderr, level: :error)
  config.secret_key_base = "contprof-test"
  config.hosts.clear if config.respond_to?(:hosts)
  routes.append do
    get "/heavy/:id", to: "burn#heavy"
    get "/light", to: "burn#light"
  end
end

class BurnController < ActionController::API
  HEAVY_SECONDS = 0.009
  LIGHT_SECONDS = 0.003

  def heavy
    ForkingTruth.burn(HEAVY_SECONDS)
    render json: { id: params[:id], pid: Process.pid }
  end

  def light
    ForkingTruth.burn(LIGHT_SECONDS)
    render json: { pid: Process.pid }
  end
end

ForkingApp.initialize!
ForkingTruth.record_at_exit
use ForkingTruth::Middleware
run ForkingApp
