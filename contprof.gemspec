# frozen_string_literal: true

require_relative "lib/contprof/version"

Gem::Specification.new do |spec|
  spec.name = "contprof"
  spec.version = Contprof::VERSION
  spec.summary = "Continuous CPU and wall-time profiler for MRI Ruby, exporting pprof"
  spec.description = "A low-overhead sampling profiler written in C that aggregates every Ruby thread's " \
                     "stacks into pprof profiles and ships them to files, Datadog or Pyroscope."
  spec.authors = ["Contprof developers"]
  spec.license = "MIT"
  spec.required_ruby_version = ">= 3.1"
  spec.files = Dir["lib/**/*.{rb,html}", "ext/contprof/**/*.{c,h,rb}", "exe/*", "README.md"]
  spec.bindir = "exe"
  spec.executables = ["contprof"]
  spec.extensions = ["ext/contprof/extconf.rb"]
  spec.require_paths = ["lib"]
end
