# frozen_string_literal: true

# The C reader and merger of pprof files (Contprof::Native::PprofMerge and
# Native.pprof_summary, over ext/contprof/pprof/pprof_merge.c and pprof_reader.c) against
# the Ruby code they stand in for (Report::Profiles.load, Pprof.summary), per file, on
# one-minute files of 8 processes as bench/viewer.rb makes them
# (SyntheticProfiles.wide(stacks: 300), retimed: about 83 kB gzipped each).
#   ruby -Ilib bench/pprof_merge.rb [FILES]      (default 80: ten minutes of 8 processes)
require "contprof"
require "contprof/reports/report"
require "contprof/reports/profiles"
require "tmpdir"
require_relative "../test/support/synthetic_profiles"

MINUTE = 60 * 1_000_000_000
count = Integer(ARGV.fetch(0, "80"))

def per_file(files, rounds = 3)
  best = Float::INFINITY
  rounds.times do
    started = Process.clock_gettime(Process::CLOCK_MONOTONIC)
    yield
    best = [best, Process.clock_gettime(Process::CLOCK_MONOTONIC) - started].min
  end
  best / files * 1000
end

Dir.mktmpdir("contprof-merge-bench") do |dir|
  templates = Array.new(8) { |i| SyntheticProfiles.wide(stacks: 300, seed: 100 + i) }
  start = 1_796_000_000 * 1_000_000_000
  paths = Array.new(count) do |i|
    path = File.join(dir, format("web-%d-%05d.pprof", 1000 + i % 8, i / 8))
    File.binwrite(path, SyntheticProfiles.retimed(templates[i % 8], start + (i / 8) * MINUTE, MINUTE))
    path
  end
  size = paths.sum { |path| File.size(path) } / count
  minutes = (count + 7) / 8
  from = Time.at((start + minutes / 4 * MINUTE) / 1_000_000_000).utc
  to = Time.at((start + minutes * 3 / 4 * MINUTE) / 1_000_000_000).utc
  nanos = ->(time) { time.to_i * 1_000_000_000 }

  c_summary = per_file(count) { paths.each { |path| Contprof::Native.pprof_summary(path) } }
  ruby_summary = per_file(count) { paths.each { |path| Contprof::Pprof.summary(File.binread(path)) } }
  c_merge = per_file(count) do
    merge = Contprof::Native::PprofMerge.new(nil, nil)
    paths.each { |path| merge.add_file(path) }
    merge.result
  end
  c_range = per_file(count) do
    merge = Contprof::Native::PprofMerge.new(nanos.(from), nanos.(to))
    paths.each { |path| merge.add_file(path) }
    merge.result
  end
  ruby_merge = per_file(count, 1) { Contprof::Report::Profiles.load(paths) }
  ruby_range = per_file(count, 1) { Contprof::Report::Profiles.load(paths, from: from, to: to) }

  puts format("%d files of %d kB (compressor %s), per file:", count, size / 1000, Contprof::Native.compressor)
  puts format("  summary: C %.2f ms, Ruby (Pprof.summary) %.2f ms (%.0fx)", c_summary, ruby_summary, ruby_summary / c_summary)
  puts format("  merge, no range: C %.2f ms (result included), Ruby (Profiles.load) %.2f ms (%.0fx)",
              c_merge, ruby_merge, ruby_merge / c_merge)
  puts format("  merge, a range of the middle half (the other files read and skipped): C %.2f ms, Ruby %.2f ms (%.0fx)",
              c_range, ruby_range, ruby_range / c_range)
end
