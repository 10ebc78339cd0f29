# frozen_string_literal: true

require_relative "labels"

module Contprof
  # Background jobs: every sample taken while a job runs carries the label `job`, the job's
  # class name, as `endpoint` names a request (see Contprof::Rack). Two hooks set it:
  #
  # - a Sidekiq server middleware (Jobs::SidekiqMiddleware), added first to the server's
  #   chain, so that the other middleware's time is the job's too;
  # - an ActiveJob `around_perform` callback on ActiveJob::Base, for every adapter.
  #
  # The name is the one Datadog's Sidekiq integration gives the job's span (its resource):
  # the class an ActiveJob wrapper runs (Sidekiq's `wrapped`) rather than the wrapper, and
  # `Class.method` for Sidekiq's delayed class methods (Sidekiq::Extensions::DelayedClass).
  # A job run by ActiveJob through Sidekiq is labelled once, by whichever hook runs first.
  # Each destination may ask for more labels with the same name (Exporters::Datadog:
  # `trace endpoint`, which its backend reads for a worker's span as for a request).
  #
  # `contprof exec` and contprof/auto install both when the gems are loaded after Contprof
  # (Jobs.install_when_loaded); with Contprof.start in the application, call Jobs.install
  # once the gems are loaded, or add the middleware yourself:
  #
  #   Sidekiq.configure_server { |config| config.server_middleware { |chain| chain.add(Contprof::Jobs::SidekiqMiddleware) } }
  module Jobs
    KEY = :job
    # Label sets kept (one per job class), as Contprof::Rack keeps one per endpoint.
    MAX_NAMES = 2000
    # The job running on this fiber: a job that is already labelled (ActiveJob inside
    # Sidekiq) is not labelled again.
    CURRENT = :__contprof_job
    DELAYED_CLASS = "Sidekiq::Extensions::DelayedClass"
    # The target and method Sidekiq's delay extension writes first in its YAML argument
    # (`- !ruby/class 'Mailer'` then `- :deliver`): read without parsing the YAML.
    DELAYED_TARGET = /\A---\s*\n- !ruby\/(?:class|module) '?([A-Z][\w:]*)'?\s*\n- :([^\s'"]+)\s*\n/.freeze
    private_constant :CURRENT, :DELAYED_CLASS, :DELAYED_TARGET

    class << self
      # Runs the block with the labels of a job named `name` (a String; nil: no labels).
      # Returns the block's value. Never raises on its own: a name the labels refuse (empty,
      # over 1024 bytes) runs the job unlabelled.
      def run(name)
        thread = Thread.current
        return yield if name.nil? || thread[CURRENT] == name || !Contprof.running?

        enclosing = thread[LabelSet::FIBER_LOCAL]
        set = label_set(name, enclosing)
        return yield unless set

        enclosing_job = thread[CURRENT]
        thread[LabelSet::FIBER_LOCAL] = set
        thread[CURRENT] = name
        begin
          yield
        ensure
          thread[LabelSet::FIBER_LOCAL] = enclosing
          thread[CURRENT] = enclosing_job
        end
      end

      # The labels of a job named `name`: `job`, and those the running profiler's
      # destinations ask for (an exporter class answering .job_labels).
      def labels(name)
        labels = { KEY => name }
        Profiler.running&.exporters&.each do |exporter|
          labels.merge!(exporter.class.job_labels(name)) if exporter.class.respond_to?(:job_labels)
        end
        labels
      end

      # The name of a Sidekiq job (its payload, a Hash), as Datadog's Sidekiq integration
      # names the job's span.
      def sidekiq_name(job)
        wrapped = job["wrapped"]
        return wrapped.to_s if wrapped

        name = job["class"].to_s
        return name unless name == DELAYED_CLASS

        target = job["args"]&.first
        match = target.is_a?(String) && DELAYED_TARGET.match(target)
        match ? "#{match[1]}.#{match[2]}" : name
      end

      # Installs the hooks of the gems loaded now: the Sidekiq middleware in a Sidekiq
      # server (a client process runs no job), the ActiveJob callback through ActiveSupport's
      # load hooks (run now if ActiveJob is loaded, else when it is). Returns true when both
      # are in (nothing is left to wait for). Safe to call again.
      def install
        install_sidekiq if !@sidekiq && defined?(::Sidekiq::CLI) && ::Sidekiq.respond_to?(:configure_server)
        install_active_job if !@active_job && defined?(::ActiveSupport) && ::ActiveSupport.respond_to?(:on_load)
        @sidekiq && @active_job ? true : false
      end

      # Installs the hooks now, and those of gems loaded later as soon as they are, through
      # a :class TracePoint (the first class body opened once the gem is loaded: Sidekiq's
      # server has its class Sidekiq::CLI opened after the rest of Sidekiq is loaded), which
      # is turned off once both are in. Until then each class body opened costs a call of
      # its block (about a microsecond; class bodies open while an application loads). An
      # error in the hooks is logged and stops the watch: it must not break the class body
      # that triggered it.
      def install_when_loaded
        return if install || @watch

        @watch = TracePoint.new(:class) do
          @watch.disable if install
        rescue StandardError => e
          @watch.disable
          Contprof.logger.warn("job labels not installed: #{e.class}: #{e.message}")
        end
        @watch.enable
      end

      private

      # One set per name while no labels enclose the job (Sidekiq's threads have none); the
      # sets are the running profiler's (its destinations decide the labels), made again for
      # a new one. nil when the labels refuse the name.
      def label_set(name, enclosing)
        return new_label_set(enclosing, name) if enclosing

        profiler = Profiler.running
        unless @sets_profiler.equal?(profiler)
          @sets = {}
          @sets_profiler = profiler
        end
        sets = @sets
        set = sets[name]
        return set unless set.nil?

        set = new_label_set(nil, name)
        sets[name.frozen? ? name : name.dup.freeze] = set || false if sets.size < MAX_NAMES
        set
      end

      def new_label_set(enclosing, name)
        LabelSet.new(enclosing, labels(name))
      rescue ArgumentError
        nil
      end

      def install_sidekiq
        @sidekiq = true
        ::Sidekiq.configure_server do |config|
          config.server_middleware do |chain|
            chain.prepend(SidekiqMiddleware) unless chain.exists?(SidekiqMiddleware)
          end
        end
      end

      def install_active_job
        @active_job = true
        ::ActiveSupport.on_load(:active_job) { around_perform(&ACTIVE_JOB) }
      end
    end

    # Sidekiq's server middleware interface.
    class SidekiqMiddleware
      def call(_worker, job, _queue, &block)
        Jobs.run(Jobs.sidekiq_name(job), &block)
      end
    end

    # ActiveJob's around_perform callback (anonymous job classes have no name: unlabelled).
    ACTIVE_JOB = ->(job, block) { Jobs.run(job.class.name) { block.call } }
  end
end
