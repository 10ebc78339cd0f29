# frozen_string_literal: true

# Speed and size of `contprof report` on a big profile, side by side with `go tool pprof`.
#
#   ruby -Ilib bench/report.rb              (STACKS=20000 ROUNDS=3 by default)
#
# Writes three profiles of STACKS unique stacks on 4 threads (see
# test/support/synthetic_profiles.rb) through Contprof::StackRecorder: a server-like one
# (20 to 90 frames over about 2,000 functions, one stack in 50 a shallow idle wait), a
# worst case for the flame graph (the same, but one stack in 4 an idle wait at full depth,
# each wide enough to be drawn in some view), and one of many functions (40 frames over
# 120,000 functions in 300 files, as a large application with many gems gives). On each
# it runs, ROUNDS times each, taking turns: `contprof report --top`, `--folded`,
# `--flamegraph`, `--speedscope`, and `go tool pprof -top` on the same file. Prints the median wall time of each command,
# its ratio to Go's, and the size of what it wrote. Every command is a fresh process,
# start-up included, as a user runs it.
require "open3"
require "rbconfig"
require "tmpdir"
require_relative "../test/support/synthetic_profiles"

ROOT = File.expand_path("..", __dir__)
EXE = File.join(ROOT, "exe", "contprof")
STACKS = Integer(ENV.fetch("STACKS", "20000"))
ROUNDS = Integer(ENV.fetch("ROUNDS", "3"))

def timed(command, env: {})
  started = Process.clock_gettime(Process::CLOCK_MONOTONIC)
  out, err, status = Open3.capture3(env, *command)
  raise "#{command.join(" ")} failed:\n#{err}" unless status.success?

  [Process.clock_gettime(Process::CLOCK_MONOTONIC) - started, out]
end

def median(list)
  list.sort[list.size / 2]
end

SHAPES = {
  "server-like" => -> { SyntheticProfiles.wide(stacks: STACKS) },
  "worst case (deep idle waits)" => -> { SyntheticProfiles.wide(stacks: STACKS, idle_one_in: 4, deep_idle: true) },
  "many functions (120,000 in 300 files)" => -> { SyntheticProfiles.many_functions(stacks: STACKS) },
}.freeze

SHAPES.each do |shape, build|
  Dir.mktmpdir("contprof-bench-report") do |dir|
    pprof = File.join(dir, "big.pprof")
    bytes = build.call
    File.binwrite(pprof, bytes)
    html = File.join(dir, "flame.html")
    speedscope = File.join(dir, "speedscope.json")
    go_env = { "HOME" => dir }
    commands = {
      "contprof report --top" => [[RbConfig.ruby, EXE, "report", pprof, "--top", "20"]],
      "contprof report --folded" => [[RbConfig.ruby, EXE, "report", pprof, "--folded"]],
      "contprof report --flamegraph" => [[RbConfig.ruby, EXE, "report", pprof, "--flamegraph", html]],
      "contprof report --speedscope" => [[RbConfig.ruby, EXE, "report", pprof, "--speedscope", speedscope]],
      "go tool pprof -top" => [%w[go tool pprof -top] + [pprof], go_env],
    }
    # Go builds its pprof tool on first use: once before timing.
    timed(commands["go tool pprof -top"][0], env: go_env)
    times = Hash.new { |hash, key| hash[key] = [] }
    ROUNDS.times do
      commands.each { |name, (command, env)| times[name] << timed(command, env: env || {}).first }
    end
    go = median(times["go tool pprof -top"])
    puts "#{shape} profile: #{STACKS} unique stacks, #{bytes.bytesize} bytes of gzip-compressed pprof; " \
         "median of #{ROUNDS} runs each, taking turns"
    puts format("%-30s %9s %12s %14s", "command", "time", "vs go -top", "output")
    commands.each_key do |name|
      output = { "contprof report --flamegraph" => html, "contprof report --speedscope" => speedscope }[name]
      size = output ? format("%.2f MB", File.size(output) / 1e6) : "-"
      puts format("%-30s %8.2fs %11.2fx %14s", name, median(times[name]), median(times[name]) / go, size)
    end
  end
  puts
end
