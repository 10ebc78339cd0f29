# frozen_string_literal: true

# Soak test of a forking server: puma in cluster mode (2 workers forked from a master that
# preloaded the app) under `contprof exec`, with allocation and live-heap profiling on,
# under steady load for SOAK_SECONDS (default 600), uploading to a local Datadog-agent
# stand-in every 10 s; then SIGTERM.
#
#   ruby -Ilib bench/soak_cluster.rb                   # 10 minutes
#   SOAK_SECONDS=120 ruby -Ilib bench/soak_cluster.rb  # 2 minutes (the memory check needs 3)
#   SOAK_HEAP=0 ruby -Ilib bench/soak_cluster.rb       # allocation profiling without the live heap
#   SOAK_BASELINE=1 ruby -Ilib bench/soak_cluster.rb   # the same puma without Contprof (RSS and stop only)
#   script/ruby-chroot 3.4 -- bash -c 'cd /work/bench-tree && rake compile && ruby -Ilib bench/soak_cluster.rb'
#
# Live-heap profiling needs Ruby 3.3 or later: on 3.1 the soak runs with allocation
# profiling only, and says so. Puma is Debian's where it is installed, else the gem from
# RubyGems into tmp/bench-gems/RUBY_VERSION; when it cannot be had, one line says so and the
# soak does not run.
#
# The app (written by this script) mixes what a server does: CPU, allocations, a per-worker
# cache whose entries are replaced (full from the start, so that memory is steady while the
# heap tracker follows objects that die), and waits. Checks, and prints:
#
# - a profile every period from every process: each upload of a process starts where its
#   previous one ended (no period lost), and each process uploaded as many as the run lasted
#   periods (less one for the first, which starts at the process's start);
# - memory stays flat: each process's RSS, and each worker's heap tracker memory (its
#   stats, served by the app), in the last minute within 5% of the second minute (runs of 3
#   minutes or more);
# - what is lost: the cpu-time of every upload of a worker against the CPU it used (/proc,
#   read just before the stop, less that of Contprof's own threads, which no profile
#   holds); a ratio outside 0.95-1.05 is noted, not failed;
# - no gap: no "not profiled" in the log, nor any other warning or error of Contprof's;
# - SIGTERM stops puma, every process having flushed its last profile, within
#   upload_timeout (10 s); past it noted (puma stalls so on its own at times), past
#   puma's worker_shutdown_timeout (30 s) and upload_timeout together failed.
#
# Exits non-zero when a check fails. The intake and the load run in processes of their own.
require "etc"
require "fileutils"
require "json"
require "net/http"
require "rbconfig"
require "socket"
require "tmpdir"

SECONDS_TO_RUN = Integer(ENV.fetch("SOAK_SECONDS", "600"))
PERIOD = 10
ROOT = File.expand_path("..", __dir__)
EXE = File.join(ROOT, "exe", "contprof")
GEM_DIR = File.join(ROOT, "tmp", "bench-gems", RUBY_VERSION)
HEAP_SUPPORTED = Gem::Version.new(RUBY_VERSION) >= Gem::Version.new("3.3")
BASELINE = ENV["SOAK_BASELINE"] == "1"
HEAP = HEAP_SUPPORTED && ENV["SOAK_HEAP"] != "0" && !BASELINE

# Debian's puma, else the gem (installed on first use). Returns [command, environment], or
# nil with one line saying why not.
def puma_command
  debian = ENV.fetch("PATH", "").split(File::PATH_SEPARATOR).map { |path| File.join(path, "puma") }.find { |path| File.executable?(path) }
  return [[debian], {}] if debian && system(RbConfig.ruby, "-e", "require 'puma'", err: File::NULL)

  env = { "GEM_PATH" => [GEM_DIR, *Gem.path].uniq.join(File::PATH_SEPARATOR) }
  bin = File.join(GEM_DIR, "bin", "puma")
  unless File.exist?(bin)
    log = File.join(ROOT, "tmp", "bench-gems", "install-puma-#{RUBY_VERSION}.log")
    Dir.mkdir(File.dirname(log)) unless Dir.exist?(File.dirname(log))
    warn "soak_cluster: installing the puma gem into #{GEM_DIR} (log: #{log})"
    unless system(RbConfig.ruby, "-S", "gem", "install", "--no-document", "--install-dir", GEM_DIR, "puma", out: log, err: log)
      reason = File.readlines(log).grep(/ERROR|error:/).first.to_s.strip[0, 160]
      puts "soak_cluster: not run: puma is not installed and the gem could not be had#{": #{reason}" unless reason.empty?}"
      return nil
    end
  end
  [[RbConfig.ruby, bin], env]
end

def free_port
  server = TCPServer.new("127.0.0.1", 0)
  server.addr[1]
ensure
  server&.close
end

def rss_kb(pid)
  File.read("/proc/#{pid}/status")[/VmRSS:\s+(\d+)/, 1].to_i
rescue SystemCallError
  nil
end

# The CPU seconds a process used so far (user + system, from /proc).
def cpu_seconds(pid)
  fields = File.read("/proc/#{pid}/stat").split(") ", 2).last.split
  (fields[11].to_i + fields[12].to_i).fdiv(Etc.sysconf(Etc::SC_CLK_TCK))
end

# The CPU seconds of a process's threads named by Contprof (its sampler and scheduler):
# no profile holds it.
def contprof_cpu_seconds(pid)
  Dir["/proc/#{pid}/task/*"].sum do |task|
    next 0 unless File.read(File.join(task, "comm")).start_with?("Contprof")

    fields = File.read(File.join(task, "stat")).split(") ", 2).last.split
    (fields[11].to_i + fields[12].to_i).fdiv(Etc.sysconf(Etc::SC_CLK_TCK))
  rescue SystemCallError
    0
  end
end

def children(pid)
  Dir["/proc/#{pid}/task/*/children"].flat_map { |file| File.read(file).split.map(&:to_i) }
rescue SystemCallError
  []
end

command, puma_env = puma_command
exit 0 unless command

dir = Dir.mktmpdir("contprof-soak-cluster")
uploads_log = File.join(dir, "uploads.jsonl")
Dir.mkdir(File.join(dir, "profiles"))
port_file = File.join(dir, "intake-port")
log = File.join(dir, "puma.log")
port = free_port

File.write(File.join(dir, "config.ru"), <<~'RUBY')
  # The soak's app: CPU, allocations, a cache whose entries are replaced, waits, and its
  # profiler's stats (for the soak's memory check).
  require "json"
  CACHE_SIZE = 50_000
  CACHE = Array.new(CACHE_SIZE) { |i| "entry #{i}" * 4 }
  $replaced = 0
  def fib(n) = n < 2 ? n : fib(n - 1) + fib(n - 2)
  def rss = File.read("/proc/self/status")[/VmRSS:\s+(\d+)/, 1].to_i
  run lambda { |env|
    body = case env["PATH_INFO"]
           when "/compute" then fib(18).to_s
           when "/allocate" then Array.new(2_000) { |i| i.to_s * 4 }.sort.join(",").size.to_s
           when "/cache"
             200.times { CACHE[($replaced += 1) % CACHE_SIZE] = "entry #{$replaced}" * 4 }
             $replaced.to_s
           when "/wait" then (sleep 0.002; "waited")
           when "/__stats"
             worker = defined?(Contprof::Profiler) && Contprof::Profiler.running&.stats&.fetch(:worker)
             JSON.generate("pid" => Process.pid, "rss" => rss, "heap_tracker_bytes" => worker && worker[:heap_tracker_bytes],
                           "heap_tracked" => worker && worker[:heap_tracked])
           else return [404, {}, ["no such path"]]
           end
    [200, { "content-type" => "text/plain" }, [body]]
  }
RUBY
File.write(File.join(dir, "puma.rb"), <<~RUBY)
  workers 2
  threads 2, 2
  preload_app!
  bind "tcp://127.0.0.1:#{port}"
  rackup #{File.join(dir, "config.ru").inspect}
RUBY

intake = spawn(RbConfig.ruby, "-I#{File.join(ROOT, "lib")}", "-e", <<~RUBY, out: File::NULL, err: File::NULL)
  require "webrick"
  require "json"
  require "contprof"
  server = WEBrick::HTTPServer.new(BindAddress: "127.0.0.1", Port: 0, Logger: WEBrick::Log.new(File::NULL), AccessLog: [])
  lock = Mutex.new
  server.mount_proc("/") do |request, response|
    event = JSON.parse(request.query["event"].to_s)
    tags = event["tags_profiler"].split(",").to_h { |tag| tag.split(":", 2) }
    profile = Contprof::Pprof.decode(request.query["profile.pprof"].to_s)
    record = { "pid" => tags["process_id"].to_i, "runtime_id" => tags["runtime-id"], "start" => event["start"],
               "end" => event["end"], "cpu" => profile.total("cpu-time"), "alloc" => profile.total("alloc-samples"),
               "heap" => (profile.total("heap-live-samples") rescue nil) }
    lock.synchronize do
      File.open(#{uploads_log.inspect}, "a") { |f| f.puts(JSON.generate(record)) }
      # Kept for a failed soak's post-mortem (`contprof report DIR/profiles`).
      File.binwrite(File.join(#{File.join(dir, "profiles").inspect}, "\#{record["pid"]}-\#{record["start"]}.pprof"),
                    request.query["profile.pprof"].to_s)
    end
    response.status = 202
  end
  File.write(#{port_file.inspect}, server.config[:Port].to_s)
  trap("TERM") { server.shutdown }
  server.start
RUBY
sleep 0.05 until File.exist?(port_file) && !File.read(port_file).empty?

env = puma_env.merge("CONTPROF_AGENT_URL" => "http://127.0.0.1:#{File.read(port_file)}", "CONTPROF_UPLOAD_PERIOD" => PERIOD.to_s,
                     "CONTPROF_SERVICE" => "soak-cluster", "CONTPROF_ALLOCATION" => "true", "CONTPROF_HEAP" => HEAP.to_s,
                     "CONTPROF_LOG_LEVEL" => "info")
profiling = BASELINE ? "baseline: no profiling" : "allocation profiling on, live heap #{HEAP ? "on" : "off (#{HEAP_SUPPORTED ? "SOAK_HEAP=0" : "needs Ruby 3.3+"})"}"
puts "soak_cluster: Ruby #{RUBY_VERSION}, #{command.last}, #{SECONDS_TO_RUN} s, #{profiling}"
env = puma_env if BASELINE
prefix = BASELINE ? [] : [RbConfig.ruby, EXE, "exec", "--"]
server = spawn(env, *prefix, *command, "-C", File.join(dir, "puma.rb"), out: log, err: [:child, :out],
               pgroup: true)
deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + 120
until (workers = children(server)).size >= 2 && File.read(log).scan(/Worker \d+ \(PID: \d+\) booted/).size >= 2
  abort "soak_cluster: puma did not start: #{File.read(log)}" if Process.waitpid(server, Process::WNOHANG) ||
                                                                 Process.clock_gettime(Process::CLOCK_MONOTONIC) > deadline
  sleep 0.1
end
processes = [server, *workers]

# The load: two clients in a process of their own, a mix of the app's paths, each on a new
# connection every 20 requests (a kept-alive connection stays with one worker).
load = spawn(RbConfig.ruby, "-rnet/http", "-e", <<~RUBY, out: File::NULL, err: File.join(dir, "load.err"))
  paths = %w[/compute /allocate /cache /wait /compute /allocate]
  2.times.map do |client|
    Thread.new do
      index = client
      loop do
        Net::HTTP.start("127.0.0.1", #{port}) { |http| 20.times { http.get(paths[(index += 1) % paths.size]) } }
      rescue SystemCallError, IOError
        sleep 0.1
      end
    end
  end.each(&:join)
RUBY

started = Process.clock_gettime(Process::CLOCK_MONOTONIC)
rss = Hash.new { |hash, key| hash[key] = [] }
tracker = Hash.new { |hash, key| hash[key] = [] }
stats_client = Net::HTTP.new("127.0.0.1", port)
while Process.clock_gettime(Process::CLOCK_MONOTONIC) - started < SECONDS_TO_RUN
  sleep 10
  processes.each { |pid| rss[pid] << rss_kb(pid) }
  # Each worker's stats: asked until both answered (the listener hands a request to either).
  seen = {}
  20.times do
    break if seen.size >= workers.size

    stats = JSON.parse(stats_client.get("/__stats").body)
    seen[stats["pid"]] ||= stats
  rescue StandardError
    break
  end
  seen.each { |pid, stats| tracker[pid] << stats["heap_tracker_bytes"].to_i }
end
cpu = processes.to_h { |pid| [pid, cpu_seconds(pid)] }
own_cpu = processes.to_h { |pid| [pid, contprof_cpu_seconds(pid)] }
Process.kill("TERM", load)
Process.wait(load)
stop_started = Process.clock_gettime(Process::CLOCK_MONOTONIC)
Process.kill("TERM", server)
_, status = Process.wait2(server)
stop_seconds = Process.clock_gettime(Process::CLOCK_MONOTONIC) - stop_started
sleep 0.5 # the last uploads' records
Process.kill("TERM", intake)
Process.wait(intake)

uploads = File.exist?(uploads_log) ? File.readlines(uploads_log).map { |line| JSON.parse(line) } : []
by_pid = uploads.group_by { |upload| upload["pid"] }
text = File.read(log)
failures = []
notes = []
puts "  puma stopped by SIGTERM in #{stop_seconds.round(2)} s (#{status.inspect})"
processes.each do |pid|
  role = pid == server ? "master" : "worker"
  list = (by_pid[pid] || []).sort_by { |upload| upload["start"] }
  breaks = list.each_cons(2).count { |before, after| after["start"] != before["end"] }
  expected = (SECONDS_TO_RUN / PERIOD) - 1
  uploaded_cpu = list.sum { |upload| upload["cpu"] } / 1e9
  app_cpu = cpu[pid] - own_cpu[pid]
  ratio = app_cpu.positive? ? uploaded_cpu / app_cpu : 1.0
  minutes = rss[pid].compact.each_slice(6).map { |minute| minute.sum.fdiv(minute.size) }
  change = minutes.size >= 3 ? (minutes.last - minutes[1]) / minutes[1] : nil
  puts format("  %-6s %d: %d profiles (%d breaks), cpu-time %.2f s / CPU %.2f s (%.2f s more in Contprof's threads) = %.4f; " \
              "RSS (kB) per minute %s%s", role, pid, list.size, breaks, uploaded_cpu, app_cpu, own_cpu[pid], ratio,
              minutes.map(&:round).join(", "), change ? format(" (last vs second %+.2f%%)", change * 100) : "")
  failures << "#{role} #{pid}: #{list.size} profiles, fewer than #{expected}" if list.size < expected && !BASELINE
  failures << "#{role} #{pid}: #{breaks} periods missing between profiles" if breaks.positive?
  failures << "#{role} #{pid}: one runtime-id per process" unless BASELINE || list.map { |u| u["runtime_id"] }.uniq.size == 1
  # Said, not failed: Ruby 3.4's workers hold 3-7% less than their threads' CPU (see
  # bench/README.md). (The master's CPU also holds what ran before profiling: `contprof
  # exec` itself, which exec'd into puma in the same process, and Ruby's start.)
  notes << "#{role} #{pid}: cpu-time ratio #{ratio.round(4)}" if role == "worker" && !BASELINE && !(0.95..1.05).cover?(ratio)
  failures << "#{role} #{pid}: RSS moved by #{(change * 100).round(2)}%" if change && change.abs > 0.05
  next unless tracker.key?(pid) && HEAP

  bytes = tracker[pid].each_slice(6).map(&:max)
  growth = bytes.size >= 3 && bytes[1].positive? ? (bytes.last - bytes[1]).fdiv(bytes[1]) : nil
  puts format("         heap tracker bytes (largest) per minute %s%s", bytes.join(", "),
              growth ? format(" (last vs second %+.2f%%)", growth * 100) : "")
  failures << "worker #{pid}: heap tracker grew by #{(growth * 100).round(2)}%" if growth && growth > 0.05
end
allocations = uploads.sum { |upload| upload["alloc"].to_i }
heap = uploads.map { |upload| upload["heap"] }.compact.max
puts "  #{uploads.size} uploads from #{by_pid.size} processes; allocation samples #{allocations}; live heap samples " \
     "(largest) #{heap || "none"}"
failures << "no allocation sample" if allocations.zero? && !BASELINE
failures << "no live-heap sample" if HEAP && heap.to_i.zero?
failures << "a gap was logged: #{text.lines.grep(/not profiled/).first.strip}" if text.include?("not profiled")
# (Asked for allocation profiling, Ruby 3.1.2 gets a warning about its own bug: not a fault.)
complaints = text.lines.grep(/(?:WARN|ERROR|FATAL) -- contprof/).grep_v(/Ruby bug #\d+/)
failures << "Contprof's warnings: #{complaints.first(3).join.strip}" unless complaints.empty?
failures << "puma ended with #{status.inspect}" unless status.termsig == Signal.list["TERM"] || status.success?
# Every process flushes and uploads its last profile within upload_timeout (10 s by default).
# Puma 8 on Ruby 3.4 sometimes stalls on its own, a worker's server thread stuck closing its
# pipes until the master kills it after worker_shutdown_timeout (30 s): seen without
# Contprof too (SOAK_BASELINE=1), so a stop past 10 s is noted, and fails past both.
if stop_seconds > 40
  failures << "puma took #{stop_seconds.round(1)} s to stop"
elsif stop_seconds > 10
  notes << "puma took #{stop_seconds.round(1)} s to stop (see bench/README.md: puma's own stall)"
end
puts "  #{text[/Puma version: [^\n]*/]}"
puts "  note: #{notes.join("; ")}" unless notes.empty?
if failures.empty?
  FileUtils.rm_rf(dir)
  puts "  OK"
else
  abort "soak_cluster failed (log and uploads in #{dir}): #{failures.join("; ")}"
end
