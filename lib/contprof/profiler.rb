# frozen_string_literal: true

require "logger"

module Contprof
  # A profile ready to export: its period, gzip-compressed pprof and tags.
  ExportedProfile = Struct.new(:start, :finish, :pprof, :tags, :paths, keyword_init: true) do
    def duration
      finish - start
    end

    # The profile as Ruby objects (see Contprof::Pprof).
    def decode
      Pprof.decode(pprof)
    end
  end

  # Continuous profiling: a sampling worker feeding a StackRecorder, and a scheduler
  # thread that, every upload_period (with up to 5% jitter, so that a fleet does not
  # upload in lockstep), serializes the recorder and hands the profile to every exporter.
  #
  # An exporter that fails is logged and counted; its profile is dropped (memory stays
  # bounded, nothing is retried) and the other exporters are unaffected. Nothing an
  # exporter or the serializer raises reaches the application.
  class Profiler
    JITTER = 0.05

    class << self
      # The profiler running in this process, if any.
      attr_accessor :running
    end

    attr_reader :settings, :recorder, :worker, :exporters

    def initialize(settings, logger:)
      @settings = settings
      @logger = logger
      @recorder = StackRecorder.new
      @worker = Collectors::CpuAndWallTimeWorker.new(
        recorder: @recorder, max_frames: settings.max_frames, interval: settings.interval,
        signals: settings.signals?, cpu_timers: settings.cpu_timers?, overhead_target: settings.overhead_target,
      )
      @exporters = build_exporters
      @lifecycle = Mutex.new
      @stats = Hash.new(0)
      @periodic = false
      @scheduler = nil
    end

    def running?
      self.class.running.equal?(self)
    end

    # Whether the scheduler flushes periodically (Contprof.start) or only at stop
    # (Contprof.profile).
    def periodic?
      @periodic
    end

    # Starts sampling, and (with periodic) the scheduler's periodic flushes.
    def start(periodic: true)
      @lifecycle.synchronize do
        raise Error, "a Contprof profiler is already running in this process" if self.class.running

        @periodic = periodic
        start_scheduler if periodic
        @worker.start
        self.class.running = self
      end
      @logger.info { "started: #{@settings.inspect}; exporters: #{@exporters.map(&:name).join(", ")}" }
      self
    end

    # Stops sampling and flushes what is left. Returns the last profile (an
    # ExportedProfile). Waits at most about upload_timeout for uploads in progress.
    def stop
      # Sampling ends first, before this method runs any other Ruby code (see
      # CpuAndWallTimeWorker#stop); a no-op when this profiler is not running.
      @worker.stop
      scheduler = @lifecycle.synchronize do
        return nil unless running?

        current = @scheduler
        @scheduler = nil
        @stopping = true
        @wakeup&.signal
        current
      end
      # Wait for the scheduler only when it is flushing (its upload may be under way): an
      # idle one just goes. Waiting for a thread means handing it the GVL, which behind busy
      # application threads can take a time slice per thread.
      if scheduler&.alive? && @flushing && !scheduler.join(@settings.upload_timeout + 1)
        scheduler.kill # cancels an upload in progress
      end
      last = flush(final: true)
      self.class.running = nil
      last
    end

    # Serializes the recorder and exports the profile. Never raises. The last flush keeps
    # the GVL while encoding, for the same reason as above.
    def flush(final: false)
      @flushing = true
      start, finish, pprof = @recorder.serialize(release_gvl: !final)
      profile = ExportedProfile.new(start: start, finish: finish, pprof: pprof, tags: Tags.build(@settings), paths: [])
      @stats[:flushes] += 1
      @exporters.each { |exporter| export(exporter, profile) }
      profile
    rescue StandardError => e
      @stats[:flush_failures] += 1
      @logger.error { "could not serialize the profile: #{e.class}: #{e.message}" }
      nil
    ensure
      @flushing = false
    end

    def stats
      @stats.merge(worker: @worker.stats, recorder: @recorder.stats)
    end

    # In a forked child (called by the fork hook): a fresh profiler, with none of the
    # parent's samples, a new runtime-id (Tags) and its own scheduler thread.
    def after_fork_in_child
      @lifecycle = Mutex.new
      @stats = Hash.new(0)
      @scheduler = nil
      # A fork in the middle of #stop (sampling already ended): the child does not profile.
      start_scheduler if @periodic && @worker.sampling?
      self.class.running = nil unless @worker.after_fork_in_child
    end

    private

    def build_exporters
      list = []
      list << Exporters::File.new(@settings.output) if @settings.output
      if @settings.agent_url || @settings.api_key
        list << Exporters::Datadog.new(agent_url: @settings.agent_url, site: @settings.site,
                                       api_key: @settings.api_key, timeout: @settings.upload_timeout)
      end
      if @settings.pyroscope_url
        list << Exporters::Pyroscope.new(url: @settings.pyroscope_url,
                                         application_name: @settings.pyroscope_application_name || @settings.service,
                                         user_tags: @settings.tags, timeout: @settings.upload_timeout)
      end
      list
    end

    def export(exporter, profile)
      if profile.duration < exporter.minimum_duration
        @stats[:"#{exporter.name}_skipped_short"] += 1
        @logger.debug { "#{exporter.name}: skipped a #{profile.duration.round(3)} s profile" }
        return
      end
      result = exporter.export(profile)
      profile.paths << result if exporter.is_a?(Exporters::File)
      @stats[:"#{exporter.name}_exported"] += 1
      @logger.info { "#{exporter.name}: exported #{profile.pprof.bytesize} bytes#{" to #{result}" if result.is_a?(String)}" }
    rescue StandardError => e
      @stats[:"#{exporter.name}_failed"] += 1
      @logger.warn { "#{exporter.name}: export failed, profile dropped: #{e.class}: #{e.message}" }
    end

    def start_scheduler
      @stopping = false
      @wakeup = ConditionVariable.new
      # A profiler thread: left out of every sample from its creation on.
      @scheduler = Native.profiler_thread do
        Thread.current.name = "Contprof::Scheduler"
        Thread.current.report_on_exception = false
        run_scheduler
      end
    end

    def run_scheduler
      # Deadlines follow a fixed cadence: the time a flush takes (which, under load,
      # includes waiting for the GVL) does not push the next one back.
      deadline = monotonic
      loop do
        deadline += @settings.upload_period * (1 + rand(-JITTER..JITTER))
        @lifecycle.synchronize do
          @wakeup.wait(@lifecycle, deadline - monotonic) while !@stopping && monotonic < deadline
        end
        break if @stopping

        flush
      end
    rescue Exception => e # rubocop:disable Lint/RescueException -- logged; the application must not see it
      @logger.error { "scheduler stopped: #{e.class}: #{e.message}" } unless e.is_a?(ThreadError)
      raise
    end

    def monotonic
      Process.clock_gettime(Process::CLOCK_MONOTONIC)
    end
  end
end
