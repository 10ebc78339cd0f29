# frozen_string_literal: true

# Contprof::Viewer on a big directory: FILES one-minute profiles of 8 processes (default
# 10,000; a week of 8 processes is 80,640), each of about 300 stacks, beside `go tool
# pprof` (the reference reader) on the same files.
#   ruby -Ilib bench/viewer.rb [FILES]
#   DIR=/tmp/viewer-bench ruby -Ilib bench/viewer.rb 80640   # keeps the files for the next run
#
# The directory: the index built cold (no index file; KEEP_INDEX=1 keeps the one a
# previous run in DIR left) and the first page of a new viewer with the index file there.
# One hour of the 8 processes (480 files), in the viewer: its flame graph first (cold: the
# viewer reads and merges the files; the OS has them in its page cache, just written or
# indexed), again (warm: the viewer's cached response), then another hour's (a range
# change, cold), and the first hour's top table. In `go tool pprof -http` on the same
# hour's files: the time from its start until its flame graph page (/ui/flamegraph)
# answers (cold: it reads and merges the files before it listens), and a second request
# (warm); and `go tool pprof -top` on them. With a day after the middle of the span (FILES
# of 8 processes over at least 2 days), a day's top table and flame graph as well.
require "contprof"
require "contprof/viewer/viewer"
require "tmpdir"
require "time"
require "open3"
require "socket"
require "net/http"
require_relative "../test/support/synthetic_profiles"

MINUTE = 60 * 1_000_000_000
START = 1_796_000_000 * 1_000_000_000
PROCESSES = 8
count = Integer(ARGV.fetch(0, "10000"))

def timed
  started = Process.clock_gettime(Process::CLOCK_MONOTONIC)
  result = yield
  [Process.clock_gettime(Process::CLOCK_MONOTONIC) - started, result]
end

# The directory's `count` profiles; those already there (DIR reused) are not written again.
# (Each process's profile is made once and given each minute's period; the files are
# written by two processes at gzip level 1: a week's 80,640 files in minutes, not hours.)
def write_profiles(dir, count)
  paths = Array.new(count) do |i|
    time = START + (i / PROCESSES) * MINUTE
    stamp = Time.at(time / 1_000_000_000).utc.strftime("%Y%m%dT%H%M%S.000000Z")
    [File.join(dir, "web-#{1000 + i % PROCESSES}-#{stamp}.pprof"), i % PROCESSES, time]
  end
  missing = paths.reject { |path, _, _| File.exist?(path) }
  unless missing.empty?
    bodies = Array.new(PROCESSES) { |process| SyntheticProfiles.untimed(SyntheticProfiles.wide(stacks: 300, seed: 100 + process)) }
    workers = Array.new(2) do |worker|
      fork do
        missing.each_with_index do |(path, process, time), n|
          next unless n % 2 == worker

          File.binwrite(path, Zlib.gzip(SyntheticProfiles.with_period(bodies[process], time, MINUTE), level: 1))
        end
      end
    end
    workers.each { |pid| Process.wait(pid) }
  end
  paths.map(&:first)
end

def iso(minute)
  Time.at((START + minute * MINUTE) / 1_000_000_000).utc.iso8601
end

def get(app, path)
  route, query = path.split("?", 2)
  status, _, body = app.call("REQUEST_METHOD" => "GET", "PATH_INFO" => route, "QUERY_STRING" => query.to_s)
  raise "#{path}: #{status} #{body.join[0, 200]}" unless status == 200

  body.join.bytesize
end

# `go tool pprof -http` on `files`: the seconds until /ui/flamegraph first answers 200, and
# those of a second request.
def go_pprof_http(files)
  port = TCPServer.open("127.0.0.1", 0) { |server| server.addr[1] }
  uri = URI("http://127.0.0.1:#{port}/ui/flamegraph")
  log = File.join(Dir.tmpdir, "contprof-bench-go-pprof.log")
  started = Process.clock_gettime(Process::CLOCK_MONOTONIC)
  # (Its own process group: `go tool` runs pprof as a child, and both are stopped.)
  pid = Process.spawn({ "HOME" => Dir.tmpdir }, ENV.fetch("GO", "go"), "tool", "pprof", "-http=127.0.0.1:#{port}",
                      "-no_browser", "-sample_index=cpu-time", *files, out: log, err: log, pgroup: true)
  first = loop do
    raise "go tool pprof -http ended: #{File.read(log)}" if Process.wait(pid, Process::WNOHANG)

    begin
      response = Net::HTTP.get_response(uri)
      break Process.clock_gettime(Process::CLOCK_MONOTONIC) - started if response.code == "200"
    rescue SystemCallError
      nil # (not listening yet: still reading the files)
    end
    sleep 0.05
  end
  again, = timed { raise "go tool pprof -http: second request failed" unless Net::HTTP.get_response(uri).code == "200" }
  [first, again]
ensure
  if pid
    begin
      Process.kill("TERM", -pid)
      Process.wait(pid)
    rescue Errno::ESRCH, Errno::ECHILD
      nil # (it had ended)
    end
  end
end

own = ENV["DIR"].nil?
dir = ENV["DIR"] || Dir.mktmpdir("contprof-viewer-bench")
begin
  FileUtils.mkdir_p(dir)
  paths = write_profiles(dir, count)
  others = Dir[File.join(dir, "*.pprof")] - paths
  raise "#{dir} holds #{others.size} other profiles (a bigger run's?): give a DIR of its own to each FILES" unless others.empty?
  index_file = File.join(dir, Contprof::Viewer::ProfileIndex::INDEX_FILE)
  File.unlink(index_file) if File.exist?(index_file) && !ENV["KEEP_INDEX"]
  bytes = paths.sum { |path| File.size(path) }

  cold, = timed { get(Contprof::Viewer.new(dir), "/") }
  app = Contprof::Viewer.new(dir)
  warm, page = timed { get(app, "/") }
  puts format("%d files (%.0f MB): first page cold (%s) %.2f s, warm (index file) %.2f s, page %d kB",
              count, bytes / 1e6, ENV["KEEP_INDEX"] ? "index file kept" : "index built", cold, warm, page / 1000)

  first = count / PROCESSES / 2 # (the middle of the span, and the hour after it)
  raise "too few files for two hours of #{PROCESSES} processes from the middle" if count / PROCESSES < first + 120

  hour = "from=#{iso(first)}&to=#{iso(first + 60)}"
  flame, flame_bytes = timed { get(app, "/flamegraph?#{hour}") }
  again, = timed { get(app, "/flamegraph?#{hour}") }
  change, = timed { get(app, "/flamegraph?from=#{iso(first + 60)}&to=#{iso(first + 120)}") }
  top, = timed { get(app, "/top?#{hour}&type=cpu-time") }
  hour_files = paths.each_slice(PROCESSES).to_a[first, 60].flatten
  puts format("contprof viewer, one hour of %d processes (%d files): flame graph first view %.2f s (cold, %d kB), " \
              "again %.3f s (warm, cached), another hour %.2f s (range change, cold); top table %.2f s",
              PROCESSES, hour_files.size, flame, flame_bytes / 1000, again, change, top)

  # A day (when the span has one after the middle): its top table first (its hours' merges
  # are built and kept), then its flame graph (the kept hours merged again), then the day an
  # hour later (23 hours kept, one read).
  if count / PROCESSES >= first + 1500
    day = "from=#{iso(first)}&to=#{iso(first + 1440)}"
    day_top, = timed { get(app, "/top?#{day}&type=cpu-time") }
    day_flame, = timed { get(app, "/flamegraph?#{day}") }
    day_later, = timed { get(app, "/top?from=#{iso(first + 60)}&to=#{iso(first + 1500)}&type=cpu-time") }
    puts format("contprof viewer, one day of %d processes (%d files): top table %.2f s (cold: hours merged and kept), " \
                "flame graph %.2f s (hours kept), top of the day an hour later %.2f s (23 hours kept)",
                PROCESSES, PROCESSES * 1440, day_top, day_flame, day_later)
  end

  go_first, go_again = go_pprof_http(hour_files)
  go_top, = timed do
    _, err, status = Open3.capture3({ "HOME" => Dir.tmpdir }, ENV.fetch("GO", "go"), "tool", "pprof", "-top",
                                    "-sample_index=cpu-time", *hour_files)
    raise "go tool pprof: #{err}" unless status.success?
  end
  puts format("go tool pprof, the same %d files: -http flame graph first view %.2f s (cold: start, read and merge), " \
              "again %.3f s (warm); -top %.2f s", hour_files.size, go_first, go_again, go_top)
ensure
  FileUtils.rm_rf(dir) if own
end
