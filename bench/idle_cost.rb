# frozen_string_literal: true

# What a profiler left on costs a process that waits: a server between requests, a job
# worker with an empty queue. THREADS threads block on a queue and the main thread sleeps
# for SECONDS while the profiler runs; the figure is the process's CPU per second of that
# wait (the profiler's own threads included), side by side with the peers, median of RUNS
# fresh processes each.
#
#   ruby -Ilib bench/idle_cost.rb   # THREADS=16 SECONDS=5 RUNS=3 PROFILERS=none,contprof,…
#
# On Ruby 3.3+ Contprof's wall clock parks while every thread waits (README, "The clock
# parks while nothing runs"); its clock wakeups are printed beside.
require "open3"
require "rbconfig"
require_relative "support/peers"
require_relative "support/statistics"
include BenchStatistics # rubocop:disable Style/MixinUsage

ROOT = File.expand_path("..", __dir__)
THREADS = Integer(ENV.fetch("THREADS", "16"))
SECONDS = Float(ENV.fetch("SECONDS", "5"))
RUNS = Integer(ENV.fetch("RUNS", "3"))

CHILD = <<~RUBY
  require_relative #{File.join(__dir__, "support", "peers").dump}
  name = ARGV[0]
  queue = Queue.new
  waiters = Array.new(#{THREADS}) { Thread.new { queue.pop } }
  agent_port = ENV["AGENT_PORT"].to_s.empty? ? nil : Integer(ENV["AGENT_PORT"])
  peer = name == "none" ? nil : Peers::InProcess.new(name, agent_port: agent_port)
  peer&.start
  sleep 0.5 # (the profiler's start-up is not the wait's)
  worker = name == "contprof" ? ObjectSpace.each_object(Contprof::Collectors::CpuAndWallTimeWorker).first : nil
  wakeups_before = worker&.stats&.fetch(:clock_wakeups)
  cpu = Process.clock_gettime(Process::CLOCK_PROCESS_CPUTIME_ID)
  sleep #{SECONDS}
  used = Process.clock_gettime(Process::CLOCK_PROCESS_CPUTIME_ID) - cpu
  wakeups = worker ? worker.stats[:clock_wakeups] - wakeups_before : 0
  peer&.stop
  waiters.size.times { queue << nil }
  waiters.each(&:join)
  puts "cpu=\#{used} wakeups=\#{wakeups}"
RUBY

peers = %w[stackprof datadog vernier rperf].select { |name| Peers.available?(name) }
profilers = ["none", "contprof", *peers]
profilers &= ENV["PROFILERS"].split(",") if ENV["PROFILERS"]
agent_port, sink = Peers.sink if profilers.include?("datadog")
puts "Ruby #{RUBY_VERSION}; #{THREADS} threads waiting and the main thread asleep for #{SECONDS} s; #{RUNS} runs each"
results = Hash.new { |hash, key| hash[key] = [] }
begin
  RUNS.times do
    profilers.each do |profiler|
      env = Peers.env.merge("AGENT_PORT" => agent_port.to_s)
      out, err, status = Open3.capture3(env, RbConfig.ruby, "-I#{File.join(ROOT, "lib")}", "-e", CHILD, profiler)
      abort "#{profiler} failed: #{err}" unless status.success?
      results[profiler] << out.scan(/(\w+)=(\S+)/).to_h.transform_values { |value| Float(value) }
    end
  end
ensure
  Process.kill("KILL", sink) if sink
end
printf("  %-10s %22s %18s\n", "profiler", "CPU ms per second", "clock wakeups/s")
profilers.each do |profiler|
  runs = results[profiler]
  per_second = runs.map { |run| run["cpu"] / SECONDS * 1000 }
  printf("  %-10s %10.3f (%.3f-%.3f) %18s\n", profiler, median(per_second), *per_second.minmax,
         profiler == "contprof" ? format("%.1f", median(runs.map { |run| run["wakeups"] }) / SECONDS) : "")
end
