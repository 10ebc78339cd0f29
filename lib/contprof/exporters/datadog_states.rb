# frozen_string_literal: true

require "zlib"
require_relative "../pprof/rewrite"

module Contprof
  # The "thread state" label as Datadog's profiler sends it: key `state`, with its values
  # ("had cpu", "sleeping", "waiting", "network", "waiting for gvl", "unknown"), which
  # Datadog's timeline colours. A PprofRewrite: its samples are re-emitted with that one
  # label rewritten, everything else is copied byte for byte, and the new strings go after
  # the string table's. A profile without the label is returned as it is.
  module DatadogStates
    class Error < Contprof::Error; end

    F = PprofWriter
    private_constant :F

    OURS = "thread state".b.freeze
    KEY = "state"
    # Ours => Datadog's. Native code without the GVL has no Datadog state: "unknown", as
    # Datadog's own profiler says of what it cannot tell.
    VALUES = {
      "running" => "had cpu", "waiting for gvl" => "waiting for gvl", "native" => "unknown",
      "sleeping" => "sleeping", "waiting" => "waiting", "io" => "network"
    }.freeze
    # The same rewrite done by the recorder while it serializes (StackRecorder#serialize's
    # relabel:), without the GVL: this module's Ruby pass is for pprofs from elsewhere.
    RELABEL = [OURS, KEY, VALUES.to_a.freeze].freeze

    class << self
      # bytes: a gzip-compressed pprof. Returns one.
      def call(bytes)
        data = Zlib.gunzip(bytes).b
        return bytes unless data.include?(OURS)

        rewritten = rewrite(data)
        rewritten ? PprofRewrite.gzip(rewritten) : bytes
      rescue Zlib::Error => e
        raise Error, "cannot read the pprof: #{e.message}"
      end

      private

      def rewrite(data)
        profile = PprofRewrite.new(data, Error)
        fields = [] # [field number, start, value start, end]
        profile.each_field { |field, _, start, value_start, finish| fields << [field, start, value_start, finish] }
        strings = profile.strings
        ours = strings.index(OURS) or return nil
        added = [KEY, *VALUES.values.uniq]
        index = ->(text) { strings.size + added.index(text) }
        new_values = VALUES.to_h { |value, theirs| [strings.index(value.b), index.(theirs)] }
        new_values.delete(nil)
        key = index.(KEY)
        labels = {}
        out = String.new(capacity: data.bytesize + 128, encoding: Encoding::BINARY)
        body = String.new(encoding: Encoding::BINARY)
        fields.each do |field, start, value_start, finish|
          if field == F::SAMPLE
            body.clear
            profile.copy_sample(body, value_start, finish) do |label|
              # (Only the state's are remembered: a timeline's timestamps are one per sample.)
              profile.label_key(label) == ours ? labels[label] ||= state(profile, label, key, new_values) : label
            end
            F.sample(out, body)
          else
            profile.copy(out, start, finish)
          end
        end
        added.each { |text| F.string(out, text) }
        out
      end

      # A "thread state" label with Datadog's key and value (the label as it is when its
      # value is not one of ours).
      def state(profile, label, key, new_values)
        str = profile.label_str(label)
        return label unless new_values.key?(str)

        F.label(key, new_values.fetch(str))
      end
    end
  end
end
