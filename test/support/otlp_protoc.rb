# frozen_string_literal: true

require "open3"

# The reference reader for OTLP requests in the tests: `protoc --decode` against
# OpenTelemetry's official .proto files (Debian sid's opentelemetry-proto, never committed
# here), and a reader of protoc's text format into nested Hashes, from which totals per
# function are computed independently of Contprof's own OTLP reader.
#
# The .proto files are looked for in CONTPROF_OTLP_PROTO_INCLUDE, /usr/include, then in the
# Ruby 3.4 chroot (script/ruby-chroot installs them there: only sid has them).
module OtlpProtoc
  REQUEST = "opentelemetry.proto.collector.profiles.v1development.ExportProfilesServiceRequest"
  SERVICE_PROTO = "opentelemetry/proto/collector/profiles/v1development/profiles_service.proto"

  module_function

  def include_dir
    chroots = ENV.fetch("CONTPROF_CHROOTS", "/var/cache/contprof/chroots")
    [ENV["CONTPROF_OTLP_PROTO_INCLUDE"], "/usr/include", File.join(chroots, "ruby-3.4", "usr", "include")]
      .compact.find { |dir| File.exist?(File.join(dir, SERVICE_PROTO)) }
  end

  def protoc
    ENV.fetch("PATH", "").split(File::PATH_SEPARATOR).map { |dir| File.join(dir, "protoc") }
       .find { |path| File.executable?(path) }
  end

  # nil when the reference reader is here, else why not (one line, for a skip).
  def why_not
    return "protoc is not installed (Debian: protobuf-compiler)" unless protoc
    return "OpenTelemetry's .proto files are not installed (Debian sid: opentelemetry-proto)" unless include_dir

    nil
  end

  # The request as protoc's text format; raises when protoc cannot decode it.
  def decode_text(bytes)
    out, err, status = Open3.capture3(protoc, "--decode=#{REQUEST}", "-I", include_dir, SERVICE_PROTO,
                                      stdin_data: bytes.b, binmode: true)
    raise "protoc --decode failed: #{err}" unless status.success? && err.empty?

    out
  end

  # Text format as nested Hashes: field name => Array of values (String, Integer, or Hash).
  def parse_text(text)
    root = {}
    stack = [root]
    text.each_line do |line|
      line = line.strip
      next if line.empty?

      if line == "}"
        stack.pop
      elsif (name = line[/\A(\w+) \{\z/, 1])
        child = {}
        (stack.last[name] ||= []) << child
        stack << child
      elsif (match = line.match(/\A(\w+): (.*)\z/))
        (stack.last[match[1]] ||= []) << scalar(match[2])
      else
        raise "unexpected protoc output line: #{line.inspect}"
      end
    end
    root
  end

  def scalar(text)
    return Integer(text) if text.match?(/\A-?\d+\z/)
    return text[1..-2].gsub(/\\([0-7]{3}|.)/) { |e| e[1] =~ /[0-7]/ ? e[1..].to_i(8).chr : e[1] } if text.start_with?('"')

    text
  end

  # The request decoded by protoc: {"resource" => {key => value}, "scope" => {...},
  # "totals" => {sample type => {leaf function name => total}}, "inclusive" =>
  # {sample type => {function name => total}}, "attributes" => [keys], "timestamps" => n}.
  def summary(bytes)
    request = parse_text(decode_text(bytes))
    dictionary = request.fetch("dictionary").first
    strings = dictionary.fetch("string_table")
    functions = dictionary.fetch("function_table")
    locations = dictionary.fetch("location_table")
    stacks = dictionary.fetch("stack_table")
    attributes = dictionary.fetch("attribute_table", [])
    function_name = lambda do |location_index|
      line = locations.fetch(location_index).fetch("lines").first
      strings.fetch(functions.fetch(line.fetch("function_index", [0]).first).fetch("name_strindex", [0]).first)
    end
    resource_profiles = request.fetch("resource_profiles").first
    resource = resource_profiles.fetch("resource").first.fetch("attributes", []).to_h do |kv|
      value = kv.fetch("value").first
      [kv.fetch("key").first, value["string_value"]&.first || value["int_value"]&.first]
    end
    scope_profiles = resource_profiles.fetch("scope_profiles").first
    totals = Hash.new { |h, k| h[k] = Hash.new(0) }
    inclusive = Hash.new { |h, k| h[k] = Hash.new(0) }
    timestamps = 0
    scope_profiles.fetch("profiles").each do |profile|
      type_index = profile.fetch("sample_type").first.fetch("type_strindex", [0]).first
      type = strings.fetch(type_index)
      profile.fetch("samples", []).each do |sample|
        ids = stacks.fetch(sample.fetch("stack_index", [0]).first).fetch("location_indices", [])
        values = sample.fetch("values", [])
        timestamps += sample.fetch("timestamps_unix_nano", []).size
        value = values.sum
        names = ids.map { |id| function_name.(id) }
        totals[type][names.first] += value if names.first
        names.uniq.each { |name| inclusive[type][name] += value }
      end
    end
    keys = attributes.drop(1).map { |a| strings.fetch(a.fetch("key_strindex", [0]).first) }.uniq
    { "resource" => resource, "scope" => scope_profiles.fetch("scope").first, "totals" => totals,
      "inclusive" => inclusive, "attributes" => keys, "timestamps" => timestamps }
  end
end
