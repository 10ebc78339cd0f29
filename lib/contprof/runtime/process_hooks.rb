# frozen_string_literal: true

module Contprof
  # Hooks into what the application does to the process that profiling must follow: fork,
  # daemon, exec, trapping SIGPROF and starting Ractors. For whatever is profiling: the
  # Contprof.start profiler, or a CpuAndWallTimeWorker used on its own.
  module ProcessHooks
    class << self
      # Ractors started in this process (their threads are not profiled).
      attr_reader :ractors_started

      # In a new child process: a fresh, running profiler with none of the parent's
      # samples. Once per process, however many hooks saw the fork.
      def after_fork_in_child
        return if @pid == Process.pid

        @pid = Process.pid
        if (profiler = Profiler.running)
          profiler.after_fork_in_child
        elsif (worker = Collectors::CpuAndWallTimeWorker.running_worker)
          worker.after_fork_in_child
        end
      end

      def ractor_started
        @ractors_started = ractors_started.to_i + 1
        Profiler.running&.report_gaps
      end

      # Whether `signal` (as trap takes it: "PROF", "SIGPROF", :PROF, 27) is SIGPROF.
      def sigprof?(signal)
        name = signal.is_a?(Integer) ? Signal.signame(signal) : signal.to_s.delete_prefix("SIG")
        name == "PROF"
      end
    end

    # Kernel#fork, Process.fork and IO.popen("-") all go through Process._fork.
    module Fork
      def _fork
        pid = super
        ProcessHooks.after_fork_in_child if pid.zero?
        pid
      end
    end

    # Process.daemon forks without Process._fork (Ruby calls daemon(3)); it returns in the
    # child only.
    module Daemon
      def daemon(*arguments)
        result = super
        ProcessHooks.after_fork_in_child
        result
      end
    end

    # Stops profiling before exec (a SIGPROF pending at exec would kill the new program;
    # the profiler also flushes its last profile). When exec fails, profiling resumes.
    module Exec
      def exec(*arguments, **options)
        profiler = Profiler.running
        worker = profiler ? nil : Collectors::CpuAndWallTimeWorker.running_worker
        profiler&.stop
        worker&.stop
        super(*arguments, **options)
      ensure
        ProcessHooks::Exec.resume(profiler, worker)
      end

      # After a failed exec. Never raises: exec's own error is the one the caller sees.
      def self.resume(profiler, worker)
        profiler.start(periodic: profiler.periodic?) if profiler && !profiler.running?
        worker&.start
      rescue StandardError => e
        Lifecycle.log(Contprof.logger, :warn) { "profiling could not resume after a failed exec: #{e.class}: #{e.message}" }
      end
    end

    # Kernel#exec is private (`obj.exec` is not a method every object answers to): so is
    # the hook in front of it.
    module PrivateExec
      include Exec
      private :exec
    end

    # The application trapping SIGPROF takes it over: profiling goes on without CPU
    # timers (CPU read from the threads' clocks), whose signals would otherwise reach the
    # application's handler, or kill it under "DEFAULT". Said once in the log and in stats.
    module Signals
      def trap(signal, *arguments, &block)
        worker = Profiler.running&.worker || Collectors::CpuAndWallTimeWorker.running_worker
        if worker && ProcessHooks.sigprof?(signal)
          worker.give_up_cpu_timers
          Profiler.running&.report_gaps
        end
        super
      end
    end

    module PrivateSignals
      include Signals
      private :trap
    end

    module Ractors
      def new(*arguments, **options, &block)
        ProcessHooks.ractor_started
        super
      end
    end
  end

  Process.singleton_class.prepend(ProcessHooks::Fork, ProcessHooks::Daemon)
  Kernel.prepend(ProcessHooks::PrivateExec, ProcessHooks::PrivateSignals)
  [Kernel.singleton_class, Process.singleton_class].each { |target| target.prepend(ProcessHooks::Exec) }
  [Kernel.singleton_class, Signal.singleton_class].each { |target| target.prepend(ProcessHooks::Signals) }
  Ractor.singleton_class.prepend(ProcessHooks::Ractors) if defined?(Ractor)
end
