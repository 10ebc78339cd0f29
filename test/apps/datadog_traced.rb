# frozen_string_literal: true

# Run by test/requests/requests_test.rb with the `datadog` gem: a traced request (a root span and a
# child span) and untraced work, profiled; prints the span ids and the trace labels each
# phase's samples carried (local root span id, span id, span_id), as JSON.
require "datadog"
Datadog.configure do |c|
  c.tracing.enabled = true
  c.diagnostics.startup_logs.enabled = false
  c.telemetry.enabled = false
  c.remote.enabled = false if c.respond_to?(:remote)
end
require "contprof"
require "json"
require_relative "endpoint_truth" # EndpointTruth.burn
def burn(seconds)
  deadline = Process.clock_gettime(Process::CLOCK_THREAD_CPUTIME_ID) + seconds
  nil while Process.clock_gettime(Process::CLOCK_THREAD_CPUTIME_ID) < deadline
end
def burn_inner = EndpointTruth.burn(0.3)
def burn_root = EndpointTruth.burn(0.3)
def burn_untraced = EndpointTruth.burn(0.2)
ids = {}
# A Pyroscope destination (unreachable: the upload fails, quietly) adds "span_id".
profile = Contprof.profile(interval: 0.005, pyroscope_url: "http://127.0.0.1:9", log_level: "fatal") do
  Datadog::Tracing.trace("web.request", type: "web", resource: "GET /x") do |root|
    ids["root"] = root.id
    Datadog::Tracing.trace("inner") { |inner| ids["inner"] = inner.id; burn_inner }
    burn_root
  end
  burn_untraced
end
seen = Hash.new { |h, k| h[k] = [] }
profile.decode.samples.each do |sample|
  name = sample.locations.map(&:function_name).find { |n| n.start_with?("Object#burn_") } or next
  seen[name] << [sample.labels["local root span id"], sample.labels["span id"], sample.labels["span_id"]]
end
puts JSON.generate("ids" => ids, "seen" => seen.transform_values(&:uniq))
