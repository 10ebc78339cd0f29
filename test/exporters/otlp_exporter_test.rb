# frozen_string_literal: true

# The OTLP/HTTP profiles exporter: its settings and OpenTelemetry's standard environment
# variables (one test per variable), the requests it sends to a local WEBrick receiver
# (bodies read back by protoc with the official .proto files), the .otlp copy of the file
# exporter, and what a dead, silent or failing endpoint costs the application.
require_relative "../test_helper"
require_relative "../support/otlp_protoc"
require "socket"
require "webrick"
require "zlib"
require "stringio"
require "tmpdir"
require "open3"
require "pp"

class OtlpExporterTest < Minitest::Test
  Otlp = Contprof::Exporters::Otlp
  SECRET = "Bearer s3cret-T0KEN-42"

  # Whether the C side takes `otlp:` in StackRecorder#serialize (the OTLP encoding).
  NATIVE_OTLP = begin
    Contprof::StackRecorder.new.serialize(otlp: { resource: [], scope_name: "contprof", scope_version: "0", gzip: false })
    true
  rescue ArgumentError => e
    raise unless e.message.include?("unknown keyword")

    false
  end

  # Whether HttpTransport._native_post takes a String as the raw request body (checked
  # without I/O: a String body passes the argument checks and the zero timeout does not).
  RAW_BODY = begin
    Contprof::HttpTransport._native_post("http://127.0.0.1:9", nil, [], "", 0)
  rescue ArgumentError
    true
  rescue TypeError
    false
  end

  # A local OTLP/HTTP receiver: keeps each request's path, headers and raw body, and
  # answers `status` (an error answer echoes the request's headers, as some proxies do).
  class Receiver
    Request = Struct.new(:path, :headers, :body, keyword_init: true)

    attr_reader :url

    def initialize(status: 200)
      @requests = Queue.new
      @server = WEBrick::HTTPServer.new(BindAddress: "127.0.0.1", Port: 0, Logger: WEBrick::Log.new(File::NULL),
                                        AccessLog: [])
      @server.mount_proc("/") do |request, response|
        @requests << Request.new(path: request.path, headers: request.header.transform_values(&:first),
                                 body: request.body.to_s.b)
        response.status = status
        response.body = status >= 300 ? "rejected; you sent:\n#{request.raw_header.join}" : ""
      end
      @thread = Thread.new { @server.start }
      @url = "http://127.0.0.1:#{@server.config[:Port]}"
    end

    def next_request(timeout: 10)
      deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + timeout
      sleep 0.01 while @requests.empty? && Process.clock_gettime(Process::CLOCK_MONOTONIC) < deadline
      raise "no request reached the receiver within #{timeout} s" if @requests.empty?

      @requests.pop
    end

    def received
      @requests.size
    end

    def stop
      @server.shutdown
      @thread.kill unless @thread.join(1)
    end
  end

  def setup
    @cleanups = []
    @dir = Dir.mktmpdir("contprof-otlp")
    @log = StringIO.new
    Contprof.logger = Logger.new(@log, progname: "contprof")
  end

  def teardown
    Contprof.stop
    Contprof.logger = nil
    @cleanups.reverse_each(&:call)
    FileUtils.rm_rf(@dir)
  end

  def resolve(keywords = {}, env = {})
    Contprof::Settings.resolve(keywords, env: env)
  end

  # OpenTelemetry's variables alone (its warnings once per call, whatever earlier tests said).
  def otel(env)
    Contprof::OtlpEnvironment.new(env, warned: [])
  end

  def receiver(**options)
    Receiver.new(**options).tap { |r| @cleanups << -> { r.stop } }
  end

  def dead_url
    "http://127.0.0.1:#{TCPServer.open("127.0.0.1", 0) { |s| s.addr[1] }}"
  end

  # An endpoint that accepts connections and never answers.
  def silent_url
    listener = TCPServer.new("127.0.0.1", 0)
    accepted = []
    thread = Thread.new { loop { accepted << listener.accept } }
    @cleanups << lambda do
      thread.kill.join(1)
      accepted.each(&:close)
      listener.close
    end
    "http://127.0.0.1:#{listener.addr[1]}"
  end

  def monotonic
    Process.clock_gettime(Process::CLOCK_MONOTONIC)
  end

  # --- protoc and OpenTelemetry's .proto files: the reference reader (OtlpProtoc) ----------

  def protoc_available!
    why = OtlpProtoc.why_not
    skip why if why
  end

  # The request as protoc's text format (raising when protoc cannot read it).
  def protoc_decode(bytes)
    protoc_available!
    OtlpProtoc.decode_text(bytes)
  end

  def protoc_encode(text)
    protoc_available!
    out, err, status = Open3.capture3(OtlpProtoc.protoc, "--encode=#{OtlpProtoc::REQUEST}", "-I", OtlpProtoc.include_dir,
                                      OtlpProtoc::SERVICE_PROTO, stdin_data: text, binmode: true)
    assert status.success?, err
    out
  end

  # A small request of known content, encoded by protoc (the exporter sends what it gets).
  def known_request
    protoc_encode(<<~TEXT)
      resource_profiles {
        resource { attributes { key: "service.name" value { string_value: "shop" } } }
        scope_profiles { scope { name: "contprof" } }
      }
    TEXT
  end

  def assert_attribute(text, key, value)
    kind = value.is_a?(Integer) ? "int_value" : "string_value"
    pattern = /key: "#{Regexp.escape(key)}"\s*value \{\s*#{kind}: #{Regexp.escape(value.inspect)}\s*\}/
    assert_match pattern, text, "resource attribute #{key} = #{value.inspect}"
  end

  def fake_profile(otlp)
    now = Time.now
    Contprof::ExportedProfile.new(start: now - 2, finish: now, pprof: Zlib.gzip(""), tags: { "process_id" => "1" },
                                  paths: [], endpoint_counts: {}, otlp: otlp)
  end

  # --- the C side (being written): which tests wait for it ------------------------------

  def needs_raw_body!
    return if RAW_BODY
    flunk "StackRecorder#serialize takes otlp:, but HttpTransport._native_post takes no String body" if NATIVE_OTLP

    skip "waiting for the C side: HttpTransport._native_post with a String (raw) body"
  end

  def needs_native_otlp!
    skip "waiting for the C side: StackRecorder#serialize(otlp:)" unless NATIVE_OTLP
    needs_raw_body!
  end

  # --- OpenTelemetry's environment variables, one by one ----------------------------------

  def test_otel_exporter_otlp_endpoint_is_a_base_url_under_which_the_signal_path_goes
    {
      "http://collector:4318" => "http://collector:4318/v1development/profiles",
      "http://collector:4318/" => "http://collector:4318/v1development/profiles",
      "https://otlp.example/api/otlp/" => "https://otlp.example/api/otlp/v1development/profiles",
    }.each do |base, expected|
      settings = resolve({}, "OTEL_EXPORTER_OTLP_ENDPOINT" => base)
      assert_equal expected, settings.otlp_endpoint, base
      assert_equal expected, Otlp.from_settings(settings).endpoint
      assert_nil settings.otlp_url, "an OTEL variable is no Contprof setting"
    end
  end

  def test_otel_exporter_otlp_profiles_endpoint_is_used_as_is
    env = { "OTEL_EXPORTER_OTLP_PROFILES_ENDPOINT" => "http://collector:4318/custom/profiles?tenant=7",
            "OTEL_EXPORTER_OTLP_ENDPOINT" => "http://other:4318" }
    assert_equal "http://collector:4318/custom/profiles?tenant=7", resolve({}, env).otlp_endpoint
    assert_equal "http://collector:4318",
                 resolve({}, "OTEL_EXPORTER_OTLP_PROFILES_ENDPOINT" => "http://collector:4318").otlp_endpoint, "no path added"
  end

  def test_an_invalid_otel_endpoint_is_warned_about_and_ignored
    log = with_log do
      assert_nil otel("OTEL_EXPORTER_OTLP_ENDPOINT" => "collector:4318").endpoint
      env = { "OTEL_EXPORTER_OTLP_PROFILES_ENDPOINT" => "ftp://a", "OTEL_EXPORTER_OTLP_ENDPOINT" => "http://b:4318" }
      assert_equal "http://b:4318/v1development/profiles", otel(env).endpoint.first, "an invalid one is as if unset"
      assert_nil otel("OTEL_EXPORTER_OTLP_ENDPOINT" => "http://u:pw-S3CRET@c:4318/?x=1").endpoint
    end
    assert_includes log, "OTEL_EXPORTER_OTLP_ENDPOINT accepts an http(s):// URL with a host"
    assert_includes log, "OTEL_EXPORTER_OTLP_PROFILES_ENDPOINT accepts an http(s):// URL with a host"
    assert_includes log,
                    'OTEL_EXPORTER_OTLP_ENDPOINT accepts a URL without a query or fragment; got "http://[redacted]@c:4318/?x=1"'
    refute_includes log, "S3CRET"
  end

  def test_otel_exporter_otlp_headers_are_percent_decoded_and_trimmed
    env = { "OTEL_EXPORTER_OTLP_HEADERS" => " Authorization = Bearer%20tok+en%2C1 ,x-tenant=acme,, api-key=%C3%A9" }
    assert_equal({ "Authorization" => "Bearer tok+en,1", "x-tenant" => "acme", "api-key" => "é" },
                 resolve({}, env).otlp_headers)
  end

  def test_otel_exporter_otlp_profiles_headers_replace_the_general_ones
    env = { "OTEL_EXPORTER_OTLP_PROFILES_HEADERS" => "x-profiles=1", "OTEL_EXPORTER_OTLP_HEADERS" => "x-all=1" }
    assert_equal({ "x-profiles" => "1" }, resolve({}, env).otlp_headers)
  end

  def test_malformed_otel_headers_are_skipped_with_a_warning_that_shows_no_value
    env = { "OTEL_EXPORTER_OTLP_HEADERS" =>
              "good=1,Bearer s3cret-A,bad%zz=s3cret-B,Auth Header=s3cret-C,x=s3cret%0AD,Content-Type=text/plain,=s3cret-E" }
    log = with_log { assert_equal({ "good" => "1" }, otel(env).headers.first) }
    [
      "OTEL_EXPORTER_OTLP_HEADERS: entry 2 is not key=value; skipped",
      "OTEL_EXPORTER_OTLP_HEADERS: entry 3 is not valid percent-encoded UTF-8; skipped",
      "OTEL_EXPORTER_OTLP_HEADERS: header 4: the name is not an HTTP token; skipped",
      "OTEL_EXPORTER_OTLP_HEADERS: header x: control characters in the value; skipped",
      "OTEL_EXPORTER_OTLP_HEADERS: header Content-Type is set by Contprof; skipped",
      "OTEL_EXPORTER_OTLP_HEADERS: entry 7 has an empty key; skipped",
    ].each { |line| assert_includes log, line }
    refute_includes log, "s3cret"
  end

  def test_otel_exporter_otlp_compression
    assert_equal "none", resolve({}, "OTEL_EXPORTER_OTLP_COMPRESSION" => "none").otlp_compression
    assert_equal "gzip", resolve({}, "OTEL_EXPORTER_OTLP_COMPRESSION" => "GZIP").otlp_compression
    env = { "OTEL_EXPORTER_OTLP_PROFILES_COMPRESSION" => "none", "OTEL_EXPORTER_OTLP_COMPRESSION" => "gzip" }
    assert_equal "none", resolve({}, env).otlp_compression, "the per-signal variable wins"
    assert_equal "gzip", resolve.otlp_compression, "Contprof's default"
    log = with_log do
      env = { "OTEL_EXPORTER_OTLP_PROFILES_COMPRESSION" => "zstd", "OTEL_EXPORTER_OTLP_COMPRESSION" => "none" }
      assert_equal ["none", "OTEL_EXPORTER_OTLP_COMPRESSION"], otel(env).compression
    end
    assert_includes log, 'OTEL_EXPORTER_OTLP_PROFILES_COMPRESSION accepts gzip or none; got "zstd"; ignored'
  end

  def test_otel_exporter_otlp_timeout_is_in_milliseconds
    assert_equal 2.5, resolve({}, "OTEL_EXPORTER_OTLP_TIMEOUT" => "2500").otlp_timeout
    env = { "OTEL_EXPORTER_OTLP_PROFILES_TIMEOUT" => "750", "OTEL_EXPORTER_OTLP_TIMEOUT" => "2500" }
    assert_equal 0.75, resolve({}, env).otlp_timeout, "the per-signal variable wins"
    assert_equal 10.0, resolve.otlp_timeout, "the specification's default, 10000 ms"
    # 0: no limit of its own (upload_timeout then applies alone).
    settings = resolve({ otlp_url: "http://c:4318", upload_timeout: 7 }, "OTEL_EXPORTER_OTLP_TIMEOUT" => "0")
    assert_equal Float::INFINITY, settings.otlp_timeout
    assert_equal 7, Otlp.from_settings(settings).instance_variable_get(:@timeout)
    log = with_log do
      %w[-1 1.5 10s].each { |text| assert_nil otel("OTEL_EXPORTER_OTLP_TIMEOUT" => text).timeout, text }
    end
    assert_includes log, 'OTEL_EXPORTER_OTLP_TIMEOUT accepts a whole number of milliseconds, 0 or more; got "-1"; ignored'
  end

  def test_the_upload_timeout_of_the_exporter_is_the_smaller_of_otlp_timeout_and_upload_timeout
    exporter = ->(keywords) { Otlp.from_settings(resolve({ otlp_url: "http://c:4318" }.merge(keywords))) }
    assert_equal 2.0, exporter.call(otlp_timeout: 2, upload_timeout: 5).instance_variable_get(:@timeout)
    assert_equal 3.0, exporter.call(otlp_timeout: 8, upload_timeout: 3).instance_variable_get(:@timeout)
  end

  def test_otel_service_name_wins_over_service_name_in_otel_resource_attributes
    env = { "OTEL_SERVICE_NAME" => "checkout", "OTEL_RESOURCE_ATTRIBUTES" => "service.name=from-attributes" }
    assert_equal "checkout", resolve({}, env).service
    assert_equal "from-attributes", resolve({}, env.except("OTEL_SERVICE_NAME")).service
    assert_equal "contprof-name", resolve({}, env.merge("CONTPROF_SERVICE" => "contprof-name")).service
    assert_equal "keyword", resolve({ service: "keyword" }, env).service
  end

  def test_otel_resource_attributes_are_percent_decoded_and_reach_the_resource
    env = { "OTEL_RESOURCE_ATTRIBUTES" =>
              " k8s.pod.name = web%2C1 ,team=a%3Db, service.version=2.0,deployment.environment.name=prod" }
    settings = resolve({}, env)
    assert_equal({ "k8s.pod.name" => "web,1", "team" => "a=b", "service.version" => "2.0",
                   "deployment.environment.name" => "prod" }, settings.otlp_resource_attributes)
    assert_equal "2.0", settings.version
    assert_equal "prod", settings.env
    attributes = Otlp::Resource.new(settings).attributes.to_h
    assert_equal "web,1", attributes["k8s.pod.name"]
    assert_equal "a=b", attributes["team"]
    assert_equal "prod", attributes["deployment.environment.name"]
    assert_equal "staging", resolve({}, "OTEL_RESOURCE_ATTRIBUTES" => "deployment.environment=staging").env,
                 "the attribute's name before semantic conventions 1.27"
  end

  def test_a_malformed_otel_resource_attributes_is_discarded_as_a_whole
    log = with_log do
      assert_equal({}, otel("OTEL_RESOURCE_ATTRIBUTES" => "team=core,broken,region=eu").resource_attributes)
      assert_equal({}, otel("OTEL_RESOURCE_ATTRIBUTES" => "team=%E9").resource_attributes)
    end
    assert_includes log, "OTEL_RESOURCE_ATTRIBUTES ignored: entry 2 is not key=value"
    assert_includes log, "OTEL_RESOURCE_ATTRIBUTES ignored: entry 1 is not valid percent-encoded UTF-8"
  end

  def test_contprof_settings_win_over_opentelemetry_variables
    env = { "OTEL_EXPORTER_OTLP_PROFILES_ENDPOINT" => "http://otel-signal:4318/p",
            "OTEL_EXPORTER_OTLP_ENDPOINT" => "http://otel:4318",
            "OTEL_EXPORTER_OTLP_HEADERS" => "x-otel=1", "OTEL_EXPORTER_OTLP_COMPRESSION" => "none",
            "OTEL_EXPORTER_OTLP_TIMEOUT" => "2000", "OTEL_SERVICE_NAME" => "otel-service",
            "OTEL_RESOURCE_ATTRIBUTES" => "service.version=9,deployment.environment.name=otel-env,team=otel" }
    contprof = { "CONTPROF_OTLP_URL" => "http://contprof:4318", "CONTPROF_OTLP_HEADERS" => "x-contprof=1",
                 "CONTPROF_OTLP_COMPRESSION" => "gzip", "CONTPROF_OTLP_TIMEOUT" => "3", "CONTPROF_SERVICE" => "shop",
                 "CONTPROF_VERSION" => "1.0", "CONTPROF_ENV" => "production", "CONTPROF_TAGS" => "team:core" }
    settings = resolve({}, env.merge(contprof))
    assert_equal "http://contprof:4318/v1development/profiles", settings.otlp_endpoint
    assert_equal({ "x-contprof" => "1" }, settings.otlp_headers)
    assert_equal "gzip", settings.otlp_compression
    assert_equal 3.0, settings.otlp_timeout
    attributes = Otlp::Resource.new(settings).attributes.to_h
    assert_equal %w[shop 1.0 production core],
                 attributes.values_at("service.name", "service.version", "deployment.environment.name", "team")
    keywords = resolve({ otlp_url: "http://keyword:4318", otlp_headers: { "x-keyword" => "1" } }, env.merge(contprof))
    assert_equal "http://keyword:4318/v1development/profiles", keywords.otlp_endpoint
    assert_equal({ "x-keyword" => "1" }, keywords.otlp_headers)
  end

  def test_only_an_endpoint_turns_the_otlp_exporter_on
    env = { "OTEL_SERVICE_NAME" => "shop", "OTEL_EXPORTER_OTLP_HEADERS" => "a=1", "OTEL_EXPORTER_OTLP_COMPRESSION" => "none",
            "OTEL_RESOURCE_ATTRIBUTES" => "team=core" }
    assert_empty Contprof::Exporters.for(resolve({}, env))
    refute Contprof::Settings.destination?(env: env)
    %w[OTEL_EXPORTER_OTLP_ENDPOINT OTEL_EXPORTER_OTLP_PROFILES_ENDPOINT].each do |name|
      with_endpoint = env.merge(name => "http://collector:4318")
      assert Contprof::Settings.destination?(env: with_endpoint), name
      assert_equal [Otlp], Contprof::Exporters.for(resolve({}, with_endpoint)).map(&:class), name
    end
    assert Contprof::Settings.destination?({ otlp_url: "http://c:4318" }, env: {})
  end

  def test_a_protocol_other_than_http_protobuf_is_warned_about
    log = with_log do
      otel("OTEL_EXPORTER_OTLP_ENDPOINT" => "http://c:4317", "OTEL_EXPORTER_OTLP_PROTOCOL" => "grpc").endpoint
    end
    assert_includes log, 'OTEL_EXPORTER_OTLP_PROTOCOL="grpc": Contprof sends profiles as http/protobuf only'
    env = { "OTEL_EXPORTER_OTLP_ENDPOINT" => "http://c:4318", "OTEL_EXPORTER_OTLP_PROTOCOL" => "http/protobuf" }
    assert_empty with_log { otel(env).endpoint }
  end

  # --- the resource ---------------------------------------------------------------------

  def test_the_resource_uses_the_semantic_conventions_names
    settings = resolve({ service: "shop", version: "1.2.3", env: "staging", tags: { team: "core" } },
                       "OTEL_RESOURCE_ATTRIBUTES" => "host.name=node-7,process.pid=1,telemetry.sdk.name=x,cloud.region=eu")
    attributes = Otlp::Resource.new(settings).attributes
    assert_equal attributes.map(&:first).uniq, attributes.map(&:first), "each key once"
    expected = {
      "service.name" => "shop", "service.version" => "1.2.3", "deployment.environment.name" => "staging",
      "process.pid" => Process.pid, "process.runtime.name" => "ruby", "process.runtime.version" => RUBY_VERSION,
      "process.runtime.description" => RUBY_DESCRIPTION, "telemetry.sdk.name" => "contprof",
      "telemetry.sdk.language" => "ruby", "telemetry.sdk.version" => Contprof::VERSION,
      "service.instance.id" => Contprof::Tags.runtime_id, "team" => "core", "cloud.region" => "eu",
      "host.name" => "node-7" # OTEL_RESOURCE_ATTRIBUTES may name the host (a container's hostname is no host's)
    }
    assert_equal expected, attributes.to_h
    assert_kind_of Integer, attributes.to_h["process.pid"]
    assert_equal File.read("/proc/sys/kernel/hostname").strip, Otlp::Resource.new(resolve).attributes.to_h["host.name"]
  end

  def test_the_resource_of_a_forked_child_has_its_own_pid_and_instance_id
    resource = Otlp::Resource.new(resolve(service: "shop"))
    reader, writer = IO.pipe
    child = fork do
      reader.close
      writer.write(Marshal.dump([Process.pid, resource.attributes.to_h]))
      writer.close
      exit!(0)
    end
    writer.close
    pid, attributes = Marshal.load(reader.read) # rubocop:disable Security/MarshalLoad -- our own child's
    Process.wait(child)
    assert_equal pid, attributes["process.pid"]
    refute_equal Process.pid, pid
    refute_equal Contprof::Tags.runtime_id, attributes["service.instance.id"]
    assert_equal Process.pid, resource.attributes.to_h["process.pid"]
  end

  # --- settings: credentials ---------------------------------------------------------------

  def test_credentials_never_appear_in_inspect
    settings = resolve(otlp_url: "https://user:pw-S3CRET@otlp.example:4318/base", otlp_headers: { "Authorization" => SECRET })
    exporter = Otlp.from_settings(settings)
    [settings.inspect, exporter.inspect, PP.pp(exporter, +"")].each do |text|
      refute_includes text, "pw-S3CRET"
      refute_includes text, SECRET
      assert_includes text, "[redacted]@otlp.example"
    end
    assert_includes settings.inspect, "otlp_headers=#{{ "Authorization" => "[redacted]" }.inspect}" # (3.4 spaces out =>)
    assert_includes exporter.inspect, 'headers=["Authorization"]'
    env_settings = resolve({}, "OTEL_EXPORTER_OTLP_ENDPOINT" => "http://u:pw-S3CRET@c:4318")
    assert_includes env_settings.inspect, 'otlp_endpoint="http://[redacted]@c:4318/v1development/profiles"'
  end

  # --- encodings and the .otlp file (no upload) --------------------------------------------

  def test_encoded_converts_between_gzip_and_plain_by_the_magic_bytes
    plain = known_request
    gzipped = Zlib.gzip(plain)
    assert_equal plain, Otlp.encoded(plain, gzip: false)
    assert_equal plain, Otlp.encoded(gzipped, gzip: false)
    assert_equal plain, Zlib.gunzip(Otlp.encoded(plain, gzip: true))
    assert_same gzipped, Otlp.encoded(gzipped, gzip: true)
  end

  def test_output_otlp_writes_the_uncompressed_request_next_to_the_pprof
    exporter = Contprof::Exporters::File.from_settings(resolve(output: @dir, output_otlp: true))
    assert_equal :plain, exporter.otlp_encoding
    pprof, otlp = exporter.export(fake_profile(Zlib.gzip(known_request)))
    assert_equal pprof.sub(/\.pprof\z/, ".otlp"), otlp
    assert_equal known_request, File.binread(otlp)
    assert_attribute protoc_decode(File.binread(otlp)), "service.name", "shop"
    assert_nil Contprof::Exporters::File.from_settings(resolve(output: @dir)).otlp_encoding
    error = assert_raises(ArgumentError) { resolve(output_otlp: true) }
    assert_match(/output_otlp \(CONTPROF_OUTPUT_OTLP\) needs output/, error.message)
  end

  # --- uploads to a local receiver -----------------------------------------------------------

  def test_a_gzip_upload_goes_to_the_signal_path_with_the_configured_headers
    needs_raw_body!
    server = receiver
    settings = resolve(otlp_url: "#{server.url}/", otlp_headers: { "Authorization" => SECRET, "X-Tenant" => "acme" })
    exporter = Otlp.from_settings(settings)
    assert_equal 200, exporter.export(fake_profile(known_request))
    request = server.next_request
    assert_equal "/v1development/profiles", request.path
    assert_equal "application/x-protobuf", request.headers["content-type"]
    assert_equal "gzip", request.headers["content-encoding"]
    assert_equal SECRET, request.headers["authorization"]
    assert_equal "acme", request.headers["x-tenant"]
    assert_match(%r{\Acontprof/#{Regexp.escape(Contprof::VERSION)} ruby/}, request.headers["user-agent"])
    assert_equal known_request, Zlib.gunzip(request.body)
    assert_attribute protoc_decode(Zlib.gunzip(request.body)), "service.name", "shop"
  end

  def test_an_uncompressed_upload_to_a_per_signal_endpoint
    needs_raw_body!
    server = receiver
    settings = resolve({}, "OTEL_EXPORTER_OTLP_PROFILES_ENDPOINT" => "#{server.url}/custom/path",
                           "OTEL_EXPORTER_OTLP_COMPRESSION" => "none", "OTEL_EXPORTER_OTLP_HEADERS" => "api-key=k%20ey")
    Otlp.from_settings(settings).export(fake_profile(Zlib.gzip(known_request)))
    request = server.next_request
    assert_equal "/custom/path", request.path
    refute request.headers.key?("content-encoding")
    assert_equal "k ey", request.headers["api-key"]
    assert_equal known_request, request.body
  end

  def test_a_dead_a_silent_and_a_failing_endpoint_raise_errors_without_credentials
    needs_raw_body!
    headers = { "Authorization" => SECRET }
    with_credentials = ->(url) { url.sub("http://", "http://user:pw-S3CRET@") }
    dead = Otlp.new(endpoint: "#{with_credentials.call(dead_url)}/v1development/profiles", headers: headers, timeout: 5)
    error = assert_raises(Contprof::HttpTransport::Error) { dead.export(fake_profile(known_request)) }
    assert_match(%r{POST http://\[redacted\]@127\.0\.0\.1:\d+/v1development/profiles: Could(n't| not) connect}, error.message)

    silent = Otlp.new(endpoint: "#{silent_url}/v1development/profiles", headers: headers, timeout: 0.5)
    started = monotonic
    error = assert_raises(Contprof::HttpTransport::Error) { silent.export(fake_profile(known_request)) }
    assert_match(/Timeout was reached/, error.message)
    assert_operator monotonic - started, :<, 2.5

    failing = receiver(status: 500)
    exporter = Otlp.new(endpoint: "#{with_credentials.call(failing.url)}/v1development/profiles", headers: headers, timeout: 5)
    error = assert_raises(Contprof::HttpTransport::Error) { exporter.export(fake_profile(known_request)) }
    assert_match(%r{POST http://\[redacted\]@127\.0\.0\.1:\d+/v1development/profiles: HTTP 500: rejected; you sent: },
                 error.message)
    assert_includes error.message, "[redacted]", "the echoed Authorization header is blanked"
    [error.message, error.full_message].each do |text|
      refute_includes text, "s3cret-T0KEN"
      refute_includes text, "pw-S3CRET"
    end
  end

  # --- end to end: the recorder's OTLP encoding ------------------------------------------------

  def test_a_profile_reaches_the_receiver_and_protoc_reads_its_resource
    needs_native_otlp!
    server = receiver
    result = Contprof.profile(otlp_url: server.url, otlp_headers: { "Authorization" => SECRET }, output: @dir,
                              output_otlp: true, service: "shop", version: "1.2.3", env: "staging", tags: { team: "core" }) do
      burn_cpu(1.1) # uploads skip profiles under 1 s
    end
    request = server.next_request
    assert_equal "/v1development/profiles", request.path
    assert_equal "gzip", request.headers["content-encoding"]
    body = Zlib.gunzip(request.body)
    text = protoc_decode(body)
    { "service.name" => "shop", "service.version" => "1.2.3", "deployment.environment.name" => "staging",
      "team" => "core", "process.pid" => Process.pid, "process.runtime.name" => "ruby",
      "process.runtime.version" => RUBY_VERSION, "telemetry.sdk.name" => "contprof",
      "telemetry.sdk.language" => "ruby", "telemetry.sdk.version" => Contprof::VERSION }.each do |key, value|
      assert_attribute text, key, value
    end
    summary = OtlpProtoc.summary(body)
    assert_equal({ "name" => ["contprof"], "version" => [Contprof::VERSION] }, summary["scope"])
    burned = summary["inclusive"]["cpu-time"]["CpuHelpers#burn_cpu"]
    assert_in_delta 1.1e9, burned, 0.25e9, "the CPU burnt is in the profile sent"
    pprof, otlp = result.paths
    assert_match(/\.pprof\z/, pprof)
    assert_equal body, File.binread(otlp), "the file holds what was sent, uncompressed"
    refute_includes @log.string, "s3cret-T0KEN"
  end

  # Each way an endpoint can fail, at stop: the application waits at most upload_timeout
  # (plus the moment a cancelled upload takes to end), the failure is logged once without
  # credentials, and the files are written all the same.
  def test_a_dead_a_silent_and_a_failing_endpoint_cost_at_most_upload_timeout_at_stop
    needs_native_otlp!
    { "dead" => dead_url, "silent" => silent_url, "failing" => receiver(status: 500).url }.each do |kind, url|
      @log.truncate(0)
      @log.rewind
      dir = File.join(@dir, kind)
      Contprof.start(output: dir, output_otlp: true, otlp_url: url.sub("http://", "http://user:pw-S3CRET@"),
                     otlp_headers: { "Authorization" => SECRET }, upload_timeout: 1, log_level: "info")
      burn_cpu(1.1)
      started = monotonic
      Contprof.stop
      elapsed = monotonic - started
      assert_operator elapsed, :<, 1 + Contprof::Profiler::CANCEL_WAIT + 1.0, "#{kind}: stop took #{elapsed.round(2)} s"
      failures = @log.string.lines.grep(/otlp: (export failed|upload cancelled)/)
      assert_equal 1, failures.size, "#{kind}: #{@log.string}"
      refute_includes @log.string, "s3cret-T0KEN", kind
      refute_includes @log.string, "pw-S3CRET", kind
      assert_equal 1, Dir[File.join(dir, "*.pprof")].size, kind
      otlp = Dir[File.join(dir, "*.otlp")]
      assert_equal 1, otlp.size, kind
      assert_attribute protoc_decode(File.binread(otlp.first)), "process.pid", Process.pid
    end
  end

  def test_exit_waits_at_most_upload_timeout_for_a_silent_endpoint
    needs_native_otlp!
    program = <<~RUBY
      require "contprof"
      Contprof.start(output: #{@dir.inspect}, output_otlp: true, otlp_url: #{silent_url.inspect}, upload_timeout: 1,
                     otlp_headers: { "Authorization" => #{SECRET.inspect} })
      start = Process.clock_gettime(Process::CLOCK_THREAD_CPUTIME_ID)
      nil while Process.clock_gettime(Process::CLOCK_THREAD_CPUTIME_ID) - start < 1.1
      at_exit { puts Process.clock_gettime(Process::CLOCK_MONOTONIC) } # runs before Contprof's own (registered earlier)
    RUBY
    # The checkout's build, as the other tests' programs: a sanitized build's would need the
    # sanitizer runtimes preloaded, which the programs the tests start do not inherit.
    out, err, status = Open3.capture3(RbConfig.ruby, "-I#{File.expand_path("../../lib", __dir__)}", "-e", program)
    exited = monotonic
    assert status.success?, err
    exit_delay = exited - Float(out.lines.last)
    assert_operator exit_delay, :<, 1 + Contprof::Profiler::CANCEL_WAIT + 1.0, "exit took #{exit_delay.round(2)} s"
    assert_equal 1, err.lines.grep(/otlp: upload cancelled at stop/).size, err
    refute_includes err, "s3cret-T0KEN"
    assert_equal 1, Dir[File.join(@dir, "*.otlp")].size
    assert_equal 1, Dir[File.join(@dir, "*.pprof")].size
  end

  private

  # What Contprof logged while the block ran.
  def with_log
    log = StringIO.new
    previous = Contprof.logger
    Contprof.logger = Logger.new(log)
    yield
    log.string
  ensure
    Contprof.logger = previous
  end
end
