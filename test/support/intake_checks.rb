# frozen_string_literal: true

require "json"
require "zlib"
require "stringio"

# What a Datadog intake and a Pyroscope server would make of an upload captured by
# IntakeServer, written from their documented behaviour and their clients' code (see the
# README, "Where profiles go"). Each check returns a list of problems (empty: accepted),
# so that tests can also feed them broken uploads and see the problem named.
module IntakeChecks
  # One multipart part, as the server's parser sees it.
  Part = Struct.new(:data, :filename, :content_type, keyword_init: true)

  RFC3339_NANOS = /\A\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{9}Z\z/.freeze
  COMPRESSED = { "gzip" => "\x1f\x8b".b, "zstd" => "\x28\xb5\x2f\xfd".b, "lz4" => "\x04\x22\x4d\x18".b }.freeze

  module_function

  # name => Part, from WEBrick's parsed form.
  def parts(form)
    form.to_h do |name, value|
      [name, Part.new(data: value.to_s.b, filename: value.filename, content_type: value["content-type"])]
    end
  end

  # ---------------------------------------------------------------------------------------
  # Datadog intake v4: the event part names the attachments; each attachment is a part
  # named after itself, compressed (recognised by its magic bytes).

  EVENT_TYPES = {
    "attachments" => Array, "tags_profiler" => String, "start" => String, "end" => String, "family" => String,
    "version" => String, "internal" => Hash, "info" => Hash,
  }.freeze
  # Keys that may be null.
  EVENT_NULLABLE = { "endpoint_counts" => Hash, "process_tags" => String }.freeze

  # path: the request's path; headers: lower-case name => value; parts: name => Part.
  def datadog_problems(path:, headers:, parts:, agentless:)
    problems = []
    expected_path = agentless ? "/api/v2/profile" : "/profiling/v1/input"
    problems << "path #{path} is not #{expected_path}" unless path == expected_path
    problems.concat(datadog_header_problems(headers, agentless))
    event_part = parts["event"]
    return problems << "no part named event" unless event_part

    problems << "event part's filename is #{event_part.filename.inspect}" unless event_part.filename == "event.json"
    unless event_part.content_type.to_s.start_with?("application/json")
      problems << "event part's content type is #{event_part.content_type.inspect}"
    end
    event = begin
      JSON.parse(event_part.data)
    rescue JSON::ParserError => e
      return problems << "event is not JSON: #{e.message}"
    end
    return problems << "event is not a JSON object" unless event.is_a?(Hash)

    problems.concat(event_problems(event))
    attachments = event["attachments"]
    return problems unless attachments.is_a?(Array)

    unless (parts.keys - ["event"]).sort == attachments.sort
      problems << "parts #{parts.keys.inspect} are not event plus the attachments #{attachments.inspect}"
    end
    problems << "profile.pprof is not among the attachments" unless attachments.include?("profile.pprof")
    attachments.each do |name|
      part = parts[name]
      next problems << "attachment #{name} has no part" unless part
      next problems << "attachment #{name}'s filename is #{part.filename.inspect}" unless part.filename == name
      next problems << "attachment #{name} is empty" if part.data.empty?

      unless COMPRESSED.values.any? { |magic| part.data.start_with?(magic) }
        problems << "attachment #{name} is not compressed (no known magic bytes)"
      end
    end
    problems
  end

  def datadog_header_problems(headers, agentless)
    problems = []
    problems << "no DD-EVP-ORIGIN header" if headers["dd-evp-origin"].to_s.empty?
    problems << "no DD-EVP-ORIGIN-VERSION header" if headers["dd-evp-origin-version"].to_s.empty?
    problems << "content type is not multipart/form-data" unless headers["content-type"].to_s.start_with?("multipart/form-data")
    if agentless && headers["dd-api-key"].to_s.empty?
      problems << "agentless upload without DD-API-KEY"
    elsif !agentless && headers.key?("dd-api-key")
      problems << "an upload through the agent carries DD-API-KEY"
    end
    problems
  end

  def event_problems(event)
    problems = []
    EVENT_TYPES.each do |key, type|
      next problems << "event has no #{key}" unless event.key?(key)

      problems << "event #{key} is a #{event[key].class}, not a #{type}" unless event[key].is_a?(type)
    end
    EVENT_NULLABLE.each do |key, type|
      next problems << "event has no #{key}" unless event.key?(key)
      next if event[key].nil? || event[key].is_a?(type)

      problems << "event #{key} is a #{event[key].class}, not a #{type} or null"
    end
    unknown = event.keys - EVENT_TYPES.keys - EVENT_NULLABLE.keys
    problems << "event has unknown keys #{unknown.inspect}" unless unknown.empty?
    problems << "event version is #{event["version"].inspect}, not \"4\"" unless event["version"] == "4"
    problems << "event family is #{event["family"].inspect}, not \"ruby\"" unless event["family"] == "ruby"
    %w[start end].each do |key|
      problems << "event #{key} #{event[key].inspect} is not RFC 3339 with 9 digits" unless event[key].to_s.match?(RFC3339_NANOS)
    end
    problems << "event end is before start" if event["start"].to_s > event["end"].to_s
    if event["tags_profiler"].is_a?(String) && !event["tags_profiler"].split(",").all? { |tag| tag.match?(/\A[^:,]+:/) }
      problems << "event tags_profiler is not comma-joined key:value pairs"
    end
    if event["attachments"].is_a?(Array) && !event["attachments"].all?(String)
      problems << "event attachments are not all strings"
    end
    counts = event["endpoint_counts"]
    if counts.is_a?(Hash) && !counts.all? { |name, count| name.is_a?(String) && count.is_a?(Integer) }
      problems << "event endpoint_counts is not endpoint => integer"
    end
    problems
  end

  # ---------------------------------------------------------------------------------------
  # Pyroscope /ingest with a pprof form: how the server names the series of an upload.

  # The server's mapping when no sample_type_config is sent (only display-name matters).
  DEFAULT_DISPLAY_NAMES = {
    "samples" => "cpu", "inuse_objects" => "inuse_objects", "alloc_objects" => "alloc_objects",
    "inuse_space" => "inuse_space", "alloc_space" => "alloc_space", "goroutine" => "goroutines",
    "contentions" => "mutex_count", "delay" => "mutex_duration",
  }.freeze

  # One `__name__` for the whole upload: "wall" when a sample type is exactly called wall;
  # else from the first sample type whose name (or display-name) says what it is; else
  # the last sample type's name.
  def pyroscope_metric_name(sample_types, config)
    names = sample_types.map(&:type)
    return "wall" if names.include?("wall")

    display = config ? config.transform_values { |v| v["display-name"] } : DEFAULT_DISPLAY_NAMES
    names.each do |type|
      name = display[type] || type
      return "process_cpu" if name.include?("cpu")
      return "memory" if name.include?("alloc_") || name.include?("inuse_") || %w[space objects].include?(name)
      return "mutex" if name.include?("mutex_")
      return "block" if name.include?("block_")
      return "goroutines" if name.include?("goroutines")
    end
    names.last
  end

  # The profile type IDs (<name>:<type>:<unit>:<period type>:<period unit>) an upload's
  # series get, one per sample type; raises with the reason when the server would refuse it.
  def pyroscope_profile_type_ids(query:, parts:, decoded:)
    raise "a format parameter makes the server skip the multipart form" if query.key?("format")
    raise "no profile part" unless parts["profile"]
    raise "prev_profile is refused (unsupported client version)" if parts["prev_profile"]
    raise "name is missing" if query["name"].to_s.empty?
    %w[from until].each { |key| raise "#{key} is not digits" unless query[key].to_s.match?(/\A\d+\z/) }

    config = parts["sample_type_config"] && JSON.parse(parts["sample_type_config"].data)
    name = pyroscope_metric_name(decoded.sample_types, config)
    period = decoded.period_type
    decoded.sample_types.map { |t| [name, t.type, t.unit, period&.type.to_s, period&.unit.to_s].join(":") }
  end

  # Pyroscope 1.x (its ValidateLabels, in grafana/pyroscope) turns every string sample
  # label into a series label and refuses the whole upload (HTTP 422, invalid_labels) when a
  # name is not [a-zA-Z_][a-zA-Z0-9_]*, or a series gets more than 30 label names. span_id and
  # trace_id stay per sample: span_id must be 16 hexadecimal digits.
  PYROSCOPE_LABEL_NAME = /\A[a-zA-Z_][a-zA-Z0-9_]*\z/.freeze
  PYROSCOPE_MAX_LABEL_NAMES = 30

  def pyroscope_label_problems(decoded, url_labels: 4)
    problems = []
    decoded.labels.uniq.each do |labels|
      string_keys = labels.select { |_, value| value.is_a?(String) }.keys
      bad = string_keys.reject { |key| key.match?(PYROSCOPE_LABEL_NAME) }
      problems << "label names #{bad.inspect} are not valid label names" unless bad.empty?
      series_keys = string_keys - %w[span_id trace_id profile_id]
      if series_keys.size + url_labels > PYROSCOPE_MAX_LABEL_NAMES
        problems << "#{series_keys.size} sample label names (+#{url_labels} of the name) exceed #{PYROSCOPE_MAX_LABEL_NAMES}"
      end
      span = labels["span_id"]
      problems << "span_id #{span.inspect} is not 16 hexadecimal digits" if span && !span.to_s.match?(/\A\h{16}\z/)
    end
    problems.uniq
  end
end
