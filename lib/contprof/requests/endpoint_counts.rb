# frozen_string_literal: true

module Contprof
  # Requests served per endpoint since the last flush: what Datadog's event.json calls
  # endpoint_counts, and `contprof report --by endpoint` shows. Contprof::Rack adds one per
  # request; each flush takes the counts and starts again. Bounded: past MAX_ENDPOINTS
  # names, new ones are counted under OTHER. Every pprof carries its period's counts as a
  # comment (EndpointCountsComment).
  class EndpointCounts
    MAX_ENDPOINTS = 1000
    OTHER = "(other endpoints)"

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
