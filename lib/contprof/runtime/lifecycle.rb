# frozen_string_literal: true

module Contprof
  # Starting and stopping, safely from any thread and from trap handlers.
  module Lifecycle
    # Serializes starts and stops across threads: one profiler at a time, started once.
    LOCK = Mutex.new

    # What a failure inside Contprof (a flush, an export, a log line) may raise and what is
    # then contained: everything but the application's own signals (Interrupt, SIGTERM's
    # SignalException) and exits, which stay the application's to see. A deep recursion, a
    # huge allocation or a failed autoload in the profiler must not end the program.
    FAILURES = [StandardError, ScriptError, NoMemoryError, SystemStackError, SecurityError].freeze

    class << self
      # Seconds on the monotonic clock: deadlines that a change of the wall clock cannot move.
      def monotonic
        Process.clock_gettime(Process::CLOCK_MONOTONIC)
      end

      # Whether this code runs in a trap handler, where Ruby refuses Mutex#lock (the code the
      # handler interrupted may hold the lock).
      def trap_context?
        Mutex.new.synchronize { false }
      rescue ThreadError
        true
      end

      # logger.public_send(level) { message }, also in a trap handler, where Logger cannot
      # write (it takes a lock): there a thread writes it.
      # Never raises: a log that cannot be written (standard error closed, a full disk under
      # a file logger) must not turn a contained failure into the application's.
      def log(logger, level, &message)
        return quietly(logger, level, &message) unless trap_context?

        Thread.new { quietly(logger, level, &message) }.report_on_exception = false
      rescue *FAILURES
        nil
      end

      # Contprof.stop as the at_exit hook runs it: the program's exit status and output stay
      # its own. A signal arriving while the last profile is exported (Ctrl-C on an exit
      # that waits for a slow intake) cuts the export short (Profiler#stop says so once)
      # and the program ends as it was ending; without Contprof it would have ended before
      # the signal came. An exit called meanwhile (a trap handler's) is the program's and
      # goes on.
      def stop_at_exit
        Contprof.stop
      rescue SignalException
        nil
      rescue *FAILURES => e
        log(Contprof.logger, :error) { "stop at exit failed: #{e.class}: #{e.message}" }
      end

      def quietly(logger, level, &message)
        logger.public_send(level, &message)
      rescue *FAILURES
        nil
      end
      private :quietly

      # mutex.synchronize { yield }, also in a trap handler (an application that stops
      # profiling on SIGTERM, or execs on SIGHUP): there the lock is polled for (another
      # thread holds it briefly), or not taken at all when the interrupted code holds it
      # itself, since waiting for it would never end.
      def locked(mutex)
        return mutex.synchronize { yield } unless trap_context?
        return yield if mutex.owned?

        sleep 0.001 until mutex.try_lock
        begin
          yield
        ensure
          mutex.unlock
        end
      end
    end
  end
  private_constant :Lifecycle
end
