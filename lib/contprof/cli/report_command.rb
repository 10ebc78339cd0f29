# frozen_string_literal: true

require "optparse"
require "time"
require_relative "../reports/report"
require_relative "../reports/profiles"

module Contprof
  module Report
    # `contprof report FILE|DIR...`: options, then which outputs to make. At most one
    # report goes to standard output (--top or --folded: the default is --top 20); the
    # file outputs (--flamegraph, --speedscope) can be added to it or made alone.
    class Command
      def initialize(out:, err:)
        @out = out
        @err = err
      end

      def run(arguments)
        options = { threads: [], labels: [], stdout_modes: [], base: [] }
        parser = option_parser(options)
        files = parser.parse(arguments)
        return 0 if options[:help]

        options[:stdout_modes].delete("top") if options[:stdout_modes].include?("growth") # --top N: its rows
        if options[:stdout_modes].uniq.size > 1
          raise CLI::UsageError, "choose one of #{options[:stdout_modes].uniq.map { |m| "--#{m}" }.join(" and ")} " \
                                 "(both print to standard output; --flamegraph and --speedscope can be added to either)"
        end

        return growth(files, options) if options[:stdout_modes].include?("growth")
        return compare(files, options) unless options[:base].empty? && options[:base_version].nil?

        # (Summed per stack unless an output draws the timeline: far faster on many files.)
        profile = Profiles.load(files, from: options[:from], to: options[:to], version: options[:version],
                                       aggregate: !(options[:flamegraph] || options[:speedscope]))
        check_type(profile, options[:type], files) if options[:type]
        profile = Profiles.filter(profile, threads: options[:threads], labels: options[:labels])
        write_outputs(profile, options, files)
        0
      end

      private

      def option_parser(options)
        OptionParser.new do |o|
          o.banner = "usage: contprof report FILE|DIR... [--top N | --folded | --by KEY | --growth] [--flamegraph OUT.html] " \
                     "[--speedscope OUT.json]\n" \
                     "                      [--type TYPE] [--thread NAME|ID]... [--label KEY=VALUE]... " \
                     "[--from TIME] [--to TIME]\n" \
                     "                      [--version V] [--base FILE|DIR]... [--base-from TIME] [--base-to TIME] " \
                     "[--base-version V]\n\n" \
                     "Reads pprof and OTLP files (gzip-compressed or not; a directory means its *.pprof files) and " \
                     "merges " \
                     "them:\ntheir sample types must be the same. Without an output option, prints the top 20 " \
                     "functions of each\nsample type.\n\noptions:"
          o.on("--top N", Integer, "the N functions with the most self time, per sample type (default 20)") do |n|
            raise CLI::UsageError, "--top needs a positive number (got #{n})" unless n.positive?

            options[:stdout_modes] << "top"
            options[:limit] = n
          end
          o.on("--by KEY", "a table of KEY's label values (endpoint, ...) with their time, requests and CPU per request") do |key|
            raise CLI::UsageError, "--by needs a label key (got #{key.inspect})" if key.empty? || key.start_with?("-")

            options[:stdout_modes] << "by"
            options[:by] = key
          end
          o.on("--growth", "sites whose live heap grows across the files' periods, by growth per hour " \
                           "(--type heap-live-size by default)") do
            options[:stdout_modes] << "growth"
          end
          o.on("--base FILE|DIR", "compare with these profiles (repeat for several): --top shows each function's " \
                                  "change, --flamegraph colours it") do |path|
            options[:base] << output_path("--base", path)
          end
          o.on("--base-from TIME", "only base files whose period ends after TIME (ISO 8601)") do |t|
            options[:base_from] = parse_time("--base-from", t)
          end
          o.on("--base-to TIME", "only base files whose period starts before TIME (ISO 8601)") do |t|
            options[:base_to] = parse_time("--base-to", t)
          end
          o.on("--version V", "only profiles of the deploy whose `version` setting was V") do |v|
            options[:version] = v
          end
          o.on("--base-version V", "compare with the profiles of version V (of the --base files, else of the " \
                                   "same files: before and after a deploy)") do |v|
            options[:base_version] = v
          end
          o.on("--folded", "folded stacks (root;...;leaf value) of one sample type, for FlameGraph tools") do
            options[:stdout_modes] << "folded"
          end
          o.on("--flamegraph OUT.html", "write a self-contained interactive HTML flame graph to OUT.html") do |path|
            options[:flamegraph] = output_path("--flamegraph", path)
          end
          o.on("--speedscope OUT.json", "write speedscope's JSON file (one profile per sample type and thread)") do |path|
            options[:speedscope] = output_path("--speedscope", path)
          end
          o.on("--type TYPE", "sample type for --top and --folded (default: all for --top, cpu-time for --folded)") do |t|
            options[:type] = t
          end
          o.on("--thread NAME|ID", "only samples of this thread (its name or id label); repeat for several") do |t|
            options[:threads] << t
          end
          o.on("--label KEY=VALUE", "only samples with this label; repeat: all must match") do |pair|
            key, separator, value = pair.partition("=")
            raise CLI::UsageError, "--label takes KEY=VALUE (got #{pair.inspect})" if separator.empty? || key.empty?

            options[:labels] << [key, value]
          end
          o.on("--from TIME", "only files whose period ends after TIME, and of timeline samples those ending after it (ISO 8601, e.g. 2026-12-03T15:04:05Z)") do |t|
            options[:from] = parse_time("--from", t)
          end
          o.on("--to TIME", "only files whose period starts before TIME, and of timeline samples those starting before it (ISO 8601)") { |t| options[:to] = parse_time("--to", t) }
          o.on("-h", "--help", "show this help") do
            @out.puts(o)
            options[:help] = true
          end
        end
      end

      def output_path(flag, path)
        raise CLI::UsageError, "#{flag} needs a file name (got #{path.inspect})" if path == "--" || path.start_with?("-")

        path
      end

      def parse_time(flag, text)
        Time.iso8601(text)
      rescue ArgumentError
        raise CLI::UsageError, "#{flag} takes an ISO 8601 time such as 2026-12-03T15:04:05Z or " \
                               "2026-12-03T16:04:05+01:00 (got #{text.inspect})"
      end

      # --base: the profiles as for any report, and the base the same way, both filtered
      # alike; --top (the default) and --flamegraph compare them.
      def compare(files, options)
        other = (options[:stdout_modes] - ["top"]).first || (options[:speedscope] && "speedscope")
        raise CLI::UsageError, "--base compares with --top and --flamegraph only (not --#{other})" if other

        base_files = options[:base].empty? ? files : options[:base]
        profile = Profiles.load(files, from: options[:from], to: options[:to], version: options[:version],
                                       aggregate: !options[:flamegraph])
        base = Profiles.load(base_files, from: options[:base_from], to: options[:base_to], version: options[:base_version],
                                         aggregate: true)
        if options[:type]
          check_type(profile, options[:type], files)
          check_type(base, options[:type], base_files)
        end
        profile = Profiles.filter(profile, threads: options[:threads], labels: options[:labels])
        base = Profiles.filter(base, threads: options[:threads], labels: options[:labels])
        require_relative "../reports/comparison"
        if options[:flamegraph]
          require_relative "../reports/flamegraph"
          Flamegraph.write(profile, options[:flamegraph], base: base,
                                                          title: "#{title_of(files)} against #{title_of(options[:base])} — Contprof")
          (options[:stdout_modes].empty? ? @out : @err).puts("wrote #{options[:flamegraph]}")
          return 0 if options[:stdout_modes].empty?
        end
        @out.print(Comparison.format_top(profile, base, limit: options.fetch(:limit, 20), types: options[:type] && [options[:type]]))
        0
      end

      def title_of(files)
        files.size == 1 ? File.basename(files.first) : "#{files.size} inputs"
      end

      GROWTH_DEFAULT_TYPE = "heap-live-size"

      # --growth reads the files one at a time (a week of them need not fit in memory).
      def growth(files, options)
        if (extra = %i[flamegraph speedscope].find { |key| options[key] }) || !options[:threads].empty?
          raise CLI::UsageError, "--growth prints a table alone: drop #{extra ? "--#{extra}" : "--thread (heap samples have no thread)"}"
        end

        type = options[:type] || GROWTH_DEFAULT_TYPE
        profiles = Profiles.each_file(files, from: options[:from], to: options[:to], version: options[:version],
                                             leaf_frames: 2).lazy.map do |path, profile|
          unless profile.sample_type_names.include?(type)
            hint = type == GROWTH_DEFAULT_TYPE ? "; the live heap is profiled on Ruby 3.3+ (heap: auto, the default)" : ""
            raise CLI::UsageError, "no sample type #{type.inspect} in #{path} (it has #{profile.sample_type_names.join(", ")})#{hint}"
          end
          [path, profile]
        end
        require_relative "../reports/growth"
        table = Growth.format(profiles, type, labels: options[:labels], limit: options.fetch(:limit, 20))
        @out.print(table)
        0
      end

      def check_type(profile, type, files)
        return if profile.sample_type_names.include?(type)

        raise CLI::UsageError, "no sample type #{type.inspect} in #{files.join(", ")} " \
                               "(it has #{profile.sample_type_names.join(", ")})"
      end

      def write_outputs(profile, options, files)
        title = "#{files.size == 1 ? File.basename(files.first) : "#{files.size} inputs"} — Contprof"
        if options[:flamegraph]
          require_relative "../reports/flamegraph"
          Flamegraph.write(profile, options[:flamegraph], title: title)
          @err.puts("wrote #{options[:flamegraph]}") unless options[:stdout_modes].empty?
          @out.puts("wrote #{options[:flamegraph]}") if options[:stdout_modes].empty?
        end
        if options[:speedscope]
          require_relative "../reports/speedscope"
          Speedscope.write(profile, options[:speedscope], name: title)
          (options[:stdout_modes].empty? ? @out : @err).puts("wrote #{options[:speedscope]}")
        end
        mode = options[:stdout_modes].first || (options[:flamegraph] || options[:speedscope] ? nil : "top")
        case mode
        when "top"
          @out.print(Report.format_top(profile, limit: options.fetch(:limit, 20), types: options[:type] && [options[:type]]))
        when "folded"
          @out.print(Report.folded(profile, options[:type] || Report.default_type(profile)))
        when "by"
          require_relative "../reports/by_label"
          @out.print(ByLabel.format(profile, options[:by], types: options[:type] && [options[:type]],
                                    limit: options.fetch(:limit, 20)))
        end
      end
    end
  end
end
