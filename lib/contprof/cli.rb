# frozen_string_literal: true

require "optparse"
require "rbconfig"

module Contprof
  # The `contprof` command: exec, report, doctor.
  class CLI
    class UsageError < StandardError; end

    COMMANDS = {
      "exec" => "run a Ruby program with profiling on",
      "report" => "read a pprof file: top functions, folded stacks, HTML flame graph",
      "doctor" => "tell whether this Ruby can be profiled",
    }.freeze
    DEFAULT_EXEC_OUTPUT = "contprof-profiles"

    def initialize(out: $stdout, err: $stderr, env: ENV)
      @out = out
      @err = err
      @env = env
    end

    # Returns the exit status (exec does not return when it succeeds).
    def run(arguments)
      arguments = arguments.dup
      command = arguments.shift
      case command
      when "exec" then exec_command(arguments)
      when "report" then report_command(arguments)
      when "doctor" then doctor_command(arguments)
      when "--version", "version" then @out.puts("contprof #{VERSION}") || 0
      when nil, "-h", "--help", "help" then @out.puts(usage) || 0
      else raise UsageError, "unknown command #{command.inspect} (commands: #{COMMANDS.keys.join(", ")}; see --help)"
      end
    rescue UsageError, OptionParser::ParseError, ArgumentError => e
      @err.puts("contprof: #{e.message}")
      2
    rescue Contprof::Error, SystemCallError => e
      @err.puts("contprof: #{e.message}")
      1
    end

    def usage
      lines = ["usage: contprof COMMAND [options]", "", "commands:"]
      COMMANDS.each { |name, description| lines << format("  %-8s %s", name, description) }
      lines << "" << "contprof COMMAND --help for a command's options; contprof --version"
      lines.join("\n")
    end

    private

    def exec_command(arguments)
      settings = {}
      parser = OptionParser.new do |o|
        o.banner = "usage: contprof exec [options] -- COMMAND [ARGUMENTS...]\n\n" \
                   "Runs COMMAND (a Ruby program, or anything that starts one) with profiling on: " \
                   "every Ruby process it starts\nloads contprof (through RUBYOPT) and writes its profile " \
                   "when it exits. Without a destination,\nprofiles go to ./#{DEFAULT_EXEC_OUTPUT}. " \
                   "Every option can also be set with its CONTPROF_* variable.\n\noptions:"
        o.on("-o", "--output DIR", "write pprof files to DIR") { |v| settings[:output] = v }
        Settings.definitions.each do |definition|
          next if definition.name == :output

          flag = "--#{definition.name.to_s.tr("_", "-")}"
          if definition.name == :signals
            o.on("--[no-]signals", definition.description) { |v| settings[:signals] = v }
          else
            o.on("#{flag} VALUE", "#{definition.description} (#{definition.env_var})") { |v| settings[definition.name] = v }
          end
        end
        o.on("-h", "--help", "show this help") do
          @out.puts(o)
          return 0
        end
      end
      command = parser.order(arguments)
      command.shift if command.first == "--"
      raise UsageError, "exec needs a command to run (contprof exec [options] -- COMMAND...)" if command.empty?

      environment = exec_environment(settings)
      Settings.resolve({}, env: @env.to_h.merge(environment)) # one-line errors now, not in the child
      Kernel.exec(environment, *command)
    rescue SystemCallError => e
      raise Contprof::Error, "cannot run #{command&.first.inspect}: #{e.message}"
    end

    def exec_environment(settings)
      environment = settings.to_h do |name, value|
        [Settings.definitions.find { |d| d.name == name }.env_var, value.to_s]
      end
      destinations = %w[CONTPROF_OUTPUT CONTPROF_AGENT_URL CONTPROF_API_KEY CONTPROF_PYROSCOPE_URL]
      unless destinations.any? { |variable| environment[variable] || @env[variable] }
        environment["CONTPROF_OUTPUT"] = DEFAULT_EXEC_OUTPUT
      end
      environment["CONTPROF_LOG_LEVEL"] ||= @env.fetch("CONTPROF_LOG_LEVEL", "info")
      lib = File.expand_path("..", __dir__)
      environment["RUBYOPT"] = ["-I#{lib}", "-rcontprof/auto", @env["RUBYOPT"]].compact.join(" ")
      environment
    end

    def report_command(arguments)
      mode = :top
      limit = 20
      type = nil
      flamegraph = nil
      parser = OptionParser.new do |o|
        o.banner = "usage: contprof report FILE [--top N | --folded | --flamegraph OUT.html] [--type TYPE]\n\n" \
                   "Reads a pprof file (gzip-compressed or not). By default prints the top functions of " \
                   "each sample type.\n\noptions:"
        o.on("--top N", Integer, "the N functions with the most self time (default 20)") do |n|
          raise UsageError, "--top needs a positive number" unless n.positive?

          mode = :top
          limit = n
        end
        o.on("--folded", "folded stacks (root;...;leaf value), for FlameGraph tools") { mode = :folded }
        o.on("--flamegraph OUT", "write a self-contained HTML flame graph to OUT") do |path|
          mode = :flamegraph
          flamegraph = path
        end
        o.on("--type TYPE", "sample type for --top and --folded (default: all for --top, cpu-time for --folded)") do |t|
          type = t
        end
        o.on("-h", "--help", "show this help") do
          @out.puts(o)
          return 0
        end
      end
      files = parser.parse(arguments)
      raise UsageError, "report needs exactly one pprof FILE (see contprof report --help)" unless files.size == 1

      profile = load_profile(files.first)
      if type && !profile.sample_type_names.include?(type)
        raise UsageError, "no sample type #{type.inspect} in #{files.first} " \
                          "(it has #{profile.sample_type_names.join(", ")})"
      end
      case mode
      when :top then @out.print(Report.format_top(profile, limit: limit, types: type && [type]))
      when :folded then @out.print(Report.folded(profile, type || default_type(profile)))
      when :flamegraph
        Flamegraph.write(profile, flamegraph, title: "#{File.basename(files.first)} — Contprof")
        @out.puts("wrote #{flamegraph}")
      end
      0
    end

    def load_profile(path)
      Pprof.decode_file(path)
    rescue Errno::ENOENT, Errno::EISDIR, Errno::EACCES => e
      raise UsageError, "cannot read #{path}: #{e.message}"
    rescue Pprof::DecodeError, Zlib::Error => e
      raise UsageError, "#{path} is not a pprof profile (#{e.message})"
    end

    def default_type(profile)
      profile.sample_type_names.include?("cpu-time") ? "cpu-time" : profile.sample_type_names.first
    end

    def doctor_command(_arguments)
      reason = Contprof.unsupported_reason
      if reason
        @out.puts("not supported: #{reason}")
        return 1
      end
      @out.puts("supported: Ruby #{RUBY_VERSION} on #{RUBY_PLATFORM}; VM access #{Native.vm_backend}; " \
                "compressor #{Native.compressor}; " \
                "HTTP uploads #{HttpTransport.available? ? "available" : "unavailable (built without libcurl)"}")
      0
    end
  end
end
