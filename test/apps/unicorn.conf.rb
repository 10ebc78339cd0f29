# frozen_string_literal: true

# Unicorn's configuration for test/runtime/production_servers_test.rb: a master and 2 workers on
# 127.0.0.1:$PORT, each worker loading forking_rails.ru (no preload: SIGHUP reloads the
# app). Before forking a worker, once it has forked one, the master burns some CPU and
# records whether its profiler still hears its CPU timers (test/apps/forking_truth.rb).
require_relative "forking_truth"

worker_processes 2
listen "127.0.0.1:#{ENV.fetch("PORT")}"
timeout 30
preload_app false
before_fork do |_server, _worker|
  ForkingTruth.after_fork_in_parent if $unicorn_forked # rubocop:disable Style/GlobalVars -- this master forked before
  $unicorn_forked = true # rubocop:disable Style/GlobalVars
end
ForkingTruth.record_at_exit
