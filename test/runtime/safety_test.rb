# frozen_string_literal: true

require_relative "../test_helper"
require "json"
require "timeout"
require "tmpdir"

# What an application does to its own process (signals, directories, daemons, exec,
# threads, Ractors, failing intakes) never hangs or kills it, and never stops profiling
# without a word. Each case runs in a child process; the README's Reliability table quotes
# the figures.
class SafetyTest < Minitest::Test
  ROOT = File.expand_path("../..", __dir__)
  BURN = "def burn(s) = (t = Process.clock_gettime(Process::CLOCK_THREAD_CPUTIME_ID); " \
         "nil while Process.clock_gettime(Process::CLOCK_THREAD_CPUTIME_ID) - t < s)"

  # The figures the README's Reliability table quotes, printed with CONTPROF_LONG_TESTS=1.
  def figure(text)
    warn "  #{name}: #{text}" if ENV["CONTPROF_LONG_TESTS"] == "1"
  end

  def setup
    @dir = Dir.mktmpdir("contprof-safety")
  end

  def teardown
    # A child that hung (or a daemon it left) is killed: its command line names the directory.
    system("pkill", "-KILL", "-f", @dir, out: File::NULL, err: File::NULL)
    FileUtils.rm_rf(@dir)
  end

  def monotonic
    Process.clock_gettime(Process::CLOCK_MONOTONIC)
  end

  # Runs Ruby code (with contprof required, DIR the test's directory, burn(seconds)) in a
  # child; returns [status, stdout, stderr, seconds it took].
  # A child still running after `timeout` seconds is killed, and the test fails.
  def ruby(code, timeout: 60, env: {})
    started = monotonic
    Open3.popen3(env, RbConfig.ruby, "-I#{File.join(ROOT, "lib")}", "-rcontprof", "-e",
                 "require 'json'; require 'fileutils'; DIR = #{@dir.inspect}; #{BURN}\n#{code}") do |stdin, stdout, stderr, waiter|
      stdin.close
      out = Thread.new { stdout.read }
      err = Thread.new { stderr.read }
      unless waiter.join(timeout)
        Process.kill(:KILL, waiter.pid)
        flunk "the child was still running after #{timeout} s: #{err.value}"
      end
      [waiter.value, out.value, err.value, monotonic - started]
    end
  end

  def assert_clean_exit(status, err, expected = 0)
    refute status.signaled?, "killed by signal #{status.termsig}: #{err}"
    assert_equal expected, status.exitstatus, err
  end

  def profiles
    Dir[File.join(@dir, "**", "*.pprof")].map { |path| decode_profile(File.binread(path)) }
  end

  # --- Directories ---------------------------------------------------------------------

  def test_an_output_directory_that_goes_away_is_made_again
    status, _, err, = ruby(<<~RUBY)
      Contprof.start(output: File.join(DIR, "out"), upload_period: 1)
      burn(0.2)
      FileUtils.rm_rf(File.join(DIR, "out"))
      Contprof.stop
    RUBY
    assert_clean_exit(status, err)
    assert_equal 1, Dir[File.join(@dir, "out", "*.pprof")].size, err
  end

  def test_an_output_directory_that_cannot_hold_files_fails_once_without_hanging
    status, out, err, seconds = ruby(<<~RUBY, timeout: 30)
      profile = Contprof.profile(output: "/proc/self") { burn(0.05) }
      p profile.paths
    RUBY
    assert_clean_exit(status, err)
    assert_equal "[]", out.strip
    assert_equal 1, err.scan(/file: export failed, profile dropped: Errno::ENOENT/).size, err
    figure("output /proc/self: failed once, process done in #{seconds.round(2)} s")
    assert_operator seconds, :<, 20 # it used to spin for ever
  end

  # --- SIGPROF taken over by the application -------------------------------------------

  def test_trapping_sigprof_default_after_start_neither_kills_nor_stops_profiling
    status, _, err, = ruby(<<~RUBY)
      Contprof.start(output: DIR, interval: 0.005)
      trap("PROF", "DEFAULT")
      burn(1.0)
      stats = Contprof::Profiler.running.stats
      Contprof.stop
      warn "given up: \#{stats[:worker][:cpu_timers_given_up]}"
    RUBY
    assert_clean_exit(status, err)
    assert_includes err, "given up: the application trapped SIGPROF"
    assert_equal 1, err.scan("not profiled: the application trapped SIGPROF").size, err
    profile = profiles.fetch(0)
    # The CPU burnt after the trap is still in the profile, read from the clock.
    assert_operator profile.total("cpu-time") / 1e9, :>, 0.7
  end

  def test_an_application_sigprof_handler_gets_no_signal_of_ours_and_stays_after_stop
    status, out, err, = ruby(<<~RUBY)
      Contprof.start(output: DIR, interval: 0.005)
      received = 0
      mine = proc { received += 1 }
      trap("PROF", &mine)
      burn(1.0)
      Contprof.stop
      after = trap("PROF", "DEFAULT")
      puts JSON.generate(received: received, kept: after.equal?(mine))
    RUBY
    assert_clean_exit(status, err)
    result = JSON.parse(out)
    assert_equal 0, result["received"], "the application's handler received Contprof's signals"
    assert result["kept"], "stop put back the disposition of before the start over the application's"
  end

  def test_a_sigprof_disposition_replaced_outside_ruby_is_noticed_at_the_next_wall_sample
    skip "needs Fiddle" unless fiddle?
    status, _, err, = ruby(<<~RUBY)
      require "fiddle"
      Contprof.start(output: DIR, interval: 0.005)
      burn(0.2)
      libc = Fiddle.dlopen(nil)
      signal = Fiddle::Function.new(libc["signal"], [Fiddle::TYPE_INT, Fiddle::TYPE_VOIDP], Fiddle::TYPE_VOIDP)
      signal.call(Signal.list.fetch("PROF"), 1) # SIG_IGN, as native code would
      burn(0.5)
      warn "given up: \#{Contprof::Profiler.running.stats[:worker][:cpu_timers_given_up]}"
      Contprof.stop
    RUBY
    assert_clean_exit(status, err)
    assert_includes err, "given up: SIGPROF's handler was replaced by code outside Ruby"
    assert_operator profiles.fetch(0).total("cpu-time") / 1e9, :>, 0.5
  end

  def fiddle?
    require "fiddle"
    true
  rescue LoadError
    false
  end

  # A thread that blocks SIGPROF (native code's pthread_sigmask) never hears its timer:
  # its CPU is read from its clock instead, and said so. Known answer: the thread's own
  # CPU clock.
  def test_a_thread_blocking_sigprof_keeps_its_cpu_time
    skip "needs Fiddle" unless fiddle?
    status, out, err, = ruby(<<~RUBY)
      require "fiddle"
      libc = Fiddle.dlopen(nil)
      sigmask = Fiddle::Function.new(libc["pthread_sigmask"], [Fiddle::TYPE_INT, Fiddle::TYPE_VOIDP, Fiddle::TYPE_VOIDP],
                                     Fiddle::TYPE_INT)
      Contprof.start(output: DIR, interval: 0.005)
      worker = Thread.new do
        set = Fiddle::Pointer.malloc(128, Fiddle::RUBY_FREE)
        set[0, 128] = "\\0" * 128
        bit = Signal.list.fetch("PROF") - 1
        set[bit / 8] = 1 << (bit % 8)
        sigmask.call(0, set, nil) # SIG_BLOCK
        started = Process.clock_gettime(Process::CLOCK_THREAD_CPUTIME_ID)
        burn(1.5)
        Process.clock_gettime(Process::CLOCK_THREAD_CPUTIME_ID) - started
      end
      Thread.current.name = "main"
      worker.name = "blocker"
      cpu = worker.value
      stats = Contprof::Profiler.running.stats
      Contprof.stop
      puts JSON.generate(cpu: cpu, unheard: stats[:worker][:threads_blocking_sigprof])
    RUBY
    assert_clean_exit(status, err)
    result = JSON.parse(out)
    assert_equal 1, result["unheard"], err
    assert_includes err, "not profiled: 1 thread(s) blocked SIGPROF (seen in their signal mask"
    profile = profiles.fetch(0)
    recorded = profile.total("cpu-time") { |sample| sample.labels["thread name"] == "blocker" } / 1e9
    # Its clock is read at wall samples: all of it is there, up to the last sample.
    figure("blocker burnt #{result["cpu"].round(3)} s of CPU, profiled #{recorded.round(3)} s")
    assert_in_delta result["cpu"], recorded, 0.1 * result["cpu"], "blocker's CPU: #{result["cpu"]} s, profiled #{recorded} s"
  end

  # Out of memory where it loses data: a thread that cannot be followed (its state, or on
  # Ruby 3.3+ its registration), a stack that cannot be read (its scratch space, when stacks
  # are read through the public API). Each loss is counted and said; nothing crashes, and
  # the thread is followed again once memory is there.
  def test_losses_to_memory_are_counted_and_said
    status, out, err, = ruby(<<~RUBY)
      Contprof.start(output: DIR, interval: 0.005)
      site = Contprof::Native.vm_backend == "ruby31" ? :thread_state : :thread_entry
      Contprof::Collectors::CpuAndWallTimeWorker::Testing.fail_allocations(site, 1)
      thread = Thread.new { Thread.current.name = "late"; burn(0.3) }
      thread.join
      burn(0.1)
      stats = Contprof::Profiler.running.stats[:worker]
      Contprof.stop
      puts JSON.generate(state: stats[:threads_unsampled_no_memory], registration: stats[:threads_unknown_no_memory])
    RUBY
    assert_clean_exit(status, err)
    lost = JSON.parse(out)
    assert_equal 1, lost["state"] + lost["registration"], err
    assert_includes err, "not profiled: 1 time(s) a thread could not be followed (out of memory)"
    return unless lost["state"] == 1

    # (Its state is made again at the next round: most of its CPU is there.)
    late = profiles.sum { |profile| profile.total("cpu-time") { |sample| sample.labels["thread name"] == "late" } }
    assert_operator late, :>, 0.15e9
  end

  def test_a_stack_that_cannot_be_read_for_lack_of_memory_says_so
    skip "stacks are read through the public API on Ruby 3.3+ only" unless VMBackend.public_thread_api?
    status, out, err, = ruby(<<~RUBY, env: { "CONTPROF_VM_LAYOUT" => "off" })
      Contprof.start(output: DIR, interval: 0.005)
      burn(0.05)
      Contprof::Collectors::CpuAndWallTimeWorker::Testing.fail_allocations(:stack_scratch, 1)
      def deep(n) = n.zero? ? burn(0.3) : deep(n - 1) # (deeper than the scratch read so far)
      deep(300)
      stats = Contprof::Profiler.running.stats[:worker]
      Contprof.stop
      puts JSON.generate(unread: stats[:stacks_unread_no_memory])
    RUBY
    assert_clean_exit(status, err)
    assert_equal 1, JSON.parse(out)["unread"], err
    assert_includes err, "not profiled: 1 stack(s) could not be read (out of memory)"
    samples = profiles.flat_map(&:samples)
    names = samples.flat_map { |sample| sample.locations.map(&:function_name) }
    assert_includes names, "Stack not read (out of memory)"
    # (Another thread may be caught with no Ruby frame yet, as one of the profiler's being
    # born: that one is in native code. The main thread, the first followed, always has frames.)
    main = samples.select { |sample| sample.labels["thread id"].to_s == "1" }.flat_map { |sample| sample.locations.map(&:function_name) }
    assert_includes main, "Object#deep"
    refute_includes main, "In native code"
  end

  # --- Daemons, exec, exit -------------------------------------------------------------

  def test_a_daemon_keeps_profiling
    status, _, err, = ruby(<<~RUBY)
      Contprof.start(output: DIR, interval: 0.005, upload_period: 1)
      parent = Process.pid
      Process.daemon(true) # (standard streams to /dev/null: the test's pipes close)
      burn(1.0)
      worker = Contprof::Profiler.running.worker
      File.write(File.join(DIR, "daemon.json"), JSON.generate(pid: Process.pid, parent: parent, running: worker.running?))
      Contprof.stop
    RUBY
    assert_clean_exit(status, err)
    result = nil
    Timeout.timeout(30) do
      sleep 0.05 until (text = File.read(File.join(@dir, "daemon.json")) rescue "") && !text.empty? &&
                       Dir[File.join(@dir, "*-#{(result = JSON.parse(text))["pid"]}-*.pprof")].any?
    end
    refute_equal result["parent"], result["pid"]
    assert result["running"], "the daemon's worker thread is not running"
    path = Dir[File.join(@dir, "*-#{result["pid"]}-*.pprof")].first
    assert_operator decode_profile(File.binread(path)).total("cpu-time") / 1e9, :>, 0.6
  end

  # With an intake that never answers, stop (at exit, before exec) returns within
  # upload_timeout, however many destinations and uploads in progress.
  def test_exit_and_exec_wait_at_most_the_upload_timeout_for_every_exporter_together
    require_relative "../support/intake_server"
    intake = IntakeServer.new(delay: 60)
    settings = "agent_url: #{intake.url.inspect}, pyroscope_url: #{intake.url.inspect}, upload_timeout: 2, " \
               "upload_period: 1.2, log_level: 'error'"
    [["exit", "nil"], ["exec", "exec('true')"]].each do |name, ending|
      status, out, err, = ruby(<<~RUBY)
        Contprof.start(#{settings})
        burn(1.8) # the first uploads are under way
        $stdout.puts Process.clock_gettime(Process::CLOCK_MONOTONIC); $stdout.flush
        #{ending}
      RUBY
      ended = monotonic
      assert_clean_exit(status, err)
      delay = ended - Float(out.lines.last)
      figure("#{name} delayed #{delay.round(2)} s with upload_timeout 2 s, 2 exporters, uploads in progress")
      # Before: 2 s per exporter for the uploads in progress, then as much again for the last.
      assert_operator delay, :<, 2 + 1.0, "#{name} was delayed #{delay.round(2)} s (upload_timeout 2 s, 2 exporters)"
    end
    assert_operator intake.requests.size, :>=, 2
  ensure
    intake&.stop
  end

  # --- Starting and stopping -----------------------------------------------------------

  def scheduler_threads = "Thread.list.count { |t| t.name == 'Contprof::Scheduler' && t.alive? }"

  def test_failed_starts_leave_nothing_running
    status, out, err, = ruby(<<~RUBY)
      trap("PROF") {}
      errors = 3.times.map { Contprof.start(output: DIR, upload_period: 1) rescue $!.class.name }
      sleep 1.5
      puts JSON.generate(errors: errors, schedulers: #{scheduler_threads}, running: Contprof.running?,
                         files: Dir[File.join(DIR, "*")].size)
    RUBY
    assert_clean_exit(status, err)
    result = JSON.parse(out)
    assert_equal ["Contprof::Error"] * 3, result["errors"]
    assert_equal 0, result["schedulers"], "failed starts left scheduler threads behind"
    refute result["running"]
    assert_equal 0, result["files"], "failed starts keep exporting"
  end

  def test_concurrent_starts_and_stops_run_one_profiler_at_a_time
    status, out, err, = ruby(<<~RUBY, timeout: 120)
      most = 0
      threads = 6.times.map do
        Thread.new do
          20.times do
            Contprof.start(output: DIR, upload_period: 60) rescue nil
            most = [most, #{scheduler_threads}].max
            Contprof.stop
          end
        end
      end
      threads.each(&:join)
      sleep 0.5
      puts JSON.generate(most: most, left: #{scheduler_threads}, running: Contprof.running?)
    RUBY
    assert_clean_exit(status, err)
    result = JSON.parse(out)
    assert_operator result["most"], :<=, 1, "more than one scheduler ran at once"
    assert_equal 0, result["left"], "scheduler threads leaked"
    refute result["running"]
  end

  def test_stop_and_exec_work_in_a_trap_handler
    status, out, err, = ruby(<<~RUBY)
      Contprof.start(output: DIR, interval: 0.005)
      trap("USR1") { Contprof.stop }
      burn(0.3)
      Process.kill("USR1", Process.pid)
      sleep 0.3
      stopped = !Contprof.running?
      Contprof.start(output: DIR) # start works again
      trap("HUP") { exec("echo", "execed from trap, stopped: \#{stopped}") }
      burn(0.2)
      Process.kill("HUP", Process.pid)
      sleep 5
    RUBY
    assert_clean_exit(status, err)
    assert_equal "execed from trap, stopped: true", out.strip, err
    refute_match(/ThreadError|log writing failed/, err)
    assert_equal 2, profiles.size
  end

  # --- Threads and Ractors -------------------------------------------------------------

  def test_a_killed_sampling_thread_and_ractors_are_said_once
    status, out, err, = ruby(<<~RUBY)
      Warning[:experimental] = false
      Contprof.start(output: DIR, upload_period: 1)
      Thread.list.find { |t| t.name == "Contprof::CpuAndWallTimeWorker" }.kill.join
      2.times { Ractor.new { 1 }.take }
      sleep 2.5 # two flushes
      puts JSON.generate(Contprof::Profiler.running.stats[:not_profiled])
    RUBY
    assert_clean_exit(status, err)
    gaps = JSON.parse(out)
    assert_match(/sampling thread was killed/, gaps["sampling"])
    assert_match(/2 Ractor\(s\) started/, gaps["ractors"])
    assert_equal 1, err.scan("not profiled: the sampling thread was killed").size, err
    assert_equal 1, err.scan(/not profiled: \d Ractor/).size, err
  end
end
