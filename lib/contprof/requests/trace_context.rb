# frozen_string_literal: true

module Contprof
  # Links samples to traces: tells the extension (collectors/trace_context.h) where the
  # Datadog tracer (the `datadog` gem, when loaded and configured) keeps each fiber's trace,
  # so that samples carry "local root span id" and "span id"; and, when profiles go to
  # Pyroscope, "span_id" too, also from OpenTelemetry's SDK when it is configured (its
  # tracer provider gets Contprof::OpenTelemetry::SpanProcessor, once). Looked up again at
  # every flush: Datadog.configure may build a new tracer with a new key, OpenTelemetry may
  # be configured after Contprof started. Never loads or configures a tracer itself.
  module TraceContext
    class << self
      def refresh(span_id_label:)
        return unless Native.respond_to?(:datadog_context_key=)

        Native.datadog_context_key = datadog_context_key
        Native.span_id_label = span_id_label
        attach_to_opentelemetry if span_id_label
      end

      # Adds the span processor to OpenTelemetry's SDK tracer provider, unless it has one.
      def attach_to_opentelemetry
        return unless defined?(::OpenTelemetry::SDK::Trace::TracerProvider)

        provider = ::OpenTelemetry.tracer_provider
        return unless provider.is_a?(::OpenTelemetry::SDK::Trace::TracerProvider)

        processors = provider.instance_variable_get(:@span_processors)
        return if !processors.is_a?(Array) || processors.any? { |processor| processor.is_a?(OpenTelemetry::SpanProcessor) }

        provider.add_span_processor(OpenTelemetry::SpanProcessor.new)
      rescue StandardError # another version of the SDK, or a trap handler (its lock)
        nil
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
