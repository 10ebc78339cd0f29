# frozen_string_literal: true

require_relative "../test_helper"
require "socket"
require_relative "../support/intake_server"
require_relative "../support/intake_checks"
require "contprof/exporters/pprof_select" # (used directly; the Pyroscope exporter loads it only when used)
require "contprof/exporters/datadog_states" # (used directly; the Datadog exporter loads it only when used)
require "json"
require "zlib"
require "stringio"

# The Datadog and Pyroscope exporters against a local server that parses their multipart
# bodies with WEBrick's stock parser; IntakeChecks then reads each upload as the Datadog
# intake or the Pyroscope server would.
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
    recorder.record_sample([["Shop#checkout", "/app/shop.rb", 12], ["thread id", "/app/main.rb", 1]],
                           { "cpu-time" => 5_000_000, "cpu-samples" => 1, "wall-time" => 9_000_000 },
                           { "thread id" => "1", "endpoint" => "Shop#checkout", "trace endpoint" => "Shop#checkout",
                             "span_id" => "00000000000004d2", "local root span id" => 1234 })
    start, finish, pprof = recorder.serialize
    Contprof::ExportedProfile.new(start: start - 2, finish: finish, pprof: pprof, tags: Contprof::Tags.build(settings),
                                  paths: [])
  end

  def datadog(url, timeout: 5.0)
    @info = Contprof::Exporters::Datadog.info(settings)
    @internal = Contprof::Exporters::Datadog.internal(settings)
    Contprof::Exporters::Datadog.new(agent_url: url, timeout: timeout, info: @info, internal: @internal)
  end

  def assert_datadog_request(request, profile, agentless: false)
    assert_equal "POST", request.method
    parts = IntakeChecks.parts(request.form)
    assert_equal [], IntakeChecks.datadog_problems(path: request.path, headers: request.headers, parts: parts,
                                                   agentless: agentless)
    assert_equal %w[event code-provenance.json profile.pprof], request.form.keys
    event = JSON.parse(parts["event"].data)
    assert_equal %w[code-provenance.json profile.pprof], event["attachments"]
    assert_equal profile.start.utc.strftime("%Y-%m-%dT%H:%M:%S.%9NZ"), event["start"]
    assert_equal profile.finish.utc.strftime("%Y-%m-%dT%H:%M:%S.%9NZ"), event["end"]
    assert_equal "ruby", event["family"]
    assert_equal "4", event["version"]
    assert event.key?("endpoint_counts") && event["endpoint_counts"].nil?, "no endpoint labels yet: null"
    assert event.key?("process_tags") && event["process_tags"].nil?
    tags = event["tags_profiler"].split(",")
    %W[service:shop env:staging version:1.2.3 team:core language:ruby runtime:ruby runtime_engine:ruby
       process_id:#{Process.pid} profiler_version:#{Contprof::VERSION} runtime_version:#{RUBY_VERSION}
       runtime_platform:#{RUBY_PLATFORM} runtime-id:#{Contprof::Tags.runtime_id}].each do |tag|
      assert_includes tags, tag
    end
    assert_equal profile.tags.size, tags.size
    assert(tags.any? { |t| t.start_with?("host:") && t.size > 5 })
    assert_match(/\A[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}\z/, Contprof::Tags.runtime_id)
    assert_equal @internal, event["internal"]
    assert_equal @info, event["info"]

    pprof_part = parts["profile.pprof"]
    assert_equal profile.pprof.b, pprof_part.data
    decoded = decode_profile(pprof_part.data)
    assert_equal 5_000_000, decoded.total("cpu-time")
    assert_equal ["Shop#checkout", "thread id"], decoded.samples.first.locations.map(&:function_name)
    assert_equal "1", decoded.samples.first.labels["thread id"]
    assert_equal "Shop#checkout", decoded.samples.first.labels["trace endpoint"], "Datadog's label arrives as it is"

    provenance = JSON.parse(Zlib.gunzip(parts["code-provenance.json"].data))
    stdlib = provenance.fetch("v1").find { |library| library["kind"] == "standard library" }
    assert_equal [RbConfig::CONFIG["rubylibdir"]], stdlib["paths"]
    provenance["v1"].each { |library| assert_equal %w[kind name paths version], library.keys.sort }

    assert_match(%r{\Acontprof/#{Regexp.escape(Contprof::VERSION)} ruby/}, request.headers["user-agent"])
    assert_equal "contprof", request.headers["dd-evp-origin"]
    assert_equal Contprof::VERSION, request.headers["dd-evp-origin-version"]
    container_id = Contprof::Exporters::Datadog.container_id
    entity_id = Contprof::Exporters::Datadog.entity_id
    [["datadog-container-id", container_id], ["datadog-entity-id", entity_id]].each do |header, value|
      value ? assert_equal(value, request.headers[header]) : refute(request.headers.key?(header), header)
    end
    assert_equal "ci-#{container_id}", entity_id if container_id
    assert_match(/\Ain-\d+\z/, entity_id) if entity_id && !container_id
  end

  # A good upload, captured, then broken one way at a time: the check names each problem.
  def test_the_intake_check_refuses_broken_uploads
    intake = server
    datadog(intake.url).export(profile)
    request = intake.next_request
    good = IntakeChecks.parts(request.form)
    check = lambda do |parts: good, headers: request.headers, path: request.path, agentless: false|
      IntakeChecks.datadog_problems(path: path, headers: headers, parts: parts, agentless: agentless)
    end
    assert_equal [], check.()
    with_event = lambda do |&change|
      event = JSON.parse(good["event"].data)
      change.(event)
      good.merge("event" => good["event"].dup.tap { |part| part.data = JSON.generate(event) })
    end
    {
      "event has no version" => with_event.() { |e| e.delete("version") },
      "event version is a Integer, not a String" => with_event.() { |e| e["version"] = 4 },
      "event has no endpoint_counts" => with_event.() { |e| e.delete("endpoint_counts") },
      "event endpoint_counts is a Array, not a Hash or null" => with_event.() { |e| e["endpoint_counts"] = [] },
      "event start \"2024-01-01T00:00:00Z\" is not RFC 3339 with 9 digits" =>
        with_event.() { |e| e["start"] = "2024-01-01T00:00:00Z" },
      "event info is a NilClass, not a Hash" => with_event.() { |e| e["info"] = nil },
      "event tags_profiler is a Array, not a String" => with_event.() { |e| e["tags_profiler"] = ["a:b"] },
      "event has unknown keys [\"data\"]" => with_event.() { |e| e["data"] = 1 },
      "attachment profile.pprof has no part" => good.reject { |name, _| name == "profile.pprof" },
      "no part named event" => good.reject { |name, _| name == "event" },
      "attachment code-provenance.json is not compressed (no known magic bytes)" =>
        good.merge("code-provenance.json" => good["code-provenance.json"].dup.tap { |p| p.data = "{}" }),
    }.each do |problem, parts|
      assert_includes check.(parts: parts), problem
    end
    assert_includes check.(headers: request.headers.reject { |k, _| k == "dd-evp-origin" }), "no DD-EVP-ORIGIN header"
    assert_includes check.(headers: request.headers.merge("dd-api-key" => "k")),
                    "an upload through the agent carries DD-API-KEY"
    assert_includes check.(path: "/v1/input"), "path /v1/input is not /profiling/v1/input"
    assert_includes check.(agentless: true), "agentless upload without DD-API-KEY"
  end

  def test_datadog_agent_over_tcp
    intake = server
    profile = profile()
    assert_equal 202, datadog(intake.url).export(profile)
    assert_datadog_request(intake.next_request, profile)
  end

  # The thread state goes to Datadog as its profiler sends it (key `state`, its values),
  # timestamps as they are; nothing else changes.
  def test_datadog_gets_thread_states_as_datadog_names_them
    recorder = Contprof::StackRecorder.new
    frames = [["Shop#checkout", "/app/shop.rb", 12]]
    { "running" => "had cpu", "sleeping" => "sleeping", "io" => "network", "native" => "unknown",
      "waiting for gvl" => "waiting for gvl", "waiting" => "waiting" }.each_with_index do |(ours, _), i|
      recorder.record_sample(frames, { "cpu-time" => i, "cpu-samples" => 1, "wall-time" => 1_000 + i },
                             { "thread id" => "1", "thread state" => ours, "end_timestamp_ns" => 1_700_000_000_000_000_000 + i })
    end
    start, finish, pprof = recorder.serialize
    exported = Contprof::ExportedProfile.new(start: start - 2, finish: finish, pprof: pprof, tags: Contprof::Tags.build(settings),
                                             paths: [])
    intake = server
    datadog(intake.url).export(exported)
    sent = decode_profile(IntakeChecks.parts(intake.next_request.form)["profile.pprof"].data)
    states = sent.samples.to_h { |s| [s.labels["state"], s.values["wall-time"]] }
    assert_equal({ "had cpu" => 1_000, "sleeping" => 1_001, "network" => 1_002, "unknown" => 1_003,
                   "waiting for gvl" => 1_004, "waiting" => 1_005 }, states)
    assert(sent.samples.none? { |s| s.labels.key?("thread state") })
    assert_equal (0..5).map { |i| 1_700_000_000_000_000_000 + i }, sent.samples.map { |s| s.labels["end_timestamp_ns"] }.sort
    assert_equal decode_profile(pprof).total("cpu-time"), sent.total("cpu-time")
  end

  # The recorder renames the states while it serializes (StackRecorder#serialize's relabel:,
  # in C without the GVL); the exporter sends that pprof, and rewrites ours in Ruby only
  # without it. Both say the same.
  def test_datadog_states_from_the_recorder_equal_the_ruby_rewrite
    record = lambda do |recorder|
      %w[running sleeping io native waiting\ for\ gvl waiting].each_with_index do |ours, i|
        recorder.record_sample([["Shop#checkout", "/app/shop.rb", 12 + i]], { "cpu-time" => i, "cpu-samples" => 1, "wall-time" => 1_000 + i },
                               { "thread id" => "1", "thread state" => ours, "phase" => ours })
      end
    end
    recorder = Contprof::StackRecorder.new
    record.(recorder)
    start, finish, pprof, otlp, extras = recorder.serialize(relabel: Contprof::DatadogStates::RELABEL)
    assert_nil otlp
    sent = [extras, nil].map do |with|
      exported = Contprof::ExportedProfile.new(start: start - 2, finish: finish, pprof: pprof, tags: Contprof::Tags.build(settings),
                                               paths: [], extras: with)
      intake = server
      datadog(intake.url).export(exported)
      decode_profile(IntakeChecks.parts(intake.next_request.form)["profile.pprof"].data)
    end
    summary = sent.map { |profile| profile.samples.map { |s| [s.locations.first.line, s.labels, s.values] }.sort_by(&:first) }
    assert_equal summary[1], summary[0]
    assert_equal "had cpu", summary[0].first[1]["state"]
    assert_equal "running", summary[0].first[1]["phase"], "a label of the program keeps its value"
    refute_equal extras[:relabeled], pprof
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
    assert_equal "https://intake.profile.datadoghq.eu/api/v2/profile", exporter.url
    assert_includes exporter.headers, ["DD-API-KEY", "key-abc"]
    assert_equal "datadog-agentless", exporter.name
    # Through an agent the key is not sent (the agent adds its own).
    through_agent = Contprof::Exporters::Datadog.new(agent_url: "http://127.0.0.1:8126", api_key: "key-abc")
    refute(through_agent.headers.any? { |name, _| name == "DD-API-KEY" })
  end

  def test_an_agentless_upload_passes_the_intake_check
    intake = server
    profile = profile()
    @info = { "runtime" => { "engine" => "ruby" } }
    @internal = {}
    exporter = Contprof::Exporters::Datadog.new(site: "datadoghq.eu", api_key: "key-abc", timeout: 5, info: @info,
                                                internal: @internal, intake_url: "#{intake.url}/api/v2/profile")
    exporter.export(profile)
    request = intake.next_request
    assert_datadog_request(request, profile, agentless: true)
    assert_equal "key-abc", request.headers["dd-api-key"]
  end

  def test_the_event_info_says_what_the_profile_page_shows
    info = Contprof::Exporters::Datadog.info(settings(interval: 0.02))
    assert_equal({ "engine" => RUBY_ENGINE, "version" => RUBY_ENGINE_VERSION, "platform" => RUBY_PLATFORM }, info["runtime"])
    assert_equal Contprof::VERSION, info.dig("profiler", "version")
    assert_equal 0.02, info.dig("profiler", "settings", "interval")
    assert_equal %w[env service start_time version], info["application"].keys.sort
    assert_equal "shop", info.dig("application", "service")
    assert_match(/\A\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ\z/, info.dig("application", "start_time"))
    assert_equal Etc.uname[:sysname], info.dig("platform", "kernel_name")
    assert_equal({ "no_signals_workaround_enabled" => true }, Contprof::Exporters::Datadog.internal(settings(signals: false)))
  end

  # Our profile reaches Pyroscope as two uploads whose series are, by the server's own
  # naming rules, the standard CPU and wall profile types.
  def test_pyroscope
    intake = server(status: 200)
    profile = profile()
    exporter = Contprof::Exporters::Pyroscope.new(url: intake.url, application_name: "shop-app",
                                                  user_tags: { "team" => "core", "odd-key" => "a=b" }, period: 10_000_000)
    assert_equal 200, exporter.export(profile)
    cpu, wall = Array.new(2) { intake.next_request }
    ids = [cpu, wall].map do |request|
      assert_equal "/ingest", request.path
      name = request.query["name"]
      assert_match(/\Ashop-app\{.*\}\z/, name)
      labels = name[/\{(.*)\}/, 1].split(",").to_h { |pair| pair.split("=", 2) }
      assert_equal({ "team" => "core", "odd_key" => "ab", "env" => "staging", "version" => "1.2.3",
                     "host" => profile.tags["host"] }, labels)
      assert_equal (profile.start.to_r * 1_000_000_000).to_i.to_s, request.query["from"]
      assert_equal (profile.finish.to_r * 1_000_000_000).to_i.to_s, request.query["until"]
      assert_equal 19, request.query["from"].size, "19 digits: the server reads nanoseconds"
      assert_equal "contprof", request.query["spyName"]
      assert_equal "100", request.query["sampleRate"]
      refute request.query.key?("format")
      parts = IntakeChecks.parts(request.form)
      assert_equal %w[profile sample_type_config], parts.keys.sort
      assert_equal "profile.pprof", parts["profile"].filename
      decoded = decode_profile(parts["profile"].data)
      assert_equal 10_000_000, decoded.period
      assert_equal decoded.sample_type_names.sort, JSON.parse(parts["sample_type_config"].data).keys.sort
      raw = go_pprof(parts["profile"].data, "-raw")
      assert_includes raw, "PeriodType: #{decoded.period_type.type} #{decoded.period_type.unit}"
      [IntakeChecks.pyroscope_profile_type_ids(query: request.query, parts: parts, decoded: decoded), decoded]
    end
    assert_equal %w[process_cpu:samples:count:cpu:nanoseconds process_cpu:cpu:nanoseconds:cpu:nanoseconds], ids[0][0]
    assert_equal %w[wall:wall:nanoseconds:wall:nanoseconds], ids[1][0]
    assert_equal 5_000_000, ids[0][1].total("cpu")
    assert_equal 1, ids[0][1].total("samples")
    assert_equal 9_000_000, ids[1][1].total("wall")
    # A function may have the text of a label key: only the key is renamed.
    assert_equal ["Shop#checkout", "thread id"], ids[1][1].samples.first.locations.map(&:function_name)
    assert_equal({ "thread_id" => "1", "endpoint" => "Shop#checkout", "trace_endpoint" => "Shop#checkout",
                   "span_id" => "00000000000004d2", "local_root_span_id" => 1234 }, ids[1][1].samples.first.labels)
    ids.each { |_, decoded| assert_empty IntakeChecks.pyroscope_label_problems(decoded) }
  end

  # Pyroscope's uploads come from the recorder's pprof with the timeline merged, when the
  # profile has one (ExportedProfile#extras).
  def test_pyroscope_reads_the_merged_timeline
    exporter = Contprof::Exporters::Pyroscope.new(url: server(status: 200).url, application_name: "shop-app", period: 10_000_000)
    assert_equal({ merged_timeline: true }, exporter.serialize_extras)
    merged = Contprof::StackRecorder.new
    merged.record_sample([["Merged#call", "/app/m.rb", 1]], { "cpu-time" => 3, "cpu-samples" => 1, "wall-time" => 4 }, { "thread id" => "1" })
    base = profile()
    exported = Contprof::ExportedProfile.new(**base.to_h, extras: { merged_timeline: merged.serialize[2] })
    intake = server(status: 200)
    exporter = Contprof::Exporters::Pyroscope.new(url: intake.url, application_name: "shop-app", period: 10_000_000)
    exporter.export(exported)
    cpu = decode_profile(IntakeChecks.parts(intake.next_request.form)["profile"].data)
    assert_equal ["Merged#call"], cpu.samples.map { |s| s.locations.first.function_name }
  end

  # With allocation (and heap) profiling, a third upload lands in the server's standard memory types.
  def test_pyroscope_memory_upload
    allocations = Contprof::Collectors::Allocations
    types = allocations::TIME_SAMPLE_TYPES + allocations::SAMPLE_TYPES + allocations::HEAP_SAMPLE_TYPES
    recorder = Contprof::StackRecorder.new(sample_types: types)
    recorder.record_sample([["Shop#cart", "/app/shop.rb", 3]], { "cpu-time" => 5_000_000, "cpu-samples" => 1 }, {})
    recorder.record_sample([["Shop#checkout", "/app/shop.rb", 12]], { "alloc-samples" => 700, "alloc-size" => 28_000 },
                           { "allocation class" => "String" })
    recorder.record_sample([["Shop#checkout", "/app/shop.rb", 12]], { "heap-live-samples" => 90, "heap-live-size" => 3_600 },
                           { "allocation class" => "String" })
    start, finish, pprof = recorder.serialize
    profile = Contprof::ExportedProfile.new(start: start - 2, finish: finish, pprof: pprof, tags: Contprof::Tags.build(settings),
                                            paths: [])
    intake = server(status: 200)
    exporter = Contprof::Exporters::Pyroscope.new(url: intake.url, application_name: "shop-app", allocation: true, heap: true)
    assert_equal 200, exporter.export(profile)
    requests = Array.new(3) { intake.next_request }
    memory = requests.last
    parts = IntakeChecks.parts(memory.form)
    decoded = decode_profile(parts["profile"].data)
    assert_equal %w[memory:alloc_objects:count:space:bytes memory:alloc_space:bytes:space:bytes
                    memory:inuse_objects:count:space:bytes memory:inuse_space:bytes:space:bytes],
                 IntakeChecks.pyroscope_profile_type_ids(query: memory.query, parts: parts, decoded: decoded)
    assert_equal 700, decoded.total("alloc_objects")
    assert_equal 28_000, decoded.total("alloc_space")
    assert_equal 90, decoded.total("inuse_objects")
    assert_equal 3_600, decoded.total("inuse_space")
    assert_equal [["Shop#checkout"]], decoded.samples.map { |sample| sample.locations.map(&:function_name) }.uniq
    assert_equal "String", decoded.samples.first.labels["allocation_class"]
    assert_empty IntakeChecks.pyroscope_label_problems(decoded)
  end

  # The test's copy of Pyroscope's naming rules tells apart what it should: our old
  # upload (one pprof, Contprof's own type names, no period type) did not land in the
  # standard types, and CPU and wall in one pprof would all be named wall.
  def test_the_pyroscope_naming_rules_reject_what_misses_the_standard_types
    query = { "name" => "app{}", "from" => "1", "until" => "2" }
    old = Contprof::Pprof.decode(profile.pprof)
    old_config = { "cpu-time" => { "display-name" => "cpu_time" } }
    parts = { "profile" => IntakeChecks::Part.new(data: profile.pprof),
              "sample_type_config" => IntakeChecks::Part.new(data: JSON.generate(old_config)) }
    assert_equal %w[process_cpu:cpu-time:nanoseconds:: process_cpu:cpu-samples:count:: process_cpu:wall-time:nanoseconds::
                    process_cpu:wall-samples:count::],
                 IntakeChecks.pyroscope_profile_type_ids(query: query, parts: parts, decoded: old)
    mixed = Contprof::PprofSelect.call(profile.pprof, [{ keep: [%w[cpu-time cpu nanoseconds], %w[wall-time wall nanoseconds]],
                                                         period_type: %w[cpu nanoseconds], period: 1 }]).first
    assert_equal %w[wall:cpu:nanoseconds:cpu:nanoseconds wall:wall:nanoseconds:cpu:nanoseconds],
                 IntakeChecks.pyroscope_profile_type_ids(query: query, parts: { "profile" => parts["profile"] },
                                                         decoded: Contprof::Pprof.decode(mixed))
    error = assert_raises(RuntimeError) do
      IntakeChecks.pyroscope_profile_type_ids(query: query.merge("format" => "pprof"), parts: parts, decoded: old)
    end
    assert_match(/format parameter/, error.message)
    assert_raises(RuntimeError) { IntakeChecks.pyroscope_profile_type_ids(query: query, parts: {}, decoded: old) }
  end

  def test_pyroscope_credentials_go_as_headers_and_are_never_shown
    intake = server(status: 401, echo: true)
    exporter = Contprof::Exporters::Pyroscope.new(url: intake.url, application_name: "shop", tenant_id: "tenant-7x",
                                                  basic_auth: %w[alice s3cret-pw])
    error = assert_raises(Contprof::HttpTransport::Error) { exporter.export(profile) }
    request = intake.next_request
    assert_equal "tenant-7x", request.headers["x-scope-orgid"]
    assert_equal "Basic #{["alice:s3cret-pw"].pack("m0")}", request.headers["authorization"]
    [exporter.inspect, error.message, error.full_message].each do |text|
      ["tenant-7x", "s3cret-pw", ["alice:s3cret-pw"].pack("m0")].each { |secret| refute_includes text, secret }
    end
    bearer = Contprof::Exporters::Pyroscope.new(url: server(status: 200).tap { |s| intake = s }.url,
                                                application_name: "shop", auth_token: "tok-12345")
    bearer.export(profile)
    assert_equal "Bearer tok-12345", intake.next_request.headers["authorization"]
    refute_includes bearer.inspect, "tok-12345"
  end

  def test_pyroscope_errors
    [400, 500].each do |status|
      intake = server(status: status)
      exporter = Contprof::Exporters::Pyroscope.new(url: intake.url, application_name: "shop")
      error = assert_raises(Contprof::HttpTransport::Error) { exporter.export(profile) }
      assert_match(%r{POST http://127.0.0.1:\d+/ingest \(cpu\): HTTP #{status}}, error.message)
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
                                                intake_url: "#{intake.url}/api/v2/profile")
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
