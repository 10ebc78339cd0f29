# frozen_string_literal: true

require_relative "labels"

module Contprof
  # OpenTelemetry's traces linked to Contprof's profiles, the way Pyroscope's span profiles
  # expect (as its own OpenTelemetry integrations do): while a local root span (the first
  # span of a trace in this process, e.g. a request's) runs, samples carry the label
  # `span_id`, its id in 16 hexadecimal digits, and the span gets the attribute
  # `pyroscope.profile.id` with the same id.
  #
  #   OpenTelemetry::SDK.configure do |c|
  #     c.add_span_processor(Contprof::OpenTelemetry::SpanProcessor.new)
  #   end
  #
  # The label is put on the fiber that starts the span and taken off when the span finishes
  # there (a span finished on another fiber leaves its label until that fiber's next root
  # span). Child spans change nothing: a root span's profile holds all its work.
  module OpenTelemetry
    class SpanProcessor
      FIBER_LOCAL = :__contprof_otel_root
      private_constant :FIBER_LOCAL

      def on_start(span, parent_context)
        return unless defined?(LabelSet)

        parent = ::OpenTelemetry::Trace.current_span(parent_context).context
        return if parent.valid? && !parent.remote? # a child of a span of this process

        id = span.context.hex_span_id
        span.set_attribute("pyroscope.profile.id", id)
        thread = Thread.current
        enclosing = thread[LabelSet::FIBER_LOCAL]
        thread[FIBER_LOCAL] = [span, enclosing, thread[FIBER_LOCAL]]
        thread[LabelSet::FIBER_LOCAL] = LabelSet.new(enclosing, { "span_id" => id })
      end

      def on_finishing(_span); end

      def on_finish(span)
        thread = Thread.current
        root, enclosing, outer = thread[FIBER_LOCAL]
        return unless root.equal?(span)

        thread[LabelSet::FIBER_LOCAL] = enclosing
        thread[FIBER_LOCAL] = outer
      end

      def force_flush(timeout: nil)
        ::OpenTelemetry::SDK::Trace::Export::SUCCESS
      end

      def shutdown(timeout: nil)
        ::OpenTelemetry::SDK::Trace::Export::SUCCESS
      end
    end
  end
end
