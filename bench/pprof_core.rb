# frozen_string_literal: true

# Benchmark of the pprof core, side by side with Go's reference pprof writer.
#
#   ruby bench/pprof_core.rb          (also part of `rake bench`)
#
# Builds bench/pprof_core_bench.c against ext/contprof once per gzip backend and level,
# builds bench/go/pprof_write_bench.go against Debian's golang-github-google-pprof-dev,
# runs everything on the same machine in one go and prints:
#   - the cost of recording a 64-frame sample (seen before / never seen), by strings and
#     by frame keys (the path the C collectors use);
#   - serialization time and size of 10,000 unique 64-frame stacks over 2,000 functions,
#     3 values and a string label each, against Go's Profile.Write on the same shape;
#   - the same profile encoded as an OTLP profiles request (pprof/pprof_otlp.c);
#   - memory held by that profile and peak memory while serializing it, relative to its
#     uncompressed pprof size.
require "open3"
require "rbconfig"
require "fileutils"

ROOT = File.expand_path("..", __dir__)
BUILD = File.join(ROOT, "bench", "build")
CORE = %w[pprof_profile.c pprof_samples.c pprof_intern.c pprof_encode.c pprof_timeline.c pprof_otlp.c pprof_gzip.c pprof_reader.c pprof_merge.c pprof_util.c pprof_alloc.c].map { |f| File.join(ROOT, "ext", "contprof", "pprof", f) }

def run!(*command, env: {})
  out, err, status = Open3.capture3(env, *command)
  raise "#{command.join(" ")} failed:\n#{err}#{out}" unless status.success?

  out
end

def parse(output)
  output.scan(/(\w+)=(\S+)/).to_h
end

def have_libdeflate?
  File.exist?("/usr/include/libdeflate.h")
end

FileUtils.mkdir_p(BUILD)
variants = []
variants << ["libdeflate", 1, "-DPPROF_USE_LIBDEFLATE", "-ldeflate"] if have_libdeflate?
variants << ["libdeflate", 6, "-DPPROF_USE_LIBDEFLATE", "-ldeflate"] if have_libdeflate?
variants << ["zlib", 1, "-DPPROF_USE_ZLIB", nil]
variants << ["zlib", 6, "-DPPROF_USE_ZLIB", nil]

binaries = variants.map do |name, level, define, lib|
  binary = File.join(BUILD, "pprof_core_bench_#{name}_#{level}")
  run!("cc", "-O2", "-std=c11", "-Wall", "-Wextra", "-Werror", define, "-DPPROF_GZIP_LEVEL=#{level}",
       File.join(ROOT, "bench", "pprof_core_bench.c"), *CORE, "-o", binary, *[lib, "-lz"].compact)
  ["#{name} -#{level}", binary]
end

go_binary = File.join(BUILD, "pprof_write_bench_go")
go_env = { "GO111MODULE" => "off", "GOPATH" => "/usr/share/gocode", "GOCACHE" => File.join(BUILD, "gocache"),
           "GOFLAGS" => "" }
run!("go", "build", "-o", go_binary, File.join(ROOT, "bench", "go", "pprof_write_bench.go"), env: go_env)

# Interleave runs of every program so that machine noise hits all of them alike; report
# the median of the per-run medians.
ROUNDS = Integer(ENV.fetch("ROUNDS", "3"))
results = Hash.new { |h, k| h[k] = [] }
timeline = { "PPROF_BENCH_TIMELINE" => "1" }
ROUNDS.times do
  results["go"] << parse(run!(go_binary))
  results["go timeline"] << parse(run!(go_binary, env: timeline))
  binaries.each do |label, binary|
    results[label] << parse(run!(binary))
    results["#{label} tree"] << parse(run!(binary, env: { "PPROF_BENCH_SHAPE" => "tree" }))
    results["#{label} timeline"] << parse(run!(binary, env: timeline))
  end
end

def median_of(runs, key)
  values = runs.map { |r| Float(r.fetch(key)) }.sort
  values[values.size / 2]
end

go_ms = median_of(results["go"], "serialize_ms")
go_bytes = median_of(results["go"], "serialized_bytes")
puts "pprof core benchmark (#{ROUNDS} interleaved rounds, medians; machine: #{`nproc`.strip} cores)"
puts
puts "Recording one 64-frame sample (median ns), libdeflate/zlib builds alike:"
first = results[binaries.first[0]]
printf("  %-44s %8.0f ns\n", "seen stack, frames as strings", median_of(first, "seen_stack_add_ns"))
printf("  %-44s %8.0f ns\n", "never-seen stack of known frames, strings", median_of(first, "new_stack_add_ns"))
printf("  %-44s %8.0f ns\n", "first stack into an empty profile, strings", median_of(first, "cold_stack_add_ns"))
printf("  %-44s %8.0f ns\n", "seen stack, frame keys (collector path)", median_of(first, "keyed_seen_stack_add_ns"))
printf("  %-44s %8.0f ns\n", "never-seen stack of known frames, keys", median_of(first, "keyed_new_stack_add_ns"))
printf("  %-44s %8.0f ns\n", "first stack into an empty profile, keys", median_of(first, "keyed_cold_stack_add_ns"))
puts
puts "Serializing 10,000 unique stacks x 64 frames, 2,000 functions, 3 values, 1 label:"
printf("  %-22s %10s %12s %10s %10s %14s\n", "writer", "ms", "bytes", "speedup", "size", "tree-shape ms/bytes")
printf("  %-22s %10.1f %12d %10s %10s %14s\n", "Go pprof/profile", go_ms, go_bytes, "1.00x", "1.00x", "-")
binaries.each do |label, _|
  runs = results[label]
  tree = results["#{label} tree"]
  ms = median_of(runs, "serialize_ms")
  bytes = median_of(runs, "serialized_bytes")
  printf("  %-22s %10.1f %12d %9.2fx %9.3fx %7.1f/%d\n", "contprof #{label}", ms, bytes, go_ms / ms, bytes / go_bytes,
         median_of(tree, "serialize_ms"), median_of(tree, "serialized_bytes"))
end
puts
puts "The same samples as timeline samples (each with an end_timestamp_ns label, as with timeline: true):"
go_timeline_ms = median_of(results["go timeline"], "serialize_ms")
go_timeline_bytes = median_of(results["go timeline"], "serialized_bytes")
printf("  %-22s %10.1f %12d %10s %10s\n", "Go pprof/profile", go_timeline_ms, go_timeline_bytes, "1.00x", "1.00x")
binaries.each do |label, _|
  runs = results["#{label} timeline"]
  ms = median_of(runs, "serialize_ms")
  bytes = median_of(runs, "serialized_bytes")
  printf("  %-22s %10.1f %12d %9.2fx %9.3fx\n", "contprof #{label}", ms, bytes, go_timeline_ms / ms, bytes / go_timeline_bytes)
end
puts
puts "The same profile as an OTLP profiles request (gzip; one Profile per sample type, one dictionary):"
printf("  %-22s %10s %12s %10s %14s %14s\n", "encoder", "ms", "bytes", "vs Go ms", "vs our pprof", "uncompressed")
binaries.each do |label, _|
  runs = results[label]
  ms = median_of(runs, "otlp_ms")
  bytes = median_of(runs, "otlp_bytes")
  printf("  %-22s %10.1f %12d %9.2fx %13.3fx %14d\n", "contprof #{label}", ms, bytes, go_ms / ms,
         bytes / median_of(runs, "serialized_bytes"), median_of(runs, "otlp_uncompressed_bytes"))
end
puts
raw = median_of(first, "uncompressed_bytes")
puts "Memory for that profile (uncompressed pprof: #{raw.to_i} bytes):"
binaries.each do |label, _|
  runs = results[label]
  printf("  %-22s held %.2fx, peak while serializing %.2fx\n", "contprof #{label}", median_of(runs, "held_ratio"),
         median_of(runs, "peak_ratio"))
end
