# frozen_string_literal: true

# Background jobs of two classes whose CPU cost is 3:1 by construction, for
# test/runtime/production_servers_test.rb: HeavyJob, a Sidekiq worker, and LightJob, an ActiveJob
# job queued through Sidekiq's adapter (which Sidekiq runs wrapped). Neither knows of
# Contprof. A server middleware of the app measures each job's CPU (its thread's, around
# everything inside it) and writes it to $TRUTH_DIR (test/apps/forking_truth.rb).
#
#   sidekiq -r ./sidekiq_jobs.rb           # the server (Redis at $REDIS_URL)
#   ruby sidekiq_jobs.rb enqueue COUNT     # queues COUNT jobs of each class
require_relative "forking_truth"
require "sidekiq"
require "active_job"

ActiveJob::Base.queue_adapter = :sidekiq
ActiveJob::Base.logger = Logger.new(nil)

class HeavyJob
  include Sidekiq::Worker
  sidekiq_options retry: false

  def perform(_index)
    ForkingTruth.burn(0.009)
  end
end

class LightJob < ActiveJob::Base
  def perform(_index)
    ForkingTruth.burn(0.003)
  end
end

# The app's own measure: each job's CPU, under the name its payload gives it.
class TruthMiddleware
  def call(_worker, job, _queue, &block)
    ForkingTruth.measure(job["wrapped"] || job["class"], &block)
  end
end

Sidekiq.configure_server do |config|
  config.server_middleware { |chain| chain.add(TruthMiddleware) }
  # (Sidekiq says "Starting processing" only to a terminal.)
  config.on(:startup) { Sidekiq.logger.info("sidekiq_jobs.rb: started") }
  ForkingTruth.record_at_exit
end

if $PROGRAM_NAME == __FILE__ && ARGV.first == "enqueue"
  Integer(ARGV[1]).times do |index|
    HeavyJob.perform_async(index)
    LightJob.perform_later(index)
  end
end
