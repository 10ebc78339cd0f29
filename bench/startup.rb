# frozen_string_literal: true

# What profiling costs a short-lived process (a rake task, a script), side by side with
# bare Ruby and the profilers users would pick instead, in one run:
#
# 1. Loading: CPU (user + system) of `ruby -e` programs that only require a profiler, or
#    require Contprof and start it with a file destination. `contprof exec` adds this to
#    every Ruby process it starts (each rake or bundle exec child). Two figures per case:
#    "to the end of the program", the child's own CPU clock read as its last statement
#    (start-up and the program, not the exit); "whole process", the child's rusage (the
#    exit too: the last flush writes a file).
# 2. Whole commands, as a user runs them: `ruby -e 1` and a short program (a quarter of a
#    second of allocating work) bare, under `contprof exec` (start, stop and the profile
#    written at exit, the wrapper process included), under stackprof (required and run
#    around the program, cpu mode, its file written) and under `ddprofrb exec` (Datadog's
#    profiler, its defaults, uploading to a stand-in agent at exit). Wall time and CPU of
#    the whole process tree, medians over RUNS interleaved runs.
#
#   ruby -Ilib bench/startup.rb            # RUNS=40
require "rbconfig"
require "tmpdir"
require_relative "support/peers"

RUNS = Integer(ENV.fetch("RUNS", "40"))
LIB = File.expand_path("../lib", __dir__)
PRINT_CPU = "print Process.clock_gettime(Process::CLOCK_PROCESS_CPUTIME_ID)"

def stackprof_available?
  system(RbConfig.ruby, "-rstackprof", "-e", "", err: File::NULL)
end

def measure(arguments)
  before = Process.times
  output = IO.popen([RbConfig.ruby, *arguments], &:read)
  Process.wait2 rescue nil # (IO.popen waited already)
  after = Process.times
  [Float(output), (after.cutime - before.cutime) + (after.cstime - before.cstime)]
end

def median(values)
  sorted = values.sort
  sorted[sorted.size / 2]
end

Dir.mktmpdir("contprof-startup") do |dir|
  cases = {
    "bare ruby" => ["-e", PRINT_CPU],
    "require contprof" => ["-I#{LIB}", "-rcontprof", "-e", PRINT_CPU],
    "require contprof + start(output:)" =>
      ["-I#{LIB}", "-rcontprof", "-e", "Contprof.start(output: #{dir.inspect}); #{PRINT_CPU}"],
  }
  cases["require stackprof"] = ["-rstackprof", "-e", PRINT_CPU] if stackprof_available?
  results = cases.transform_values { [[], []] }
  RUNS.times do
    cases.each do |name, arguments|
      own, whole = measure(arguments)
      results[name][0] << own
      results[name][1] << whole
    end
  end

  bare_own = median(results["bare ruby"][0])
  bare_whole = median(results["bare ruby"][1])
  puts "CPU per process, medians of #{RUNS} runs (ruby #{RUBY_VERSION})"
  puts format("%-36s %14s %12s %14s %12s", "case", "to the end", "over bare", "whole process", "over bare")
  results.each do |name, (own, whole)|
    puts format("%-36s %11.1f ms %9.1f ms %11.1f ms %9.1f ms", name, median(own) * 1e3,
                (median(own) - bare_own) * 1e3, median(whole) * 1e3, (median(whole) - bare_whole) * 1e3)
  end
end

# 2. Whole commands
SHORT_PROGRAM = "list = []; 200_000.times { |i| list << \"item-\#{i}\" }; list.sort!; puts list.size"

def run_tree(env, command)
  before = Process.times
  started = Process.clock_gettime(Process::CLOCK_MONOTONIC)
  system(env, *command, out: File::NULL, err: File::NULL) or raise "#{command.join(" ")} failed"
  wall = Process.clock_gettime(Process::CLOCK_MONOTONIC) - started
  after = Process.times
  [wall, (after.cutime - before.cutime) + (after.cstime - before.cstime)]
end

Dir.mktmpdir("contprof-startup") do |dir|
  contprof = [RbConfig.ruby, "-I#{LIB}", File.expand_path("../exe/contprof", __dir__), "exec", "-o", dir, "--"]
  programs = { "ruby -e 1" => "1", "short program" => SHORT_PROGRAM }
  commands = {}
  programs.each do |label, code|
    commands["#{label}: bare"] = [{}, [RbConfig.ruby, "-e", code]]
    commands["#{label}: contprof exec"] = [{}, [*contprof, RbConfig.ruby, "-e", code]]
    if stackprof_available?
      wrapped = "StackProf.run(mode: :cpu, interval: 1000, out: #{File.join(dir, "stackprof.dump").inspect}) { #{code} }"
      commands["#{label}: stackprof"] = [{}, [RbConfig.ruby, "-rstackprof", "-e", wrapped]]
    end
  end
  if Peers.available?("datadog")
    agent_port, sink = Peers.sink
    env = Peers.env.merge("DD_PROFILING_ENABLED" => "true", "DD_TRACE_ENABLED" => "false",
                          "DD_TELEMETRY_ENABLED" => "false", "DD_AGENT_HOST" => "127.0.0.1",
                          "DD_TRACE_AGENT_PORT" => agent_port.to_s, "RUBYOPT" => "-rdatadog/profiling/preload")
    programs.each { |label, code| commands["#{label}: datadog"] = [env, [RbConfig.ruby, "-e", code]] }
  end
  results = commands.transform_values { [[], []] }
  begin
    RUNS.times do
      commands.each do |name, (env, command)|
        wall, cpu = run_tree(env, command)
        results[name][0] << wall
        results[name][1] << cpu
      end
    end
  ensure
    Process.kill("KILL", sink) if sink
  end
  puts
  puts "Whole commands: wall time and CPU of the process tree, medians of #{RUNS} runs"
  puts format("%-36s %10s %12s %10s %12s", "command", "wall", "over bare", "CPU", "over bare")
  results.each do |name, (walls, cpus)|
    bare = results["#{name.split(":").first}: bare"]
    puts format("%-36s %7.1f ms %9.1f ms %7.1f ms %9.1f ms", name, median(walls) * 1e3,
                (median(walls) - median(bare[0])) * 1e3, median(cpus) * 1e3, (median(cpus) - median(bare[1])) * 1e3)
  end
end
