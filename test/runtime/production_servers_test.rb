# frozen_string_literal: true

require_relative "../test_helper"
require_relative "../support/intake_checks"
require_relative "../support/intake_server"
require "json"
require "net/http"
require "socket"
require "tmpdir"
require "fileutils"
require "contprof/reports/otlp"

# Production shapes, run as users run them: the real server (Debian's puma, unicorn,
# Sidekiq with a Redis of its own, and a fork-per-job runner) started by the test under
# `contprof exec`, with no change to the app (test/apps/), driven by a bounded loopback
# client, then stopped by a signal to the PID the test started. Each test checks:
#
# - every process (master, workers, the workers that replace them, children) writes its own
#   profiles: its pid in the file names, its own runtime-id (the OTLP copy's
#   service.instance.id, which a fork or an exec renews);
# - CPU per endpoint or job class, all processes together, matches the app's own measure
#   (its threads' CPU clocks around the work, test/apps/forking_truth.rb) within 3 points or
#   3 standard errors of the sample count, whichever is larger;
# - a parent keeps hearing its CPU timers after it forked (the signals its profiler counted
#   while it burned a known CPU time; commit 65544ee fixed children switching them off),
#   and no thread stopped hearing them;
# - no gap in the log ("not profiled: ...") nor any other warning of Contprof's;
# - the server's signals act as without Contprof (a run without it, with the same restart
#   and stop, gives the same exit status), the restart happens and its new workers serve;
# - the server stops, every process flushed and uploaded, within upload_timeout.
#
# The whole file takes 45-85 s on two cores.
class ProductionServersTest < Minitest::Test
  include IntakeChecks

  ROOT = File.expand_path("../..", __dir__)
  EXE = File.join(ROOT, "exe", "contprof")
  APPS = File.join(__dir__, "..", "apps")
  # More samples than the default (10 ms) give tighter shares for the same CPU, and an
  # overhead budget the sampler never reaches keeps the period where it was set: the timer
  # signals a parent should hear follow from it.
  INTERVAL = "0.002"
  OVERHEAD_TARGET = "1"
  UPLOAD_TIMEOUT = 5.0
  # Requests served before the restart signal, and by the new workers after it.
  REQUESTS_BEFORE = 200
  REQUESTS_AFTER = 200
  HEAVY_PATTERN = /heavy/i
  LIGHT_PATTERN = /light/i
  START_TIMEOUT = 60

  Run = Struct.new(:dir, :truth, :output, :log, :intake, keyword_init: true)

  def setup
    skip Contprof.unsupported_reason unless Contprof.supported?
    @pids = []
    @dirs = []
  end

  # Every process the test started is killed, whatever happened (a test that failed half
  # way leaves servers with workers behind otherwise: the group takes them all).
  def teardown
    @threads&.each(&:kill)
    (@pids || []).each do |pid|
      Process.kill("KILL", -pid)
    rescue Errno::ESRCH, Errno::EPERM
      begin
        Process.kill("KILL", pid)
      rescue Errno::ESRCH
        nil
      end
    ensure
      begin
        Process.wait(pid)
      rescue Errno::ECHILD
        nil
      end
    end
    @intakes&.each(&:stop)
    @dirs&.each { |dir| FileUtils.rm_rf(dir) unless ENV["PRODUCTION_KEEP"] }
  end

  # Puma, 2 workers forked from a master that loaded the app (preload_app!); a hot restart
  # (SIGUSR2: the master execs itself) under load; SIGTERM.
  def test_puma_cluster_preload_app_hot_restart_and_sigterm
    skip_unless_loadable("puma", "action_controller/railtie", "puma")
    check_server(kind: :puma, env: { "PUMA_SHAPE" => "preload" }, restart: "USR2", stop: "TERM")
  end

  # Puma, fork_worker (worker 0 loads the app and forks the others); a phased restart
  # (SIGUSR1: workers replaced one by one) under load; SIGINT.
  def test_puma_cluster_fork_worker_phased_restart_and_sigint
    skip_unless_loadable("puma", "action_controller/railtie", "puma")
    check_server(kind: :puma, env: { "PUMA_SHAPE" => "fork_worker" }, restart: "USR1", stop: "INT")
  end

  # Unicorn, a master and 2 workers; SIGHUP (the config and the app reloaded, workers
  # replaced) under load; SIGQUIT (graceful stop).
  def test_unicorn_reload_and_graceful_stop
    skip_unless_loadable("unicorn", "action_controller/railtie", "unicorn")
    check_server(kind: :unicorn, env: {}, restart: "HUP", stop: "QUIT")
  end

  # Sidekiq with 2 threads, jobs of two classes (one a Sidekiq worker, one an ActiveJob job
  # through Sidekiq's adapter): each job's samples carry its class in `job`, and, uploading
  # to Datadog, in `trace endpoint`; SIGTERM.
  JOBS_PER_CLASS = 250

  def test_sidekiq_jobs_carry_their_class
    skip_unless_loadable("sidekiq", "active_job", "sidekiq")
    skip "redis-server is not installed (Debian: apt-get install redis-server)" unless command?("redis-server")

    redis_url = start_redis
    env = { "REDIS_URL" => redis_url }
    app = File.join(APPS, "sidekiq_jobs.rb")
    baseline = background { sidekiq_outcome(env.merge("REDIS_URL" => start_redis), app) }

    run = new_run
    enqueue = Process.spawn(env.merge("TRUTH_DIR" => run.truth), RbConfig.ruby, app, "enqueue", JOBS_PER_CLASS.to_s,
                            out: run.log, err: %i[child out])
    @pids << enqueue
    assert wait_for_exit(enqueue).success?, "queueing the jobs failed: #{File.read(run.log)}"
    pid = spawn_server(run, env, %W[sidekiq -c 2 -r #{app}], profiled: true)
    wait_for_log(run.log, pid, /sidekiq_jobs.rb: started/)
    deadline = monotonic + START_TIMEOUT
    until truth_records(run).size >= 2 * JOBS_PER_CLASS
      flunk "jobs left undone after #{START_TIMEOUT} s: #{log_tail(run.log, 2000)}" if monotonic > deadline
      sleep 0.1
    end
    outcome, stop_seconds = stop(pid, "TERM")
    assert_equal baseline.value, outcome, "SIGTERM: Sidekiq without vs under contprof exec ([exit status, signal])"
    assert_operator stop_seconds, :<, UPLOAD_TIMEOUT, "Sidekiq stopped within upload_timeout"

    truth = truth_records(run).group_by { |record| record["name"] }.transform_values { |list| list.sum { |r| r["cpu"] } }
    assert_equal({ "HeavyJob" => JOBS_PER_CLASS, "LightJob" => JOBS_PER_CLASS },
                 truth_records(run).group_by { |r| r["name"] }.transform_values(&:size))
    profiles = check_processes(run, forks: false)
    profiles.flat_map { |profile| profile[:pprof].samples }.each do |sample|
      job = sample.locations.map(&:function_name).grep(/\A(?:Heavy|Light)Job#perform\z/).first
      assert_equal job.delete_suffix("#perform"), sample.labels["job"], "a sample in #{job} carries its class" if job
    end
    cpu = cpu_by_label(profiles, "job", known: truth.keys)
    check_shares(cpu, truth, "Sidekiq jobs")
    check_log(run.log)

    upload = run.intake.next_request
    assert_empty datadog_problems(path: upload.path, headers: upload.headers, parts: parts(upload.form), agentless: false)
    samples = Contprof::Pprof.decode(parts(upload.form)["profile.pprof"].data).samples
    labelled = samples.select { |sample| sample.labels["job"] }
    refute_empty labelled
    labelled.each { |sample| assert_equal sample.labels["job"], sample.labels["trace endpoint"], "Datadog's label names the job too" }
  end

  # A parent forking a child per job and computing itself meanwhile: every child writes
  # its own profile, the parent keeps hearing its timers, CPU per job class (each child's
  # profile, by the job method on its stacks) and the parent's own match the truth.
  FORKED_JOBS = 24

  def test_fork_per_job_runner
    runner = File.join(APPS, "fork_per_job.rb")
    baseline_run = new_run
    baseline = Process.spawn({ "TRUTH_DIR" => baseline_run.truth, "JOBS" => "2" }, RbConfig.ruby, runner,
                             out: baseline_run.log, err: %i[child out])
    @pids << baseline
    baseline_status = wait_for_exit(baseline)

    run = new_run
    pid = spawn_server(run, { "JOBS" => FORKED_JOBS.to_s }, [RbConfig.ruby, runner], profiled: true)
    status = wait_for_exit(pid)
    assert_equal [baseline_status.exitstatus, baseline_status.termsig], [status.exitstatus, status.termsig],
                 "the runner ends as without Contprof: #{File.read(run.log)}"

    profiles = check_processes(run)
    records = truth_records(run)
    children = records.reject { |r| r["name"] == "parent" }
    assert_equal FORKED_JOBS, children.size, "every job ran"
    assert_equal FORKED_JOBS, children.map { |r| r["pid"] }.uniq.size, "each in a child of its own"
    kind_of = children.to_h { |r| [r["pid"], r["name"]] }
    truth = records.group_by { |r| r["name"] }.transform_values { |list| list.sum { |r| r["cpu"] } }
    methods = { "heavy" => "ForkPerJob.heavy_job", "light" => "ForkPerJob.light_job",
                "parent" => "ForkPerJob.parent_work" }
    cpu = Hash.new(0)
    samples = Hash.new(0)
    profiles.each do |profile|
      expected = kind_of[profile[:pid]] || "parent"
      profile[:pprof].samples.each do |sample|
        names = sample.locations.map(&:function_name)
        kind = methods.find { |_, method| names.include?(method) }&.first or next
        assert_equal expected, kind, "a #{kind} sample in the profile of pid #{profile[:pid]} (#{expected})"
        cpu[kind] += sample.values["cpu-time"]
        samples[kind] += sample.values["cpu-samples"]
      end
    end
    check_shares({ cpu: cpu, samples: samples }, truth, "fork-per-job runner")
    check_log(run.log)
  end

  private

  # --- the servers ---------------------------------------------------------------------

  def check_server(kind:, env:, restart:, stop:)
    started = monotonic
    # The same server without Contprof, run meanwhile (on another port).
    baseline = background { server_outcome(kind, env, restart, stop) }
    run = new_run
    port = free_port
    env = env.merge("PORT" => port.to_s)
    pid = spawn_server(run, env, server_command(kind), profiled: true)
    first_workers = wait_for_workers(kind, run.log, pid, 2)
    note("booted", started)
    served = drive(port, run.log, pid, kind, restart, first_workers)
    note("load", started)
    outcome, stop_seconds = stop(pid, stop)
    note("stopped", started)
    assert_equal baseline.value, outcome, "SIG#{stop} after SIG#{restart}: #{kind} without vs under contprof exec ([exit status, signal])"
    assert_operator stop_seconds, :<, UPLOAD_TIMEOUT, "#{kind} stopped within upload_timeout"

    new_workers = served.keys - first_workers
    refute_empty new_workers, "the workers started by SIG#{restart} served requests: #{served}"
    truth = truth_by_endpoint(run)
    assert_operator truth_records(run).size, :>=, served.values.sum, "every request served was measured"
    profiles = check_processes(run)
    note("profiles read", started)
    (first_workers + new_workers).each do |worker|
      assert profiles.any? { |p| p[:pid] == worker }, "worker #{worker} (served #{served[worker]}) wrote a profile"
    end
    check_shares(cpu_by_label(profiles, "endpoint", known: truth.keys), truth, "#{kind} #{env["PUMA_SHAPE"]}".strip)
    check_log(run.log)
    note("checked", started)
  end

  def server_command(kind)
    case kind
    when :puma then %W[puma -C #{File.join(APPS, "puma_cluster.rb")}]
    when :unicorn then %W[unicorn -c #{File.join(APPS, "unicorn.conf.rb")} #{File.join(APPS, "forking_rails.ru")}]
    end
  end

  # The same server without Contprof, its restart and stop signals (no load): what exit
  # status (or signal) the stop gives.
  def server_outcome(kind, env, restart, stop)
    run = new_run
    env = env.merge("PORT" => free_port.to_s)
    pid = spawn_server(run, env, server_command(kind), profiled: false)
    first = wait_for_workers(kind, run.log, pid, 2)
    Process.kill(restart, pid)
    wait_for_workers(kind, run.log, pid, 2, besides: first)
    stop(pid, stop).first
  end

  # Sidekiq without Contprof, stopped by SIGTERM once started: what exit status it gives.
  def sidekiq_outcome(env, app)
    run = new_run
    pid = spawn_server(run, env, %W[sidekiq -c 2 -r #{app}], profiled: false)
    wait_for_log(run.log, pid, /sidekiq_jobs.rb: started/)
    stop(pid, "TERM").first
  end

  # Starts `command` (under `contprof exec` when profiled) in a process group of its own,
  # its output in run.log.
  def spawn_server(run, env, command, profiled:)
    env = env.merge("TRUTH_DIR" => run.truth)
    if profiled
      env = env.merge("CONTPROF_INTERVAL" => INTERVAL, "CONTPROF_OVERHEAD_TARGET" => OVERHEAD_TARGET, "CONTPROF_UPLOAD_TIMEOUT" => UPLOAD_TIMEOUT.to_s,
                      "CONTPROF_LOG_LEVEL" => "info", "CONTPROF_SERVICE" => "prod-shapes")
      command = [RbConfig.ruby, EXE, "exec", "-o", run.output, "--output-otlp", "--agent-url", run.intake.url, "--", *command]
    end
    pid = Process.spawn(env, *command, out: run.log, err: %i[child out], chdir: APPS, pgroup: true)
    @pids << pid
    pid
  end

  # The status of a process the test started, once it ended (within START_TIMEOUT).
  def wait_for_exit(pid)
    deadline = monotonic + START_TIMEOUT
    loop do
      done, status = Process.wait2(pid, Process::WNOHANG)
      if done
        @pids.delete(pid)
        return status
      end
      flunk "pid #{pid} still runs after #{START_TIMEOUT} s" if monotonic > deadline
      sleep 0.02
    end
  end

  # Sends `signal` and waits for the process: [[exit status, signal], seconds it took].
  def stop(pid, signal)
    started = monotonic
    Process.kill(signal, pid)
    status = wait_for_exit(pid)
    [[status.exitstatus, status.termsig], monotonic - started]
  end

  # Requests from two client threads on loopback: REQUESTS_BEFORE, then the restart
  # signal, then on until the restart's new workers have served REQUESTS_AFTER. A request
  # that meets a connection being closed (workers stopping) is sent again on a new one.
  # Returns { worker pid => requests it served }.
  def drive(port, log, pid, kind, restart, first_workers)
    lock = Mutex.new
    served = Hash.new(0)
    signalled = false
    after = 0
    deadline = monotonic + START_TIMEOUT
    done = lambda do
      lock.synchronize do
        if !signalled && served.values.sum >= REQUESTS_BEFORE
          signalled = true
          Process.kill(restart, pid)
        end
        after >= REQUESTS_AFTER
      end
    end
    clients = Array.new(2) do |client|
      Thread.new do
        http = nil
        index = 0
        until done.call
          flunk "the load did not end within #{START_TIMEOUT} s (served: #{served})" if monotonic > deadline
          index += 1
          path = (index + client).even? ? "/heavy/#{index}" : "/light"
          begin
            http ||= Net::HTTP.start("127.0.0.1", port, open_timeout: 5, read_timeout: 30)
            response = http.get(path)
          rescue SystemCallError, IOError, Net::OpenTimeout, Net::ReadTimeout
            http&.finish rescue nil # rubocop:disable Style/RescueModifier -- already broken
            http = nil
            sleep 0.02
            retry
          end
          assert_equal "200", response.code, "#{path}: #{response.code} #{response.to_hash} #{response.body.to_s[0, 300]}\n" \
                                             "the server's log ends: #{log_tail(log)}"
          worker = JSON.parse(response.body).fetch("pid")
          lock.synchronize do
            served[worker] += 1
            after += 1 if signalled && !first_workers.include?(worker)
          end
        end
      ensure
        http&.finish rescue nil # rubocop:disable Style/RescueModifier
      end
    end
    clients.each(&:join)
    served
  end

  # The pids of `count` workers that announced themselves (besides those given), read from
  # the server's log; waits for them. (Puma's master may print a line twice: its stdout
  # buffer is copied into workers that flush it as they exit.)
  def wait_for_workers(kind, log, pid, count, besides: [])
    pattern = kind == :puma ? /Worker \d+ \(PID: (\d+)\) booted/ : /\[(?:\d+-\d+-\d+T[\d:.]+ )?#(\d+)\][^\n]*worker=\d+ ready/
    deadline = monotonic + START_TIMEOUT
    loop do
      workers = File.read(log).scan(pattern).flatten.map(&:to_i).uniq - besides
      return workers.first(count) if workers.size >= count

      if Process.waitpid(pid, Process::WNOHANG)
        @pids.delete(pid)
        flunk "the server ended: #{log_tail(log)}"
      end
      flunk "#{count} workers did not start within #{START_TIMEOUT} s: #{log_tail(log)}" if monotonic > deadline
      sleep 0.05
    end
  end

  def wait_for_log(log, pid, pattern)
    deadline = monotonic + START_TIMEOUT
    until File.read(log).match?(pattern)
      if Process.waitpid(pid, Process::WNOHANG)
        @pids.delete(pid)
        flunk "the server ended: #{log_tail(log)}"
      end
      flunk "#{pattern.inspect} not in the log within #{START_TIMEOUT} s: #{log_tail(log)}" if monotonic > deadline
      sleep 0.05
    end
  end

  # A redis-server of the test's own on a free port, in the foreground, without
  # persistence. Returns its URL once it answers.
  def start_redis
    port = free_port
    dir = Dir.mktmpdir("contprof-redis")
    @dirs << dir
    log = File.join(dir, "redis.log")
    pid = Process.spawn("redis-server", "--port", port.to_s, "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                        "--dir", dir, out: log, err: %i[child out], pgroup: true)
    @pids << pid
    deadline = monotonic + START_TIMEOUT
    loop do
      socket = TCPSocket.new("127.0.0.1", port)
      socket.write("PING\r\n")
      break if socket.gets.to_s.start_with?("+PONG")
    rescue SystemCallError
      flunk "redis-server did not start: #{File.read(log)}" if Process.waitpid(pid, Process::WNOHANG) || monotonic > deadline
      sleep 0.05
    ensure
      socket&.close
    end
    "redis://127.0.0.1:#{port}/0"
  end

  # --- what the processes wrote --------------------------------------------------------

  def new_run
    dir = Dir.mktmpdir("contprof-production")
    @dirs << dir
    %w[truth profiles].each { |sub| Dir.mkdir(File.join(dir, sub)) }
    intake = IntakeServer.new
    run = Run.new(dir: dir, truth: File.join(dir, "truth"), output: File.join(dir, "profiles"),
                  log: File.join(dir, "server.log"), intake: intake)
    (@intakes ||= []) << intake
    run
  end

  def truth_records(run)
    Dir[File.join(run.truth, "truth-*.jsonl")].flat_map { |file| File.readlines(file).map { |line| JSON.parse(line) } }
  end

  def truth_by_endpoint(run)
    truth_records(run).group_by { |r| r["name"] }.transform_values { |list| list.sum { |r| r["cpu"] } }
  end

  # Every process that ran (it measured something or exited) wrote profiles named after
  # its pid, whose OTLP copies say the same pid and a runtime-id of that process only; a
  # parent heard its timers after forking (the signals counted while it burned a known
  # CPU time: at least N - 3 sqrt(N) of the N its timers' period makes, a count of N
  # having a standard error of at most sqrt(N)); no thread stopped hearing them. Returns
  # [{ pid:, pprof: }] for every profile. (forks: false for a server that forks nothing.)
  def check_processes(run, forks: true)
    profiles = Dir[File.join(run.output, "*.pprof")].sort.map do |path|
      pid = File.basename(path)[/\A.*-(\d+)-\d{8}T[\d.]+Z\.pprof\z/, 1]&.to_i
      assert pid, "#{path}: the file name carries the pid"
      otlp = path.sub(/\.pprof\z/, ".otlp")
      assert File.exist?(otlp), "#{otlp} was written beside #{path}"
      attributes = Contprof::Otlp.resource_attributes(File.binread(otlp))
      assert_equal pid, attributes["process.pid"], "#{otlp}: process.pid"
      { pid: pid, runtime_id: attributes.fetch("service.instance.id"), pprof: Contprof::Pprof.decode_file(path), path: path }
    end
    refute_empty profiles, "no profile was written: #{log_tail(run.log)}"
    profiles.group_by { |p| p[:runtime_id] }.each do |runtime_id, list|
      assert_equal 1, list.map { |p| p[:pid] }.uniq.size, "runtime-id #{runtime_id} is one process's: #{list.map { |p| p[:path] }}"
    end

    ran = Dir[File.join(run.truth, "*-*.json*")].map { |file| File.basename(file)[/-(\d+)\.json/, 1].to_i }.uniq
    ran.each { |pid| assert profiles.any? { |p| p[:pid] == pid }, "process #{pid} wrote a profile" }

    exits = Dir[File.join(run.truth, "exit-*.json")].map { |file| JSON.parse(File.read(file)) }
    refute_empty exits
    exits.each do |exit|
      assert exit["worker"], "process #{exit["pid"]} was profiled until its exit"
      assert_equal 0, exit["worker"]["threads_not_hearing_timers"], "process #{exit["pid"]}: #{exit}"
      assert_nil exit["worker"]["cpu_timers_given_up"], "process #{exit["pid"]}"
    end

    parents = Dir[File.join(run.truth, "parent-*.jsonl")]
    refute_empty parents, "a parent recorded its timers after forking" if forks
    parents.each do |file|
      records = File.readlines(file).map { |line| JSON.parse(line) }
      expected = records.sum { |r| r["cpu"] * 1e9 / r["period_ns"] }
      signals = records.sum { |r| r["signals"] }
      floor = expected - 3 * Math.sqrt(expected)
      assert_operator floor, :>=, 1, "#{file}: the parent burns too little CPU for the check to tell"
      assert_operator signals, :>=, floor,
                      "#{file}: the parent heard #{signals} timer signals after forking, for #{expected.round(1)} expected " \
                      "(#{records.count { |r| r["signals"].zero? }} of its #{records.size} forks were followed by none)"
    end
    profiles
  end

  # CPU (ns) and CPU samples per label value, summed over every profile, the values of
  # `label` mapped to the truth's names (`known`) by what they contain; a labelled sample
  # that is neither fails.
  def cpu_by_label(profiles, label, known:)
    cpu = Hash.new(0)
    samples = Hash.new(0)
    profiles.each do |profile|
      profile[:pprof].samples.each do |sample|
        value = sample.labels[label] or next
        name = known.find { |k| name_of(k) == name_of(value) }
        assert name, "#{label} #{value.inspect} is none of #{known}"
        cpu[name] += sample.values["cpu-time"]
        samples[name] += sample.values["cpu-samples"]
      end
    end
    { cpu: cpu, samples: samples }
  end

  def name_of(text)
    return :heavy if text.match?(HEAVY_PATTERN)
    return :light if text.match?(LIGHT_PATTERN)

    text
  end

  # Each name's share of the CPU, profiled vs measured: within 3 points, or 3 standard
  # errors of the share for the sample count, whichever is larger.
  def check_shares(profiled, truth, what)
    total = profiled[:cpu].values.sum.to_f
    count = profiled[:samples].values.sum
    assert_operator count, :>, 0, "#{what}: no sample"
    truth_total = truth.values.sum
    report = truth.keys.map do |name|
      share = profiled[:cpu][name] / total
      expected = truth[name] / truth_total
      tolerance = [0.03, 3 * Math.sqrt(expected * (1 - expected) / count)].max
      [name, share, expected, tolerance]
    end
    text = report.map { |n, s, e, t| format("%s %.1f%% vs %.1f%% (±%.1f)", n, s * 100, e * 100, t * 100) }.join(", ")
    warn "#{what}: #{text}; #{count} CPU samples" if ENV["PRODUCTION_VERBOSE"]
    report.each do |name, share, expected, tolerance|
      assert_in_delta expected, share, tolerance, "#{what}: #{name}'s CPU share (#{text}; #{count} samples)"
    end
  end

  # No gap in the profiles, nor any other warning or error of Contprof's.
  def check_log(log)
    text = File.read(log)
    refute_match(/not profiled/, text)
    complaints = text.lines.grep(/(?:WARN|ERROR|FATAL) -- contprof/)
    assert_empty complaints, "Contprof's warnings in the log"
  end

  # --- helpers -------------------------------------------------------------------------

  DEBIAN_PACKAGES = { "puma" => "puma", "unicorn" => "unicorn", "sidekiq" => "ruby-sidekiq" }.freeze
  LIBRARY_PACKAGES = { "action_controller/railtie" => "ruby-rails", "active_job" => "ruby-activejob" }.freeze

  # Skips, in one line, unless `command` is installed and this Ruby loads `gem` and `library`.
  def skip_unless_loadable(gem, library, command)
    skip "#{command} is not installed (Debian: apt-get install #{DEBIAN_PACKAGES.fetch(gem)})" unless command?(command)
    return if system(RbConfig.ruby, "-e", "require #{gem.inspect}; require #{library.inspect}", err: File::NULL)

    skip "#{gem} or #{library} cannot be loaded by this Ruby (Debian: #{DEBIAN_PACKAGES.fetch(gem)}, #{LIBRARY_PACKAGES.fetch(library)})"
  end

  # A thread whose failure is reported by #value, where the test joins it.
  def background(&block)
    thread = Thread.new(&block)
    thread.report_on_exception = false
    (@threads ||= []) << thread
    thread
  end

  def command?(name)
    system("command -v #{name} > /dev/null")
  end

  def monotonic
    Process.clock_gettime(Process::CLOCK_MONOTONIC)
  end

  def note(what, since)
    warn format("  %s at %.1f s", what, monotonic - since) if ENV["PRODUCTION_VERBOSE"]
  end
end
