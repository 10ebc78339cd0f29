# frozen_string_literal: true

module Contprof
  # Starting and stopping, safely from any thread and from trap handlers.
  module Lifecycle
    # Serializes starts and stops across threads: one profiler at a time, started once.
    LOCK = Mutex.new

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
      def log(logger, level, &message)
        return logger.public_send(level, &message) unless trap_context?

        Thread.new { logger.public_send(level, &message) }.report_on_exception = false
      end

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
