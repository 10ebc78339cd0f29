# frozen_string_literal: true

# What Contprof adds to each GVL switch: on Ruby 3.3+ its thread event hooks run at every
# one (a thread gives up the GVL, wants it back, takes it), so a server that switches a lot
# pays them per switch. Two threads hand a token back and forth through Queues (each
# handoff: one thread blocks in Queue#pop and gives up the GVL, the other takes it), in
# fresh processes, without a profiler and with each profiler started at its defaults,
# interleaved; the figure is the process CPU per handoff, median over RUNS. stackprof has
# no such hooks; rperf (Ruby 3.4+) times off-GVL stretches through them, as Contprof does.
#
#   ruby -Ilib bench/gvl_switch_cost.rb   # RUNS=9 HANDOFFS=100000 EXTRA=1 MN=1
#
# MN=1 runs every process with M:N threads (RUBY_MN_THREADS=1, Ruby 3.3+): the two threads
# then share a native thread, and Contprof's hooks also read its CPU clock at each switch.
#
# Multiply by the switches a request makes (bench/rails.rb's servers: voluntary context
# switches per request, printed by that script with THREADS > 1) to get a request's share.
require "rbconfig"
require_relative "support/peers"

ROOT = File.expand_path("..", __dir__)
RUNS = Integer(ENV.fetch("RUNS", "9"))
HANDOFFS = Integer(ENV.fetch("HANDOFFS", "100000"))

# (Under M:N the main thread keeps a native thread of its own: two other threads hand off.)
PROGRAM = <<~RUBY
  ping = Queue.new
  pong = Queue.new
  other = Thread.new { #{HANDOFFS}.times { pong << ping.pop } }
  handoffs = -> { #{HANDOFFS}.times { ping << 1; pong.pop } }
  cpu = Process.clock_gettime(Process::CLOCK_PROCESS_CPUTIME_ID, :nanosecond)
  #{ENV["MN"] ? "Thread.new(&handoffs).join" : "handoffs.call"}
  other.join
  puts (Process.clock_gettime(Process::CLOCK_PROCESS_CPUTIME_ID, :nanosecond) - cpu) / (2.0 * #{HANDOFFS})
RUBY

profilers = {
  "none" => "",
  "contprof" => "require 'contprof'; Contprof.start(log_level: 'error'); at_exit { Contprof.stop }",
}
# Where Contprof's part goes (EXTRA=1): its CPU timers as POSIX timers, or none.
if ENV["EXTRA"]
  profilers["contprof-posix"] = profilers["contprof"].sub("log_level:", "cpu_timers: :posix, log_level:")
  profilers["contprof-notimers"] = profilers["contprof"].sub("log_level:", "cpu_timers: false, log_level:")
end
profilers["stackprof"] = "require 'stackprof'; StackProf.start(mode: :cpu, interval: 1000)" if Peers.available?("stackprof")
# rperf times what threads do off the GVL through the same hooks (wall mode).
profilers["rperf"] = "require 'rperf'; Rperf.start(frequency: 100, mode: :wall); at_exit { Rperf.stop }" if Peers.available?("rperf")

results = Hash.new { |h, k| h[k] = [] }
RUNS.times do
  profilers.to_a.shuffle.each do |name, setup|
    env = ENV["MN"] ? Peers.env.merge("RUBY_MN_THREADS" => "1") : Peers.env
    out = IO.popen(env, [RbConfig.ruby, "-I#{File.join(ROOT, "lib")}", "-e", "#{setup}\n#{PROGRAM}"], &:read)
    abort "#{name}: the run failed" unless $?.success?
    results[name] << Float(out.lines.last)
  end
end

median = ->(values) { values.sort[values.size / 2] }
base = median.(results["none"])
puts "Ruby #{RUBY_VERSION}#{" (M:N threads)" if ENV["MN"]}, #{HANDOFFS} handoffs each way, median of #{RUNS} runs: process CPU per GVL handoff"
results.each do |name, values|
  m = median.(values)
  puts format("  %-10s %8.0f ns  %+6.0f ns  (runs: %.0f-%.0f ns)", name, m, m - base, values.min, values.max)
end
