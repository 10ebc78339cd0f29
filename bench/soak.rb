# frozen_string_literal: true

# Soak test: a mixed multi-threaded workload profiled continuously, uploading to a local
# Datadog-agent stand-in every 5 s, for SOAK_SECONDS (default 600).
#
#   ruby -Ilib bench/soak.rb                 # 10 minutes
#   SOAK_SECONDS=120 ruby -Ilib bench/soak.rb
#   SOAK_BASELINE=1 ruby -Ilib bench/soak.rb # the same workload without profiling (RSS only)
#   SOAK_HEAP=1 ruby -Ilib bench/soak.rb     # with allocation and live-heap profiling (3.3+);
#                                            # SOAK_ALLOCATION_INTERVAL=200 samples more often
#
# Checks, and prints: RSS stays stable (the last minute's within 5% of the second
# minute's), and the cpu-time summed over every uploaded profile matches the process's
# CPU time over the same span within 5% (nothing lost between flushes). Exits non-zero
# when a check fails. The intake server runs in its own process, so that its CPU is not
# the workload's. With SOAK_HEAP=1 a thread also keeps a rolling cache of 200,000 strings
# (full from the start, so that RSS is steady; old ones die as new ones arrive), and the
# heap tracker's memory (stats) must stay within its bound: the last minute's no larger than
# the second minute's by more than 5%.
require "json"
require "rbconfig"
require "tmpdir"
require "open3"

SECONDS_TO_RUN = Integer(ENV.fetch("SOAK_SECONDS", "600"))
BASELINE = ENV["SOAK_BASELINE"] == "1"
HEAP = ENV["SOAK_HEAP"] == "1"
ALLOCATION_INTERVAL = ENV.fetch("SOAK_ALLOCATION_INTERVAL", "auto")
ROOT = File.expand_path("..", __dir__)
dir = Dir.mktmpdir("contprof-soak")
uploads_log = File.join(dir, "uploads.jsonl")
port_file = File.join(dir, "port")

server = spawn(RbConfig.ruby, "-I#{File.join(ROOT, "lib")}", "-e", <<~RUBY, out: File::NULL, err: File::NULL)
  require "webrick"
  require "json"
  require "contprof"
  server = WEBrick::HTTPServer.new(BindAddress: "127.0.0.1", Port: 0, Logger: WEBrick::Log.new(File::NULL), AccessLog: [])
  server.mount_proc("/") do |request, response|
    profile = Contprof::Pprof.decode(request.query["profile.pprof"].to_s)
    record = { "cpu" => profile.total("cpu-time"), "wall" => profile.total("wall-time"),
               "duration" => profile.duration_nanos, "samples" => profile.samples.size }
    File.open(#{uploads_log.inspect}, "a") { |f| f.puts(JSON.generate(record)) }
    response.status = 202
  end
  File.write(#{port_file.inspect}, server.config[:Port].to_s)
  trap("TERM") { server.shutdown }
  server.start
RUBY
sleep 0.1 until File.exist?(port_file) && !File.read(port_file).empty?
agent_url = "http://127.0.0.1:#{File.read(port_file)}"

workload = <<~RUBY
  require "contprof"
  require "json"
  def burn(seconds)
    start = Process.clock_gettime(Process::CLOCK_THREAD_CPUTIME_ID)
    nil while Process.clock_gettime(Process::CLOCK_THREAD_CPUTIME_ID) - start < seconds
  end
  def rss = File.read("/proc/self/status")[/VmRSS:\\s+(\\d+)/, 1].to_i
  cache = #{HEAP} ? Array.new(200_000) { |i| "entry \#{i}" * 3 } : [] # full before the first minute
  cpu_before = Process.clock_gettime(Process::CLOCK_PROCESS_CPUTIME_ID)
  profiler = #{BASELINE} ? nil : Contprof.start(agent_url: #{agent_url.inspect}, upload_period: 5, service: "soak", log_level: "warn",
                                                   allocation: #{HEAP}, heap: #{HEAP},
                                                   allocation_interval: #{ALLOCATION_INTERVAL.inspect})
  deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + #{SECONDS_TO_RUN}
  running = -> { Process.clock_gettime(Process::CLOCK_MONOTONIC) < deadline }
  threads = []
  threads += 2.times.map { |i| Thread.new { burn(0.01 * (i + 1)) && sleep(0.005) while running.() } }
  threads += 2.times.map { Thread.new { (Array.new(2_000) { |j| j.to_s * 4 }.join; sleep 0.002) while running.() } }
  threads << Thread.new do
    reader, writer = IO.pipe
    while running.()
      writer.write("x" * 512)
      reader.read(512)
      IO.select([reader], nil, nil, 0.003)
    end
  end
  threads << Thread.new { (Thread.new { burn(0.002) }.join) while running.() } # thread churn
  queue = Queue.new
  threads << Thread.new { (queue << 1; sleep 0.001) while running.() }
  threads << Thread.new { queue.pop while running.() }
  if #{HEAP}
    threads << Thread.new do
      index = 0
      while running.()
        cache[index % cache.size] = "entry \#{index}" * 3
        index += 1
        sleep 0.001 if (index % 200).zero?
      end
    end
  end
  rss_samples = []
  tracker_bytes = []
  diagnostics = []
  while running.()
    sleep 10
    rss_samples << [Process.clock_gettime(Process::CLOCK_MONOTONIC), rss]
    tracker_bytes << (profiler&.stats&.dig(:worker, :heap_tracker_bytes) || 0)
    diagnostics << { "pprof_bytes" => Contprof::StackRecorder::Testing.pprof_allocated_bytes,
                     "live_slots" => GC.stat(:heap_live_slots), "threads" => Thread.list.size } if ENV["SOAK_DIAGNOSTICS"]
  end
  queue << 1
  threads.each(&:join)
  Contprof.stop
  cpu = Process.clock_gettime(Process::CLOCK_PROCESS_CPUTIME_ID) - cpu_before
  stats = profiler ? profiler.stats : {}
  diagnostics.each_slice(6) { |minute| warn JSON.generate(minute.last) }
  puts JSON.generate("cpu" => cpu, "rss" => rss_samples.map(&:last), "tracker_bytes" => tracker_bytes,
                     "stats" => stats.reject { |_, v| v.is_a?(Hash) }, "worker" => stats[:worker])
RUBY

out, err, status = Open3.capture3(RbConfig.ruby, "-I#{File.join(ROOT, "lib")}", "-e", workload)
Process.kill(:TERM, server)
Process.wait(server)
abort "workload failed (#{status}): #{err}" unless status.success?

result = JSON.parse(out.lines.last)
uploads = BASELINE ? [] : File.readlines(uploads_log).map { |line| JSON.parse(line) }
uploaded_cpu = uploads.sum { |u| u["cpu"] } / 1e9
rss = result["rss"]
per_minute = rss.each_slice(6).map { |minute| minute.sum / minute.size.to_f }
second_minute = per_minute[1] || per_minute.first
last_minute = per_minute.last
rss_change = (last_minute - second_minute) / second_minute
cpu_ratio = uploaded_cpu / result["cpu"]
tracker_per_minute = result["tracker_bytes"].each_slice(6).map(&:max)
tracker_change = HEAP && tracker_per_minute.size > 1 ? (tracker_per_minute.last - tracker_per_minute[1]).fdiv(tracker_per_minute[1]) : 0

puts "Soak: #{SECONDS_TO_RUN} s, #{BASELINE ? "baseline: no profiling" : "#{uploads.size} uploads (every 5 s)"}"
puts "  profiler: #{result["stats"]}"
puts "  worker: #{result["worker"]}"
puts format("  RSS (kB) per minute: %s", per_minute.map(&:round).join(", "))
puts format("  RSS, last minute vs second minute: %+.2f%%", rss_change * 100)
if HEAP
  puts format("  heap tracker bytes (largest) per minute: %s; last vs second minute %+.2f%%",
              tracker_per_minute.join(", "), tracker_change * 100)
end
puts format("  cpu-time in all uploaded profiles: %.2f s; process CPU: %.2f s; ratio %.4f",
            uploaded_cpu, result["cpu"], cpu_ratio)
unless err.empty?
  File.write(File.join(dir, "workload.err"), err)
  puts "  (#{err.lines.size} lines on the workload's standard error, kept in #{dir}/workload.err)"
end
failures = []
failures << "RSS moved by #{(rss_change * 100).round(2)}%" if SECONDS_TO_RUN >= 180 && rss_change.abs > 0.05
failures << "heap tracker grew by #{(tracker_change * 100).round(2)}%" if SECONDS_TO_RUN >= 180 && tracker_change > 0.05
failures << "cpu-time ratio #{cpu_ratio.round(4)}" unless BASELINE || (0.95..1.05).cover?(cpu_ratio)
abort "soak failed: #{failures.join("; ")}" unless failures.empty?
puts "  OK"
