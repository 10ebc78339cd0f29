# frozen_string_literal: true

module Contprof
  # The thread that flushes a profiler every `period` seconds, with up to JITTER of jitter
  # so that a fleet of processes does not upload in lockstep. Deadlines follow a fixed
  # cadence: the time a flush takes (which, under load, includes waiting for the GVL) does
  # not push the next one back. A profiler thread: left out of every sample.
  class Scheduler
    JITTER = 0.05

    # flush: called on the scheduler's thread at each deadline.
    def initialize(period:, logger:, &flush)
      @period = period
      @logger = logger
      @flush = flush
      @lock = Mutex.new
      @wakeup = ConditionVariable.new
      @stopping = false
    end

    attr_reader :thread

    def start
      @thread = Native.profiler_thread do
        Thread.current.name = "Contprof::Scheduler"
        Thread.current.report_on_exception = false
        run
      end
      self
    end

    # Asks the thread to end (it does at once unless it is flushing); returns it, for the
    # caller to wait for or not. Also from a trap handler.
    def stop
      Lifecycle.locked(@lock) do
        @stopping = true
        @wakeup.signal
      end
      @thread
    end

    private

    def run
      deadline = Lifecycle.monotonic
      loop do
        deadline += @period * (1 + rand(-JITTER..JITTER))
        @lock.synchronize do
          @wakeup.wait(@lock, deadline - Lifecycle.monotonic) while !@stopping && Lifecycle.monotonic < deadline
        end
        break if @stopping

        @flush.call
      end
    rescue Exception => e # rubocop:disable Lint/RescueException -- logged; the application must not see it
      # The thread ends here, without an exception: Profiler#stop joins it, and a join
      # raises the exception a thread ended with in the joining thread (at exit: the
      # application's main thread). (A flush contains its own failures: this is for
      # what reaches the thread from outside, e.g. another thread's Thread#raise.)
      Lifecycle.log(@logger, :error) { "scheduler stopped: #{e.class}: #{e.message}" } unless e.is_a?(ThreadError)
    end
  end
end
