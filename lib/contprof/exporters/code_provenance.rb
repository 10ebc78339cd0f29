# frozen_string_literal: true

require "json"
require "rbconfig"

module Contprof
  # code-provenance.json for Datadog: which loaded files belong to the standard library
  # and to which gem, so that the profile viewer can tell application code from libraries.
  # Lists only libraries with at least one file in $LOADED_FEATURES.
  module CodeProvenance
    class << self
      def json
        JSON.generate({ "v1" => libraries })
      end

      def libraries
        features = $LOADED_FEATURES.dup
        loaded = ->(path) { features.any? { |feature| feature.start_with?(path) } }
        result = []
        stdlib = RbConfig::CONFIG["rubylibdir"]
        if stdlib && loaded.(stdlib)
          result << { "kind" => "standard library", "name" => "stdlib", "version" => RUBY_VERSION, "paths" => [stdlib] }
        end
        Gem.loaded_specs.each_value do |spec|
          next unless spec.gem_dir && loaded.(spec.gem_dir)

          result << { "kind" => "library", "name" => spec.name, "version" => spec.version.to_s, "paths" => [spec.gem_dir] }
        end
        result
      end
    end
  end
end
