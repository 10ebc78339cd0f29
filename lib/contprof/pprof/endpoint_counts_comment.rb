# frozen_string_literal: true

require "json"

module Contprof
  # How a profile carries the requests served per endpoint during its period (what
  # Contprof::EndpointCounts took at the flush): a pprof comment (`go tool pprof -comments`
  # shows it), PREFIX and a JSON object. Written by the profiler at each flush; read by
  # `contprof report --by endpoint`, and summed when profiles are merged.
  module EndpointCountsComment
    PREFIX = "contprof endpoint_counts "

    module_function

    # The comment of `counts` (a Hash of endpoint => Integer).
    def comment(counts)
      PREFIX + JSON.generate(counts)
    end

    # The counts in a profile's comments (summed when several), or an empty Hash.
    def counts(comments)
      comments.each_with_object(Hash.new(0)) do |comment, counts|
        next unless comment.start_with?(PREFIX)

        parsed = JSON.parse(comment.delete_prefix(PREFIX))
        parsed.each { |name, count| counts[name] += count if count.is_a?(Integer) } if parsed.is_a?(Hash)
      rescue JSON::ParserError
        next
      end
    end

    # The comments of merged profiles: each once, but the requests counted per endpoint
    # summed into one.
    def merge(comments)
      counts = counts(comments)
      others = comments.reject { |comment| comment.start_with?(PREFIX) }.uniq
      counts.empty? ? others : others << comment(counts)
    end
  end
end
