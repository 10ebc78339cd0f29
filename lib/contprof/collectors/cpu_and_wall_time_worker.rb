# frozen_string_literal: true

module Contprof
  module Collectors
    # Samples every thread's stack, CPU time and wall time until stopped: wall time every
    # interval on a background thread's clock, CPU time on each thread's own CPU clock. The
    # mechanism (signals, timers, a postponed job on the thread holding the GVL) is in C:
    # see ext/contprof/sampling/cpu_and_wall_time_worker.c. This class holds the settings
    # and the lifecycle: start, stop, and the fork and exec hooks.
    class CpuAndWallTimeWorker

      attr_reader :recorder, :collector, :interval, :overhead_target

      class << self
        # The worker currently running in this process, if any (there is at most one).
        attr_accessor :running_worker
      end

      # cpu_timers: true gives every thread a CPU-time timer that signals it (SIGPROF) each
      # time it has used an interval of CPU, where its CPU samples are taken: a perf event
      # where the kernel allows it (exact), else a POSIX timer (checked at the kernel's
      # tick). :posix asks for POSIX timers only. false: no signal at all; CPU is read from
      # the threads' clocks at wall rounds, which places it less exactly.
      # signals: false is the same as cpu_timers: false (the only signals are the timers').
      # allocation_interval: sample one allocation in that many, on average, into the
      # recorder's alloc-samples and alloc-size types; :auto: at least Limits::ALLOCATION_INTERVAL,
      # more when the program allocates fast, to keep the cost low (see
      # ext/contprof/sampling/allocation_sampler.c); nil: none.
      # timeline: every CPU and wall sample carries its timestamp (end_timestamp_ns).
      def initialize(recorder:, max_frames: Limits::MAX_FRAMES, interval: Limits::INTERVAL, signals: true,
                     overhead_target: Limits::OVERHEAD_TARGET, cpu_timers: true, allocation_interval: nil,
                     timeline: false)
        unless interval.is_a?(Numeric) && Limits::INTERVALS.cover?(interval)
          raise ArgumentError, "interval must be a number of seconds from #{Limits::INTERVALS.min} to #{Limits::INTERVALS.max}, " \
                               "got #{interval.inspect}"
        end
        raise ArgumentError, "signals must be true or false, got #{signals.inspect}" unless [true, false].include?(signals)
        unless [true, false, :posix].include?(cpu_timers)
          raise ArgumentError, "cpu_timers must be true, false or :posix, got #{cpu_timers.inspect}"
        end
        unless overhead_target.is_a?(Numeric) && overhead_target.positive? && overhead_target <= 1
          raise ArgumentError, "overhead_target must be a fraction of one core above 0 and at most 1 " \
                               "(0.02 = 2%), got #{overhead_target.inspect}"
        end

        unless allocation_interval.nil? || allocation_interval == :auto ||
               (allocation_interval.is_a?(Integer) && Limits::ALLOCATION_INTERVALS.cover?(allocation_interval))
          raise ArgumentError, "allocation_interval must be nil, :auto or an Integer from " \
                               "#{Limits::ALLOCATION_INTERVALS.min} to #{Limits::ALLOCATION_INTERVALS.max}, " \
                               "got #{allocation_interval.inspect}"
        end
        Allocations.check_ruby! if allocation_interval

        @recorder = recorder
        @interval = interval.to_f
        @signals = signals
        @overhead_target = overhead_target.to_f
        @collector = ThreadContext.new(recorder: recorder, max_frames: max_frames, timeline: timeline)
        _native_initialize(@collector, @interval, @overhead_target, signals && cpu_timers, max_frames,
                           allocation_interval == :auto ? -Limits::ALLOCATION_INTERVAL : allocation_interval || 0)
        @lifecycle = Mutex.new
        @thread = nil
      end

      def signals?
        @signals
      end

      # Starts sampling. Does nothing when already running. When the worker thread cannot
      # be created (ThreadError under a thread limit), everything prepare_start installed
      # (signal handler, hooks, CPU timers) is removed before the error propagates.
      def start
        Lifecycle.locked(@lifecycle) do
          return self if running?

          _native_prepare_start
          @ended_without_stop = nil
          self.class.running_worker = self
          begin
            start_thread
          rescue Exception # rubocop:disable Lint/RescueException -- undone, then re-raised
            @thread = nil
            _native_request_stop
            finish_stop
            raise
          end
        end
        _native_wait_until_started
        self
      end

      # Stops sampling. Does nothing when not running. Returns without waiting for the
      # background thread to end (it needs the GVL to, which can take long behind busy
      # threads): no signal can be sent once this returns. A sampling failure is not
      # raised here: see #failure.
      #
      # Sampling ends at the first line, before any other Ruby code runs: a sampling round
      # already queued on this thread (its CPU timer fired in code that does not check for
      # interrupts) would otherwise run at the first check in here and record the
      # profiler's own frames with the application's CPU. (Stopping a worker that is not
      # running does nothing: the request only clears flags.)
      def stop
        _native_request_stop
        thread = Lifecycle.locked(@lifecycle) do
          current = @thread
          @thread = nil
          current
        end
        return self unless thread

        # One last round, so that the time since the previous one is recorded too.
        _native_final_round if failure.nil?
        finish_stop
        self
      end

      def running?
        !@thread.nil? && @thread.alive? && _native_active?
      end

      # The background thread of the current run (nil when stopped).
      attr_reader :thread

      # The exception that stopped sampling, if any.
      def failure
        _native_failure
      end

      def stats
        _native_stats.merge(@collector.stats.except(:rounds))
                     .merge(interval_ns: (@interval * 1e9).round, signals: @signals, running: running?)
      end

      # Whether samples are being taken right now (false once #stop has begun).
      def sampling?
        _native_sampling?
      end

      # The rest of this run samples without CPU timers, hence without SIGPROF: the
      # application takes SIGPROF over (ProcessHooks::Signals). Its threads' CPU is then
      # read from their clocks at wall samples.
      def give_up_cpu_timers
        _native_give_up_cpu_timers
        self
      end

      # Records every thread's time up to now, on the calling thread (when running).
      def wall_round_now
        _native_wall_round_now
        self
      end

      # Why sampling ended without #stop (the worker thread was killed), or nil.
      attr_reader :ended_without_stop

      # In a forked child (called by the fork hook): sampling restarts from scratch, with
      # none of the parent's samples. Returns false, leaving the child stopped, when the
      # fork came in the middle of #stop (sampling had already ended).
      def after_fork_in_child
        @recorder.reset_after_fork
        _native_reset_after_fork
        @lifecycle = Mutex.new
        unless sampling?
          @thread = nil
          finish_stop # what the parent's #stop had not done yet
          return false
        end

        start_thread
        _native_wait_until_started
        true
      end

      private

      # Removes the signal handler and hooks of the current run; this worker is no longer
      # the running one.
      def finish_stop
        _native_finish_stop(_native_run)
        self.class.running_worker = nil if self.class.running_worker.equal?(self)
      end

      def start_thread
        run = _native_run
        # A profiler thread: left out of every sample from its creation on.
        @thread = Native.profiler_thread do
          Thread.current.name = "Contprof::CpuAndWallTimeWorker"
          Thread.current.report_on_exception = false # reported below, in one line
          failure = _native_sampling_loop(run)
          if failure
            # Said once: as the profiler's gap when a profiler runs this worker, else here.
            if (profiler = Profiler.running) && profiler.worker.equal?(self)
              profiler.report_gaps
            else
              Lifecycle.log(Contprof.logger, :error) { "sampling stopped after an error: #{failure.class}: #{failure.message}" }
            end
            raise failure
          end
        ensure
          if failure.nil? && sampling? && _native_run == run
            @ended_without_stop = "the sampling thread was killed (Thread#kill or exit)"
          end
          # However this run ends (a sampling failure, kill, VM shutdown), the signal
          # handler and hooks go; a no-op when #stop did it already, or a newer run started.
          _native_finish_stop(run)
          self.class.running_worker = nil if failure && self.class.running_worker.equal?(self)
        end
      end
    end
  end
end
