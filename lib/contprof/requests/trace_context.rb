# frozen_string_literal: true

module Contprof
  # Links samples to traces: tells the extension (collectors/trace_context.h) where the
  # Datadog tracer (the `datadog` gem, when loaded and configured) keeps each fiber's trace,
  # so that samples carry "local root span id" and "span id"; and, when profiles go to
  # Pyroscope, "span_id" too. Looked up again at every flush: Datadog.configure may build a
  # new tracer with a new key. Never loads or configures the tracer itself.
  module TraceContext
    class << self
      def refresh(span_id_label:)
        return unless Native.respond_to?(:datadog_context_key=)

        Native.datadog_context_key = datadog_context_key
        Native.span_id_label = span_id_label
      end

      # The tracer's fiber-local key (a Symbol), or nil when there is no tracer yet.
      def datadog_context_key
        return nil unless defined?(::Datadog::Tracing) && ::Datadog.respond_to?(:components, true)

        components = ::Datadog.send(:components, allow_initialization: false)
        fiber_local = components&.tracer&.provider&.instance_variable_get(:@context)
        key = fiber_local&.instance_variable_get(:@key)
        key.is_a?(Symbol) ? key : nil
      rescue StandardError # another version of the gem, or a trap handler (its lock)
        nil
      end
    end
  end
end
