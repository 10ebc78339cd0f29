# frozen_string_literal: true

# What the test apps of test/runtime/production_servers_test.rb measure of themselves, written to
# files of their own in $TRUTH_DIR (one per process, appended to), so that the test can
# hold every process's profiles against them whichever process served what:
#
#   truth-<pid>.jsonl   per request or job: the CPU time the thread that ran it spent in it
#   parent-<pid>.jsonl  each time a process forked a child: the CPU it then burned on its
#                       own thread, and the CPU-timer signals its profiler heard meanwhile
#   exit-<pid>.json     at exit: the profiler's worker stats
#
# The apps run with and without Contprof (the test compares the servers' own behaviour):
# without it, the stats are absent. Lines are short enough to be written whole by one
# write(2) in append mode, so processes never interleave them.
require "json"

module ForkingTruth
  DIR = ENV.fetch("TRUTH_DIR")
  # The CPU a parent burns after each fork: 20 timer signals at the default 10 ms
  # interval, about 13 at the slowest the sampler went in these tests; a parent that no
  # longer hears its timers gets none.
  PARENT_BURN = 0.2

  class << self
    def thread_cpu
      Process.clock_gettime(Process::CLOCK_THREAD_CPUTIME_ID)
    end

    def burn(seconds)
      deadline = thread_cpu + seconds
      nil while thread_cpu < deadline
    end

    # Runs the block, recording the CPU this thread spent in it under `name`.
    def measure(name)
      before = thread_cpu
      result = yield
      append("truth", "name" => name, "cpu" => thread_cpu - before)
      result
    end

    # In a parent right after it forked a child (a server's hook, or a runner's own work):
    # runs the block (by default, burns PARENT_BURN of CPU), recording the CPU it took, the
    # timer signals the profiler heard meanwhile and the timers' period (the longer of
    # before and after: the sampler may slow down), and, with a name, the CPU as that
    # name's truth.
    def after_fork_in_parent(name: nil)
      before = worker_stats
      cpu = thread_cpu
      block_given? ? yield : burn(PARENT_BURN)
      cpu = thread_cpu - cpu
      after = worker_stats
      append("truth", "name" => name, "cpu" => cpu) if name
      return unless before && after

      append("parent", "cpu" => cpu, "signals" => after[:timer_signals] - before[:timer_signals],
                       "period_ns" => [before[:cpu_timers_period_ns], after[:cpu_timers_period_ns]].max,
                       "cpu_timers" => after[:cpu_timers])
    end

    # Registers the exit record once per program (a forked child inherits it, and so writes
    # its own when it exits).
    def record_at_exit
      return if $forking_truth_at_exit # rubocop:disable Style/GlobalVars -- once per program, across files

      $forking_truth_at_exit = true # rubocop:disable Style/GlobalVars
      at_exit do
        stats = worker_stats
        File.write(File.join(DIR, "exit-#{Process.pid}.json"),
                   JSON.generate("pid" => Process.pid, "worker" => stats && stats.slice(:timer_signals, :threads_not_hearing_timers,
                                                                                        :cpu_timers, :cpu_timers_given_up)))
      end
    end

    def worker_stats
      defined?(Contprof::Profiler) && Contprof::Profiler.running&.stats&.fetch(:worker)
    end

    private

    def append(kind, record)
      File.write(File.join(DIR, "#{kind}-#{Process.pid}.jsonl"), "#{JSON.generate(record.merge("pid" => Process.pid))}\n",
                 mode: "a")
    end
  end

  # Rack middleware: each request's CPU, by path (ids as :id).
  class Middleware
    def initialize(app)
      @app = app
    end

    def call(env)
      ForkingTruth.measure(env["PATH_INFO"].sub(%r{/\d+\z}, "/:id")) { @app.call(env) }
    end
  end
end
