# frozen_string_literal: true

require_relative "test_helper"
require "socket"
require_relative "support/intake_server"
require "json"
require "zlib"
require "stringio"

# The Datadog and Pyroscope exporters against a local server that parses their multipart
# bodies with WEBrick's stock parser.
class ExportersTest < Minitest::Test
  RFC3339_NANOS = /\A\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{9}Z\z/

  def setup
    @servers = []
  end

  def teardown
    @servers.each(&:stop)
  end

  def server(**options)
    IntakeServer.new(**options).tap { |s| @servers << s }
  end

  def settings(**keywords)
    Contprof::Settings.resolve({ service: "shop", env: "staging", version: "1.2.3", tags: { team: "core" } }.merge(keywords),
                               env: {})
  end

  def profile(settings = self.settings)
    recorder = Contprof::StackRecorder.new
    recorder.record_sample([["Shop#checkout", "/app/shop.rb", 12], ["<main>", "/app/main.rb", 1]],
                           { "cpu-time" => 5_000_000, "cpu-samples" => 1, "wall-time" => 9_000_000 }, { "thread id" => 1 })
    start, finish, pprof = recorder.serialize
    Contprof::ExportedProfile.new(start: start - 2, finish: finish, pprof: pprof, tags: Contprof::Tags.build(settings),
                                  paths: [])
  end

  def datadog(url, timeout: 5.0)
    Contprof::Exporters::Datadog.new(agent_url: url, timeout: timeout)
  end

  def assert_datadog_request(request, profile)
    assert_equal "POST", request.method
    assert_equal "/profiling/v1/input", request.path
    form = request.form
    assert_equal "3", form["version"].to_s
    assert_equal "ruby", form["family"].to_s
    assert_match RFC3339_NANOS, form["start"].to_s
    assert_match RFC3339_NANOS, form["end"].to_s
    assert_equal profile.start.utc.strftime("%Y-%m-%dT%H:%M:%S.%9NZ"), form["start"].to_s
    assert_equal profile.finish.utc.strftime("%Y-%m-%dT%H:%M:%S.%9NZ"), form["end"].to_s
    tags = form["tags[]"].list.map(&:to_s)
    %W[service:shop env:staging version:1.2.3 team:core language:ruby runtime:ruby runtime_engine:ruby
       process_id:#{Process.pid} profiler_version:#{Contprof::VERSION} runtime_version:#{RUBY_VERSION}
       runtime_platform:#{RUBY_PLATFORM} runtime-id:#{Contprof::Tags.runtime_id}].each do |tag|
      assert_includes tags, tag
    end
    assert(tags.any? { |t| t.start_with?("host:") && t.size > 5 })
    assert_match(/\A[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}\z/, Contprof::Tags.runtime_id)

    pprof_part = form["data[rubyprofile.pprof]"]
    assert_equal "rubyprofile.pprof", pprof_part.filename
    assert_equal profile.pprof.b, pprof_part.to_s.b
    decoded = decode_profile(pprof_part.to_s)
    assert_equal 5_000_000, decoded.total("cpu-time")
    assert_equal ["Shop#checkout", "<main>"], decoded.samples.first.locations.map(&:function_name)

    provenance_part = form["data[code-provenance.json]"]
    assert_equal "code-provenance.json", provenance_part.filename
    provenance = JSON.parse(Zlib.gunzip(provenance_part.to_s))
    stdlib = provenance.fetch("v1").find { |library| library["kind"] == "standard library" }
    assert_equal [RbConfig::CONFIG["rubylibdir"]], stdlib["paths"]
    provenance["v1"].each { |library| assert_equal %w[kind name paths version], library.keys.sort }

    assert_match(%r{\Acontprof/#{Regexp.escape(Contprof::VERSION)} ruby/}, request.headers["user-agent"])
    refute request.headers.key?("dd-api-key")
  end

  def test_datadog_agent_over_tcp
    intake = server
    profile = profile()
    assert_equal 202, datadog(intake.url).export(profile)
    assert_datadog_request(intake.next_request, profile)
  end

  def test_datadog_agent_over_a_unix_socket
    intake = server(unix_socket: true)
    profile = profile()
    exporter = datadog(intake.url)
    assert_equal intake.socket_path, exporter.unix_socket
    exporter.export(profile)
    assert_datadog_request(intake.next_request, profile)
  end

  def test_agent_down
    port = TCPServer.open("127.0.0.1", 0) { |s| s.addr[1] } # free, and closed again
    error = assert_raises(Contprof::HttpTransport::Error) { datadog("http://127.0.0.1:#{port}").export(profile) }
    assert_match(/POST http:\/\/127.0.0.1:#{port}\/profiling\/v1\/input: Could(n't| not) connect to server/, error.message)
  end

  # Issue #15, item 13: libcurl says "Failed to connect to localhost port 80" for a socket
  # it cannot use; the error names the socket and what is wrong with it.
  def test_an_unusable_agent_socket_is_named_with_its_problem
    dir = Dir.mktmpdir("contprof-socket")
    closed = File.join(dir, "closed.sock")
    UNIXServer.new(closed).close
    {
      File.join(dir, "missing.sock") => /no socket at #{dir}\/missing.sock/,
      __FILE__ => /#{Regexp.escape(__FILE__)} is a regular file, not a socket/,
      dir => /#{dir} is a directory, not a socket/,
      closed => /nothing listens on the socket #{closed}/,
    }.each do |path, expected|
      error = assert_raises(Contprof::HttpTransport::Error) { datadog("unix://#{path}").export(profile) }
      assert_match expected, error.message
      assert_includes error.message, "via unix://#{path}"
      refute_match(/port 80/, error.message)
    end
  ensure
    FileUtils.rm_rf(dir)
  end

  def test_timeout_is_honoured
    intake = server(delay: 3)
    started = Process.clock_gettime(Process::CLOCK_MONOTONIC)
    error = assert_raises(Contprof::HttpTransport::Error) { datadog(intake.url, timeout: 0.5).export(profile) }
    elapsed = Process.clock_gettime(Process::CLOCK_MONOTONIC) - started
    assert_match(/Timeout was reached/, error.message)
    assert_operator elapsed, :<, 2.5, "gave up after the 0.5 s timeout, not after the server's 3 s"
  end

  def test_4xx_and_5xx_answers_are_errors
    [400, 403, 500, 503].each do |status|
      intake = server(status: status)
      error = assert_raises(Contprof::HttpTransport::Error) { datadog(intake.url).export(profile) }
      assert_match(/HTTP #{status}: intake says no \(#{status}\)/, error.message)
      assert intake.next_request
    end
  end

  def test_agentless_uploads_carry_the_api_key_to_the_intake_only
    exporter = Contprof::Exporters::Datadog.new(site: "datadoghq.eu", api_key: "key-abc", timeout: 1)
    assert_equal "https://intake.profile.datadoghq.eu/v1/input", exporter.url
    assert_includes exporter.headers, ["DD-API-KEY", "key-abc"]
    assert_equal "datadog-agentless", exporter.name
  end

  def test_pyroscope
    intake = server(status: 200)
    profile = profile()
    exporter = Contprof::Exporters::Pyroscope.new(url: intake.url, application_name: "shop-app",
                                                  user_tags: { "team" => "core", "odd-key" => "a=b" })
    assert_equal 200, exporter.export(profile)
    request = intake.next_request
    assert_equal "/ingest", request.path
    name = request.query["name"]
    assert_match(/\Ashop-app\{.*\}\z/, name)
    labels = name[/\{(.*)\}/, 1].split(",").to_h { |pair| pair.split("=", 2) }
    assert_equal({ "team" => "core", "odd_key" => "ab", "env" => "staging", "version" => "1.2.3",
                   "host" => profile.tags["host"] }, labels)
    assert_equal profile.start.to_i.to_s, request.query["from"]
    assert_equal profile.finish.to_i.to_s, request.query["until"]
    assert_equal "contprof", request.query["spyName"]
    refute request.query.key?("format")
    assert_equal "profile.pprof", request.form["profile"].filename
    assert_equal 5_000_000, decode_profile(request.form["profile"].to_s).total("cpu-time")
    config = JSON.parse(request.form["sample_type_config"].to_s)
    assert_equal "nanoseconds", config.dig("cpu-time", "units")
    assert_equal "sum", config.dig("wall-time", "aggregation")
  end

  def test_pyroscope_errors
    [400, 500].each do |status|
      intake = server(status: status)
      exporter = Contprof::Exporters::Pyroscope.new(url: intake.url, application_name: "shop")
      error = assert_raises(Contprof::HttpTransport::Error) { exporter.export(profile) }
      assert_match(%r{POST http://127.0.0.1:\d+/ingest: HTTP #{status}}, error.message)
    end
    port = TCPServer.open("127.0.0.1", 0) { |s| s.addr[1] }
    down = Contprof::Exporters::Pyroscope.new(url: "http://127.0.0.1:#{port}", application_name: "shop")
    error = assert_raises(Contprof::HttpTransport::Error) { down.export(profile) }
    assert_match(/Could(n't| not) connect to server/, error.message)
    timeout = Contprof::Exporters::Pyroscope.new(url: server(delay: 3).url, application_name: "shop", timeout: 0.5)
    assert_raises(Contprof::HttpTransport::Error) { timeout.export(profile) }
  end

  def test_an_upload_in_progress_is_cancelled_when_its_thread_is_killed
    intake = server(delay: 5)
    thread = Thread.new { datadog(intake.url, timeout: 30).export(profile) }
    sleep 0.3
    started = Process.clock_gettime(Process::CLOCK_MONOTONIC)
    thread.kill
    assert thread.join(3), "the upload stopped when its thread was killed"
    assert_operator Process.clock_gettime(Process::CLOCK_MONOTONIC) - started, :<, 3
  end

  # A routine interrupt (here Thread#wakeup, arriving while the request waits for its
  # answer) is processed and the request still completes. Interrupts pending when the
  # request starts take the same path (the timer's time slice, the sampler's postponed
  # jobs): they once made one soak upload in 15 fail as "cancelled".
  def test_routine_interrupts_do_not_cancel_an_upload
    intake = server(delay: 0.5)
    url = "#{intake.url}/x"
    parts = [["data", "payload", nil, nil]]
    uploader = Thread.current
    waker = Thread.new { sleep 0.2; uploader.wakeup }
    status, = Contprof::HttpTransport._native_post(url, nil, [], parts, 10)
    waker.join
    assert_equal 202, status
    # Interrupted after its body was sent, the request went again from the start: the
    # intake may see it twice (see run_call in ext/contprof/transport/http_transport.c).
    assert_equal "payload", intake.next_request.form["data"]
  end

  def test_transport_argument_checks
    assert_raises(TypeError) { Contprof::HttpTransport._native_post(1, nil, [], [], 1) }
    assert_raises(ArgumentError) { Contprof::HttpTransport._native_post("http://x", nil, [["a"]], [], 1) }
    assert_raises(ArgumentError) { Contprof::HttpTransport._native_post("http://x", nil, [], [["a", "b"]], 1) }
    assert_raises(ArgumentError) { Contprof::HttpTransport._native_post("http://x", nil, [], [], 0) }
    assert_raises(ArgumentError) { Contprof::HttpTransport._native_post("http://x\0y", nil, [], [], 1) }
  end

  # Issue #15, item 10: an intake that echoes the request puts neither the API key nor a
  # forged log line into the error.
  def test_an_echoing_intake_error_shows_neither_the_key_nor_newlines
    intake = server(status: 400, echo: true)
    exporter = Contprof::Exporters::Datadog.new(site: "datadoghq.eu", api_key: "key-abcdef-123", timeout: 5,
                                                intake_url: "#{intake.url}/v1/input")
    error = assert_raises(Contprof::HttpTransport::Error) { exporter.export(profile) }
    assert_match(/HTTP 400: you sent: Host: /, error.message)
    assert_includes error.message, "[redacted]"
    refute_includes error.message, "key-abcdef-123"
    refute_match(/[\r\n]/, error.message)
  end

  # Issue #15, item 11: user:password@ in a URL (Pyroscope's way to authenticate) is never
  # printed: not by the settings (the INFO start line), an exporter's inspect, or an error.
  def test_url_credentials_are_never_shown
    listener = TCPServer.new("127.0.0.1", 0) # a port nobody listens on once closed
    port = listener.addr[1]
    listener.close
    url = "http://alice:s3cret-pw@127.0.0.1:#{port}"
    settings = self.settings(pyroscope_url: url)
    exporter = Contprof::Exporters::Pyroscope.new(url: settings.pyroscope_url, application_name: "shop", timeout: 2)
    error = assert_raises(Contprof::HttpTransport::Error) { exporter.export(profile) }
    [settings.inspect, exporter.inspect, error.message, error.full_message].each do |text|
      refute_includes text, "s3cret-pw"
      assert_includes text, "[redacted]@127.0.0.1"
    end
    assert_nil error.cause
  end
end
