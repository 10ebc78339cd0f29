# frozen_string_literal: true

# What loading Contprof costs a process: CPU (user + system) of `ruby -e` programs that
# only require a profiler, or require Contprof and start it with a file destination, side
# by side with bare Ruby and stackprof, in one run. `contprof exec` adds this to every Ruby
# process it starts (each rake or bundle exec child).
#
#   ruby -Ilib bench/startup.rb            # RUNS=40
#
# Two figures per case, medians over RUNS interleaved runs:
# - "to the end of the program": the child's own CPU clock read as its last statement
#   (start-up and the program, not the exit);
# - "whole process": the child's rusage (the exit too: the last flush writes a file).
require "rbconfig"
require "tmpdir"

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
