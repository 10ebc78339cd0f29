# frozen_string_literal: true

# Contprof::Viewer on a big directory: FILES one-minute profiles of 8 processes (default
# 10,000; a week of 8 processes is 80,640), each of about 300 stacks. Times: the index
# built cold (no index file), the first page of a new process with the index file there
# (warm), and a one-hour range's flame graph and top table, first and again (cached);
# beside them, `go tool pprof -top` merging the same hour's files (the reference reader).
#   ruby -Ilib bench/viewer.rb [FILES]
require "contprof"
require "contprof/viewer/viewer"
require "tmpdir"
require "time"
require "open3"
require_relative "../test/support/synthetic_profiles"

MINUTE = 60 * 1_000_000_000
count = Integer(ARGV.fetch(0, "10000"))


def timed
  started = Process.clock_gettime(Process::CLOCK_MONOTONIC)
  result = yield
  [Process.clock_gettime(Process::CLOCK_MONOTONIC) - started, result]
end

Dir.mktmpdir("contprof-viewer-bench") do |dir|
  templates = Array.new(8) { |i| SyntheticProfiles.wide(stacks: 300, seed: 100 + i) }
  start = 1_796_000_000 * 1_000_000_000
  count.times do |i|
    process = i % 8
    minute = i / 8
    time = start + minute * MINUTE
    stamp = Time.at(time / 1_000_000_000).utc.strftime("%Y%m%dT%H%M%S.000000Z")
    File.binwrite(File.join(dir, "web-#{1000 + process}-#{stamp}.pprof"), SyntheticProfiles.retimed(templates[process], time, MINUTE))
  end
  bytes = Dir[File.join(dir, "*.pprof")].sum { |path| File.size(path) }
  get = lambda do |app, path|
    route, query = path.split("?", 2)
    status, _, body = app.call("REQUEST_METHOD" => "GET", "PATH_INFO" => route, "QUERY_STRING" => query.to_s)
    raise "#{path}: #{status} #{body.join[0, 200]}" unless status == 200

    body.join.bytesize
  end
  cold, = timed { get.(Contprof::Viewer.new(dir), "/") }
  app = Contprof::Viewer.new(dir)
  warm, page = timed { get.(app, "/") }
  from = Time.at((start + (count / 16) * MINUTE) / 1_000_000_000).utc.iso8601
  to = Time.at((start + (count / 16 + 60) * MINUTE) / 1_000_000_000).utc.iso8601
  flame, flame_bytes = timed { get.(app, "/flamegraph?from=#{from}&to=#{to}") }
  again, = timed { get.(app, "/flamegraph?from=#{from}&to=#{to}") }
  top, = timed { get.(app, "/top?from=#{from}&to=#{to}&type=cpu-time") }
  puts format("%d files (%.0f MB): first page cold (index built) %.1f s, warm (index file) %.2f s, page %d kB",
              count, bytes / 1e6, cold, warm, page / 1000)
  in_hour = 8 * [[count / 8 - count / 16, 60].min, 0].max
  hour_files = Dir[File.join(dir, "*.pprof")].select do |path|
    minute = (Time.strptime(path[/-(\d{8}T\d{6})\./, 1], "%Y%m%dT%H%M%S").to_i * 1_000_000_000 - start) / MINUTE
    minute >= count / 16 && minute < count / 16 + 60
  end
  go, = timed do
    _, err, status = Open3.capture3({ "HOME" => Dir.tmpdir }, ENV.fetch("GO", "go"), "tool", "pprof", "-top",
                                    "-sample_index=cpu-time", *hour_files)
    raise "go tool pprof: #{err}" unless status.success?
  end
  puts format("one hour of 8 processes (%d files): flame graph %.2f s (%d kB), again %.3f s (cached), top %.2f s; " \
              "go tool pprof -top on them %.2f s", in_hour, flame, flame_bytes / 1000, again, top, go)
end
