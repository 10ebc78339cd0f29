# frozen_string_literal: true

require "open3"
require "optparse"
require "rbconfig"
require_relative "../reports/report"

module Contprof
  # The `contprof` command: exec, report, serve, doctor. Usage errors (no command, unknown
  # options, missing values) print one line on standard error and return status 2.
  class CLI
    class UsageError < StandardError; end

    COMMANDS = {
      "exec" => "run a Ruby program with profiling on",
      "report" => "read pprof files: top functions, folded stacks, flame graph, speedscope",
      "serve" => "browse and compare profile directories in a web browser",
      "doctor" => "tell whether this Ruby can be profiled",
    }.freeze
    DEFAULT_EXEC_OUTPUT = Settings::DEFAULT_OUTPUT
    # Settings that are on/off switches, written --NAME, --no-NAME or --NAME=VALUE.
    SWITCHES = %i[signals cpu_timers timeline output_otlp].freeze
    # Short names of options, beside the generated ones.
    ALIASES = { otlp_url: "--otlp" }.freeze
    SWITCH_WORDS = (Settings::BOOLEANS.keys + ["posix"]).freeze

    def initialize(out: $stdout, err: $stderr, env: ENV)
      @out = out
      @err = err
      @env = env
    end

    # Returns the exit status.
    def run(arguments)
      arguments = arguments.dup
      command = arguments.shift
      case command
      when "exec" then exec_command(arguments)
      when "report" then report_command(arguments)
      when "serve"
        require_relative "serve_command"
        ServeCommand.new(out: @out, err: @err).run(arguments)
      when "doctor" then doctor_command(arguments)
      when "--version", "version" then @out.puts("contprof #{VERSION}") || 0
      when "-h", "--help", "help" then @out.puts(usage) || 0
      when nil then @err.puts(usage) || 2
      else raise UsageError, "unknown command #{command.inspect} (commands: #{COMMANDS.keys.join(", ")}; see --help)"
      end
    rescue OptionParser::ParseError => e
      @err.puts("contprof: #{one_line(e)}")
      2
    rescue UsageError, Report::InputError, ArgumentError => e
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

    # OptionParser's message, with its "Did you mean?" suggestion on the same line.
    def one_line(error)
      message, *suggestions = error.message.split("\n")
      names = suggestions.join(" ").sub(/\ADid you mean\?\s*/, "").split
      names.empty? ? message : "#{message} (did you mean #{names.map { |n| "--#{n}" }.join(" or ")}?)"
    end

    # An option's value must not be "--" (the end of the options) nor another option.
    def value_of(flag, value)
      if value == "--" || value.start_with?("--")
        raise UsageError, "#{flag} needs a value (got #{value.inspect}; write #{flag}=VALUE for a value starting with --)"
      end

      value
    end

    # `--signals false` (the value as the next word) means `--signals=false`, as
    # `--cpu-timers posix` does: join them before OptionParser, which takes a switch's
    # value only after "=".
    def join_switch_values(arguments)
      joined = []
      index = 0
      while index < arguments.size
        argument = arguments[index]
        break joined.concat(arguments[index..]) if argument == "--"

        if SWITCHES.any? { |name| argument == "--#{name.to_s.tr("_", "-")}" } &&
           SWITCH_WORDS.include?(arguments[index + 1].to_s.downcase)
          joined << "#{argument}=#{arguments[index + 1]}"
          index += 2
        else
          joined << argument
          index += 1
        end
      end
      joined
    end

    def exec_command(arguments)
      settings = {}
      parser = OptionParser.new do |o|
        o.banner = "usage: contprof exec [options] -- COMMAND [ARGUMENTS...]\n\n" \
                   "Runs COMMAND (a Ruby program, or anything that starts one) with profiling on: " \
                   "every Ruby process it starts\nloads contprof (through RUBYOPT) and writes its profile " \
                   "when it exits. Without a destination,\nprofiles go to ./#{DEFAULT_EXEC_OUTPUT}. " \
                   "Every option can also be set with its CONTPROF_* variable.\n" \
                   "Contprof logs warnings and errors only unless --log-level says otherwise.\n\noptions:"
        o.on("-o", "--output DIR", "write pprof files to DIR (CONTPROF_OUTPUT)") { |v| settings[:output] = value_of("--output", v) }
        Settings.definitions.each do |definition|
          next if definition.name == :output

          flag = "--#{definition.name.to_s.tr("_", "-")}"
          help = "#{definition.description}: #{definition.accepts} (#{definition.env_var})"
          if SWITCHES.include?(definition.name)
            o.on("--[no-]#{flag.delete_prefix("--")}[=VALUE]", help) do |v|
              settings[definition.name] = v.nil? ? true : v
            end
          else
            argument = definition.accepts.include?("seconds") ? "SECONDS" : "VALUE"
            names = ["#{flag} #{argument}", *(ALIASES[definition.name] && "#{ALIASES[definition.name]} #{argument}")]
            o.on(*names, help) { |v| settings[definition.name] = value_of(flag, v) }
          end
        end
        o.on("-h", "--help", "show this help") do
          @out.puts(o)
          return 0
        end
      end
      command = parser.order(join_switch_values(arguments))
      command.shift if command.first == "--"
      raise UsageError, "exec needs a command to run (contprof exec [options] -- COMMAND...)" if command.empty?

      environment = exec_environment(settings)
      Settings.resolve({}, env: @env.to_h.merge(environment)) # one-line errors now, not in the child
      run_profiled(environment, command)
    end

    def exec_environment(settings)
      environment = settings.to_h do |name, value|
        [Settings.definitions.find { |d| d.name == name }.env_var, value.to_s]
      end
      unless Settings.destination?(env: @env.to_h.merge(environment))
        environment["CONTPROF_OUTPUT"] = DEFAULT_EXEC_OUTPUT
      end
      # Quiet by default: the program's standard error is the user's, not contprof's.
      environment["CONTPROF_LOG_LEVEL"] ||= @env.fetch("CONTPROF_LOG_LEVEL", "warn")
      lib = File.expand_path("../..", __dir__)
      environment["RUBYOPT"] = ["-I#{lib}", "-rcontprof/auto", @env["RUBYOPT"]].compact.join(" ")
      environment
    end

    # Replaces this process with the command, as `bundle exec` and `ruby -r` users expect:
    # the PID a supervisor started is the program's, so its signals (SIGINT, SIGTERM,
    # SIGQUIT...) and its exit status are the program's own. Since nothing is left to see
    # the program end, whether it can be profiled is told before: a command that is no Ruby
    # program, or whose Ruby cannot load Contprof, gets a one-line note (it runs anyway).
    def run_profiled(environment, command)
      note = profiling_note(command)
      @err.puts("contprof: #{note}") if note
      @out.flush
      @err.flush
      Kernel.exec(environment, *command, close_others: false)
    rescue SystemCallError => e
      raise Contprof::Error, "cannot run #{command.first.inspect}: #{e.message}"
    end

    # Why the command may write no profile, or nil when it is a Ruby program able to.
    def profiling_note(command)
      path = executable_path(command.first)
      return nil unless path # exec itself says it cannot be run

      ruby = ruby_of(path)
      unless ruby
        return "#{command.first} is not a Ruby program: only Ruby processes it starts (which read RUBYOPT) are profiled"
      end
      return nil if same_file?(ruby, RbConfig.ruby) && Contprof.supported?

      check = "require 'contprof'; exit(Contprof.supported? ? 0 : (warn(Contprof.unsupported_reason); 1))"
      lib = File.expand_path("../..", __dir__)
      _, problem, status = Open3.capture3({ "RUBYOPT" => "-I#{lib}" }, ruby, "-e", check)
      return nil if status.success?

      "#{ruby} cannot be profiled: #{problem.lines.last.to_s.strip}"
    rescue SystemCallError => e
      "cannot tell whether #{command.first} can be profiled (#{e.message})"
    end

    def executable_path(name)
      return (File.file?(name) && File.executable?(name) ? name : nil) if name.include?("/")

      @env.fetch("PATH", "").split(File::PATH_SEPARATOR).map { |dir| File.join(dir, name) }
          .find { |candidate| File.file?(candidate) && File.executable?(candidate) }
    end

    # The Ruby that runs the executable at `path`: itself when it is a Ruby interpreter, the
    # interpreter its #! line names for a script, or nil.
    def ruby_of(path)
      return path if File.basename(path).match?(/\Aruby[\d.]*\z/)

      line = File.open(path, "rb") { |f| f.gets(256) }.to_s
      return nil unless line.start_with?("#!")

      words = line.delete_prefix("#!").split
      interpreter = File.basename(words.first.to_s) == "env" ? words.find { |w| !w.start_with?("-") && w != words.first } : words.first
      return nil unless interpreter && File.basename(interpreter).match?(/\Aruby[\d.]*\z/)

      interpreter.include?("/") ? interpreter : executable_path(interpreter)
    end

    def same_file?(a, b)
      File.realpath(a) == File.realpath(b)
    rescue SystemCallError
      false
    end

    def report_command(arguments)
      require_relative "report_command"
      Report::Command.new(out: @out, err: @err).run(arguments)
    end

    def doctor_command(arguments)
      OptionParser.new do |o|
        o.banner = "usage: contprof doctor\n\nTells whether this Ruby can be profiled, and how " \
                   "(VM access, compressor, HTTP uploads).\n\noptions:"
        o.on("-h", "--help", "show this help") do
          @out.puts(o)
          return 0
        end
      end.parse(arguments).then do |rest|
        raise UsageError, "doctor takes no arguments (got #{rest.first.inspect})" unless rest.empty?
      end
      reason = Contprof.unsupported_reason
      if reason
        @out.puts("not supported: #{reason}")
        return 1
      end
      note = Native.vm_backend_note
      access = note.empty? ? Native.vm_backend : "#{Native.vm_backend} (#{note})"
      @out.puts("supported: Ruby #{RUBY_VERSION} on #{RUBY_PLATFORM}; VM access #{access}; " \
                "compressor #{Native.compressor}; " \
                "HTTP uploads #{HttpTransport.available? ? "available" : "unavailable (built without libcurl)"}")
      doctor_details.each { |line| @out.puts("  #{line}") }
      0
    end

    # What the first line cannot say: what this process would get at run time (each line
    # "what: answer", see the README's Troubleshooting).
    def doctor_details
      perf = Native.perf_events_refused
      paranoid = (File.read("/proc/sys/kernel/perf_event_paranoid").strip rescue "unknown")
      curl = HttpTransport.load_problem
      allocations = Collectors::Allocations
      allocation = allocations.unsupported_reason
      allocation_note = allocations.caveat ? " (off by default: #{allocations.caveat})" : ""
      heap = allocations.heap_unsupported_reason
      [
        "CPU timers: #{perf ? "POSIX timers (#{perf}; kernel.perf_event_paranoid is #{paranoid})" : "perf events"}",
        "libcurl: #{curl ? "cannot be used (#{curl})" : "loads"}",
        "allocation profiling: #{allocation ? "unavailable (#{allocation})" : "available#{allocation_note}"}",
        "live-heap profiling: #{heap ? "unavailable (#{heap.delete_prefix("live-heap profiling is not available: ")})" : "available"}",
        "M:N threads: #{mn_threads}",
      ]
    end

    # Ruby reads RUBY_MN_THREADS at boot as an integer, as the extension does.
    def mn_threads
      return "not in Ruby #{RUBY_VERSION} (3.3+)" if RUBY_VERSION < "3.3"

      value = ENV.fetch("RUBY_MN_THREADS", nil)
      return "off (RUBY_MN_THREADS #{value ? "is #{value}" : "unset"}: one native thread per Ruby thread)" unless value.to_i.positive?

      "on (RUBY_MN_THREADS=#{value}): threads seen sharing a native thread get their CPU time from the thread " \
        "hooks, charged at wall samples"
    end
  end
end
