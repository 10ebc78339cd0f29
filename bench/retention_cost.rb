# frozen_string_literal: true

# What keeping an output directory within its limits costs the profiler's thread at each
# flush: Exporters::File#enforce_retention on a directory of FILES profile files (default
# 20,000, as 1 GiB of 50 KB profiles) when nothing is due, the usual case.
#   ruby -Ilib bench/retention_cost.rb [FILES]
require "contprof"
require "tmpdir"
require "fileutils"

count = Integer(ARGV.fetch(0, "20000"))
Dir.mktmpdir("contprof-retention-cost") do |dir|
  now = Time.now
  count.times do |i|
    File.write(File.join(dir, "web-#{i % 8}-#{(now - i * 60).utc.strftime("%Y%m%dT%H%M%S.%6NZ")}.pprof"), "x" * 100)
  end
  exporter = Contprof::Exporters::File.new(dir, retention: 30 * 86_400, max_bytes: 1024**3)
  clock = -> { Process.clock_gettime(Process::CLOCK_MONOTONIC) }
  times = Array.new(7) do
    started = clock.call
    exporter.enforce_retention
    clock.call - started
  end
  listing = Array.new(7) do
    started = clock.call
    Contprof::Native.profile_files(dir)
    clock.call - started
  end
  puts format("%d files: enforce_retention %.1f ms (median of 7), of which the listing %.1f ms",
              count, times.sort[3] * 1000, listing.sort[3] * 1000)
end
