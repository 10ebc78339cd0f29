# frozen_string_literal: true

require "optparse"
require "rbconfig"
require_relative "../reports/report"

module Contprof
  # The `contprof` command: exec, report, doctor. Usage errors (no command, unknown
  # options, missing values) print one line on standard error and return status 2.
  class CLI
    class UsageError < StandardError; end

    COMMANDS = {
      "exec" => "run a Ruby program with profiling on",
      "report" => "read pprof files: top functions, folded stacks, flame graph, speedscope",
      "doctor" => "tell whether this Ruby can be profiled",
    }.freeze
    DEFAULT_EXEC_OUTPUT = Settings::DEFAULT_OUTPUT
    # Settings that are on/off switches, written --NAME, --no-NAME or --NAME=VALUE.
    SWITCHES = %i[signals cpu_timers].freeze
    SWITCH_WORDS = (Settings::BOOLEANS.keys + ["posix"]).freeze
    # Signals a user sends to `contprof exec` that belong to the program it runs. SIGINT and
    # SIGQUIT from the terminal reach the program directly (same process group), so contprof
    # only ignores them while it waits, as a shell does.
    FORWARDED_SIGNALS = %w[TERM HUP USR1 USR2 ALRM].freeze

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
            o.on("#{flag} #{argument}", help) { |v| settings[definition.name] = value_of(flag, v) }
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

    # Runs the command as a child (not exec: contprof must see it end, to say when no
    # profile was written) and returns as it did: its exit status, or death by the same
    # signal. Standard streams, the terminal and the process group are the child's too.
    def run_profiled(environment, command)
      output = environment["CONTPROF_OUTPUT"] || @env["CONTPROF_OUTPUT"]
      before = output && profiles_in(output)
      started = Time.now
      pid = begin
        Process.spawn(environment, *command, close_others: false)
      rescue SystemCallError => e
        raise Contprof::Error, "cannot run #{command.first.inspect}: #{e.message}"
      end
      previous = install_forwarding(pid)
      _, status = Process.wait2(pid)
      restore_handlers(previous)
      if output && (profiles_in(output) - before).none? { |path| File.mtime(path) >= started - 1 }
        @err.puts("contprof: no profile was written to #{output}: #{command.first} started no Ruby " \
                  "process that loaded contprof (only ruby reads RUBYOPT)")
      end
      exit_like(status)
    end

    def profiles_in(directory)
      Dir[File.join(directory, "*.pprof")]
    end

    def install_forwarding(pid)
      previous = {}
      %w[INT QUIT].each { |signal| previous[signal] = trap(signal, "IGNORE") }
      FORWARDED_SIGNALS.each do |signal|
        previous[signal] = trap(signal) do
          Process.kill(signal, pid)
        rescue Errno::ESRCH
          nil
        end
      end
      previous
    end

    def restore_handlers(previous)
      previous.each { |signal, handler| trap(signal, handler || "DEFAULT") }
    end

    def exit_like(status)
      return status.exitstatus if status.exited?

      signal = status.termsig
      @out.flush
      @err.flush
      begin
        trap(signal, "DEFAULT") unless Signal.signame(signal) == "KILL"
        Process.kill(signal, Process.pid)
        sleep 1 # the signal ends this process before this returns
      rescue ArgumentError
        nil # a signal Ruby keeps for itself (SEGV, BUS...): the shell's convention instead
      end
      128 + signal
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
      0
    end
  end
end
