# frozen_string_literal: true

require "logger"
require_relative "scheduler"
require_relative "../pprof/endpoint_counts_comment"

module Contprof
  # A profile ready to export: its period, gzip-compressed pprof, tags, the requests
  # Contprof::Rack counted per endpoint meanwhile (a Hash, empty when none), and, when an
  # exporter wants it, the same samples as an OTLP ExportProfilesServiceRequest (otlp;
  # gzip-compressed or not, see Exporters::Otlp.encoded), and the pprofs rewritten for an
  # exporter (extras: {merged_timeline:, relabeled:}, see StackRecorder#serialize).
  ExportedProfile = Struct.new(:start, :finish, :pprof, :tags, :paths, :endpoint_counts, :otlp, :extras,
                               keyword_init: true) do
    def duration
      finish - start
    end

    # The profile as Ruby objects (see Contprof::Pprof).
    def decode
      Pprof.decode(pprof)
    end
  end

  # Continuous profiling: a sampling worker feeding a StackRecorder, and a Scheduler that,
  # every upload_period, serializes the recorder and hands the profile to every exporter.
  #
  # An exporter that fails is counted and its profile dropped (memory stays bounded,
  # nothing is retried); the other exporters are unaffected. Each kind of failure of each
  # destination is logged once per process and Contprof.start (see #failed): a destination
  # that fails at every flush must not fill the application's log, and the counts in
  # #stats go on growing. Nothing an exporter or the serializer raises reaches the
  # application, not even what is no StandardError (see Lifecycle::FAILURES).
  class Profiler
    # How long stop waits, past upload_timeout, for cancelled uploads to end (a cancelled
    # request returns within milliseconds: HttpTransport wakes it).
    CANCEL_WAIT = 0.5
    # The kind of failure (see #failed) of exports that stop gave up at upload_timeout.
    TIMED_OUT_AT_STOP = "upload_timeout reached at stop"

    class << self
      # The profiler running in this process, if any.
      attr_accessor :running

      # Whether `key` ([exporter name, destination, kind of failure]) is new to this
      # process since the last continuous start, remembered from now on. Kept by the class,
      # not by a profiler: each Contprof.profile block makes a new profiler for the same
      # destinations. A forked child inherits what its parent said (a server forking a
      # child per job would otherwise log each failure once per job).
      def first_failure?(key)
        said = (@failures_said ||= {})
        return false if said.key?(key)

        said[key] = true
      end

      # A new continuous start (Contprof.start): failures are said again.
      def forget_failures_said
        @failures_said = {}
      end
    end

    attr_reader :settings, :recorder, :worker, :exporters

    # recorder_only: no worker of its own; another profiler copies samples into its
    # recorder (see #profile_block_into), whose sample types (`sample_types`) it takes.
    def initialize(settings, logger:, recorder_only: false, sample_types: nil)
      @settings = settings
      @logger = logger
      allocation = allocation_possible?
      @heap = allocation && settings.heap? && !recorder_only && heap_possible?
      if settings.heap_requested? && !allocation && !recorder_only
        log(:warn) { "heap profiling is off: it follows sampled allocations, and allocation profiling is off here" }
      end
      @recorder = StackRecorder.new(sample_types: sample_types || Collectors::Allocations.sample_types(allocation, @heap))
      unless recorder_only
        @worker = Collectors::CpuAndWallTimeWorker.new(
          recorder: @recorder, max_frames: settings.max_frames, interval: settings.interval,
          signals: settings.signals?, cpu_timers: settings.cpu_timers?, overhead_target: settings.overhead_target,
          allocation_interval: allocation ? settings.allocation_interval : nil, timeline: settings.timeline?,
        )
      end
      @exporters = Exporters.for(settings)
      otlp_encodings = @exporters.filter_map { |exporter| exporter.otlp_encoding if exporter.respond_to?(:otlp_encoding) }
      # Built now, not in the middle of a flush (it loads the exporter's file).
      @otlp_resource = Exporters::Otlp::Resource.new(settings) unless otlp_encodings.empty?
      # Compressed by the recorder (in C, as the pprof is) when every such exporter sends it so.
      @otlp_gzip = otlp_encodings.all?(:gzip)
      # Rewritten pprofs the exporters read instead of rewriting ours in Ruby.
      @serialize_extras = @exporters.each_with_object({}) do |exporter, extras|
        extras.merge!(exporter.serialize_extras) if exporter.respond_to?(:serialize_extras)
      end
      @uploads_to_datadog = @exporters.any? { |exporter| exporter.class.name == "Contprof::Exporters::Datadog" }
      @uploads_to_pyroscope = @exporters.any? { |exporter| exporter.class.name == "Contprof::Exporters::Pyroscope" }
      @lifecycle = Mutex.new
      @stats = Hash.new(0)
      reset_failures
      @periodic = false
      @scheduler = nil
    end

    def running?
      self.class.running.equal?(self)
    end

    # Whether profiles go to Datadog (Contprof::Rack then also labels `trace endpoint`).
    def uploads_to_datadog?
      @uploads_to_datadog
    end

    # Live-heap profiling was asked for: whether this Ruby can have it (else a warning).
    def heap_possible?
      reason = Collectors::Allocations.heap_unsupported_reason
      log(:warn) { "#{reason}; heap profiling is off" } if reason
      reason.nil?
    end

    # Whether allocations are sampled. Asked for explicitly, a Ruby that cannot have it, or
    # where a VM bug may meet it, gets a warning; by default (`auto`: off on such Rubies) a
    # note says why it is off.
    def allocation_possible?
      reason = Collectors::Allocations.unsupported_reason
      caveat = Collectors::Allocations.caveat
      if @settings.allocation == :auto
        log(:info) { "allocation profiling is off by default here: #{reason || caveat}" } if reason || caveat
      elsif @settings.allocation
        log(:warn) { "allocation profiling is off: #{reason}" } if reason
        log(:warn) { caveat } if caveat && !reason
      end
      @settings.allocation? && reason.nil?
    end

    # Whether the scheduler flushes periodically (Contprof.start) or only at stop
    # (Contprof.profile).
    def periodic?
      @periodic
    end

    # Starts sampling, and (with periodic) the scheduler's periodic flushes. When either
    # cannot start, neither runs.
    def start(periodic: true)
      Lifecycle.locked(@lifecycle) do
        raise Error, "a Contprof profiler is already running in this process" if self.class.running

        @periodic = periodic
        Profiler.forget_failures_said if periodic
        Contprof.endpoint_counts.take # requests before this start are no profile's
        TraceContext.refresh(span_id_label: @uploads_to_pyroscope)
        prepare_exit
        @worker.start
        begin
          start_scheduler if periodic
        rescue Exception # rubocop:disable Lint/RescueException -- undone, then re-raised
          @worker.stop
          raise
        end
        self.class.running = self
      end
      log(:info) { "started: #{@settings.inspect}; exporters: #{@exporters.map(&:name).join(", ")}" }
      if periodic && @exporters.empty?
        log(:warn) do
          "no destination (output, agent_url, agentless + api_key, pyroscope_url, otlp_url): profiles go nowhere; " \
            "only Contprof.stop's return value holds the last one"
        end
      end
      self
    end

    # Stops sampling and flushes what is left. Returns the last profile (an
    # ExportedProfile). Returns within upload_timeout (plus the time to encode and write
    # files), however many uploads are in progress or due: this runs at exit and before
    # exec, which the application is waiting for. Raises nothing but the application's
    # own signal (SignalException) or exit arriving meanwhile, after giving the flush up.
    def stop
      # Sampling ends first, before this method runs any other Ruby code (see
      # CpuAndWallTimeWorker#stop); a no-op when this profiler is not running.
      @worker.stop
      deadline = Lifecycle.monotonic + @settings.upload_timeout
      scheduler = Lifecycle.locked(@lifecycle) do
        return nil unless running?

        current = @scheduler
        @scheduler = nil
        current&.stop
      end
      # Wait for the scheduler only when it is flushing (its upload may be under way): an
      # idle one just goes. Waiting for a thread means handing it the GVL, which behind busy
      # application threads can take a time slice per thread.
      begin
        if scheduler&.alive? && @flushing && !scheduler.join([deadline - Lifecycle.monotonic, 0].max)
          exporting = @exporting
          scheduler.kill # cancels an upload in progress
          @stats[:uploads_cancelled_at_stop] += 1
          reached = "upload_timeout (#{@settings.upload_timeout} s) reached"
          if exporting
            failed(exporting, exporting, TIMED_OUT_AT_STOP, "upload cancelled at stop: #{reached}")
          else
            failed("flush", @recorder, TIMED_OUT_AT_STOP, "a flush in progress was cancelled at stop: #{reached}")
          end
        end
        flush(final: true, deadline: deadline)
      rescue SignalException => e
        # The application's signal (Ctrl-C on an exit waiting for a slow intake): the last
        # profile is given up, and the signal goes on to the application (at exit,
        # Lifecycle.stop_at_exit ends it there).
        scheduler&.kill
        @stats[:stop_interrupted] += 1
        cancelled = @cancelled_by_signal.to_a
        log(:warn) do
          "stop interrupted by #{signal_name(e)}: " +
            (cancelled.empty? ? "the last profile was not exported" : "the last profile's uploads (#{cancelled.join(", ")}) cancelled")
        end
        raise
      rescue *Lifecycle::FAILURES => e
        # (Not from flush, which contains its own: from waiting for the scheduler.)
        @stats[:flush_failures] += 1
        log(:error) { "stop failed: #{e.class}: #{printable(e.message)}" }
        nil
      ensure
        self.class.running = nil
      end
    end

    # Serializes the recorder and exports the profile. Never raises. The last flush keeps
    # the GVL while encoding, for the same reason as above, and uploads to every
    # destination at once, until `deadline`.
    def flush(final: false, deadline: nil)
      @flushing = true
      # The live heap is a snapshot: of the tracked objects, those alive now.
      @worker.collector.record_heap_live if @heap
      # Threads blocked since the clock parked have their wait in this profile (and, below,
      # a record in the next one for the rest of it, while the clock may stay parked).
      @worker.collector.charge_stretches if @worker
      TraceContext.refresh(span_id_label: @uploads_to_pyroscope) if running? && !final
      endpoint_counts = running? ? Contprof.endpoint_counts.take : {}
      @recorder.add_comment(EndpointCountsComment.comment(endpoint_counts)) unless endpoint_counts.empty?
      deploy = DeployTags.comment(@settings)
      @recorder.add_comment(deploy) if deploy
      start, finish, pprof, otlp, extras = serialize(final)
      @worker.collector.charge_stretches if @worker && !final
      profile = ExportedProfile.new(start: start, finish: finish, pprof: pprof, tags: Tags.build(@settings), paths: [],
                                    endpoint_counts: endpoint_counts, otlp: otlp, extras: extras)
      @stats[:flushes] += 1
      report_gaps
      if deadline
        export_all_until(profile, deadline)
      else
        written = @exporters.select do |exporter|
          @exporting = exporter # (for stop, which may have to cancel it)
          export(exporter, profile)
        end
        # (A directory that could not be written to is not pruned: its failure is logged.)
        written.each { |exporter| enforce_retention(exporter, profile) if exporter.respond_to?(:enforce_retention) }
      end
      profile
    rescue *Lifecycle::FAILURES => e
      @stats[:flush_failures] += 1
      failed("flush", @recorder, e, "could not serialize the profile", level: :error)
      nil
    ensure
      @flushing = false
      @exporting = nil
    end

    # Counters (Integers: flushes, <exporter>_exported, <exporter>_failed...), and:
    # failures: {exporter name or "flush" => {kind => count}}, every failure counted, the
    # kind being an error's class (Errno::ENOSPC), an HTTP status ("HTTP 500") or what
    # libcurl says ("Couldn't connect to server"); last_errors: {exporter name or "flush" =>
    # the last failure's message}; worker, recorder: their own stats; not_profiled.
    def stats
      worker = @worker&.stats
      @stats.merge(failures: @failures.to_h { |name, kinds| [name, Hash[kinds]] }, last_errors: @last_errors.dup,
                   worker: worker, recorder: @recorder.stats, not_profiled: worker ? not_profiled(worker) : {})
    end

    # Contprof.profile { } while this profiler runs: the block's samples are recorded here
    # as always, and copied into `block_profiler`'s recorder, whose profile (exported to
    # its destinations) is returned. A round at each end puts the time before the block
    # out of the copy, and the block's last moments in.
    def profile_block_into(block_profiler)
      @worker.wall_round_now
      begin
        @recorder.copy_samples_to(block_profiler.recorder)
      rescue Error
        raise Error, "another Contprof.profile block is being profiled (one at a time)"
      end
      begin
        yield
      ensure
        @worker.wall_round_now
        @recorder.copy_samples_to(nil)
        deadline = Lifecycle.monotonic + block_profiler.settings.upload_timeout
        result = block_profiler.flush(final: true, deadline: deadline)
      end
      result
    end

    # What the profiles leave out, and why (see #report_gaps). `worker`: the worker's
    # stats, when already at hand.
    def not_profiled(worker = @worker&.stats)
      return {} unless @worker

      gaps = {}
      gaps[:sampling] = @worker.ended_without_stop if @worker.ended_without_stop
      if (failure = @worker.failure)
        gaps[:sampling] = "sampling stopped after an error (#{failure.class}: #{failure.message}): nothing is sampled " \
                          "for the rest of this run"
      end
      if worker[:cpu_timers_given_up]
        gaps[:cpu_timers] = "#{worker[:cpu_timers_given_up]}: CPU time is read from the threads' clocks at wall " \
                            "samples, which places it less exactly"
      end
      gaps.merge!(thread_gaps(worker))
      if (ractors = ProcessHooks.ractors_started)
        gaps[:ractors] = "#{ractors} Ractor(s) started: the threads of Ractors other than the main one are not profiled"
      end
      gaps.merge!(recorder_gaps(@recorder.stats))
      if (stopped = worker[:heap_tracking_stopped])
        gaps[:heap] = "#{stopped}; the live heap (heap-live-samples, heap-live-size) is left out of the profiles"
      end
      gaps
    end

    # Samples lost by the recorder (out of memory, both profile slots taken at once).
    def recorder_gaps(recorder)
      gaps = {}
      if recorder[:samples_failed].positive?
        gaps[:samples_dropped] = "#{recorder[:samples_failed]} sample(s) could not be recorded (out of memory or an " \
                                 "internal limit): their time is missing"
      end
      if recorder[:samples_not_copied].positive?
        gaps[:samples_not_copied] = "#{recorder[:samples_not_copied]} sample(s) could not be copied into a " \
                                    "Contprof.profile block's profile: that profile misses their time"
      end
      gaps
    end

    # Threads whose time is read less exactly, or not at all, and why (the worker's stats).
    # CPU read "from their clocks at wall samples" is all there, in total; only where it
    # goes within the thread blurs.
    def thread_gaps(worker)
      gaps = {}
      from_clocks = "their CPU time is read from their clocks at wall samples"
      if worker[:threads_blocking_sigprof].to_i.positive?
        gaps[:threads_blocking_sigprof] = "#{worker[:threads_blocking_sigprof]} thread(s) blocked SIGPROF (seen in " \
                                          "their signal mask, set by native code) and did not hear their CPU timer: " \
                                          "#{from_clocks} while they do"
      end
      if worker[:threads_with_silent_timer].to_i.positive?
        gaps[:threads_with_silent_timer] = "#{worker[:threads_with_silent_timer]} thread(s) used CPU without their " \
                                           "CPU timer's signal arriving (SIGPROF not blocked): #{from_clocks} until it " \
                                           "arrives again"
      end
      if worker[:threads_without_cpu_timer].to_i.positive?
        gaps[:threads_without_cpu_timer] = "#{worker[:threads_without_cpu_timer]} thread(s) have no CPU timer yet (not " \
                                           "seen switching the GVL since Contprof was loaded, or the timer was " \
                                           "refused): #{from_clocks}"
      end
      if worker[:threads_sharing_native].to_i.positive?
        gaps[:mn_threads] = "#{worker[:threads_sharing_native]} thread(s) shared native threads (M:N threads, " \
                            "RUBY_MN_THREADS): their CPU time is what the thread hooks measured while each ran, " \
                            "charged at wall samples (a native thread's CPU timer would count every thread it runs); " \
                            "CPU used in native code without the GVL is charged when the thread takes the GVL back"
      end
      lost = worker[:threads_unsampled_no_memory].to_i + worker[:threads_unknown_no_memory].to_i
      gaps[:threads_out_of_memory] = "#{lost} time(s) a thread could not be followed (out of memory): its time since is missing" if lost.positive?
      if worker[:stacks_unread_no_memory].to_i.positive?
        gaps[:stacks_out_of_memory] = "#{worker[:stacks_unread_no_memory]} stack(s) could not be read (out of memory): " \
                                      "their time is under \"Stack not read (out of memory)\""
      end
      gaps
    end

    # Says each gap in the profiles once, in the log: at each flush, and as soon as a hook
    # sees one (SIGPROF trapped, a Ractor started).
    def report_gaps
      @gaps_said ||= []
      not_profiled.each do |kind, text|
        next if @gaps_said.include?(kind)

        @gaps_said << kind
        # (M:N threads are profiled whole, only placed less exactly: said, not warned.)
        kind == :mn_threads ? log(:info) { "M:N threads: #{text}" } : log(:warn) { "not profiled: #{text}" }
      end
    end

    # In a forked child (called by the fork hook): a fresh profiler, with none of the
    # parent's samples, a new runtime-id (Tags) and its own scheduler thread.
    def after_fork_in_child
      @lifecycle = Mutex.new
      @stats = Hash.new(0)
      reset_failures
      Contprof.endpoint_counts.reset_after_fork # the parent's requests are the parent's
      @scheduler = nil
      # A fork in the middle of #stop (sampling already ended): the child does not profile.
      start_scheduler if @periodic && @worker.sampling?
      self.class.running = nil unless @worker.after_fork_in_child
    end

    private

    def log(level, &message)
      Lifecycle.log(@logger, level, &message)
    end

    def reset_failures
      @failures = Hash.new { |failures, name| failures[name] = Hash.new(0) }
      @last_errors = {}
    end

    # Counts a failure of `exporter` (an exporter, or "flush") and logs it when its kind is
    # new for that destination in this process (later ones at debug level only). `error`:
    # an exception, or the kind itself (a String) for failures that raise nothing.
    def failed(exporter, destination, error, what, level: :warn)
      name = exporter.is_a?(String) ? exporter : exporter.name
      if error.is_a?(Exception)
        kind = error.respond_to?(:kind) && error.kind ? error.kind : error.class.name
        message = "#{what}: #{error.class}: #{printable(error.message)}"
      else
        kind = error
        message = what
      end
      @stats[:"#{name}_failed"] += 1 unless name == "flush"
      @failures[name][kind] += 1
      @last_errors[name] = message
      if Profiler.first_failure?([name, destination_of(destination), kind])
        log(level) { "#{name}: #{message} (logged once: later ones of this kind are only counted, in stats[:failures])" }
      else
        log(:debug) { "#{name}: #{message}" }
      end
    end

    # What tells one destination from another, credentials left out: a file exporter's
    # directory, an uploader's inspect (its URL, redacted).
    def destination_of(exporter)
      return exporter.directory if exporter.respond_to?(:directory)
      return "recorder" if exporter.equal?(@recorder)

      exporter.inspect
    end

    # `text` made fit for one log line: valid UTF-8, no control characters (an error may
    # carry a path with odd bytes, or a server's words).
    def printable(text)
      text.to_s.dup.force_encoding(Encoding::UTF_8).scrub("?").gsub(/[[:cntrl:]]+/, " ")
    end

    def signal_name(error)
      error.respond_to?(:signo) && error.signo ? "SIG#{Signal.signame(error.signo)}" : error.class.name
    end

    # [start, finish, pprof, OTLP request or nil, extras or nil]. The OTLP encoding (and its
    # resource, with this process's pid) and the extras only when an exporter wants them.
    def serialize(final)
      options = @serialize_extras.dup
      options[:otlp] = Exporters::Otlp.serialize_options(@otlp_resource, gzip: @otlp_gzip) if @otlp_resource
      @recorder.serialize(release_gvl: !final, **options)
    end

    # Files are written here; uploads run side by side, each on a thread of its own, and
    # those still running at `deadline` are cancelled.
    def export_all_until(profile, deadline)
      @cancelled_by_signal = nil
      files, uploaders = @exporters.partition(&:local?)
      files.each { |exporter| export(exporter, profile) }
      uploads = uploaders.filter_map do |exporter|
        timeout = deadline - Lifecycle.monotonic
        if timeout < 0.05
          failed(exporter, exporter, TIMED_OUT_AT_STOP,
                 "profile dropped at stop: upload_timeout (#{@settings.upload_timeout} s) reached")
          next
        end
        thread = Thread.new { contained { export(exporter, profile, timeout: timeout) } }
        thread.report_on_exception = false
        [exporter, thread]
      end
      begin
        late = uploads.reject { |_, thread| thread.join([deadline - Lifecycle.monotonic, 0].max) }
      rescue SignalException
        # The application's signal, on its main thread waiting here: every upload is given
        # up at once (Profiler#stop says so).
        @cancelled_by_signal = uploads.filter_map do |exporter, thread|
          next unless thread.alive?

          thread.kill
          @stats[:"#{exporter.name}_failed"] += 1
          @failures[exporter.name]["interrupted at stop"] += 1
          exporter.name
        end
        raise
      end
      # Every late request is cancelled at once (see HttpTransport), then awaited together.
      late.each { |_, thread| thread.kill }
      cancelled_by = Lifecycle.monotonic + CANCEL_WAIT
      late.each do |exporter, thread|
        thread.join([cancelled_by - Lifecycle.monotonic, 0].max)
        failed(exporter, exporter, TIMED_OUT_AT_STOP,
               "upload cancelled at stop: upload_timeout (#{@settings.upload_timeout} s) reached")
      end
    end

    # Runs the block on an upload's thread: whatever it raises (an application's
    # Thread#raise included) ends the thread there, never in a join at stop.
    def contained
      yield
    rescue Exception # rubocop:disable Lint/RescueException -- see above
      nil
    end

    def export(exporter, profile, timeout: nil)
      if profile.duration < exporter.minimum_duration
        @stats[:"#{exporter.name}_skipped_short"] += 1
        log(:debug) { "#{exporter.name}: skipped a #{profile.duration.round(3)} s profile" }
        return false
      end
      result = exporter.export(profile, timeout: timeout || @settings.upload_timeout)
      paths = exporter.local? ? Array(result) : [] # (a file exporter may write a .pprof and a .otlp)
      profile.paths.concat(paths)
      @stats[:"#{exporter.name}_exported"] += 1
      bytes = exporter.respond_to?(:sent_bytes) ? exporter.sent_bytes : profile.pprof.bytesize
      log(:info) { "#{exporter.name}: exported #{bytes} bytes#{" to #{paths.join(", ")}" unless paths.empty?}" }
      true
    rescue *Lifecycle::FAILURES => e
      failed(exporter, exporter, e, "export failed, profile dropped")
      false
    end

    # An output directory's limits, after a periodic flush (at exit every file operation
    # could wait behind busy threads; the next process's flushes see to it then).
    def enforce_retention(exporter, profile)
      files, bytes = exporter.enforce_retention(profile.paths)
      @stats[:output_files_deleted] += files
      @stats[:output_bytes_deleted] += bytes
      log(:debug) { "#{exporter.name}: deleted #{files} old profile files (#{bytes} bytes)" } if files.positive?
    rescue *Lifecycle::FAILURES => e
      failed("retention", exporter, e, "could not keep #{exporter.directory} within output_retention and output_max_bytes")
    end

    # What the last flush needs from the system is read, and made, now: at exit every call
    # that waits hands the GVL to each busy application thread in turn (100 ms each), and a
    # handful of them made a process with 40 busy threads take 20 s more to exit.
    def prepare_exit
      Tags.prepare
      @exporters.each { |exporter| exporter.prepare if exporter.respond_to?(:prepare) }
    end

    def start_scheduler
      @scheduler = Scheduler.new(period: @settings.upload_period, logger: @logger) { flush }.start
    end
  end
end
