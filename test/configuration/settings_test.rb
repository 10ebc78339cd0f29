# frozen_string_literal: true

require_relative "../test_helper"
require "stringio"

class SettingsTest < Minitest::Test
  Settings = Contprof::Settings

  def resolve(keywords = {}, env = {})
    Settings.resolve(keywords, env: env)
  end

  def test_defaults
    settings = resolve
    assert_equal 0.01, settings.interval
    assert_equal 400, settings.max_frames
    assert_equal 60.0, settings.upload_period
    assert_equal 10.0, settings.upload_timeout
    assert_equal 0.02, settings.overhead_target
    assert settings.signals?
    assert settings.cpu_timers?
    assert_equal "warn", settings.log_level
    assert_equal({}, settings.tags)
    assert_nil settings.output
    refute_empty settings.service
    assert_nil settings.otlp_url
    assert_nil settings.otlp_endpoint
    assert_equal({}, settings.otlp_headers)
    assert_equal "gzip", settings.otlp_compression
    assert_equal 10.0, settings.otlp_timeout
    refute settings.output_otlp?
  end

  def test_environment_variables_and_keywords_win
    env = { "CONTPROF_SERVICE" => "from-env", "CONTPROF_INTERVAL" => "0.05", "CONTPROF_SIGNALS" => "false",
            "CONTPROF_CPU_TIMERS" => "off",
            "CONTPROF_TAGS" => "team:core, region:eu", "CONTPROF_MAX_FRAMES" => "64", "CONTPROF_ENV" => "" }
    settings = resolve({}, env)
    assert_equal "from-env", settings.service
    assert_equal 0.05, settings.interval
    refute settings.signals?
    refute settings.cpu_timers?
    assert_equal({ "team" => "core", "region" => "eu" }, settings.tags)
    assert_equal 64, settings.max_frames
    assert_nil settings.env, "an empty variable counts as unset"

    assert_equal :posix, resolve({}, { "CONTPROF_CPU_TIMERS" => "POSIX" }).cpu_timers?
    assert_equal :posix, resolve({ cpu_timers: :posix }, {}).cpu_timers?

    settings = resolve({ service: "kw", interval: 0.02, tags: { team: "web" } }, env)
    assert_equal "kw", settings.service
    assert_equal 0.02, settings.interval
    assert_equal({ "team" => "web" }, settings.tags)
  end

  def test_every_invalid_value_names_the_setting_and_what_it_accepts
    {
      interval: [0, "fast", 61], max_frames: [4, "many", 1.5], upload_period: [0.5, "x"],
      upload_timeout: [0, 301], overhead_target: [0, 1.5], signals: ["maybe", 2], cpu_timers: ["sometimes", 0.5],
      log_level: ["loud", 3], tags: ["novalue", 42, { "a,b" => "c" }], agent_url: ["ftp://x", "localhost:8126", "unix://relative"],
      pyroscope_url: ["nope"], service: ["", 7], output: [""],
      # Issue #15, item 12: control characters anywhere, ports out of range, and what an
      # exporter appends its own path to.
      env: ["prod\r\nX-Evil: 1"], version: ["1\n2"], site: ["datadoghq.com\r"], pyroscope_application_name: ["app\0"],
      otlp_url: ["ftp://collector", "collector:4318", "http://collector:99999", "http://collector:4318?x=1",
                 "http://collector:4318#x", "http://collector:4318/\r\n"],
      otlp_compression: ["br", "", 1], otlp_timeout: [0, 301, "soon"], output_otlp: ["maybe", 2],
    }.merge(
      service: ["web\r\nX-Evil: 1", "a\0b"], output: ["/tmp/x\0", "/tmp/x\ny"], tags: [{ "team" => "web\r\nX: 1" }, "a:b\n"],
      agent_url: ["http://localhost:99999", "http://localhost:0", "http://localhost:8126/v0.4", "http://localhost:8126?x=1",
                  "http://localhost:8126#frag", "unix:///var/run/a\nb"],
      pyroscope_url: ["http://localhost:65536", "http://pyro:4040/?tenant=x", "http://pyro:4040/#x"],
    ) { |_, old, new| old + new }.each do |name, values|
      values.each do |value|
        error = assert_raises(ArgumentError, "#{name}=#{value.inspect}") { resolve(name => value) }
        assert_match(/\Asetting #{name} \(#{name}\) accepts .+; got #{Regexp.escape(value.inspect)}/, error.message)
      end
    end
    error = assert_raises(ArgumentError) { resolve({}, "CONTPROF_INTERVAL" => "soon") }
    assert_match(/setting interval \(CONTPROF_INTERVAL\) accepts a number of seconds from 0.001 to 60; got "soon"/,
                 error.message)
  end

  # Issue #16: a misspelt variable is said once, with the closest setting's variable.
  def test_unknown_contprof_variables_are_warned_about_once
    log = StringIO.new
    previous = Contprof.logger
    Contprof.logger = Logger.new(log)
    env = { "CONTPROF_INTERVALL" => "0.1", "CONTPROF_LONG_TESTS" => "1", "CONTPROF_ZZZZZZZZZZZZ" => "1" }
    2.times { resolve({}, env) }
    assert_equal 1, log.string.scan("unknown variable CONTPROF_INTERVALL ignored; did you mean CONTPROF_INTERVAL?").size,
                 log.string
    assert_equal 1, log.string.scan("unknown variable CONTPROF_ZZZZZZZZZZZZ ignored; settings are listed").size
    refute_includes log.string, "CONTPROF_LONG_TESTS", "the test suite's own variables are known"
  ensure
    Contprof.logger = previous
  end

  def test_unknown_settings_are_rejected
    error = assert_raises(ArgumentError) { resolve(intervall: 1) }
    assert_match(/unknown setting :intervall/, error.message)
    assert_match(/interval, max_frames/, error.message)
  end

  def test_urls
    assert_equal "http://localhost:8126", resolve(agent_url: "http://localhost:8126/").agent_url
    assert_equal "http://localhost:65535", resolve(agent_url: "http://localhost:65535").agent_url
    # A Pyroscope behind a reverse proxy, under a path of its own.
    assert_equal "https://example.org/pyroscope", resolve(pyroscope_url: "https://example.org/pyroscope/").pyroscope_url
    assert_equal "unix:///var/run/datadog/apm.socket", resolve(agent_url: "unix:///var/run/datadog/apm.socket").agent_url
    assert_equal "https://pyro.example:4040", resolve(pyroscope_url: "https://pyro.example:4040").pyroscope_url
  end

  # As dd-trace-rb: agentless is asked for explicitly and needs the key; the key alone
  # switches nothing (with an agent it is not needed); nothing is silently ignored.
  def test_agentless_needs_an_api_key_and_the_key_is_never_shown
    settings = resolve(agentless: true, api_key: "secret-key-123")
    assert_equal "datadoghq.com", settings.site
    assert settings.agentless?
    refute_includes settings.inspect, "secret-key-123"
    assert_includes settings.inspect, "api_key=[redacted]"
    assert Contprof::Settings.resolve({}, env: { "CONTPROF_AGENTLESS" => "true", "CONTPROF_API_KEY" => "k" }).agentless?
    refute resolve(agent_url: "http://127.0.0.1:8126", api_key: "k").agentless?
    {
      { agentless: true } => /\Asetting agentless \(CONTPROF_AGENTLESS\) needs api_key/,
      { api_key: "secret-key-123" } => /\Asetting api_key \(CONTPROF_API_KEY\) alone uploads nowhere: set agentless/,
      { site: "datadoghq.eu" } => /\Asetting site \(CONTPROF_SITE\) is for agentless uploads/,
      { site: "datadoghq.eu", api_key: "secret-key-123" } => /\Asetting site .* set agentless/,
      { agentless: true, api_key: "secret-key-123", agent_url: "http://127.0.0.1:8126" } => /set one of them/,
      { agentless: "maybe" } => /\Asetting agentless \(agentless\) accepts true or false; got "maybe"/,
      # The intake's host is made of the site: nothing that could point the API key elsewhere.
      { agentless: true, api_key: "secret-key-123", site: "x@127.0.0.1:1234" } => /\Asetting site \(site\) .*not a host name/,
      { agentless: true, api_key: "secret-key-123", site: "datadoghq.com/steal" } => /not a host name/,
      { agentless: true, api_key: "secret-key-123", site: "localhost" } => /not a host name/,
    }.each do |keywords, message|
      error = assert_raises(ArgumentError, keywords.inspect) { resolve(**keywords) }
      assert_match message, error.message
      refute_includes error.message, "secret-key-123"
    end
  end

  def test_pyroscope_credentials_are_checked_and_never_shown
    secrets = { pyroscope_tenant_id: "tenant-7x", pyroscope_basic_auth_user: "alice-user",
                pyroscope_basic_auth_password: "s3cret-pw" }
    settings = resolve(pyroscope_url: "http://pyro.example:4040", **secrets)
    secrets.each do |name, value|
      assert_equal value, settings.public_send(name)
      refute_includes settings.inspect, value
      assert_includes settings.inspect, "#{name}=[redacted]"
    end
    assert_equal "tok-1", Contprof::Settings.resolve({}, env: { "CONTPROF_PYROSCOPE_AUTH_TOKEN" => "tok-1" }).pyroscope_auth_token
    {
      { pyroscope_basic_auth_user: "alice-user" } => /\Asetting pyroscope_basic_auth_user .* needs the other one/,
      { pyroscope_basic_auth_password: "s3cret-pw" } => /\Asetting pyroscope_basic_auth_password .* needs the other one/,
      { pyroscope_basic_auth_user: "alice:user", pyroscope_basic_auth_password: "s3cret-pw" } =>
        /\Asetting pyroscope_basic_auth_user .* accepts .*; got a value of class String \(not shown: a secret\) \(':' is not accepted\)/,
      { pyroscope_auth_token: "tok\r\nX: 1" } => /\Asetting pyroscope_auth_token .*not shown.*control characters/,
      { pyroscope_tenant_id: "ten\nant" } => /\Asetting pyroscope_tenant_id .*not shown.*control characters/,
      { pyroscope_auth_token: "tok-1", pyroscope_basic_auth_user: "alice-user", pyroscope_basic_auth_password: "s3cret-pw" } =>
        /exclude each other/,
      { pyroscope_url: "http://alice-user:s3cret-pw@pyro.example:4040", pyroscope_basic_auth_user: "alice-user",
        pyroscope_basic_auth_password: "s3cret-pw" } => /give them once/,
    }.each do |keywords, message|
      error = assert_raises(ArgumentError, keywords.keys.inspect) { resolve(**keywords) }
      assert_match message, error.message
      ["alice-user", "s3cret-pw", "tok-1", "tenant-7x", "ten\nant", "tok\r"].each { |secret| refute_includes error.message, secret }
    end
  end

  # OTLP headers: as a Hash or in OpenTelemetry's "name=value,..." form (percent-decoded);
  # a wrong one is refused naming the header by position or name, never its value.
  def test_otlp_headers_are_checked_and_never_shown
    settings = resolve({ otlp_url: "http://collector:4318", otlp_headers: "Authorization=Bearer%20tok-1, X-Scope-OrgID = t-7x" })
    assert_equal({ "Authorization" => "Bearer tok-1", "X-Scope-OrgID" => "t-7x" }, settings.otlp_headers)
    assert_equal({ "api-key" => "k-9" }, resolve({}, "CONTPROF_OTLP_HEADERS" => "api-key=k-9").otlp_headers)
    assert_equal({ "api-key" => "k-9" }, resolve(otlp_headers: { "api-key": "k-9" }).otlp_headers)
    refute_includes settings.inspect, "tok-1"
    refute_includes settings.inspect, "t-7x"
    {
      "Bearer tok-1" => /\(entry 1 is not key=value\)/,
      "a=1,tok-1%zz=x" => /\(entry 2 is not valid percent-encoded UTF-8\)/,
      "Auth tok-1=x" => /\(header 1: the name is not an HTTP token\)/,
      { "Authorization" => "tok-1\r\nX-Evil: 1" } => /\(header Authorization: control characters in the value\)/,
      { "Content-Encoding" => "tok-1" } => /\(header Content-Encoding is set by Contprof\)/,
      { "Authorization" => :"tok-1" } => /\(header Authorization: the value is not a String\)/,
      ["tok-1"] => /got a value of class Array/,
    }.each do |value, message|
      error = assert_raises(ArgumentError, value.inspect) { resolve(otlp_headers: value) }
      assert_match(/\Asetting otlp_headers \(otlp_headers\) accepts a Hash or "name=value,name=value" .*not shown: a secret/,
                   error.message)
      assert_match message, error.message
      refute_includes error.message, "tok-1"
    end
  end

  def test_output_otlp_needs_output
    assert resolve(output: "/tmp/x", output_otlp: true).output_otlp?
    assert resolve({}, "CONTPROF_OUTPUT" => "/tmp/x", "CONTPROF_OUTPUT_OTLP" => "yes").output_otlp?
    error = assert_raises(ArgumentError) { resolve(output_otlp: true) }
    assert_equal "setting output_otlp (CONTPROF_OUTPUT_OTLP) needs output (CONTPROF_OUTPUT): the .otlp files are " \
                 "written next to the .pprof files", error.message
  end

  def test_otlp_url_is_a_base_url_and_the_signal_path_is_appended_once
    assert_equal "http://collector:4318/v1development/profiles", resolve(otlp_url: "http://collector:4318/").otlp_endpoint
    assert_equal "https://otlp.example/base/v1development/profiles",
                 resolve({}, "CONTPROF_OTLP_URL" => "https://otlp.example/base").otlp_endpoint
  end

  # Issue #15, items 9 and 12: a wrong API key is never echoed, and one with CR/LF (which
  # would forge an HTTP header) is refused.
  def test_a_wrong_api_key_is_refused_without_being_shown
    error = assert_raises(ArgumentError) { Contprof::Settings.resolve({ api_key: 1_234_567_890 }, env: {}) }
    assert_match(/setting api_key .* got a value of class Integer \(not shown: a secret\)/, error.message)
    refute_includes error.message, "1234567890"
    error = assert_raises(ArgumentError) { Contprof::Settings.resolve({ api_key: "k3y\r\nX-Evil: 1" }, env: {}) }
    refute_includes error.message, "k3y"
    assert_match(/control characters/, error.message)
    error = assert_raises(ArgumentError) { Contprof::Settings.resolve({}, env: { "CONTPROF_API_KEY" => "k3\0y" }) }
    refute_includes error.message, "k3"
  end
end
