# frozen_string_literal: true

module Contprof
  # Reading a profile from the command line: top functions, folded stacks, and the call
  # tree behind the HTML flame graph (Contprof::Flamegraph).
  module Report
    Row = Struct.new(:name, :flat, :cumulative)

    class << self
      # Functions by self ("flat": samples where the function is the leaf) and total
      # ("cumulative": samples where it is anywhere in the stack, counted once), sorted by
      # flat then cumulative.
      def top(profile, type, limit: 20)
        flat = Hash.new(0)
        cumulative = Hash.new(0)
        profile.samples.each do |sample|
          value = sample.values.fetch(type)
          next if value.zero?

          names = sample.locations.map(&:function_name)
          flat[names.first || "<empty stack>"] += value
          names.uniq.each { |name| cumulative[name] += value }
        end
        rows = cumulative.map { |name, total| Row.new(name, flat[name], total) }
        rows.sort_by { |row| [-row.flat, -row.cumulative, row.name] }.first(limit)
      end

      def format_top(profile, limit: 20, types: nil)
        types ||= profile.sample_type_names
        sections = types.map do |type|
          unit = profile.sample_types.find { |t| t.type == type }&.unit
          total = profile.total(type)
          lines = ["#{type} (#{format_value(total, unit)} in all)",
                   format("%12s %7s %12s %7s  %s", "flat", "flat%", "cum", "cum%", "function")]
          top(profile, type, limit: limit).each do |row|
            lines << format("%12s %6.2f%% %12s %6.2f%%  %s", format_value(row.flat, unit), percent(row.flat, total),
                            format_value(row.cumulative, unit), percent(row.cumulative, total), row.name)
          end
          lines.join("\n")
        end
        "#{sections.join("\n\n")}\n"
      end

      # Folded ("collapsed") stacks, the FlameGraph tools' input: frames root first,
      # separated by ";", then a space and the value; equal stacks summed.
      def folded(profile, type)
        totals = Hash.new(0)
        profile.samples.each do |sample|
          value = sample.values.fetch(type)
          totals[sample.locations.reverse.map { |f| f.function_name.tr(";", ":") }.join(";")] += value unless value.zero?
        end
        totals.sort.map { |stack, value| "#{stack} #{value}\n" }.join
      end

      # The call tree for one sample type: { "n" => name, "v" => total, "s" => self,
      # "c" => [children] }, children by decreasing value.
      def call_tree(profile, type)
        root = { "n" => "all", "v" => 0, "s" => 0, "c" => {} }
        profile.samples.each do |sample|
          value = sample.values.fetch(type)
          next if value.zero?

          node = root
          node["v"] += value
          sample.locations.reverse_each do |frame|
            node = (node["c"][frame.function_name] ||= { "n" => frame.function_name, "v" => 0, "s" => 0, "c" => {} })
            node["v"] += value
          end
          node["s"] += value
        end
        finish_tree(root)
      end

      def format_value(value, unit)
        return value.to_s unless unit == "nanoseconds" && !value.zero?

        seconds = value / 1e9
        if seconds.abs >= 1 then format("%.2fs", seconds)
        elsif seconds.abs >= 1e-3 then format("%.2fms", seconds * 1e3)
        else format("%.2fus", seconds * 1e6)
        end
      end

      private

      def percent(part, total)
        total.zero? ? 0.0 : 100.0 * part / total
      end

      def finish_tree(node)
        node["c"] = node["c"].values.sort_by { |child| [-child["v"], child["n"]] }.map { |child| finish_tree(child) }
        node
      end
    end
  end
end
