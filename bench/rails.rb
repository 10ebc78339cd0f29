# frozen_string_literal: true

# What a profiler left on costs a real application: a Rails JSON API (bench/rails/config.ru,
# Debian's Rails 6.1, production mode) on puma, driven by a loopback client, side by side
# with the profilers users would pick instead, in one run.
#
#   ruby -Ilib bench/rails.rb   # ROUNDS=7 SECONDS=4 THREADS=1 CONNECTIONS=2 ENDPOINTS=/items,/report
#
# Four servers run, on their own ports, one at a time (the others frozen with SIGSTOP, so
# that their profilers take nothing from the machine meanwhile): bare (no profiler), contprof (`contprof exec`
# at its defaults, writing profiles to a directory every 60 s), stackprof (cpu mode, 1 ms,
# started in the app) and datadog (the `datadog` gem's profiler at its defaults, through
# `-rdatadog/profiling/preload` as `ddprofrb exec` does, uploading to a stand-in agent;
# tracing and telemetry off). Each round drives every server in turn, in random order, for
# SECONDS with wrk (one thread, CONNECTIONS connections, two by default: the server always
# has the next request; as many as puma's THREADS make a server that switches threads a lot),
# and reads the server's process CPU before and after (a route served before Rails). The
# figure is the server's CPU per request; the ratio, that of a profiler's server over the
# bare server's in the same round; the table gives the median ratio over rounds and its
# spread (lowest to highest). A first round warms every server up and is not counted.
require "fileutils"
require "net/http"
require "rbconfig"
require "tmpdir"
require_relative "support/peers"
require_relative "support/statistics"
include BenchStatistics # rubocop:disable Style/MixinUsage

ROOT = File.expand_path("..", __dir__)
APP = File.join(__dir__, "rails", "config.ru")
ROUNDS = Integer(ENV.fetch("ROUNDS", "7"))
SECONDS = Integer(ENV.fetch("SECONDS", "4"))
THREADS = Integer(ENV.fetch("THREADS", "1"))
CONNECTIONS = Integer(ENV.fetch("CONNECTIONS", "2"))
ENDPOINTS = ENV.fetch("ENDPOINTS", "/items,/report").split(",")

def need(command, package)
  return if system("command -v #{command} > /dev/null")

  abort "bench/rails.rb needs #{command} (Debian: apt-get install #{package})"
end

need("puma", "puma")
need("wrk", "wrk")
abort "bench/rails.rb needs Rails (Debian: apt-get install ruby-rails)" unless system(RbConfig.ruby, "-e", "require 'rails'", err: File::NULL)

class Server
  attr_reader :name, :port

  def initialize(name, port, env, command)
    @name = name
    @port = port
    @log = File.join(Dir.tmpdir, "contprof-bench-rails-#{name}.log")
    @pid = spawn(env, *command, out: @log, err: @log, pgroup: true)
  end

  def wait_until_up
    deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + 60
    loop do
      return if cpu_ns
    rescue SystemCallError, Net::ReadTimeout
      abort "#{@name} did not start: #{File.read(@log)[-2000..]}" if Process.clock_gettime(Process::CLOCK_MONOTONIC) > deadline
      sleep 0.2
    end
  end

  def cpu_ns = Integer(Net::HTTP.get(URI("http://127.0.0.1:#{@port}/__cpu")))

  # Drives the server for SECONDS; returns [requests, CPU ns].
  def drive(endpoint)
    before = cpu_ns
    out = `wrk -t1 -c#{CONNECTIONS} -d#{SECONDS}s http://127.0.0.1:#{@port}#{endpoint}`
    after = cpu_ns
    abort "#{@name}: wrk saw errors:\n#{out}" if out =~ /Non-2xx|Socket errors/
    [Integer(out[/(\d+) requests in/, 1]), after - before]
  end

  # Freezes the server (SIGSTOP to its process group) while another is measured: its
  # profiler's timers and threads then take nothing from the machine.
  def pause = Process.kill("STOP", -@pid)
  def resume = Process.kill("CONT", -@pid)

  def stop
    Process.kill("CONT", -@pid)
    Process.kill("TERM", -@pid)
    Process.wait(@pid)
  rescue Errno::ESRCH, Errno::ECHILD
    nil
  end
end

puma = ["puma", "-t", "#{THREADS}:#{THREADS}", "-e", "production", "--silent"]
base_env = { "RAILS_ENV" => "production" }
profiles = Dir.mktmpdir("contprof-bench-rails")
configs = {
  "bare" => [base_env, []],
  "contprof" => [base_env, [RbConfig.ruby, "-I#{File.join(ROOT, "lib")}", File.join(ROOT, "exe", "contprof"), "exec",
                            "-o", profiles, "--"]],
}
# Contprof variants that show where its cost goes (EXTRA=contprof-loaded,...): loaded only
# (never started), without CPU timers, with POSIX CPU timers, at a 100 ms interval, without
# Contprof::Rack (contprof-norack: the middleware and its labels are in contprof); and
# allocation profiling: contprof-alloc (at its default interval), contprof-heap (that and
# live-heap tracking, Ruby 3.3+), contprof-merged (timeline: false; the timeline is on by
# default), stackprof-object (stackprof's object mode, every 1000th
# allocation, instead of its cpu mode).
contprof_variants = {
  "contprof-loaded" => { "RUBYOPT" => "-I#{File.join(ROOT, "lib")} -rcontprof" },
  "contprof-notimers" => { "CONTPROF_CPU_TIMERS" => "false" },
  "contprof-posix" => { "CONTPROF_CPU_TIMERS" => "posix" },
  "contprof-100ms" => { "CONTPROF_INTERVAL" => "0.1" },
  "contprof-norack" => { "CONTPROF_RACK" => "false" },
  "contprof-alloc" => { "CONTPROF_ALLOCATION" => "true" },
  "contprof-heap" => { "CONTPROF_ALLOCATION" => "true", "CONTPROF_HEAP" => "true" },
  "contprof-merged" => { "CONTPROF_TIMELINE" => "false" },
  "stackprof-object" => { "BENCH_STACKPROF" => "object" },
}
extras = ENV.fetch("EXTRA", "").split(",")
(extras - ["datadog-alloc"]).each do |name|
  variant = contprof_variants.fetch(name) { abort "EXTRA: #{name}? (#{[*contprof_variants.keys, "datadog-alloc"].join(", ")})" }
  next puts("stackprof-object: stackprof cannot be had here") if name == "stackprof-object" && !Peers.available?("stackprof")

  command = %w[contprof-loaded stackprof-object].include?(name) ? [] : configs["contprof"][1]
  configs[name] = [base_env.merge(variant), command]
end
configs["stackprof"] = [base_env.merge("BENCH_STACKPROF" => "1"), []] if Peers.available?("stackprof")
if Peers.available?("datadog")
  agent_port, sink = Peers.sink
  configs["datadog"] = [base_env.merge(Peers.env).merge(
    "RUBYOPT" => "-rdatadog/profiling/preload", "DD_PROFILING_ENABLED" => "true", "DD_TRACE_ENABLED" => "false",
    "DD_TELEMETRY_ENABLED" => "false", "DD_AGENT_HOST" => "127.0.0.1", "DD_TRACE_AGENT_PORT" => agent_port.to_s
  ), []]
  # datadog-alloc: its allocation profiling too (a NEWOBJ hook left on), beside contprof-alloc.
  configs["datadog-alloc"] = [configs["datadog"][0].merge("DD_PROFILING_ALLOCATION_ENABLED" => "true"), []] if extras.include?("datadog-alloc")
end

servers = configs.each_with_index.map do |(name, (env, prefix)), index|
  port = 9400 + index
  Server.new(name, port, env, [*prefix, *puma, "-b", "tcp://127.0.0.1:#{port}", APP])
end
begin
  servers.each(&:wait_until_up)
  puts "Ruby #{RUBY_VERSION}, puma #{THREADS} thread(s), #{CONNECTIONS} connections, #{ROUNDS} rounds of #{SECONDS} s per server and endpoint " \
       "(after one warm-up round); servers: #{servers.map(&:name).join(", ")}"
  ENDPOINTS.each do |endpoint|
    per_request = Hash.new { |h, k| h[k] = [] }
    servers.each(&:pause)
    (ROUNDS + 1).times do |round|
      servers.shuffle.each do |server|
        server.resume
        requests, cpu = server.drive(endpoint)
        server.pause
        per_request[server.name] << cpu / requests.to_f if round.positive?
      end
    end
    servers.each(&:resume)
    bare = per_request["bare"]
    puts
    puts "GET #{endpoint}"
    printf("  %-10s %14s %8s %17s\n", "server", "CPU/request", "ratio", "(spread)")
    servers.each do |server|
      ratios = per_request[server.name].each_with_index.map { |cpu, i| cpu / bare[i] }
      printf("  %-10s %11.3f ms %8.4f %17s\n", server.name, median(per_request[server.name]) / 1e6, median(ratios),
             format("(%.3f-%.3f)", *ratios.minmax))
    end
  end
ensure
  servers.each(&:stop)
  Process.kill("KILL", sink) if sink
  FileUtils.rm_rf(profiles)
end
