# frozen_string_literal: true

require "json"

module Contprof
  # Requests served per endpoint since the last flush: what Datadog's event.json calls
  # endpoint_counts, and `contprof report --by endpoint` shows. Contprof::Rack adds one per
  # request; each flush takes the counts and starts again. Bounded: past MAX_ENDPOINTS
  # names, new ones are counted under OTHER. Every pprof carries its period's counts as a
  # comment (`go tool pprof -comments` shows it): COMMENT_PREFIX and a JSON object.
  class EndpointCounts
    MAX_ENDPOINTS = 1000
    OTHER = "(other endpoints)"
    COMMENT_PREFIX = "contprof endpoint_counts "

    def self.comment(counts)
      COMMENT_PREFIX + JSON.generate(counts)
    end

    # The counts in a profile's comments (summed when several), or an empty Hash.
    def self.from_comments(comments)
      comments.each_with_object(Hash.new(0)) do |comment, counts|
        next unless comment.start_with?(COMMENT_PREFIX)

        parsed = JSON.parse(comment.delete_prefix(COMMENT_PREFIX))
        parsed.each { |name, count| counts[name] += count if count.is_a?(Integer) } if parsed.is_a?(Hash)
      rescue JSON::ParserError
        next
      end
    end

    def initialize
      @lock = Mutex.new
      @counts = Hash.new(0)
    end

    def add(endpoint)
      @lock.synchronize do
        endpoint = OTHER if @counts.size >= MAX_ENDPOINTS && !@counts.key?(endpoint)
        @counts[endpoint] += 1
      end
    end

    # The counts so far (a Hash of endpoint => Integer), and zero from now on. In a trap
    # handler (Contprof.stop there), where no Mutex may be taken, the swap alone: a request
    # counted at that very moment may be missed.
    def take
      return swap if Lifecycle.trap_context?

      @lock.synchronize { swap }
    end

    def to_h
      @lock.synchronize { @counts.dup }
    end

    # In a forked child: a new lock (the parent's may have been held at the fork), no counts.
    def reset_after_fork
      @lock = Mutex.new
      @counts = Hash.new(0)
    end

    private

    def swap
      counts = @counts
      @counts = Hash.new(0)
      counts
    end
  end

  ENDPOINT_COUNTS = EndpointCounts.new
  private_constant :ENDPOINT_COUNTS

  # Requests counted by Contprof::Rack since the last flush.
  def self.endpoint_counts = ENDPOINT_COUNTS
end
