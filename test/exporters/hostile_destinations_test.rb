# frozen_string_literal: true

# Every destination setting given hostile values, tried as a user would: `contprof exec` on
# a real program (which prints "hi" on standard output, "err" on standard error and exits
# 3), under each bad `output`, `agent_url`, `pyroscope_url`, `otlp_url` and agentless
# `api_key`, and along each way a process ends (at_exit, exec, fork, daemon, a signal, an
# uncaught exception). Each run must keep the program's exit status and output its own:
# standard output exactly the program's, standard error the program's plus Contprof's log
# lines, one per kind of failure however many flushes failed; the run must end within
# upload_timeout of the program's own end; and the failures must be counted in the
# profiler's stats, which the program hands over on fd 3 from a finalizer (finalizers run
# after every at_exit hook, so after the last flush).
#
# The cases of a test method run side by side (they mostly wait: for Ruby to start, for
# upload_timeout), each in processes of its own.

require_relative "../test_helper"
require "json"
require "openssl"
require "rbconfig"
require "logger"
require "socket"
require "stringio"
require "timeout"
require "tmpdir"

class HostileDestinationsTest < Minitest::Test
  ROOT = File.expand_path("../..", __dir__)
  CONTPROF = [RbConfig.ruby, "-I#{File.join(ROOT, "lib")}", File.join(ROOT, "exe", "contprof"), "exec", "--"].freeze
  # Put before each program: hands the stats of the profiler running in it (nil when none
  # runs), its pid and when the program itself ended (its at_exit hook runs before
  # Contprof's, registered earlier) to fd 3 when the process ends, after the last flush.
  PRELUDE = <<~RUBY
    require "json"
    $contprof_profiler = Contprof::Profiler.running if defined?(Contprof::Profiler)
    at_exit { $contprof_program_end = Process.clock_gettime(Process::CLOCK_MONOTONIC) }
    $contprof_keep = Object.new
    ObjectSpace.define_finalizer($contprof_keep, proc do
      stats = $contprof_profiler&.stats&.reject { |key, _| %i[worker recorder not_profiled].include?(key) }
      io = IO.for_fd(3, autoclose: false)
      io.write(JSON.generate("pid" => Process.pid, "program_end" => $contprof_program_end, "stats" => stats) + "\\n")
      io.flush
    rescue StandardError
      nil
    end)
  RUBY
  PROGRAM = "puts :hi; $stderr.puts :err; exit 3"
  # A line of Contprof's log (Logger's format, progname contprof).
  LOG_LINE = /\A[DIWEF], \[[^\]]+\] +[A-Z]+ -- contprof: /
  # Ruby's start-up, twice (`contprof exec`, then the program), and the process's end, on a
  # machine loaded by the cases running side by side.
  START_SLACK = 8.0
  # What the process's end may take past its last flush's own work (the finalizers, Ruby's
  # teardown) on such a machine: well under the seconds that a wait for a hanging
  # destination past upload_timeout, or the old endless mkdir, took.
  EXIT_SLACK = 2.5
  # upload_timeout where the server never answers (the wait is what is checked), and where
  # it answers at once (room for a loaded machine: the server is a thread of this process).
  NEVER_TIMEOUT = 1.0
  ANSWER_TIMEOUT = 4.0
  # libcurl's wording: "Couldn't connect", "Could not connect" since 8.x.
  COULD_NOT = "Could(?:n't| not)"
  # A server that never answers: its upload times out, or is cancelled at stop when that
  # comes first.
  NEVER_ANSWERED = /upload cancelled at stop: upload_timeout \(1\.0 s\) reached|Timeout was reached/
  # A credential that must appear in no log line, stats or output.
  SECRET = "SECRET-KEY-0123456789abcdef"

  # What stop may wait for uploads at most, and the process's end after.
  def self.upload_delay(timeout)
    timeout + Contprof::Profiler::CANCEL_WAIT + EXIT_SLACK
  end

  Result = Struct.new(:label, :status, :out, :err, :seconds, :ended_at, :stats_lines, :pid, keyword_init: true) do
    def stats(pid = self.pid)
      line = stats_lines.find { |entry| entry["pid"] == pid }
      line && line["stats"]
    end

    # Seconds from the program's own end (its at_exit hook) to the process's, or nil.
    def exit_delay
      line = stats_lines.find { |entry| entry["pid"] == pid }
      line && line["program_end"] && ended_at - line["program_end"]
    end

    def log_lines
      err.lines.grep(LOG_LINE)
    end

    def program_err
      err.lines.grep_v(LOG_LINE).join
    end

    def describe
      "#{label}: #{status.inspect} in #{seconds.round(2)} s (exit delay #{exit_delay&.round(2).inspect} s)\nstdout: #{out.inspect}\nstderr:\n#{err}\nstats: #{stats_lines.inspect}"
    end
  end

  # A TCP server that fails as asked: :never (reads the request, never answers), an
  # Integer (answers that status), :echo (400 with the request's headers, as some proxies
  # do, credentials first: the log shows an answer's first 200 characters), :garbage (no HTTP at all), :plain (an HTTP server: answers 400 to whatever comes,
  # a TLS handshake included), :tls (a TLS server with a self-signed certificate).
  class HostileServer
    attr_reader :port

    def initialize(mode)
      @mode = mode
      @server = TCPServer.new("127.0.0.1", 0)
      @port = @server.addr[1]
      @accepted = Queue.new
      @sockets = []
      @threads = []
      @tls = tls_context if mode == :tls
      @acceptor = Thread.new do
        loop do
          socket = @server.accept
          @sockets << socket
          @accepted << true
          @threads << Thread.new(socket) { |s| serve(s) }
        end
      rescue IOError, SystemCallError
        nil
      end
    end

    def url(scheme = "http")
      "#{scheme}://127.0.0.1:#{@port}"
    end

    # Waits for the next connection.
    def wait_for_connection(timeout)
      Timeout.timeout(timeout) { @accepted.pop }
    end

    def stop
      @server.close
      @acceptor.join(1)
      (@threads + [@acceptor]).each(&:kill)
      @sockets.each { |socket| socket.close rescue nil } # rubocop:disable Style/RescueModifier
    end

    private

    def serve(socket)
      case @mode
      when :never then read_request(socket) # and hold the connection
      when Integer then read_request(socket) && answer(socket, @mode, "no (#{@mode})")
      when :echo then (headers = read_request(socket)) && answer(socket, 400, "you sent:\n#{credentials_first(headers)}")
      when :garbage then read_request(socket) && (socket.write("garbage\r\n\r\n\x00\xff".b) && socket.close)
      when :plain then socket.readpartial(4096) && answer(socket, 400, "")
      when :tls
        tls = OpenSSL::SSL::SSLSocket.new(socket, @tls)
        tls.accept
        read_request(tls) && answer(tls, 202, "{}")
      end
    rescue IOError, SystemCallError, OpenSSL::SSL::SSLError
      nil
    ensure
      socket.close unless @mode == :never # (as a TLS server does after a failed handshake)
    end

    # The request's head, after reading its body (libcurl sends no body to a server that
    # answers first, and then reports a send error, not the answer).
    def read_request(socket)
      data = +""
      data << socket.readpartial(65_536) until data.include?("\r\n\r\n")
      head, body = data.split("\r\n\r\n", 2)
      socket.write("HTTP/1.1 100 Continue\r\n\r\n") if head.match?(/^Expect: 100-continue/i)
      length = head[/^Content-Length: *(\d+)/i, 1].to_i
      body << socket.readpartial(65_536) while body.bytesize < length
      head
    rescue EOFError
      nil
    end

    def credentials_first(head)
      head.lines.sort_by { |line| line.match?(/\A(authorization|dd-api-key):/i) ? 0 : 1 }.join
    end

    def answer(socket, status, body)
      socket.write("HTTP/1.1 #{status} Hostile\r\nContent-Length: #{body.bytesize}\r\nConnection: close\r\n\r\n#{body}")
      socket.close
    end

    def tls_context
      key = OpenSSL::PKey::EC.generate("prime256v1")
      certificate = OpenSSL::X509::Certificate.new
      certificate.version = 2
      certificate.serial = 1
      certificate.subject = certificate.issuer = OpenSSL::X509::Name.parse("/CN=127.0.0.1")
      certificate.public_key = key
      certificate.not_before = Time.now - 60
      certificate.not_after = Time.now + 3600
      certificate.sign(key, OpenSSL::Digest.new("SHA256"))
      OpenSSL::SSL::SSLContext.new.tap do |context|
        context.cert = certificate
        context.key = key
      end
    end
  end

  def setup
    @dir = Dir.mktmpdir("contprof-hostile")
    File.chmod(0o755, @dir) # (the permission case runs its program as another user)
    @servers = []
  end

  def teardown
    @servers.each(&:stop)
    FileUtils.rm_rf(@dir) if @dir
  end

  def server(mode)
    HostileServer.new(mode).tap { |s| @servers << s }
  end

  def monotonic
    Process.clock_gettime(Process::CLOCK_MONOTONIC)
  end

  # Runs `contprof exec -- ruby -e PRELUDE+program` with `env` (over a cleared Contprof and
  # OpenTelemetry environment). prefix: a command in front (unshare, setpriv); during: called
  # with the pid while the program runs (to signal it).
  def run_case(label, env, program: PROGRAM, prefix: [], options: {}, during: nil, timeout: 40)
    clean = ENV.keys.grep(/\A(CONTPROF|OTEL)_/).to_h { |key| [key, nil] }
    reader, writer = IO.pipe
    started = monotonic
    Open3.popen3(clean.merge(env), *prefix, *CONTPROF, RbConfig.ruby, "-e", PRELUDE + program,
                 3 => writer, chdir: @dir, **options) do |stdin, stdout, stderr, waiter|
      writer.close
      stdin.close
      out = Thread.new { stdout.read }
      err = Thread.new { stderr.read }
      stats = Thread.new { reader.read }
      during&.call(waiter.pid)
      unless waiter.join(timeout)
        Process.kill(:KILL, waiter.pid)
        flunk "#{label}: still running after #{timeout} s: #{err.value}"
      end
      ended_at = monotonic
      Result.new(label: label, status: waiter.value, out: out.value, err: err.value, seconds: ended_at - started,
                 ended_at: ended_at, pid: waiter.pid,
                 stats_lines: stats.value.lines.map { |line| JSON.parse(line) })
    end
  ensure
    reader.close
    writer.close unless writer.closed?
  end

  # Runs the cases (label => [env, options]) side by side; yields each result.
  def run_cases(cases)
    threads = cases.map do |label, (env, options)|
      Thread.new { run_case(label, env, **(options || {})) }
    end
    results = threads.map(&:value)
    results.each { |result| yield result }
  end

  # The program ran as without Contprof: its status, its output; its standard error holds,
  # besides its own, `lines` Contprof lines, each matching `log`; the process ended within
  # `delay` seconds of the program's own end (the last flush: a file written, or uploads
  # until upload_timeout), and the whole run within the program's `run` seconds plus that
  # and the start-up.
  def assert_own_exit(result, log:, delay: EXIT_SLACK, run: 0, status: 3, out: "hi\n", err: "err\n", lines: 1)
    refute result.status.signaled?, result.describe
    assert_equal status, result.status.exitstatus, result.describe
    assert_equal out, result.out, result.describe
    assert_equal err, result.program_err, result.describe
    assert_equal lines, result.log_lines.size, result.describe
    result.log_lines.each { |line| assert_match log, line, result.describe }
    assert_operator result.exit_delay, :<, delay, result.describe if result.exit_delay
    assert_operator result.seconds, :<, run + delay + START_SLACK, result.describe
  end

  # The stats (of the process `pid`) show `count` failures of `exporter` (at least `count`
  # with at_least), of a kind matching `kind`; and the log has said each kind of failure
  # exactly once.
  def assert_counted(result, exporter, kind, count, at_least: false, pid: result.pid)
    stats = result.stats(pid)
    refute_nil stats, result.describe
    said = result.log_lines.count { |line| line.include?("##{pid}]") }
    assert_equal stats.fetch("failures").sum { |_, kinds| kinds.size }, said, result.describe
    kinds = stats.dig("failures", exporter) || {}
    total = kinds.select { |name, _| name.match?(kind) }.sum { |_, n| n }
    if at_least
      assert_operator total, :>=, count, result.describe
    else
      assert_equal count, total, result.describe
    end
    assert_equal kinds.values.sum, stats["#{exporter}_failed"], result.describe
    refute_nil stats.dig("last_errors", exporter), result.describe
  end

  # --- output ----------------------------------------------------------------------------

  def test_output_directories_that_cannot_be_made_or_written
    File.write(File.join(@dir, "a-file"), "")
    long = File.join(@dir, "#{"d" * 300}/x")
    cases = {
      # procfs answers ENOENT under /proc, which exists: the old mkdir -p recursed for ever.
      "procfs" => [["/proc/forbidden", /mkdir \/proc\/forbidden/], Errno::ENOENT],
      "a file where a directory should be" => [["#{@dir}/a-file/out", /a-file.*not a directory/], Errno::ENOTDIR],
      "a device" => [["/dev/full", /\/dev\/full: something that is not a directory/], Errno::ENOTDIR],
      "a directory that holds no files" => [["/proc/self", /writing \/proc\/self\/ruby-/], Errno::ENOENT],
      "a name too long" => [[long, /File name too long - mkdir/], Errno::ENAMETOOLONG],
    }
    run_cases(cases.transform_values { |((path, _), _)| [{ "CONTPROF_OUTPUT" => path }] }) do |result|
      (_, message), error = cases.fetch(result.label)
      assert_own_exit(result, log: /WARN -- contprof: file: export failed, profile dropped: #{error.name}: .*#{message}/)
      assert_counted(result, "file", /\A#{error.name}\z/, 1)
    end
  end

  def test_a_failing_output_is_logged_once_and_counted_at_every_flush
    cases = {
      "procfs" => [{ "CONTPROF_OUTPUT" => "/proc/forbidden" }, Errno::ENOENT],
      # The parent of the output directory becomes a file after the first flush.
      "a directory that vanishes" => [{ "CONTPROF_OUTPUT" => File.join(@dir, "vanishing", "out") }, Errno::ENOTDIR],
    }
    program = <<~RUBY
      sleep 1.4
      if ENV["CONTPROF_OUTPUT"].include?("vanishing")
        Dir.children(ENV["CONTPROF_OUTPUT"]).each { |name| File.unlink(File.join(ENV["CONTPROF_OUTPUT"], name)) }
        Dir.rmdir(ENV["CONTPROF_OUTPUT"])
        Dir.rmdir(File.dirname(ENV["CONTPROF_OUTPUT"]))
        File.write(File.dirname(ENV["CONTPROF_OUTPUT"]), "")
      end
      sleep 1
      #{PROGRAM}
    RUBY
    run_cases(cases.transform_values { |env, _| [env.merge("CONTPROF_UPLOAD_PERIOD" => "1"), { program: program }] }) do |result|
      error = cases.fetch(result.label)[1]
      assert_own_exit(result, log: /file: export failed, profile dropped: #{error.name}/, run: 2.4)
      flushes = result.stats.fetch("flushes")
      assert_operator flushes, :>=, 3, result.describe # 2 periods, and at exit
      failures = result.label == "procfs" ? flushes : flushes - 1 # (the first flush of the vanishing one is written)
      assert_counted(result, "file", /\A#{error.name}\z/, failures)
    end
  end

  # A full disk and a read-only file system, each a tmpfs of the program's own (a mount
  # namespace: `unshare -m` as root, or with a user namespace `unshare -rm`).
  def test_a_full_disk_and_a_read_only_file_system
    unshare = %w[-m -rm].map { |flags| ["unshare", flags] }.find { |command| system(*command, "true", err: File::NULL) }
    skip "needs unshare -m (root) or -rm (user namespaces) to mount a tmpfs" unless unshare
    mount = File.join(@dir, "mnt")
    Dir.mkdir(mount)
    script = {
      "full" => "mount -t tmpfs -o size=16k none #{mount} && head -c 1048576 /dev/zero > #{mount}/fill 2>/dev/null",
      "read-only" => "mount -t tmpfs -o ro,size=16k none #{mount}",
    }
    cases = script.to_h do |label, mounting|
      [label, [{ "CONTPROF_OUTPUT" => mount }, { prefix: [*unshare, "sh", "-c", "#{mounting}; exec \"$@\"", "sh"] }]]
    end
    run_cases(cases) do |result|
      error = result.label == "full" ? "Errno::ENOSPC" : "Errno::EROFS"
      assert_own_exit(result, log: /file: export failed, profile dropped: #{error}: .* - writing #{mount}\/ruby-/)
      assert_counted(result, "file", /\A#{error}\z/, 1)
    end
  end

  def test_permission_denied_a_file_size_limit_and_a_removed_current_directory
    locked = File.join(@dir, "locked")
    Dir.mkdir(locked, 0o555)
    as_nobody = Process.uid.zero? ? %w[setpriv --reuid=65534 --regid=65534 --clear-groups --] : []
    if as_nobody.any? && !system(*as_nobody, "test", "-r", File.join(ROOT, "lib", "contprof.rb"), err: File::NULL)
      skip "needs setpriv, and a checkout that user nobody can read, to be denied a directory as root"
    end
    gone = File.join(@dir, "gone")
    cases = {
      "permission denied" => [{ "CONTPROF_OUTPUT" => File.join(locked, "out") }, { prefix: as_nobody }],
      # The kernel would stop the write at the limit and kill the program with SIGXFSZ.
      "file size limit" => [{ "CONTPROF_OUTPUT" => File.join(@dir, "small") }, { options: { rlimit_fsize: 64 } }],
      # The default output, ./contprof-profiles, under a current directory that was removed.
      "current directory removed" => [{}, { prefix: ["sh", "-c", "mkdir #{gone} && cd #{gone} && rmdir #{gone} && exec \"$@\"", "sh"] }],
    }
    expected = {
      "permission denied" => ["Errno::EACCES", /mkdir #{locked}\/out/],
      "file size limit" => ["Errno::EFBIG", /over this process's file size limit \(64 bytes, ulimit -f\)/],
      "current directory removed" => ["Errno::ENOENT", /mkdir contprof-profiles/],
    }
    run_cases(cases) do |result|
      error, message = expected.fetch(result.label)
      assert_own_exit(result, log: /file: export failed, profile dropped: #{error}: .*#{message}/)
      assert_counted(result, "file", /\A#{error}\z/, 1)
    end
  end

  def test_odd_but_valid_names_are_written
    odd = File.join(@dir, "odd 'name' $HOME * ü ✓ [1] -x")
    cases = {
      "odd directory name" => [{ "CONTPROF_OUTPUT" => odd }],
      "service name longer than a file name may be" => [{ "CONTPROF_OUTPUT" => File.join(@dir, "long"), "CONTPROF_SERVICE" => "s/" * 200 }],
    }
    run_cases(cases) do |result|
      assert_own_exit(result, log: //, lines: 0)
      assert_equal 1, result.stats.fetch("file_exported"), result.describe
    end
    assert_equal 1, Dir.children(odd).grep(/\.pprof\z/).size
    names = Dir.children(File.join(@dir, "long"))
    assert_equal 1, names.size
    assert_operator names.first.bytesize, :<=, 200
  end

  def test_an_output_that_is_not_utf8_is_refused_naming_the_setting_and_the_program_runs
    # Under RUBYOPT=-rcontprof/auto (contprof exec refuses it before running anything).
    clean = ENV.keys.grep(/\A(CONTPROF|OTEL)_/).to_h { |key| [key, nil] }
    env = clean.merge("CONTPROF_OUTPUT" => "#{@dir}/odd\xff\xfe".b, "RUBYOPT" => "-I#{File.join(ROOT, "lib")} -rcontprof/auto")
    out, err, status = Open3.capture3(env, RbConfig.ruby, "-e", PROGRAM, chdir: @dir)
    assert_equal 3, status.exitstatus, err
    assert_equal "hi\n", out
    assert_equal ["err\n"], err.lines.grep_v(LOG_LINE), err
    assert_equal 1, err.lines.grep(LOG_LINE).size, err
    assert_match(/ERROR -- contprof: not profiling: setting output \(CONTPROF_OUTPUT\) accepts a directory path/, err)
  end

  # --- uploads ---------------------------------------------------------------------------

  # Every upload destination at once (each fails on its own, and says so once) at each
  # hostile server or URL; the program runs 1.1 s (shorter profiles are not uploaded).
  def test_upload_destinations
    plain = server(:plain)
    tls = server(:tls)
    cases = {
      "closed port" => ["http://127.0.0.1:#{closed_port}", /#{COULD_NOT} connect to server/],
      "unresolvable host" => ["http://contprof-nowhere.invalid:8126", /#{COULD_NOT} resolve host ?name/],
      "answers 500" => [server(500).url, /HTTP 500: no \(500\)/],
      "answers 413" => [server(413).url, /HTTP 413: no \(413\)/],
      "answers garbage" => [server(:garbage).url, /Unsupported protocol|Weird server reply|HTTP\/0\.9/],
      "https to an http server" => [plain.url("https"), /SSL connect error|SSL/],
      "http to a TLS server" => [tls.url, /Failure when receiving data|Recv failure|Empty reply|HTTP\/0\.9|Weird/],
      "https with a self-signed certificate" => [tls.url("https"), /SSL peer certificate|certificate/],
      "never answers" => [server(:never).url, NEVER_ANSWERED],
    }
    exporters = %w[datadog-agent pyroscope otlp]
    timeout = ->(label) { label == "never answers" ? NEVER_TIMEOUT : ANSWER_TIMEOUT }
    run_cases(cases.to_h do |label, (url, _)|
      [label, [{ "CONTPROF_AGENT_URL" => url, "CONTPROF_PYROSCOPE_URL" => url, "CONTPROF_OTLP_URL" => url,
                 "CONTPROF_UPLOAD_TIMEOUT" => timeout.call(label).to_s }, { program: "sleep 1.1; #{PROGRAM}" }]]
    end) do |result|
      message = cases.fetch(result.label)[1]
      assert_own_exit(result, log: /WARN -- contprof: (#{exporters.join("|")}): .*#{message}/, lines: exporters.size,
                              delay: self.class.upload_delay(timeout.call(result.label)), run: 1.1)
      exporters.each do |exporter|
        assert_equal 1, result.log_lines.grep(/contprof: #{exporter}: /).size, result.describe
        assert_counted(result, exporter, //, 1)
      end
    end
  end

  # Credentials reach neither the log nor the stats, whatever the server says back.
  def test_credentials_stay_out_of_logs_and_stats
    echo = server(:echo)
    never = server(:never)
    agentless = { "CONTPROF_AGENTLESS" => "true", "CONTPROF_API_KEY" => SECRET }
    cases = {
      # (The intake is https://intake.profile.<site>, port 443: our servers stand in as the
      # HTTPS proxy libcurl takes from the environment, as a company's proxy would.)
      "agentless, unresolvable site" => [agentless.merge("CONTPROF_SITE" => "contprof-nowhere.invalid"), /#{COULD_NOT} resolve host/],
      "agentless, a proxy that refuses the tunnel" => [agentless.merge("https_proxy" => echo.url), /CONNECT tunnel failed|from proxy/],
      "agentless, a proxy that never answers" => [agentless.merge("https_proxy" => never.url), NEVER_ANSWERED],
      "pyroscope basic auth, echoed" => [{ "CONTPROF_PYROSCOPE_URL" => echo.url, "CONTPROF_PYROSCOPE_BASIC_AUTH_USER" => "user",
                                           "CONTPROF_PYROSCOPE_BASIC_AUTH_PASSWORD" => SECRET }, /HTTP 400: you sent: .*\[redacted\]/],
      "pyroscope password in the URL" => [{ "CONTPROF_PYROSCOPE_URL" => "http://user:#{SECRET}@127.0.0.1:#{closed_port}" },
                                          /\[redacted\]@127\.0\.0\.1.*#{COULD_NOT} connect/],
      "otlp header, echoed" => [{ "CONTPROF_OTLP_URL" => echo.url, "CONTPROF_OTLP_HEADERS" => "authorization=Bearer #{SECRET}" },
                                /HTTP 400: you sent: .*\[redacted\]/],
    }
    program = "sleep 1.1; #{PROGRAM}"
    timeout = ->(label) { label.include?("never answers") ? NEVER_TIMEOUT : ANSWER_TIMEOUT }
    run_cases(cases.to_h do |label, (env, _)|
      [label, [env.merge("CONTPROF_UPLOAD_TIMEOUT" => timeout.call(label).to_s), { program: program }]]
    end) do |result|
      assert_own_exit(result, log: cases.fetch(result.label)[1], delay: self.class.upload_delay(timeout.call(result.label)), run: 1.1)
      everything = result.out + result.err + JSON.generate(result.stats_lines)
      [SECRET, [SECRET].pack("m0"), ["user:#{SECRET}"].pack("m0")].each do |secret|
        refute_includes everything, secret, result.describe
      end
    end
  end

  # Uploads failing at every flush: one line per kind, every failure counted, the program
  # untouched, and no wait past upload_timeout at exit.
  def test_uploads_failing_at_every_flush
    cases = {
      "answers 500" => [{ "CONTPROF_AGENT_URL" => server(500).url }, "datadog-agent", /HTTP 500/, 1],
      "closed port" => [{ "CONTPROF_OTLP_URL" => "http://127.0.0.1:#{closed_port}" }, "otlp", /#{COULD_NOT} connect/, 1],
      # Each periodic upload times out; at exit one may be in progress, or the last profile
      # have no time left: that is another kind, said once.
      "never answers" => [{ "CONTPROF_PYROSCOPE_URL" => server(:never).url }, "pyroscope",
                          /Timeout was reached|cancelled at stop|dropped at stop/, 1..2],
    }
    # (Periods of 1.2 s: a profile shorter than 1 s is not uploaded, and periods vary by 5%.)
    program = "sleep 2.7; #{PROGRAM}"
    timeout = ->(label) { label == "never answers" ? NEVER_TIMEOUT : ANSWER_TIMEOUT }
    run_cases(cases.to_h do |label, (env, *)|
      [label, [env.merge("CONTPROF_UPLOAD_PERIOD" => "1.2", "CONTPROF_UPLOAD_TIMEOUT" => timeout.call(label).to_s), { program: program }]]
    end) do |result|
      _, exporter, message, lines = cases.fetch(result.label)
      lines = result.log_lines.size if lines.is_a?(Range) && lines.cover?(result.log_lines.size)
      assert_own_exit(result, log: /WARN -- contprof: #{exporter}: .*#{message}/, lines: lines,
                              delay: self.class.upload_delay(timeout.call(result.label)), run: 2.7)
      assert_counted(result, exporter, //, 2, at_least: true)
    end
  end

  # --- failures that are no StandardError, and every way a process ends --------------------

  def test_errors_that_are_no_standard_error_stay_inside_the_flush
    failing = {
      "NoMemoryError" => 'def export(*) = "x" * (1 << 45)', # a real failed allocation
      "SystemStackError" => "def export(*) = deep(0)\ndef deep(depth) = deep(depth + 1) + 1",
      "LoadError" => 'def export(*) = raise(LoadError, "cannot load such file -- gone")',
    }
    cases = failing.to_h do |error, method|
      program = "Contprof::Exporters::File.prepend(Module.new { #{method} })\nsleep 2.3\n#{PROGRAM}"
      [error, [{ "CONTPROF_OUTPUT" => File.join(@dir, error), "CONTPROF_UPLOAD_PERIOD" => "1" }, { program: program }]]
    end
    cases["in an upload's thread"] = [{ "CONTPROF_AGENT_URL" => server(202).url },
                                      { program: "Contprof::Exporters::Datadog.prepend(Module.new { #{failing["NoMemoryError"]} })\n" \
                                                 "sleep 1.1\n#{PROGRAM}" }]
    cases["in serialize"] = [{ "CONTPROF_OUTPUT" => File.join(@dir, "serialize") },
                             { program: "Contprof::StackRecorder.prepend(Module.new { def serialize(**) = raise(NoMemoryError) })\n#{PROGRAM}" }]
    run_cases(cases) do |result|
      case result.label
      when "in an upload's thread"
        assert_own_exit(result, log: /datadog-agent: export failed, profile dropped: NoMemoryError/, run: 1.1)
        assert_counted(result, "datadog-agent", /\ANoMemoryError\z/, 1)
      when "in serialize"
        assert_own_exit(result, log: /ERROR -- contprof: flush: could not serialize the profile: NoMemoryError/)
        assert_equal({ "NoMemoryError" => 1 }, result.stats.dig("failures", "flush"), result.describe)
      else
        assert_own_exit(result, log: /file: export failed, profile dropped: #{result.label}/, run: 2.3)
        flushes = result.stats.fetch("flushes")
        assert_operator flushes, :>=, 3, result.describe # two periods (the scheduler's thread), and at exit
        assert_counted(result, "file", /\A#{result.label}\z/, flushes)
      end
    end
  end

  def test_every_way_a_process_ends
    forbidden = { "CONTPROF_OUTPUT" => "/proc/forbidden" }
    ruby = RbConfig.ruby.inspect
    cases = {
      "exec" => [forbidden, { program: "puts :a; $stdout.flush; exec(#{ruby}, '-e', #{(PRELUDE + PROGRAM).inspect})" }],
      "fork, exit! and exit" => [forbidden, { program: <<~RUBY }],
        Process.wait(fork { exit!(4) })
        puts $?.exitstatus
        Process.wait(fork { $stderr.puts :child; exit 5 })
        puts $?.exitstatus
        #{PROGRAM}
      RUBY
      "daemon" => [forbidden, { program: "Process.daemon(true, true)\n#{PROGRAM}" }],
      "uncaught exception" => [forbidden, { program: "puts :hi; $stderr.puts :err; raise 'boom'" }],
      "its own SIGTERM" => [forbidden, { program: "puts :hi; $stdout.flush; $stderr.puts :err; Process.kill(:TERM, $$); sleep 5" }],
    }
    run_cases(cases) do |result|
      log = /file: export failed, profile dropped: Errno::ENOENT: .*mkdir \/proc\/forbidden/
      case result.label
      when "exec"
        # Two programs, one after the other in one process: each says it once.
        assert_own_exit(result, log: log, out: "a\nhi\n", lines: 2)
        assert_equal({ "Errno::ENOENT" => 1 }, result.stats.dig("failures", "file"), result.describe)
      when "fork, exit! and exit"
        # A child that ends with exit! runs no at_exit hook: no flush, nothing said. One
        # that exits says its own failure (the parent had not met it yet), once.
        assert_own_exit(result, log: log, out: "4\n5\nhi\n", err: "child\nerr\n", lines: 2)
        assert_equal 2, result.log_lines.map { |line| line[/#(\d+)\]/, 1] }.uniq.size, result.describe
        assert_counted(result, "file", /ENOENT/, 1)
      when "daemon"
        # The parent leaves through daemon(3)'s _exit(0); the daemon flushes at its exit.
        assert_own_exit(result, log: log, status: 0)
        assert_equal 1, result.stats_lines.size, result.describe
        assert_counted(result, "file", /ENOENT/, 1, pid: result.stats_lines.first["pid"])
      when "uncaught exception"
        assert_equal 1, result.status.exitstatus, result.describe
        assert_equal "hi\n", result.out
        assert_match(/\A-e:\d+:in [`']<main>': boom \(RuntimeError\)\n\z/, result.program_err.delete_prefix("err\n"), result.describe)
        assert_equal 1, result.log_lines.size, result.describe
        assert_counted(result, "file", /ENOENT/, 1)
      when "its own SIGTERM"
        assert_equal Signal.list.fetch("TERM"), result.status.termsig, result.describe
        assert_equal "hi\n", result.out
        assert_equal "err\n", result.program_err
        assert_equal 1, result.log_lines.size, result.describe
        assert_counted(result, "file", /ENOENT/, 1)
      end
    end
  end

  # Ctrl-C (or SIGTERM) while the last profile is being uploaded at exit, to an intake that
  # never answers: the upload is given up at once and the program ends with its own status.
  def test_a_signal_during_the_exit_flush_ends_it_with_the_program_s_status
    cases = %w[INT TERM].to_h do |signal|
      never = server(:never)
      signalled = nil
      during = lambda do |pid|
        never.wait_for_connection(20)
        signalled = monotonic
        Process.kill(signal, pid)
      end
      env = { "CONTPROF_AGENT_URL" => never.url, "CONTPROF_UPLOAD_TIMEOUT" => "20" }
      [signal, [env, { program: "sleep 1.1; #{PROGRAM}", during: during }, -> { signalled }]]
    end
    run_cases(cases.transform_values { |env, options, _| [env, options] }) do |result|
      assert_own_exit(result, log: /stop interrupted by SIG#{result.label}: the last profile's uploads \(datadog-agent\) cancelled/,
                              run: 1.1)
      ended_after = result.ended_at - cases.fetch(result.label)[2].call
      assert_operator ended_after, :<, 5, result.describe # (upload_timeout is 20 s)
      assert_equal({ "interrupted at stop" => 1 }, result.stats.dig("failures", "datadog-agent"), result.describe)
      assert_equal 1, result.stats["stop_interrupted"], result.describe
    end
  end

  # In this process: Contprof.profile blocks, each a profiler of its own, say a failing
  # destination once; a new Contprof.start says it again; a logger that raises changes
  # nothing.
  def test_blocks_say_a_failure_once_a_new_start_again_and_a_raising_logger_is_harmless
    log = StringIO.new
    Contprof.logger = Logger.new(log, progname: "contprof")
    missing = File.join(@dir, "a-file", "out")
    File.write(File.join(@dir, "a-file"), "")
    3.times { assert_equal [], Contprof.profile(output: missing) { nil }.paths }
    assert_equal 1, log.string.scan("file: export failed").size, log.string
    profiler = Contprof.start(output: missing, upload_period: 60)
    Contprof.stop
    assert_equal 2, log.string.scan("file: export failed").size, log.string
    assert_equal({ "Errno::ENOTDIR" => 1 }, profiler.stats[:failures]["file"])
    assert_match(/\Aexport failed, profile dropped: Errno::ENOTDIR: Not a directory - mkdir .*a-file/,
                 profiler.stats[:last_errors]["file"])

    broken = Class.new(Logger) { def add(*) = raise(IOError, "closed stream") }
    Contprof.logger = broken.new(File::NULL)
    profiler = Contprof.start(output: missing, upload_period: 60)
    assert_nil Contprof.stop.paths.first
    assert_equal 1, profiler.stats[:file_failed]
  ensure
    Contprof.stop
    Contprof.logger = nil
  end

  # The log cannot be written: the failure is still counted, nothing else changes.
  def test_a_closed_standard_error
    clean = ENV.keys.grep(/\A(CONTPROF|OTEL)_/).to_h { |key| [key, nil] }
    reader, writer = IO.pipe
    out_reader, out_writer = IO.pipe
    # (A program that writes to its closed standard error fails on its own: this one does not.)
    pid = Process.spawn(clean.merge("CONTPROF_OUTPUT" => "/proc/forbidden"), *CONTPROF, RbConfig.ruby, "-e", "#{PRELUDE}puts :hi; exit 3",
                        3 => writer, out: out_writer, err: :close, chdir: @dir)
    [writer, out_writer].each(&:close)
    stats = JSON.parse(reader.read)
    _, status = Process.wait2(pid)
    assert_equal 3, status.exitstatus
    assert_equal "hi\n", out_reader.read
    assert_equal({ "Errno::ENOENT" => 1 }, stats.dig("stats", "failures", "file"))
  ensure
    [reader, out_reader].each { |io| io&.close }
  end
end
