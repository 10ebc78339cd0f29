# frozen_string_literal: true

require_relative "report"

module Contprof
  module Report
    # `contprof report NEW... --base OLD...`: what changed between two profiles (two
    # deploys, two time ranges). Per sample type, every function of either, with its flat
    # value in each, the change, its flat share in each and the change of share in points,
    # with the standard error of that change (from the samples behind each share, as
    # Report.share_error): a change of a few points over a few samples is noise, and says so.
    # Sorted by the change of share, which compares profiles of different lengths fairly.
    module Comparison
      Row = Struct.new(:name, :flat, :base_flat, :share, :base_share, :error) do
        def change = share - base_share
      end

      class << self
        # The rows of `type`: all functions of either profile, by |change of share|, then name.
        # `new_rows`, `base_rows`: the profiles' tables of that type (Report.tops), when read
        # already.
        def rows(profile, base, type, new_rows: Report.top(profile, type, limit: nil),
                 base_rows: Report.top(base, type, limit: nil))
          total = profile.total(type)
          base_total = base.total(type)
          base_by_name = base_rows.to_h { |row| [row.name, row] }
          names = new_rows.map(&:name) | base_rows.map(&:name)
          new_by_name = new_rows.to_h { |row| [row.name, row] }
          rows = names.map do |name|
            mine = new_by_name[name]
            theirs = base_by_name[name]
            flat = mine ? mine.flat : 0
            base_flat = theirs ? theirs.flat : 0
            Row.new(name, flat, base_flat, share(flat, total), share(base_flat, base_total),
                    change_error(flat, total, mine&.samples || 0, new_rows.sample_total,
                                 base_flat, base_total, theirs&.samples || 0, base_rows.sample_total))
          end
          # (Functions with no time of their own in either are left out: their callees show it.)
          rows.reject { |row| row.flat.zero? && row.base_flat.zero? }.sort_by { |row| [-row.change.abs, row.name] }
        end

        # The text of --top with --base: per type, a header line and the rows.
        def format_top(profile, base, limit: 20, types: nil)
          types ||= profile.sample_type_names & base.sample_type_names
          # (Every type's table from one pass over each profile's samples.)
          new_tables = Report.tops(profile, types, limit: nil)
          base_tables = Report.tops(base, types, limit: nil)
          sections = types.each_with_index.map do |type, t|
            unit = profile.sample_types[profile.type_index(type)].unit
            total = profile.total(type)
            base_total = base.total(type)
            rows = rows(profile, base, type, new_rows: new_tables[t], base_rows: base_tables[t])
            relative = base_total.zero? ? "" : format(" (%+.1f%%)", 100.0 * (total - base_total) / base_total)
            lines = ["#{type}: #{Report.format_value(total, unit)} in all, base #{Report.format_value(base_total, unit)}" \
                     "#{relative}; new: #{Report.describe_source(profile)}; base: #{Report.describe_source(base)}" \
                     "#{rows.size > limit ? "; top #{limit} of #{rows.size} functions by change of share" : ""}",
                     format("%10s %10s %11s %7s %7s %8s %9s  %s", "flat", "base flat", "change", "flat%", "base%",
                            "change", "± (1 se)", "name")]
            rows.first(limit).each do |row|
              lines << format("%10s %10s %11s %6.2f%% %6.2f%% %+7.2fpt %9s  %s",
                              Report.format_value(row.flat, unit), Report.format_value(row.base_flat, unit),
                              signed(row.flat - row.base_flat, unit), 100 * row.share, 100 * row.base_share,
                              100 * row.change, row.error ? Report.format_error(100 * row.error, "pt") : "-", row.name)
            end
            lines.join("\n")
          end
          "#{sections.join("\n\n")}\n"
        end

        private

        def share(part, whole)
          whole.zero? ? 0.0 : part.to_f / whole
        end

        # The standard error of the difference of two independent shares.
        def change_error(flat, total, samples, all, base_flat, base_total, base_samples, base_all)
          mine = total.zero? ? 0.0 : Report.share_standard_error(flat, total, samples, all)
          theirs = base_total.zero? ? 0.0 : Report.share_standard_error(base_flat, base_total, base_samples, base_all)
          mine && theirs && Math.sqrt(mine**2 + theirs**2)
        end

        def signed(value, unit)
          value.zero? ? "0" : "#{value.positive? ? "+" : ""}#{Report.format_value(value, unit)}"
        end
      end
    end
  end
end
