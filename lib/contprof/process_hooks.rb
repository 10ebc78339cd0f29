# frozen_string_literal: true

module Contprof
  # Hooks into fork and exec, for whatever is profiling: the Contprof.start profiler, or a
  # CpuAndWallTimeWorker used on its own.
  module ProcessHooks
    # Kernel#fork, Process.fork and IO.popen("-") all go through Process._fork: the child
    # gets a fresh, running profiler with none of the parent's samples.
    module Fork
      def _fork
        pid = super
        if pid.zero?
          if (profiler = Profiler.running)
            profiler.after_fork_in_child
          elsif (worker = Collectors::CpuAndWallTimeWorker.running_worker)
            worker.after_fork_in_child
          end
        end
        pid
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
        profiler.start(periodic: profiler.periodic?) if profiler && !profiler.running?
        worker&.start
      end
    end

    # Kernel#exec is private (`obj.exec` is not a method every object answers to): so is
    # the hook in front of it.
    module PrivateExec
      include Exec
      private :exec
    end
  end

  Process.singleton_class.prepend(ProcessHooks::Fork)
  Kernel.prepend(ProcessHooks::PrivateExec)
  [Kernel.singleton_class, Process.singleton_class].each { |target| target.prepend(ProcessHooks::Exec) }
end
