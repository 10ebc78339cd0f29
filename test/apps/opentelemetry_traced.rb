# frozen_string_literal: true

# Run by test/requests/requests_test.rb with the opentelemetry-sdk gem: a traced request (a root span
# and a child span) and untraced work, profiled with Contprof's span processor (added by
# hand, or with ATTACH=1 by Contprof itself, as profiles go to Pyroscope); prints the root
# span's id, its pyroscope.profile.id attribute and the span_id labels each phase's samples
# carried, as JSON.
require "opentelemetry/sdk"
require "contprof"
require "json"
require_relative "endpoint_truth" # EndpointTruth.burn

OpenTelemetry.logger = Logger.new(File::NULL)
OpenTelemetry::SDK.configure { |c| c.add_span_processor(Contprof::OpenTelemetry::SpanProcessor.new) unless ENV["ATTACH"] }
TRACER = OpenTelemetry.tracer_provider.tracer("test")

def burn_inner = EndpointTruth.burn(0.3)
def burn_root = EndpointTruth.burn(0.3)
def burn_untraced = EndpointTruth.burn(0.2)

result = {}
# With ATTACH, a Pyroscope destination (unreachable: the upload fails, quietly).
settings = ENV["ATTACH"] ? { pyroscope_url: "http://127.0.0.1:9", log_level: "fatal" } : {}
profile = Contprof.profile(interval: 0.005, **settings) do
  TRACER.in_span("request") do |root|
    result["root"] = root.context.hex_span_id
    TRACER.in_span("inner") { burn_inner }
    burn_root
    result["attribute"] = root.attributes["pyroscope.profile.id"]
  end
  burn_untraced
end
seen = Hash.new { |h, k| h[k] = [] }
profile.decode.samples.each do |sample|
  name = sample.locations.map(&:function_name).find { |n| n.start_with?("Object#burn_") } or next
  seen[name] << sample.labels["span_id"]
end
result["seen"] = seen.transform_values(&:uniq)
result["after"] = Contprof.labels
puts JSON.generate(result)
