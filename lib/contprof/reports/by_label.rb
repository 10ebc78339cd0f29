# frozen_string_literal: true

require_relative "../pprof/endpoint_counts_comment"

module Contprof
  module Report
    # `contprof report --by KEY`: a table of a label's values (endpoints, tenants...) with
    # each time type's total and share, most expensive first, and when the profile counts
    # its samples, the samples behind each share and its standard error. For endpoints, the
    # requests Contprof::Rack counted (kept in each profile's comments) and the CPU per
    # request too.
    module ByLabel
      ENDPOINT_KEYS = ["endpoint", "trace endpoint"].freeze

      class << self
        def format(profile, key, types: nil, limit: 20)
          types ||= default_types(profile)
          unless profile.labels.any? { |labels| labels.key?(key) }
            keys = profile.labels.uniq.flat_map(&:keys).uniq.sort
            raise InputError, "no sample has the label #{key.inspect} (label keys: #{keys.empty? ? "none" : keys.join(", ")})"
          end

          counts = ENDPOINT_KEYS.include?(key) ? EndpointCountsComment.counts(profile.comments) : {}
          count_indexes = types.map { |type| Report.sample_count_index(profile, type) }
          rows = totals(profile, key, types, count_indexes)
          counts.each_key { |name| rows[name] ||= Array.new(types.size * 2, 0) }
          grand = (0...types.size * 2).map { |j| rows.each_value.sum { |row| row[j] } }
          # (a count type that nobody filled in says nothing)
          count_indexes = count_indexes.each_with_index.map { |index, j| index if grand[types.size + j].positive? }
          sorted = rows.sort_by { |name, row| [-row.first, name] }
          lines = ["by #{key}: #{Report.describe_source(profile)}" \
                   "#{sorted.size > limit ? "; top #{limit} of #{sorted.size} values" : ""}"]
          lines << header(types, counts, count_indexes)
          sorted.first(limit).each { |name, row| lines << line(name, row, grand, types, counts, count_indexes, profile) }
          "#{lines.join("\n")}\n"
        end

        private

        def default_types(profile)
          time = profile.sample_type_names.select { |type| type.end_with?("-time") }
          time.empty? ? profile.sample_type_names : time
        end

        # Per label value: each type's total, then (at types.size + j) the samples behind it.
        def totals(profile, key, types, count_indexes)
          indices = types.map { |type| profile.type_index(type) }
          rows = {}
          profile.labels.each_with_index do |labels, i|
            value = labels[key]
            name = value.nil? ? "(no #{key})" : value.to_s
            row = rows[name] ||= Array.new(types.size * 2, 0)
            values = profile.values[i]
            indices.each_with_index do |index, j|
              row[j] += values[index]
              # (Counted where the value is 0 too: see Report.top_rows.)
              row[types.size + j] += values[count_indexes[j]] if count_indexes[j]
            end
          end
          rows
        end

        def per_request?(types, counts)
          !counts.empty? && types.include?("cpu-time")
        end

        def header(types, counts, count_indexes)
          columns = []
          columns << Kernel.format("%9s", "requests") unless counts.empty?
          types.each_with_index do |type, j|
            columns << Kernel.format("%12s %6s", type, "%")
            columns << Kernel.format("%7s %7s", "± %", "samples") if count_indexes[j]
          end
          columns << Kernel.format("%12s", "cpu/request") if per_request?(types, counts)
          columns.join(" ").rstrip
        end

        def line(name, row, grand, types, counts, count_indexes, profile)
          columns = []
          columns << Kernel.format("%9s", counts.key?(name) ? counts[name] : "-") unless counts.empty?
          types.each_with_index do |type, j|
            unit = profile.sample_types[profile.type_index(type)].unit
            columns << Kernel.format("%12s %6s", Report.format_value(row[j], unit), Report.percentage(row[j], grand[j]).strip)
            next unless count_indexes[j]

            samples = row[types.size + j]
            columns << Kernel.format("%7s %7d", Report.share_error(row[j], grand[j], row[types.size + j], grand[types.size + j]), samples)
          end
          if per_request?(types, counts)
            requests = counts[name].to_i
            cpu = row[types.index("cpu-time")]
            columns << Kernel.format("%12s", requests.positive? ? Report.format_value(cpu / requests, "nanoseconds") : "-")
          end
          "#{columns.join(" ")}  #{name}"
        end
      end
    end
  end
end
