# frozen_string_literal: true

# Puma's configuration for test/runtime/production_servers_test.rb: cluster mode, 2 workers of 2
# threads on 127.0.0.1:$PORT, serving forking_rails.ru, with the app loaded in the master
# and forked (PUMA_SHAPE=preload) or loaded by worker 0, which forks the others
# (PUMA_SHAPE=fork_worker). After each fork the parent (master, or worker 0) burns some CPU
# and records whether its profiler still hears its CPU timers (test/apps/forking_truth.rb).
require_relative "forking_truth"

workers 2
threads 2, 2
# The master checks its workers (and moves a phased restart on) at this pace: 5 s by default.
worker_check_interval 1
bind "tcp://127.0.0.1:#{ENV.fetch("PORT")}"
rackup File.join(__dir__, "forking_rails.ru")
case ENV.fetch("PUMA_SHAPE")
when "preload" then preload_app!
when "fork_worker" then fork_worker
else raise "PUMA_SHAPE is preload or fork_worker"
end
after_worker_fork { ForkingTruth.after_fork_in_parent }
ForkingTruth.record_at_exit
