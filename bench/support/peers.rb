# frozen_string_literal: true

# The profilers users would pick instead of Contprof, for the benchmarks that put them side
# by side with it: where to get them, and how to start and stop each in a running process.
#
# - stackprof: Debian's ruby-stackprof (bin/setup installs it for Ruby 3.1; Debian builds
#   it only for its default Ruby), else the stackprof gem; cpu mode at 1 ms unless told
#   otherwise;
# - datadog: Datadog's profiler (the `datadog` gem, 2.x) at its defaults, tracing and
#   telemetry off (only the profiler is measured), uploading to an agent that accepts
#   anything (Peers.sink);
# - vernier: (Ruby 3.2.1 and later) wall mode;
# - rperf: (Ruby 3.4 and later) samples at safe points, each weighted by the time since
#   the previous one.
#
# Gems come from RubyGems into tmp/bench-gems/RUBY_VERSION, installed on first use by the
# benchmark that needs them; the product itself never needs them. When one cannot be had,
# Peers says so in one line and the benchmark goes on without it.
require "rbconfig"

module Peers
  ROOT = File.expand_path("../..", __dir__)
  GEM_DIR = File.join(ROOT, "tmp", "bench-gems", RUBY_VERSION)
  # What to require => the gem that has it (opentelemetry/sdk: for the tests' span processor).
  GEMS = { "datadog" => "datadog", "vernier" => "vernier", "stackprof" => "stackprof", "rperf" => "rperf",
           "opentelemetry/sdk" => "opentelemetry-sdk" }.freeze
  MIN_RUBY = { "vernier" => "3.2.1", "rperf" => "3.4.0" }.freeze

  module_function

  # The environment for child processes that load the benchmark gems.
  def env
    { "GEM_PATH" => [GEM_DIR, *Gem.path].uniq.join(File::PATH_SEPARATOR) }
  end

  # Makes the benchmark gems loadable in this process.
  def use_gem_dir!
    return if Gem.path.include?(GEM_DIR)

    ENV["GEM_PATH"] = env["GEM_PATH"]
    Gem.clear_paths
  end

  # Whether `name` can be used here; installs a gem on first use. Says why not, once.
  def available?(name)
    @available ||= {}
    return @available[name] if @available.key?(name)

    @available[name] = check(name)
  end

  def check(name)
    if MIN_RUBY[name] && Gem::Version.new(RUBY_VERSION) < Gem::Version.new(MIN_RUBY[name])
      return unavailable(name, "needs Ruby #{MIN_RUBY[name]} or later")
    end
    # Debian's package first, where there is one.
    return true if name == "stackprof" && system(RbConfig.ruby, "-e", "require 'stackprof'", err: File::NULL)

    use_gem_dir!
    loads = -> { system(env, RbConfig.ruby, "-e", "require #{name.dump}", err: File::NULL, out: File::NULL) }
    return true if loads.call

    log = File.join(ROOT, "tmp", "bench-gems", "install-#{name.tr("/", "-")}-#{RUBY_VERSION}.log")
    Dir.mkdir(File.dirname(log)) unless Dir.exist?(File.dirname(log))
    warn "bench: installing the #{name} gem into #{GEM_DIR} (log: #{log})"
    installed = system(RbConfig.ruby, "-S", "gem", "install", "--no-document", "--install-dir", GEM_DIR, GEMS.fetch(name),
                       out: log, err: log)
    return true if installed && loads.call

    unavailable(name, "could not be installed from RubyGems#{install_failure(log)}")
  end

  # Why `gem install` failed, from its log (and the build log it points to): a missing
  # compiler or tool first, else the first error line.
  def install_failure(log)
    return "" unless File.exist?(log)

    text = File.read(log)
    build_log = text[/Results logged to (\S+)/, 1]
    text += File.read(build_log) if build_log && File.exist?(build_log)
    missing = text[/(\S+): (?:No such file or directory|command not found)/, 1]
    return ": its build needs #{File.basename(missing)}, not installed here" if missing

    line = text.lines.grep(/error:|ERROR/).reject { |l| l.include?("Error installing") }.first || text.lines.grep(/ERROR/).first
    line ? ": #{line.strip[0, 160]}" : ""
  end

  def unavailable(name, why)
    warn "bench: #{name} is left out: #{why}"
    false
  end

  # The samples of a StackProf result taken with raw: true: yields each stack's frame names
  # and how many samples it had.
  def each_stackprof_sample(result)
    frames = result[:frames]
    raw = result[:raw] || []
    position = 0
    while position < raw.size
      length = raw[position]
      stack = raw[position + 1, length]
      yield stack.map { |id| frames[id] && frames[id][:name] }, raw[position + 1 + length]
      position += length + 2
    end
  end

  # Contprof's settings for a diagnostic run, from CONTPROF_BENCH_OPTIONS
  # ("cpu_timers=false,interval=0.02"); none by default (its defaults are what is measured).
  def contprof_options
    ENV.fetch("CONTPROF_BENCH_OPTIONS", "").split(",").to_h do |pair|
      key, value = pair.split("=", 2)
      value = case value
              when "true", "false" then value == "true"
              when /\A\d+\z/ then Integer(value)
              when /\A[\d.]+\z/ then Float(value)
              else value.to_sym
              end
      [key.to_sym, value]
    end
  end

  # Runs the block under Datadog's profiler at its defaults and returns the pprof bytes of
  # what ran meanwhile, taken from its exporter (nothing is uploaded), and the block's value.
  def datadog_profile
    use_gem_dir!
    require "datadog"
    Datadog.configure do |c|
      c.logger.level = ::Logger::ERROR
      c.profiling.enabled = true
      c.tracing.enabled = false
      c.telemetry.enabled = false
      c.agent.host = "127.0.0.1"
      c.agent.port = 9 # (discard)
    end
    exporter = Datadog.send(:components).profiler.instance_variable_get(:@scheduler).instance_variable_get(:@exporter)
    exporter.flush # what came before the block
    value = yield
    bytes = exporter.flush.encoded_profile._native_bytes
    Datadog.shutdown!
    # (A zstd-compressed pprof: read with the zstd command.)
    if bytes.start_with?("\x28\xb5\x2f\xfd".b)
      require "open3"
      raise "Datadog's profile is zstd-compressed: needs the zstd command (Debian: apt-get install zstd)" unless system("command -v zstd > /dev/null")

      bytes, status = Open3.capture2("zstd", "-dc", stdin_data: bytes, binmode: true)
      raise "zstd -dc failed on Datadog's profile" unless status.success?
    end
    [bytes, value]
  end

  # An HTTP server on loopback that answers 200 to anything, standing in for a Datadog
  # agent. Runs in a process of its own (its CPU is not the profiled program's); returns
  # [port, pid].
  def sink
    reader, writer = IO.pipe
    pid = spawn(RbConfig.ruby, "-rsocket", "-e", <<~RUBY, out: writer)
      server = TCPServer.new("127.0.0.1", 0)
      $stdout.puts server.addr[1]
      $stdout.flush
      loop do
        client = server.accept
        Thread.new(client) do |c|
          length = 0
          while (line = c.gets) && line != "\\r\\n"
            length = line.split(":", 2)[1].to_i if line =~ /\\Acontent-length:/i
          end
          c.read(length) if length.positive?
          c.write("HTTP/1.1 200 OK\\r\\ncontent-length: 2\\r\\nconnection: close\\r\\n\\r\\n{}")
          c.close
        rescue StandardError
          nil
        end
      end
    RUBY
    writer.close
    port = Integer(reader.gets)
    [port, pid]
  end

  # Starts and stops one profiler inside the current process (for on/off segments).
  # contprof: Contprof's defaults (time, and allocations where `allocation: auto` turns
  # them on: Ruby 3.1.4+ but 3.2.0-3.2.2); contprof-time: time profiling only.
  # Allocation profiling: contprof-alloc (Contprof with allocation sampling at its default,
  # automatic interval), contprof-heap (the same with live-heap tracking, Ruby 3.3+; its
  # snapshot taken at each stop, as a flush would), stackprof-object (stackprof's object mode, every 1000th
  # allocation), datadog-alloc (its allocation profiling, off by default there).
  class InProcess
    def initialize(name, agent_port: nil)
      @name = name
      @agent_port = agent_port
      case name
      when "contprof", "contprof-time", "contprof-alloc", "contprof-heap"
        require "contprof"
      when "stackprof", "stackprof-object"
        require "stackprof"
      when "datadog", "datadog-alloc"
        Peers.use_gem_dir!
        require "datadog"
      when "vernier"
        Peers.use_gem_dir!
        require "vernier"
      end
    end

    # Samples collected by the last run, when known.
    attr_reader :samples

    def start
      case @name
      when "contprof", "contprof-time", "contprof-alloc", "contprof-heap"
        allocation = @name == "contprof" ? Contprof::Collectors::Allocations.on_by_default? : @name != "contprof-time"
        @recorder = Contprof::StackRecorder.new(
          sample_types: Contprof::Collectors::Allocations.sample_types(allocation, @name == "contprof-heap"),
        )
        options = { allocation_interval: (:auto if allocation) }.merge(Peers.contprof_options)
        @worker = Contprof::Collectors::CpuAndWallTimeWorker.new(recorder: @recorder, **options)
        @worker.start
      when "stackprof" then StackProf.start(mode: :cpu, interval: 1000)
      when "stackprof-object" then StackProf.start(mode: :object, interval: 1000)
      when "datadog", "datadog-alloc" then datadog(true, allocation: @name == "datadog-alloc")
      when "vernier" then Vernier.start_profile(mode: :wall)
      end
    end

    def stop
      case @name
      when "contprof", "contprof-time", "contprof-alloc", "contprof-heap"
        @worker.stop
        @worker.collector.record_heap_live if @name == "contprof-heap"
        # The worker thread ends on its own after stop.
        Thread.pass while Thread.list.any? { |t| t.name&.start_with?("Contprof") }
        @samples = @recorder.stats[:samples_recorded]
        @recorder.serialize
      when "stackprof", "stackprof-object"
        StackProf.stop
        @samples = StackProf.results[:samples]
      when "datadog", "datadog-alloc" then datadog(false)
      when "vernier" then @samples = Vernier.stop_profile.total_samples
      end
    end

    private

    def datadog(enabled, allocation: false)
      port = @agent_port
      Datadog.configure do |c|
        c.logger.level = ::Logger::ERROR
        c.profiling.enabled = enabled
        c.profiling.allocation_enabled = allocation
        c.tracing.enabled = false
        c.telemetry.enabled = false
        c.diagnostics.startup_logs.enabled = false
        c.agent.host = "127.0.0.1"
        c.agent.port = port if port
      end
    end
  end
end
