# frozen_string_literal: true

# A Sinatra app with two endpoints of known CPU cost, for test/requests/requests_test.rb.
require_relative "endpoint_truth"
require "sinatra/base"

class EndpointsApp < Sinatra::Base
  set :logging, false
  set :host_authorization, { permitted_hosts: [] } if respond_to?(:host_authorization)

  get "/heavy/:id" do
    EndpointTruth.burn(EndpointTruth::HEAVY_SECONDS)
    "heavy #{params[:id]}"
  end

  get "/light" do
    EndpointTruth.burn(EndpointTruth::LIGHT_SECONDS)
    "light"
  end
end

use EndpointTruth::Middleware
use Contprof::Rack if defined?(Contprof::Rack)
run EndpointsApp
