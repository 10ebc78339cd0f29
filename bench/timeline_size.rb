# frozen_string_literal: true

# What the timeline (timeline: true) does to the profiles of a real app: the Rails JSON API
# (bench/rails/config.ru) on puma with THREADS threads, driven by wrk for SECONDS, profiled
# by `contprof exec` once with the timeline off and once on. Each run writes one profile
# (upload_period above SECONDS); the table compares their sizes, sample counts, and the
# time our encoder takes to write each again (StackRecorder#serialize of the same samples,
# decoded and re-recorded, their timestamps as plain numeric labels). Against Go's writer:
# bench/pprof_core.rb.
#
#   ruby -Ilib bench/timeline_size.rb   # SECONDS=60 THREADS=5 ENDPOINT=/items; KEEP=DIR keeps
#                                       # both profiles in DIR
require "fileutils"
require "net/http"
require "rbconfig"
require "tmpdir"
require "contprof"

ROOT = File.expand_path("..", __dir__)
APP = File.join(__dir__, "rails", "config.ru")
SECONDS = Integer(ENV.fetch("SECONDS", "60"))
THREADS = Integer(ENV.fetch("THREADS", "5"))
ENDPOINT = ENV.fetch("ENDPOINT", "/items")

%w[puma wrk].each do |command|
  abort "bench/timeline_size.rb needs #{command} (Debian: apt-get install #{command})" unless system("command -v #{command} > /dev/null")
end

def run(timeline, port)
  dir = Dir.mktmpdir("contprof-bench-timeline")
  log = File.join(dir, "server.log")
  env = { "RAILS_ENV" => "production", "CONTPROF_TIMELINE" => timeline.to_s, "CONTPROF_UPLOAD_PERIOD" => (SECONDS * 10).to_s }
  pid = spawn(env, RbConfig.ruby, "-I#{File.join(ROOT, "lib")}", File.join(ROOT, "exe", "contprof"), "exec", "-o", dir, "--",
              "puma", "-t", "#{THREADS}:#{THREADS}", "-e", "production", "--silent", "-b", "tcp://127.0.0.1:#{port}", APP,
              out: log, err: log, pgroup: true)
  deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + 60
  begin
    Net::HTTP.get(URI("http://127.0.0.1:#{port}/__cpu"))
  rescue SystemCallError
    abort "puma did not start: #{File.read(log)[-2000..]}" if Process.clock_gettime(Process::CLOCK_MONOTONIC) > deadline
    sleep 0.2
    retry
  end
  out = `wrk -t1 -c2 -d#{SECONDS}s http://127.0.0.1:#{port}#{ENDPOINT}`
  Process.kill("TERM", -pid)
  Process.wait(pid)
  files = Dir[File.join(dir, "*.pprof")]
  abort "no profile written: #{File.read(log)[-2000..]}" if files.empty?
  FileUtils.cp(files.max_by { |f| File.size(f) }, File.join(ENV["KEEP"], "timeline-#{timeline}.pprof")) if ENV["KEEP"]
  [files.max_by { |f| File.size(f) }, Integer(out[/(\d+) requests in/, 1])]
end

# Re-records a decoded profile's samples and times the serialization (median of 5).
def our_serialize_ms(profile)
  recorder = Contprof::StackRecorder.new(sample_types: profile.sample_types.map { |t| [t.type, t.unit] })
  profile.samples.each do |sample|
    recorder.record_sample(sample.locations.map { |l| [l.function_name, l.file_name, l.line] }, sample.values, sample.labels)
  end
  Array.new(5) do
    profile.samples.each do |sample|
      recorder.record_sample(sample.locations.map { |l| [l.function_name, l.file_name, l.line] }, sample.values, sample.labels)
    end
    start = Process.clock_gettime(Process::CLOCK_MONOTONIC)
    recorder.serialize
    (Process.clock_gettime(Process::CLOCK_MONOTONIC) - start) * 1e3
  end.sort[2]
end

rows = [false, true].each_with_index.map do |timeline, i|
  path, requests = run(timeline, 9480 + i)
  profile = Contprof::Pprof.decode(File.binread(path))
  timed = profile.samples.count { |s| s.labels.key?("end_timestamp_ns") }
  [timeline, File.size(path), profile.sample_count, timed, requests, our_serialize_ms(profile)]
end
puts "Ruby #{RUBY_VERSION}, Rails JSON API #{ENDPOINT}, puma -t #{THREADS}:#{THREADS}, #{SECONDS} s of wrk"
puts format("  %-9s %12s %9s %9s %10s %14s", "timeline", "pprof bytes", "samples", "timed", "requests", "serialize ms")
rows.each { |row| puts format("  %-9s %12d %9d %9d %10d %14.2f", *row) }
puts format("timeline on: %.2fx the bytes of timeline off", rows[1][1].fdiv(rows[0][1]))
