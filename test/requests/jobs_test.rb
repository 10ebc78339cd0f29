# frozen_string_literal: true

require_relative "../test_helper"
require "json"
require "logger"
require "rbconfig"
require "stringio"
require "tmpdir"

# Background-job labels (Contprof::Jobs): the name a job gets, that its samples carry it
# (with Datadog's `trace endpoint` when profiles go there), that a job inside another is
# labelled once, that the hooks install themselves when Sidekiq or ActiveJob loads after
# Contprof, and that nothing is loaded or hooked without them. The real Sidekiq server, with
# CPU per job class against the jobs' own measure, runs in test/runtime/production_servers_test.rb.
class JobsTest < Minitest::Test
  ROOT = File.expand_path("../..", __dir__)

  # Each job's work is a method of its own: a sample's job is the burn_* method on its stack.
  def burn_heavy = burn_cpu(0.06)
  def burn_light = burn_cpu(0.03)
  def burn_inner = burn_cpu(0.03)
  def burn_between = burn_cpu(0.03)

  def test_job_names_are_those_datadog_gives_the_job_span
    delayed = "Sidekiq::Extensions::DelayedClass"
    {
      { "class" => "HardWorker" } => "HardWorker",
      { "class" => "ActiveJob::QueueAdapters::SidekiqAdapter::JobWrapper", "wrapped" => "SendInvoiceJob" } => "SendInvoiceJob",
      { "class" => delayed, "args" => ["---\n- !ruby/class 'Billing::Mailer'\n- :deliver_now\n- - 1\n"] } =>
        "Billing::Mailer.deliver_now",
      { "class" => delayed, "args" => ["---\n- !ruby/module 'Reports'\n- :rebuild!\n- []\n"] } => "Reports.rebuild!",
      { "class" => delayed, "args" => ["not yaml"] } => delayed,
      { "class" => delayed, "args" => [] } => delayed,
      { "class" => :Symbolic } => "Symbolic",
    }.each do |job, name|
      assert_equal name, Contprof::Jobs.sidekiq_name(job), job.inspect
    end
  end

  def test_a_job_s_samples_carry_its_class
    skip Contprof.unsupported_reason unless Contprof.supported?
    middleware = Contprof::Jobs::SidekiqMiddleware.new
    seen = {}
    profile = Contprof.profile do
      middleware.call(nil, { "class" => "HeavyJob" }, "default") do
        burn_heavy
        seen[:heavy] = Contprof.labels
        # The same job seen again (ActiveJob's hook inside Sidekiq's): labelled once.
        Contprof::Jobs.run("HeavyJob") { seen[:again] = Contprof.labels }
        Contprof::Jobs.run("InnerJob") { burn_inner }
      end
      assert_raises(RuntimeError) { middleware.call(nil, { "class" => "LightJob" }, "default") do
        burn_light
        raise "boom"
      end }
      seen[:after] = Contprof.labels
      burn_between
    end
    assert_equal({ "job" => "HeavyJob" }, seen[:heavy])
    assert_equal seen[:heavy], seen[:again]
    assert_empty seen[:after], "the labels come off when the job ends, also by an exception"

    expected = { "JobsTest#burn_heavy" => "HeavyJob", "JobsTest#burn_light" => "LightJob",
                 "JobsTest#burn_inner" => "InnerJob", "JobsTest#burn_between" => nil }
    found = Hash.new { |hash, key| hash[key] = [] }
    decode_profile(profile.pprof).samples.each do |sample|
      method = expected.keys.find { |name| sample.locations.any? { |frame| frame.function_name == name } } or next
      found[method] << sample.labels["job"]
      refute sample.labels.key?("trace endpoint"), "no Datadog label without Datadog"
    end
    assert_equal expected.keys.sort, found.keys.sort, "every phase was sampled"
    expected.each { |method, job| assert_equal [job], found[method].uniq, method }
  end

  # Uploading to Datadog, a job's samples also carry `trace endpoint` (what Datadog's own
  # profiler puts there for a job's span); the label sets are the running profiler's, so one
  # profiler after another gets its own.
  def test_with_datadog_jobs_also_carry_trace_endpoint
    skip Contprof.unsupported_reason unless Contprof.supported?
    seen = []
    # (A profile this short is not uploaded: nothing is sent to the unreachable agent.)
    [{}, { agent_url: "http://127.0.0.1:9" }, {}].each do |settings|
      profile = Contprof.profile(**settings) do
        Contprof::Jobs.run("ReportJob") do
          burn_heavy
          seen << Contprof.labels
        end
      end
      labelled = decode_profile(profile.pprof).samples.select { |sample| sample.labels["job"] }
      refute_empty labelled
      assert_equal [seen.last["trace endpoint"]], labelled.map { |sample| sample.labels["trace endpoint"] }.uniq
    end
    assert_equal [{ "job" => "ReportJob" }, { "job" => "ReportJob", "trace endpoint" => "ReportJob" }, { "job" => "ReportJob" }], seen
  end

  def test_jobs_run_unlabelled_when_not_profiling_or_when_the_name_is_refused
    skip Contprof.unsupported_reason unless Contprof.supported?
    assert_equal [:ran, {}], Contprof::Jobs.run("IdleJob") { [:ran, Contprof.labels] }
    Contprof.profile do
      ["", "J" * 1025, nil].each do |name|
        assert_equal [:ran, {}], Contprof::Jobs.run(name) { [:ran, Contprof.labels] }, name.inspect
      end
    end
  end

  # Sidekiq's server and ActiveJob loaded after Contprof (`contprof exec -- sidekiq`): the
  # middleware goes first in the server's chain, the callback on ActiveJob::Base, and the
  # watch ends; an ActiveJob job run by Sidekiq is labelled with the job's class, once.
  def test_the_hooks_install_when_sidekiq_and_active_job_load_later
    skip Contprof.unsupported_reason unless Contprof.supported?
    unless system(RbConfig.ruby, "-e", 'require "sidekiq"; require "active_job"', err: File::NULL)
      skip "sidekiq or active_job cannot be loaded by this Ruby (Debian: ruby-sidekiq, ruby-activejob)"
    end

    result = run_auto(<<~RUBY)
      require "sidekiq/cli"
      Sidekiq.configure_server { |config| config.server_middleware { |chain| chain.add(Class.new { def call(*) = yield }) } }
      chain = Sidekiq.server_middleware.map(&:klass)
      require "active_job"
      ActiveJob::Base.logger = Logger.new(nil)
      class LightJob < ActiveJob::Base
        def perform = $seen << Contprof.labels
      end
      $seen = []
      LightJob.perform_now
      wrapper = { "class" => "ActiveJob::QueueAdapters::SidekiqAdapter::JobWrapper", "wrapped" => "LightJob" }
      Sidekiq.server_middleware.invoke(nil, wrapper, "default") { LightJob.perform_now }
      puts JSON.generate("chain" => chain.map(&:to_s), "seen" => $seen,
                         "watching" => Contprof::Jobs.instance_variable_get(:@watch).enabled?)
    RUBY
    assert_equal "Contprof::Jobs::SidekiqMiddleware", result["chain"].first, "first in the chain: #{result["chain"]}"
    assert_equal [{ "job" => "LightJob" }] * 2, result["seen"]
    refute result["watching"], "the watch ends once both hooks are in"
  end

  # Without Sidekiq or ActiveJob, Contprof loads neither (nor ActiveSupport) and hooks
  # nothing: its watch waits for them.
  def test_nothing_is_loaded_without_sidekiq_or_active_job
    skip Contprof.unsupported_reason unless Contprof.supported?
    result = run_auto(<<~RUBY)
      class Opened; end
      module AlsoOpened; end
      puts JSON.generate("loaded" => $LOADED_FEATURES.grep(/sidekiq|active_job|active_support/),
                         "constants" => %i[Sidekiq ActiveJob ActiveSupport].select { |name| Object.const_defined?(name) },
                         "watching" => Contprof::Jobs.instance_variable_get(:@watch).enabled?)
    RUBY
    assert_equal({ "loaded" => [], "constants" => [], "watching" => true }, result)
  end

  # Pyroscope keeps a series label over a sample label of the same name: a tag named `job`
  # or `endpoint` would hide the labels, and is said once.
  def test_pyroscope_says_when_a_tag_hides_the_job_label
    require "contprof/exporters/pyroscope"
    log = StringIO.new
    logger = Contprof.logger
    Contprof.logger = Logger.new(log)
    Contprof::Exporters::Pyroscope.new(url: "http://127.0.0.1:9", application_name: "app", user_tags: { "team" => "core" })
    assert_empty log.string
    Contprof::Exporters::Pyroscope.new(url: "http://127.0.0.1:9", application_name: "app", user_tags: { "job" => "web" })
    assert_match(/the tag\(s\) job hide the samples' label/, log.string)
  ensure
    Contprof.logger = logger
  end

  private

  # Runs Ruby code as `contprof exec` runs a program (RUBYOPT=-rcontprof/auto); returns
  # the JSON of its last line.
  def run_auto(code)
    Dir.mktmpdir("contprof-jobs") do |dir|
      env = { "RUBYOPT" => "-I#{File.join(ROOT, "lib")} -rcontprof/auto", "CONTPROF_OUTPUT" => dir }
      out, err, status = Open3.capture3(env, RbConfig.ruby, "-rjson", "-e", code)
      assert status.success?, err
      JSON.parse(out.lines.last)
    end
  end
end
