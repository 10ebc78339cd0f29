# frozen_string_literal: true

# A fork-per-job runner, for test/runtime/production_servers_test.rb: the parent forks a child for
# each of $JOBS jobs (heavy and light in turn, 3:1 in CPU) and computes after each fork
# itself, then waits for its children. It knows nothing of Contprof. Each job's CPU and the
# parent's are measured where they are spent and written to $TRUTH_DIR, with the CPU-timer
# signals the parent heard while computing (test/apps/forking_truth.rb).
require_relative "forking_truth"

module ForkPerJob
  # Tens of milliseconds, as jobs worth a process of their own are: the profile of a child
  # misses about its first sampling period, and the parent's, a fraction of a millisecond
  # around each fork (see the production-shapes test).
  HEAVY = 0.09
  LIGHT = 0.03
  PARENT = 0.03

  def self.heavy_job = ForkingTruth.burn(HEAVY)
  def self.light_job = ForkingTruth.burn(LIGHT)
  def self.parent_work = ForkingTruth.burn(PARENT)
end

ForkingTruth.record_at_exit
children = Array.new(Integer(ENV.fetch("JOBS"))) do |index|
  kind = index.even? ? "heavy" : "light"
  child = fork { ForkingTruth.measure(kind) { ForkPerJob.public_send(:"#{kind}_job") } }
  ForkingTruth.after_fork_in_parent(name: "parent") { ForkPerJob.parent_work }
  child
end
failed = children.map { |child| Process.wait2(child)[1] }.reject(&:success?)
abort "#{failed.size} job(s) failed: #{failed.map(&:inspect).join(", ")}" unless failed.empty?
