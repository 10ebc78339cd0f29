# frozen_string_literal: true

require_relative "../test_helper"
require "json"
require "pp"
require_relative "../support/intake_server"
require "tmpdir"
require "stringio"
require "logger"

# Contprof.start / stop / profile: the scheduler, the file exporter, failures, fork.
class ProfilerTest < Minitest::Test
  def setup
    @dir = Dir.mktmpdir("contprof-profiles")
    @log = StringIO.new
    Contprof.logger = Logger.new(@log, progname: "contprof")
    @servers = []
  end

  def teardown
    Contprof.stop
    Contprof.logger = nil
    @servers.each(&:stop)
    FileUtils.rm_rf(@dir)
  end

  def pprof_files
    Dir[File.join(@dir, "*.pprof")].sort
  end

  def parent_work
    burn_cpu(0.3)
  end

  def child_work
    burn_cpu(0.3)
  end

  def test_start_flushes_periodically_and_at_stop
    refute Contprof.running?
    Contprof.start(output: @dir, upload_period: 1, service: "my service", version: "2.0.1", env: "prod")
    assert Contprof.running?
    used = 0.0
    # Until two periodic flushes have written their files (however slowly the machine lets
    # the scheduler run), with a generous deadline.
    deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + 30
    while pprof_files.size < 2 && Process.clock_gettime(Process::CLOCK_MONOTONIC) < deadline
      start = thread_cpu_time
      burn_cpu(0.05)
      used += thread_cpu_time - start
    end
    last = Contprof.stop
    refute Contprof.running?
    assert_kind_of Contprof::ExportedProfile, last

    files = pprof_files
    assert_operator files.size, :>=, 3, "two periodic flushes and the last one: #{files}"
    files.each { |f| assert_match(/\/my_service-#{Process.pid}-\d{8}T\d{6}\.\d{6}Z\.pprof\z/, f) }
    assert_empty Dir[File.join(@dir, ".*.tmp")], "no temporary file left behind"
    files.each { |f| assert_equal 0o644 & ~File.umask, File.stat(f).mode & 0o777 }
    profiles = files.map { |f| decode_profile(File.binread(f)) }
    burned = profiles.sum do |p|
      p.total("cpu-time") { |s| s.locations.any? { |frame| frame.function_name.end_with?("#burn_cpu") } }
    end
    assert_in_delta used * 1e9, burned, used * 1e9 * 0.1
    # Contiguous periods: each profile starts where the previous one finished.
    profiles.each_cons(2) { |a, b| assert_equal a.time_nanos + a.duration_nanos, b.time_nanos }
    # Each carries its deploy (for comparisons by version: DeployTags).
    profiles.each { |p| assert_equal({ "version" => "2.0.1", "env" => "prod" }, Contprof::DeployTags.from_comments(p.comments)) }
  end

  def test_profile_a_block
    result = Contprof.profile(output: @dir) { burn_cpu(0.2) }
    assert_kind_of Contprof::ExportedProfile, result
    assert_equal 1, result.paths.size
    assert_equal pprof_files, result.paths
    decoded = decode_profile(result.pprof)
    assert_operator decoded.total("cpu-time") { |s| s.locations.any? { |f| f.function_name.end_with?("#burn_cpu") } },
                    :>, 150_000_000
    refute Contprof.running?
    assert_kind_of Contprof::ExportedProfile, Contprof.profile { nil }, "no output: returned only"
  end

  # A CPU timer can fire while the application runs code that never checks for
  # interrupts, leaving the sampling round to run at the first check, which may be inside
  # Contprof.stop. Sampling ends before stop runs any Ruby code of its own, and the final
  # round gives the calling thread's last stretch to where it was, not to the profiler.
  def test_a_round_queued_just_before_stop_records_no_profiler_frames
    worker = Contprof::Collectors::CpuAndWallTimeWorker
    5.times do
      Contprof.start(output: @dir, upload_period: 60)
      burn_cpu(0.03)
      last = worker::Testing.queue_sampling_job { Contprof.stop }
      profile = decode_profile(last.pprof)
      own = profile.samples.select do |sample|
        sample.locations.any? { |frame| frame.file_name.include?("/lib/contprof") }
      end
      assert_empty own.map { |s| [s.values, s.locations.map(&:function_name)] }, "samples in the profiler's own code"
      assert_operator profile.total("cpu-time"), :>, 20_000_000
    end
  end

  def test_continuous_profiling_without_a_destination_says_so
    Contprof.start
    assert_equal 1, @log.string.scan("no destination").size, @log.string
  ensure
    Contprof.stop
  end

  # A profiler without a worker of its own (the one behind a Contprof.profile block inside
  # continuous profiling) still answers #stats.
  def test_stats_of_a_profiler_without_a_worker
    settings = Contprof::Settings.new(output: @dir)
    stats = Contprof::Profiler.new(settings, logger: Contprof.logger, recorder_only: true).stats
    assert_nil stats[:worker]
    assert_equal 0, stats[:recorder][:samples_recorded]
    assert_equal({}, stats[:not_profiled])
  end

  def test_invalid_settings_and_double_start
    assert_raises(ArgumentError) { Contprof.start(interval: -1) }
    refute Contprof.running?
    Contprof.start(output: @dir)
    error = assert_raises(Contprof::Error) { Contprof.start(output: @dir) }
    assert_match(/already running/, error.message)
  end

  def test_a_failing_exporter_affects_neither_the_others_nor_the_application
    dead_port = TCPServer.open("127.0.0.1", 0) { |s| s.addr[1] }
    Contprof.start(output: @dir, agent_url: "http://127.0.0.1:#{dead_port}", api_key: nil, log_level: "info")
    burn_cpu(1.1) # long enough to be uploaded
    Contprof.stop
    assert_equal 1, pprof_files.size
    assert_match(/datadog-agent: export failed, profile dropped: Contprof::HttpTransport::Error: POST .*Could(n't| not) connect/,
                 @log.string)
    assert_match(/file: exported/, @log.string)
  end

  def test_the_api_key_never_reaches_the_logs
    profiler = Contprof.start(output: @dir, agentless: true, api_key: "SECRET-KEY-42", site: "invalid.example", upload_timeout: 1,
                              log_level: "debug")
    # Issue #15, item 8: nor `inspect` / `pp` of the profiler (its exporters included).
    refute_includes profiler.inspect, "SECRET-KEY-42"
    refute_includes PP.pp(profiler, +""), "SECRET-KEY-42"
    burn_cpu(1.1)
    Contprof.stop
    assert_match(/datadog-agentless: export failed/, @log.string)
    refute_includes @log.string, "SECRET-KEY-42"
    assert_includes @log.string, "api_key=[redacted]"
  end

  def test_short_profiles_are_written_but_not_uploaded
    intake = IntakeServer.new.tap { |s| @servers << s }
    Contprof.start(output: @dir, agent_url: intake.url)
    burn_cpu(0.1)
    Contprof.stop
    assert_equal 1, pprof_files.size
    assert_empty intake.requests, "a profile under 1 s is not uploaded"
  end

  def test_a_forked_child_exports_its_own_profiles
    intake = IntakeServer.new.tap { |s| @servers << s }
    Contprof.start(output: @dir, agent_url: intake.url, upload_period: 60)
    parent_runtime_id = Contprof::Tags.runtime_id
    parent_work
    pid = fork do
      child_work
      burn_cpu(0.8) # long enough to be uploaded
      # exits normally: the at_exit hook stops the child's profiler and flushes
    end
    Process.wait(pid)
    assert $?.success?
    request = intake.next_request
    tags = JSON.parse(request.form["event"].to_s)["tags_profiler"].split(",").to_h { |t| t.split(":", 2) }
    assert_equal pid.to_s, tags["process_id"]
    refute_equal parent_runtime_id, tags["runtime-id"]

    child_files = pprof_files.select { |f| f.include?("-#{pid}-") }
    assert_equal 1, child_files.size
    names = decode_profile(File.binread(child_files.first)).samples.flat_map { |s| s.locations.map(&:function_name) }
    assert_includes names, "ProfilerTest#child_work"
    refute_includes names, "ProfilerTest#parent_work"

    # The parent goes on with its own profile.
    assert Contprof.running?
    last = Contprof.stop
    names = last.decode.samples.flat_map { |s| s.locations.map(&:function_name) }
    assert_includes names, "ProfilerTest#parent_work"
    refute_includes names, "ProfilerTest#child_work"
    assert_equal parent_runtime_id, last.tags["runtime-id"]
  end

  # Issue #16: Contprof.profile { } under continuous profiling. Known answer: each phase's
  # own CPU clock.
  def test_a_profiled_block_inside_continuous_profiling_goes_to_both
    Contprof.start(output: File.join(@dir, "continuous"), interval: 0.005, log_level: "error")
    before = cpu_of { before_the_block }
    inside = nil
    block = Contprof.profile(output: File.join(@dir, "block")) { inside = cpu_of { inside_the_block } }
    after = cpu_of { before_the_block }
    continuous = decode_profile(Contprof.stop.pprof)
    block_profile = decode_profile(File.binread(block.paths.fetch(0)))
    cpu = ->(profile, name) { profile.total("cpu-time") { |s| s.locations.any? { |l| l.function_name.end_with?(name) } } / 1e9 }
    assert_in_delta inside, cpu.(block_profile, "inside_the_block"), 0.1 * inside + 0.02
    assert_equal 0, cpu.(block_profile, "before_the_block"), "time outside the block is not in its profile"
    assert_in_delta inside, cpu.(continuous, "inside_the_block"), 0.1 * inside + 0.02
    assert_in_delta before + after, cpu.(continuous, "before_the_block"), 0.1 * (before + after) + 0.02
    # One block at a time.
    Contprof.start(output: File.join(@dir, "continuous"), log_level: "error")
    error = assert_raises(Contprof::Error) { Contprof.profile { Contprof.profile { nil } } }
    assert_match(/another Contprof.profile block/, error.message)
  ensure
    Contprof.stop
  end

  def cpu_of
    started = thread_cpu_time
    yield
    thread_cpu_time - started
  end

  def before_the_block = burn_cpu(0.3)
  def inside_the_block = burn_cpu(0.5)

  # Issue #15, item 15: hooking exec must not make it a public method of every object.
  def test_the_exec_hook_keeps_kernel_exec_private
    refute Object.new.respond_to?(:exec), "Object#exec stays private"
    assert_includes Kernel.private_instance_methods, :exec
    assert Process.respond_to?(:exec) && Kernel.respond_to?(:exec)
    # So does the trap hook.
    refute Object.new.respond_to?(:trap), "Object#trap stays private"
    assert Signal.respond_to?(:trap) && Kernel.respond_to?(:trap)
  end
end
