# frozen_string_literal: true

# A one-file Rails application for bench/rails.rb: what a JSON API does per request, on
# Debian's Rails 6.1 in production mode. Endpoints:
#   GET /items   builds 300 small records (hashes of strings, numbers, times) and renders
#                them as JSON: allocation-heavy, as most API endpoints are;
#   GET /report  sums and sorts numbers in Ruby and renders a short JSON: CPU-heavy, few
#                allocations (a contrast, not part of the headline).
require "rails"
require "action_controller/railtie"

class BenchApp < Rails::Application
  config.root = __dir__
  config.eager_load = true
  config.cache_classes = true
  config.consider_all_requests_local = false
  config.secret_key_base = "contprof-bench-not-a-secret"
  config.logger = Logger.new($stderr, level: :warn)
  config.log_level = :warn
  config.hosts.clear
  config.middleware.delete ActionDispatch::HostAuthorization if defined?(ActionDispatch::HostAuthorization)
  routes.append do
    get "/items" => "items#index"
    get "/report" => "items#report"
  end
end

class ItemsController < ActionController::API
  CATEGORIES = %w[books music garden toys tools kitchen].freeze

  def index
    now = Time.now
    items = Array.new(300) do |i|
      {
        id: i,
        name: "item-#{i}",
        category: CATEGORIES[i % CATEGORIES.size],
        price: (i * 37 % 1000) / 10.0,
        tags: ["t#{i % 7}", "t#{i % 11}"],
        updated_at: (now - i * 60).iso8601,
      }
    end
    render json: { count: items.size, items: items }
  end

  def report
    total = 0
    values = Array.new(2_000) { |i| (i * 7919) % 10_007 }
    200.times { |round| values.each { |v| total += (v ^ round) & 0xff } }
    render json: { total: total, top: values.max(3) }
  end
end

BenchApp.initialize!

# The process's CPU time so far, for bench/rails.rb (served before Rails: not a request of
# the application's). stackprof, when asked for, starts here as its README says: in the app.
map("/__cpu") { run ->(_env) { [200, {}, [Process.clock_gettime(Process::CLOCK_PROCESS_CPUTIME_ID, :nanosecond).to_s]] } }
if ENV["BENCH_STACKPROF"]
  require "stackprof"
  if ENV["BENCH_STACKPROF"] == "object"
    StackProf.start(mode: :object, interval: 1000, raw: false)
  else
    StackProf.start(mode: :cpu, interval: 1000, raw: false)
  end
end
run BenchApp
