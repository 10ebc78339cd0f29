# frozen_string_literal: true

module Contprof
  module Report
    # `contprof report DIR --growth`: which allocation sites' live heap grows across the
    # periods of a directory, ranked by their slope per hour: what a leak looks like, found
    # without a heap dump. Each profile with `heap` holds a snapshot of the sampled objects
    # still alive at its flush, so a site's value across one process's files is a time
    # series; a straight line fitted to it (least squares) gives the growth per hour, its
    # standard error, and how much of the series' variation the line explains (R²).
    #
    # Several processes (files <service>-<pid>-<start>.pprof) are separate series: a site's
    # growth is the sum of its slopes in each (the growth of the fleet's total), its error
    # the root of the summed variances, its R² pooled. A site is the leaf frame of its
    # stacks (a C method carries its caller's file and line) and the `allocation class`.
    module Growth
      Site = Struct.new(:function, :file, :line, :klass, :caller)
      Row = Struct.new(:site, :slope, :error, :r2, :rises, :steps, :last)
      # A site's fits summed over processes: slopes, their variances, residual and total sums
      # of squares, periods that rose, steps, and the last periods' values.
      Fit = Struct.new(:slope, :variance, :sse, :sst, :rises, :steps, :last)

      # At least this many periods in a process for its series to count: a line through
      # two points has no error to state.
      MIN_PERIODS = 3
      NANOS_PER_HOUR = 3600 * 1_000_000_000
      PROCESS_IN_NAME = /-(\d+)-\d{8}T\d{6}(?:\.\d+)?Z\.(?:pprof|otlp)\z/

      class << self
        # `profiles`: [path, Pprof::Profile] pairs (any order); `labels`: [key, value] pairs
        # every counted sample must carry.
        def rows(profiles, type, labels: [])
          series = Hash.new { |h, k| h[k] = [] } # process => [[time, {site => value}]]
          unit = nil
          profiles.each do |path, profile|
            unit ||= profile.sample_types[profile.type_index(type)].unit
            series[process_of(path)] << [profile.time_nanos + profile.duration_nanos, site_values(profile, type, labels)]
          end
          usable = series.values.select { |points| points.size >= MIN_PERIODS }
          if usable.empty?
            raise InputError, "--growth needs at least #{MIN_PERIODS} periods of one process " \
                              "(got #{series.values.map(&:size).max || 0}; profiles are written every upload_period)"
          end

          fits = Hash.new { |h, k| h[k] = Fit.new(0.0, 0.0, 0.0, 0.0, 0, 0, 0) }
          usable.each { |points| add_process(points.sort_by(&:first), fits) }
          rows = fits.map do |site, fit|
            Row.new(site, fit.slope, Math.sqrt(fit.variance), fit.sst.positive? ? 1.0 - fit.sse / fit.sst : 0.0,
                    fit.rises, fit.steps, fit.last)
          end
          [rows.sort_by { |row| [-row.slope, row.site.to_a.map(&:to_s)] }, usable, unit]
        end

        # The text of `--growth`: a header, then the sites whose live heap grew.
        def format(profiles, type, labels: [], limit: 20)
          rows, usable, unit = rows(profiles, type, labels: labels)
          growing = rows.select { |row| row.slope.positive? }
          periods = usable.sum(&:size)
          times = usable.flat_map { |points| points.map(&:first) }
          lines = ["#{type} growth per hour: #{periods} periods of #{usable.size} " \
                   "process#{usable.size == 1 ? "" : "es"}, #{iso(times.min)} to #{iso(times.max)}; #{growing.size} of #{rows.size} sites grew" \
                   "#{growing.size > limit ? ", top #{limit}" : ""}",
                   Kernel.format("%12s %11s %5s %7s %10s  %s", "growth/h", "± (1 se)", "R²", "rising", "last", "site")]
          growing.first(limit).each do |row|
            lines << Kernel.format("%12s %11s %5.2f %7s %10s  %s", Report.format_value(row.slope.round, unit),
                                   Report.format_value(row.error.round, unit), row.r2,
                                   "#{row.rises}/#{row.steps}", Report.format_value(row.last, unit), describe(row.site))
          end
          lines << "(no site's #{type} grew)" if growing.empty?
          "#{lines.join("\n")}\n"
        end

        def describe(site)
          where = site.line.to_i.positive? ? "#{site.file}:#{site.line}" : site.file.to_s
          text = +"#{site.function} #{where}"
          text << " in #{site.caller}" if site.caller
          text << " (#{site.klass})" if site.klass
          text
        end

        private

        def iso(nanos)
          Time.at(nanos / 1_000_000_000, nanos % 1_000_000_000, :nsec).utc.iso8601
        end

        def process_of(path)
          name = File.basename(path)
          match = PROCESS_IN_NAME.match(name)
          match ? name[0, match.begin(0)] + "-#{match[1]}" : :unnamed
        end

        def site_values(profile, type, labels)
          index = profile.type_index(type)
          sites = {}
          totals = Hash.new(0)
          profile.stacks.each_with_index do |stack, i|
            value = profile.values[i][index]
            next if value.zero? || stack.empty?

            sample_labels = profile.labels[i]
            next unless labels.all? { |key, wanted| sample_labels[key].to_s == wanted }

            leaf = profile.frames[stack[0]]
            caller = stack.size > 1 && profile.frames[stack[1]]
            key = [leaf.to_a, sample_labels["allocation class"], caller && caller.function_name]
            sites[key] ||= Site.new(leaf.function_name, leaf.file_name, leaf.line, key[1], key[2])
            totals[sites[key]] += value
          end
          totals
        end

        # Adds one process's least-squares fit of each site to `fits` (a site absent from a
        # period had nothing alive there: 0).
        def add_process(points, fits)
          hours = points.map { |time, _| (time - points[0][0]).fdiv(NANOS_PER_HOUR) }
          n = points.size
          mean_x = hours.sum / n
          sxx = hours.sum { |x| (x - mean_x)**2 }
          return unless sxx.positive?

          sites = points.flat_map { |_, values| values.keys }.uniq
          sites.each do |site|
            ys = points.map { |_, values| values.fetch(site, 0) }
            mean_y = ys.sum.fdiv(n)
            sxy = hours.each_index.sum { |k| (hours[k] - mean_x) * (ys[k] - mean_y) }
            syy = ys.sum { |y| (y - mean_y)**2 }
            slope = sxy / sxx
            sse = [syy - slope * sxy, 0.0].max
            fit = fits[site]
            fit.slope += slope
            fit.variance += sse / (n - 2) / sxx
            fit.sse += sse
            fit.sst += syy
            fit.rises += ys.each_cons(2).count { |a, b| b > a }
            fit.steps += n - 1
            fit.last += ys.last
          end
        end
      end
    end
  end
end
