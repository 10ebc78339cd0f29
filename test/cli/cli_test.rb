# frozen_string_literal: true

require_relative "../test_helper"
require "tmpdir"
require "cgi"

# The contprof command, run as a separate process, as users run it.
class CLITest < Minitest::Test
  ROOT = File.expand_path("../..", __dir__)
  EXE = File.join(ROOT, "exe", "contprof")
  WORKLOAD = File.join(ROOT, "examples", "workload.rb")
  CHROMIUM_FLAGS = %w[--headless --no-sandbox --disable-gpu --disable-quic --no-first-run
                      --disable-background-networking --disable-component-update --disable-sync].freeze

  def setup
    @dir = Dir.mktmpdir("contprof-cli")
  end

  def teardown
    FileUtils.rm_rf(@dir)
  end

  def contprof(*arguments, env: {})
    Open3.capture3(env, RbConfig.ruby, EXE, *arguments)
  end

  # One profile of examples/workload.rb, recorded once for the whole class.
  def self.workload_profile
    @workload_profile ||= begin
      dir = Dir.mktmpdir("contprof-cli-workload")
      _, err, status = Open3.capture3(RbConfig.ruby, EXE, "exec", "-o", dir, "--", RbConfig.ruby, WORKLOAD, "2")
      raise "contprof exec failed: #{err}" unless status.success?

      Dir[File.join(dir, "*.pprof")].first or raise "contprof exec wrote no profile: #{err}"
    end
  end

  def test_exec_profiles_a_program_and_the_hot_method_leads
    out, err, status = contprof("exec", "-o", @dir, "--service", "demo", "--", RbConfig.ruby, WORKLOAD, "1.5")
    assert status.success?, err
    assert_match(/report rounds: \d+/, out)
    files = Dir[File.join(@dir, "*.pprof")]
    assert_equal 1, files.size
    assert_match(/demo-\d+-\d{8}T\d{6}\.\d{6}Z\.pprof\z/, files.first)
    assert_empty err, "quiet by default: the program's standard error is left alone"

    top = go_pprof(File.binread(files.first), "-top")
    assert_match(/^Type: cpu-time$/, top)
    first_row = top.lines.drop_while { |l| !l.include?("flat%") }[1]
    assert_match(/Report#fibonacci$/, first_row.strip, "the hottest method leads go tool pprof -top:\n#{top}")
    profile = decode_profile(File.binread(files.first))
    fibonacci = profile.total("cpu-time") { |s| s.locations.first.function_name == "Report#fibonacci" }
    assert_operator fibonacci, :>, profile.total("cpu-time") / 2
  end

  # Issue #16: RUBYOPT=-rcontprof/auto without a destination writes where `contprof exec`
  # does, and says so once.
  def test_auto_without_a_destination_writes_to_contprof_profiles
    env = { "RUBYOPT" => "-I#{File.join(ROOT, "lib")} -rcontprof/auto" }
    _, err, status = Open3.capture3(env, RbConfig.ruby, "-e", "fork { 1 }; Process.wait", chdir: @dir)
    assert status.success?, err
    assert_equal 1, err.scan("no destination set").size, err
    assert_includes err, "writing profiles to ./contprof-profiles"
    files = Dir[File.join(@dir, "contprof-profiles", "*.pprof")]
    assert_equal 2, files.size, "the program and its forked child" # (both read back)
    files.each { |file| decode_profile(File.binread(file)) }
  end

  def test_exec_errors
    _, err, status = contprof("exec")
    assert_equal 2, status.exitstatus
    assert_equal "contprof: exec needs a command to run (contprof exec [options] -- COMMAND...)\n", err
    _, err, status = contprof("exec", "--interval", "zero", "--", "ruby", "-e", "1")
    assert_equal 2, status.exitstatus
    assert_match(/\Acontprof: setting interval \(CONTPROF_INTERVAL\) accepts a number of seconds/, err)
    assert_equal 1, err.lines.size
    _, err, status = contprof("exec", "--bogus", "--", "ruby")
    assert_equal 2, status.exitstatus
    assert_equal "contprof: invalid option: --bogus\n", err
    _, err, status = contprof("exec", "--", "/nonexistent/program")
    assert_equal 1, status.exitstatus
    assert_match(/\Acontprof: cannot run "\/nonexistent\/program": No such file or directory/, err)
  end

  def test_exec_options_never_take_the_end_of_options_and_switches_read_alike
    _, err, status = contprof("exec", "--version", "--", RbConfig.ruby, "-e", "1")
    assert_equal 2, status.exitstatus
    assert_match(/\Acontprof: --version needs a value \(got "--"/, err)
    _, err, status = contprof("exec", "--outptu", @dir, "--", RbConfig.ruby, "-e", "1")
    assert_equal [2, "contprof: invalid option: --outptu (did you mean --output?)\n"], [status.exitstatus, err]
    show = [RbConfig.ruby, "-e", 'print ENV["CONTPROF_SIGNALS"].inspect, " ", ENV["CONTPROF_CPU_TIMERS"].inspect']
    [[%w[--signals=false --cpu-timers=posix], '"false" "posix"'], [%w[--signals false --cpu-timers posix], '"false" "posix"'],
     [%w[--no-signals --no-cpu-timers], '"false" "false"'], [%w[--signals --cpu-timers], '"true" "true"']].each do |options, shown|
      out, err, status = contprof("exec", "-o", @dir, *options, "--", *show)
      assert status.success?, "#{options}: #{err}"
      assert_equal shown, out, options.join(" ")
    end
  end

  # --otlp is --otlp-url; --output-otlp a switch; an OTLP endpoint (option or OpenTelemetry's
  # variable) is a destination, so no default output is added.
  def test_exec_otlp_options
    show = [RbConfig.ruby, "-e", 'print ENV.values_at(*%w[CONTPROF_OTLP_URL CONTPROF_OTLP_TIMEOUT CONTPROF_OUTPUT_OTLP]).inspect']
    out, err, status = contprof("exec", "--otlp", "http://127.0.0.1:9/otlp", "--otlp-timeout", "2", "--output-otlp",
                                "-o", @dir, "--", *show)
    assert status.success?, err
    assert_equal '["http://127.0.0.1:9/otlp", "2", "true"]', out
    assert_empty err, "a profile under 1 s is written, not uploaded"
    assert_equal 1, Dir[File.join(@dir, "*.otlp")].size
    assert_equal 1, Dir[File.join(@dir, "*.pprof")].size
    output = [RbConfig.ruby, "-e", 'print ENV["CONTPROF_OUTPUT"].inspect']
    [[["--otlp-url", "http://127.0.0.1:9"], {}],
     [[], { "OTEL_EXPORTER_OTLP_ENDPOINT" => "http://127.0.0.1:9" }]].each do |options, env|
      out, err, status = contprof("exec", *options, "--", *output, env: env)
      assert status.success?, err
      assert_equal "nil", out, "#{options} #{env}"
    end
    _, err, status = contprof("exec", "--otlp", "ftp://collector", "--", RbConfig.ruby, "-e", "1")
    assert_equal 2, status.exitstatus
    assert_match(/\Acontprof: setting otlp_url \(CONTPROF_OTLP_URL\) accepts an http\(s\):/, err)
  end

  # exec replaces itself with the command: its PID, exit status, signals and standard input
  # are the program's; a command that cannot be profiled is told so before it runs.
  def test_exec_becomes_the_program_and_says_when_it_cannot_be_profiled
    _, err, status = contprof("exec", "-o", @dir, "--", "sh", "-c", "exit 7")
    assert_equal 7, status.exitstatus
    assert_equal "contprof: sh is not a Ruby program: only Ruby processes it starts (which read RUBYOPT) are " \
                 "profiled\n", err
    _, _, status = contprof("exec", "-o", @dir, "--", "sh", "-c", "kill -TERM $$")
    assert_equal Signal.list["TERM"], status.termsig
    out, err, status = Open3.capture3(RbConfig.ruby, EXE, "exec", "-o", @dir, "--", RbConfig.ruby, "-e",
                                      "print STDIN.read.upcase; exit 3", stdin_data: "profiled input")
    assert_equal [3, "PROFILED INPUT", ""], [status.exitstatus, out, err]
    assert_equal 1, Dir[File.join(@dir, "*.pprof")].size
    script = File.join(@dir, "script")
    File.write(script, "#!/usr/bin/env #{File.basename(RbConfig.ruby)}\nprint Process.pid\n")
    File.chmod(0o755, script)
    reader, writer = IO.pipe
    pid = Process.spawn({ "PATH" => "#{RbConfig::CONFIG["bindir"]}:#{ENV["PATH"]}" }, RbConfig.ruby, EXE, "exec",
                        "-o", @dir, "--", script, out: writer, err: writer)
    writer.close
    Process.wait(pid)
    assert_equal pid.to_s, reader.read, "the script runs as the process contprof exec was"
  end

  # A supervisor's signal to the PID it started is the program's to handle.
  def test_exec_signals_reach_the_program
    ready = File.join(@dir, "ready")
    program = "trap('INT') { exit 42 }; trap('TERM') { exit 43 }; File.write(#{ready.inspect}, '1'); sleep"
    signals = { "INT" => 42, "TERM" => 43, "QUIT" => nil }
    # A shell without job control starts background commands with SIGQUIT (and SIGINT)
    # ignored, and the program inherits that, as it should: then SIGQUIT cannot end it.
    ignored = File.read("/proc/self/status")[/^SigIgn:\s*(\h+)/, 1].to_i(16)
    signals.delete("QUIT") if ignored[Signal.list["QUIT"] - 1] == 1
    signals.each do |signal, status|
      File.delete(ready) if File.exist?(ready)
      pid = Process.spawn(RbConfig.ruby, EXE, "exec", "-o", @dir, "--", RbConfig.ruby, "-e", program)
      deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + 30
      sleep 0.05 until File.exist?(ready) || Process.clock_gettime(Process::CLOCK_MONOTONIC) > deadline
      Process.kill(signal, pid)
      _, result = Process.wait2(pid)
      if status
        assert_equal status, result.exitstatus, "SIGINT/SIGTERM handled by the program (#{signal})"
      else
        assert_equal Signal.list[signal], result.termsig, "SIGQUIT ends it as it would end Ruby"
      end
    end
    assert_equal signals.size, Dir[File.join(@dir, "*.pprof")].size, "each run wrote its profile at exit"
  end

  # A profile's sample types at the defaults: time, and allocations where they are on by
  # default (allocation: auto).
  def default_types
    allocation = Contprof::Collectors::Allocations.on_by_default?
    Contprof::Collectors::Allocations.sample_types(allocation, Contprof::Collectors::Allocations.heap_supported?).map(&:first)
  end

  def test_report_top
    out, err, status = contprof("report", self.class.workload_profile, "--top", "5")
    assert status.success?, err
    sections = out.split("\n\n")
    assert_equal default_types, sections.map { |s| s[/\A[^:\s]+/] }
    cpu = sections.first.lines
    assert_match(/\A +flat +flat% +sum% +cum +cum% +samples +± flat%\n\z/, cpu[1])
    assert_match(/Report#fibonacci$/, cpu[2].strip)
    assert_operator cpu.size, :<=, 7
    out, = contprof("report", self.class.workload_profile, "--type", "wall-time")
    assert_equal ["wall-time"], out.split("\n\n").map { |s| s[/\A[^:\s]+/] }
  end

  def test_report_folded
    out, err, status = contprof("report", self.class.workload_profile, "--folded")
    assert status.success?, err
    lines = out.lines
    refute_empty lines
    lines.each { |line| assert_match(/\A[^;\n]+(;[^;\n]+)* \d+\n\z/, line) }
    totals = lines.to_h { |l| l.rpartition(" ").then { |stack, _, value| [stack, Integer(value)] } }
    profile = decode_profile(File.binread(self.class.workload_profile))
    assert_equal profile.total("cpu-time"), totals.values.sum
    assert(totals.keys.any? { |stack| stack.end_with?(";Report#fibonacci") })
    # Never the profiler's own frames: a round queued when the program ends cannot run
    # inside Contprof's at-exit stop (ProfilerTest covers that case deterministically).
    assert_empty totals.keys.grep(/Contprof/), "samples in the profiler's exit path"
    # The program's CPU is in Report#run but for what it does after (printing its own
    # figures, where the final stretch of up to an interval of CPU also goes: more under
    # the sanitizers as the adaptive rate stretches it) and GC pending at exit (recorded
    # as Garbage Collection alone when no frame of the program is left).
    in_run = profile.total("cpu-time") do |sample|
      sample.locations.reverse.map(&:function_name).first(2) == ["<main>", "Report#run"]
    end
    assert_operator in_run, :>=, profile.total("cpu-time") * (ENV["CONTPROF_SANITIZED"] ? 0.85 : 0.95),
                    totals.reject { |stack, _| stack.start_with?("<main>;Report#run") }
  end

  def test_report_flamegraph_renders_in_chromium_with_the_hot_method_widest
    html = File.join(@dir, "flame.html")
    out, err, status = contprof("report", self.class.workload_profile, "--flamegraph", html)
    assert status.success?, err
    assert_equal "wrote #{html}\n", out
    page = File.read(html)
    refute_match(%r{<script[^>]+src=|<link[^>]+href=|https?://}, page, "self-contained: nothing to fetch")

    chromium = %w[chromium chromium-browser].find { |c| system("command -v #{c} >/dev/null 2>&1") }
    flunk "Chromium is needed to check the flame graph (Debian package chromium; bin/setup installs it)" unless chromium
    dom, = Open3.capture3(chromium, *CHROMIUM_FLAGS, "--user-data-dir=#{File.join(@dir, "chromium")}",
                          "--dump-dom", "file://#{html}")
    frames = dom.scan(/<div class="frame[^"]*" data-name="([^"]*)"[^>]*style="[^"]*width: ([\d.]+)%/)
    refute_empty frames, "the page drew its frames"
    widths = Hash.new(0.0)
    frames.each { |name, width| widths[CGI.unescapeHTML(name)] = [widths[CGI.unescapeHTML(name)], width.to_f].max }
    assert_in_delta 100.0, widths["all"], 0.01
    assert_operator widths["Report#fibonacci"], :>, 50.0
    assert_operator widths["Report#fibonacci"], :>, widths["Report#checksum"]
  end

  def test_report_errors
    _, err, status = contprof("report")
    assert_equal 2, status.exitstatus
    assert_equal "contprof: report needs at least one pprof FILE or directory (see contprof report --help)\n", err
    _, err, status = contprof("report", "/nonexistent.pprof")
    assert_equal 2, status.exitstatus
    assert_match(/\Acontprof: cannot read \/nonexistent.pprof: No such file or directory/, err)
    _, err, status = contprof("report", __FILE__)
    assert_equal 2, status.exitstatus
    assert_match(/\Acontprof: .* is not a pprof profile/, err)
    assert_equal 1, err.lines.size
    _, err, status = contprof("report", self.class.workload_profile, "--type", "alloc-bytes")
    assert_equal 2, status.exitstatus
    assert_match(/no sample type "alloc-bytes" .* \(it has #{default_types.join(", ")}\)/, err)
    _, err, status = contprof("report", self.class.workload_profile, "--top", "0")
    assert_equal 2, status.exitstatus
    assert_match(/--top needs a positive number/, err)
    _, err, status = contprof("report", self.class.workload_profile, "--flamegrpah", "x")
    assert_equal 2, status.exitstatus
    assert_equal "contprof: invalid option: --flamegrpah (did you mean --flamegraph?)\n", err
  end

  def test_help_version_doctor_and_unknown_commands
    [["--help"], %w[exec --help], %w[report --help], %w[doctor --help]].each do |arguments|
      out, err, status = contprof(*arguments)
      assert status.success?, "#{arguments}: #{err}"
      assert_match(/usage: contprof/, out)
    end
    out, err, status = contprof
    assert_equal [2, ""], [status.exitstatus, out]
    assert_match(/\Ausage: contprof COMMAND/, err)
    _, err, status = contprof("doctor", "--bogus")
    assert_equal [2, "contprof: invalid option: --bogus\n"], [status.exitstatus, err]
    out, = contprof("exec", "--help")
    assert_match(/--interval SECONDS +time between samples: a number of seconds from 0.001 to 60/, out)
    assert_match(/--upload-period SECONDS +time between profile flushes/, out)
    assert_match(/--\[no-\]signals\[=VALUE\]/, out)
    assert_match(/--otlp-url, --otlp VALUE +OTLP\/HTTP endpoint to upload to/, out)
    assert_match(/--\[no-\]output-otlp\[=VALUE\]/, out)
    out, = contprof("--version")
    assert_equal "contprof #{Contprof::VERSION}\n", out
    out, _, status = contprof("doctor")
    assert status.success?
    assert_match(/\Asupported: Ruby #{Regexp.escape(RUBY_VERSION)}/, out)
    # What this machine gives a profiled process, each as the run would find it.
    timers = Contprof::Native.perf_events_refused ? /^  CPU timers: POSIX timers \(perf_event_open refused: .+; kernel\.perf_event_paranoid is / : /^  CPU timers: perf events$/
    assert_match(timers, out)
    assert_match(/^  libcurl: loads$/, out) # (bin/setup installs it)
    heap = Contprof::Collectors::Allocations.heap_supported? ? /^  live-heap profiling: available$/ : /^  live-heap profiling: unavailable \(/
    assert_match(heap, out)
    mn = RUBY_VERSION < "3.3" ? /^  M:N threads: not in Ruby / : /^  M:N threads: off \(RUBY_MN_THREADS unset/
    assert_match(mn, out) unless ENV["RUBY_MN_THREADS"]
    if RUBY_VERSION >= "3.3"
      out, = contprof("doctor", env: { "RUBY_MN_THREADS" => "1" })
      assert_match(/^  M:N threads: on \(RUBY_MN_THREADS=1\): threads seen sharing/, out)
    end
    _, err, status = contprof("frobnicate")
    assert_equal 2, status.exitstatus
    assert_equal "contprof: unknown command \"frobnicate\" (commands: exec, report, serve, doctor; see --help)\n", err
  end
end
