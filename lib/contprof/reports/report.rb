# frozen_string_literal: true

module Contprof
  # Reading profiles from the command line: top functions (the rows of `go tool pprof
  # -top`, digit for digit), folded stacks, and the pieces the HTML flame graph
  # (Contprof::Flamegraph) and the speedscope file (Contprof::Speedscope) share: which
  # thread a sample belongs to and which samples are idle waits.
  module Report
    class InputError < StandardError; end

    # `samples`: how many samples stand behind `flat` (nil when the profile does not say).
    Row = Struct.new(:name, :flat, :cumulative, :samples)

    # For each sample type, the type that counts the samples behind its values (Contprof's
    # profiles have them; other writers' may not): an estimate's error bar.
    SAMPLE_COUNT_TYPES = {
      "cpu-time" => "cpu-samples", "cpu-samples" => "cpu-samples",
      "wall-time" => "wall-samples", "wall-samples" => "wall-samples",
      "alloc-samples" => "alloc-samples-unscaled", "alloc-size" => "alloc-samples-unscaled",
      "alloc-samples-unscaled" => "alloc-samples-unscaled",
      "heap-live-samples" => "heap-live-samples-unscaled", "heap-live-size" => "heap-live-samples-unscaled",
      "heap-live-samples-unscaled" => "heap-live-samples-unscaled"
    }.freeze


    # The first rows of a top table (an Array of Row, sorted by flat then name), the number
    # of rows in all (`count`) and their smallest non-zero value (`smallest`: a row's flat,
    # else its cum), without building or sorting the other rows: a profile may hold a
    # hundred thousand functions for a table of 20. With `flat_samples` (per function, the
    # samples behind its flat value), `sample_total` is the samples behind the table's total.
    class TopRows < Array
      attr_reader :count, :smallest, :sample_total

      def initialize(names, flat, cumulative, limit, flat_samples = nil, sample_total = nil)
        @sample_total = sample_total
        present = (0...names.size).select { |f| cumulative[f] }
        @count = present.size
        @smallest = nil
        present.each do |f|
          value = flat[f].zero? ? cumulative[f].abs : flat[f].abs
          @smallest = value if value.positive? && (@smallest.nil? || value < @smallest)
        end
        picked = if limit.nil? || present.size <= limit
                   present
                 else
                   # Rows above the limit-th largest |flat|, then ties at it by name.
                   threshold = present.map { |f| flat[f].abs }.max(limit).last
                   above = present.select { |f| flat[f].abs > threshold }
                   above + present.select { |f| flat[f].abs == threshold }.min_by(limit - above.size) { |f| names[f] }
                 end
        super(picked.sort_by { |f| [-flat[f].abs, names[f]] }
                    .map { |f| Row.new(names[f], flat[f], cumulative[f], flat_samples && flat_samples[f]) })
      end
    end

    # Functions a thread blocks in while it waits for something else (a timer, a queue,
    # a lock, a socket, a child process). A sample whose leaf frame is one of these is an
    # "idle wait": its wall time passed with the thread doing nothing. The profiles have no
    # thread-state label, and on Ruby 3.3+ a thread waiting and one running native code
    # look alike to the sampler (see the README), so this is decided by name.
    IDLE_WAIT_FUNCTIONS = %w[
      Kernel#sleep Thread::Queue#pop Thread::SizedQueue#pop Thread::SizedQueue#push
      Thread::Mutex#lock Thread::Mutex#sleep Thread::ConditionVariable#wait Thread#join Thread#value
      MonitorMixin::ConditionVariable#wait Monitor#wait_for_cond
      IO.select Kernel#select IO#wait IO#wait_readable IO#wait_writable IO#wait_priority
      IO#read IO#readpartial IO#gets IO#readline IO#sysread IO#getc IO#getbyte Kernel#gets
      BasicSocket#recv BasicSocket#recvmsg Socket#accept TCPServer#accept UNIXServer#accept
      TCPSocket#initialize Addrinfo.getaddrinfo
      Process.wait Process.wait2 Process.waitpid Process.waitpid2 Process.waitall Process::Status.wait
      Kernel#system Kernel#` Kernel#spawn
    ].freeze

    IDLE_WAIT = IDLE_WAIT_FUNCTIONS.to_h { |name| [name, true] }.freeze
    private_constant :IDLE_WAIT

    # The "thread state" label values of a thread doing nothing: waiting for time, a queue,
    # a lock or I/O. ("waiting for gvl" is not one: that thread wants to run.)
    IDLE_STATES = %w[sleeping waiting io].freeze

    NO_THREAD = "(no thread label)"

    class << self
      # The sample type to read when one is needed and none was asked for.
      def default_type(profile)
        profile.sample_type_names.include?("cpu-time") ? "cpu-time" : profile.sample_type_names.first
      end

      # A sample's thread: its "thread id" label (the stable one), else its "thread name".
      # The thread's id (a number: Contprof writes it as a string of digits, as Datadog's
      # profilers do, older profiles as a number), else its name.
      def thread_key(labels)
        id = labels["thread id"]
        id = Integer(id, 10) if id.is_a?(String) && id.match?(/\A\d+\z/)
        id || labels["thread name"] || NO_THREAD
      end

      # Thread ids in increasing order, then thread names, then "no thread label".
      def sort_thread_keys(keys)
        keys.sort_by { |key| key.is_a?(Integer) ? [0, key, ""] : [key == NO_THREAD ? 2 : 1, 0, key.to_s] }
      end

      # "name (id)" for a thread key, from the labels of its samples.
      def thread_title(key, name = nil)
        return key.to_s if key == NO_THREAD || key.is_a?(String)

        name ? "#{name} (#{key})" : "thread #{key}"
      end

      # Per frame id: true when the frame is an idle wait (see IDLE_WAIT_FUNCTIONS).
      def idle_frames(profile)
        profile.frames.map { |frame| frame ? IDLE_WAIT.key?(frame.function_name) : false }
      end

      # Whether sample `i` is an idle wait: by its "thread state" label when it has one
      # (profiles since the label exists), else by its leaf (`idle_frames`).
      def idle_sample?(profile, i, idle_frames)
        state = profile.labels[i]["thread state"]
        return IDLE_STATES.include?(state) if state

        stack = profile.stacks[i]
        !stack.empty? && idle_frames[stack[0]]
      end

      # Functions by self ("flat": samples where the function is the leaf) and total
      # ("cumulative": samples where it is anywhere in the stack, counted once), sorted as
      # `go tool pprof -top` sorts them: by flat, then by name. `limit`: only the first rows
      # (the count of all rows is then TopRows#count).
      def top(profile, type, limit: 20)
        top_rows(profile, [type], limit: limit).first
      end

      # `top` of each of `types`, from one pass over the samples.
      def tops(profile, types, limit: 20)
        top_rows(profile, types, limit: limit)
      end

      # The text of `contprof report --top`: per type, a header line and the rows in the
      # columns of `go tool pprof -top`, then (when the profile counts its samples) the
      # samples behind each row's flat value and the standard error of its flat share.
      def format_top(profile, limit: 20, types: nil)
        types ||= profile.sample_type_names
        tables = top_rows(profile, types, limit: limit)
        sections = types.zip(tables).map do |type, rows|
          unit = profile.sample_types[profile.type_index(type)].unit
          total = profile.total(type)
          counted = rows.sample_total&.positive? # (a count type that nobody filled in says nothing)
          lines = ["#{type}: #{format_value(total, unit)} in all, #{describe_source(profile)}" \
                   "#{rows.count > limit ? "; top #{limit} of #{rows.count} functions" : ""}",
                   format("%10s %5s%% %5s%% %10s %5s%%#{counted ? " %8s %8s" : ""}", "flat", "flat", "sum", "cum", "cum",
                          *(counted ? ["samples", "± flat%"] : []))]
          flat_sum = 0
          column_unit = column_unit(rows.smallest, total, unit)
          rows.each do |row|
            flat_sum += row.flat
            errors = counted ? format(" %8d %8s", row.samples, share_error(row.flat, total, row.samples, rows.sample_total)) : ""
            lines << format("%10s %s %s %10s %s%s  %s", in_unit(row.flat, column_unit), percentage(row.flat, total),
                            percentage(flat_sum, total), in_unit(row.cumulative, column_unit),
                            percentage(row.cumulative, total), errors, row.name)
          end
          lines.join("\n")
        end
        "#{sections.join("\n\n")}\n"
      end

      # The standard error of `part`'s share p of `whole`, where `samples` of `all_samples`
      # samples stand behind `part` (as "±1.2%", in points of the whole). Each side's count
      # (n of the part, m of the rest) is taken as Poisson, each of its samples weighing that
      # side's mean: by the delta method the share's error is then p (1 - p) sqrt(1/n + 1/m),
      # which is sqrt(p (1 - p) / (n + m)), the binomial one, when the weights are equal, and
      # follows them when they are not (allocation samples weigh the sampling interval, which
      # grows with the allocation rate; CPU and wall samples their interval). Checked against
      # programs that know their truth in test/reports/error_bars_test.rb.
      def share_error(part, whole, samples, all_samples)
        error = share_standard_error(part, whole, samples, all_samples)
        error ? format_error(error * 100, "%") : "-"
      end

      # share_error as a fraction of the whole (0.012), or nil when the counts cannot say.
      def share_standard_error(part, whole, samples, all_samples)
        return nil if whole.zero? || samples.nil? || all_samples.nil? || (samples.zero? && !part.zero?)

        p = (part.to_f / whole).clamp(0.0, 1.0)
        rest = all_samples - samples
        if p.zero? || p == 1.0 then 0.0
        elsif samples.zero? || rest <= 0 then Math.sqrt(p * (1 - p) / all_samples)
        else p * (1 - p) * Math.sqrt(1.0 / samples + 1.0 / rest)
        end
      end

      # "±1.2%" (two significant digits under 1).
      def format_error(error, suffix)
        error >= 1 ? format("±%.1f%s", error, suffix) : format("±%.2g%s", error, suffix)
      end

      # The index of the type counting `type`'s samples, or nil when the profile has none.
      def sample_count_index(profile, type)
        name = SAMPLE_COUNT_TYPES[type]
        name && profile.sample_type_names.index(name)
      end

      # Folded ("collapsed") stacks, the FlameGraph tools' input: frames root first,
      # separated by ";", then a space and the value; equal stacks summed.
      def folded(profile, type)
        index = profile.type_index(type)
        names = profile.frames.map { |frame| frame&.function_name&.tr(";", ":") }
        totals = Hash.new(0)
        profile.stacks.each_with_index do |stack, i|
          value = profile.values[i][index]
          totals[stack.reverse.map { |id| names[id] }.join(";")] += value unless value.zero?
        end
        totals.sort.map { |stack, value| "#{stack} #{value}\n" }.join
      end

      # A value as `go tool pprof` prints it: time and byte units scaled to the largest
      # unit the value reaches, two decimals without a trailing ".00"; other units bare.
      def format_value(value, unit)
        return "-#{format_value(-value, unit)}" if value.negative?

        scaled, suffix = scale(value, unit)
        text = format("%.2f", scaled).delete_suffix(".00")
        text == "0" ? "0" : "#{text}#{suffix}"
      end

      # A share of the total as `go tool pprof` prints it.
      def percentage(value, total)
        ratio = total.zero? ? 0.0 : (value.to_f / total).abs * 100
        if ratio >= 99.95 && ratio <= 100.05 then "  100%"
        elsif ratio >= 1.0 then format("%5.2f%%", ratio)
        else format("%5.2g%%", ratio)
        end
      end

      private

      TIME_UNITS = [["ns", 1], ["us", 1e3], ["ms", 1e6], ["s", 1e9], ["hrs", 3600e9]].freeze
      BYTE_UNITS = [["B", 1], ["kB", 2.0**10], ["MB", 2.0**20], ["GB", 2.0**30], ["TB", 2.0**40], ["PB", 2.0**50]].freeze
      UNIT_FACTORS = { "nanoseconds" => [TIME_UNITS, 1], "microseconds" => [TIME_UNITS, 1e3],
                       "milliseconds" => [TIME_UNITS, 1e6], "seconds" => [TIME_UNITS, 1e9],
                       "bytes" => [BYTE_UNITS, 1] }.freeze
      private_constant :TIME_UNITS, :BYTE_UNITS, :UNIT_FACTORS

      def scale(value, unit)
        units, factor = UNIT_FACTORS[unit]
        return [value.to_f, ""] unless units

        name, size = auto_unit(value, unit)
        [value * factor.to_f / size, name]
      end

      # The largest unit of `unit`'s kind that `value` reaches (seconds or bytes when none).
      def auto_unit(value, unit)
        units, factor = UNIT_FACTORS.fetch(unit)
        base = value * factor.to_f
        units.select { |_, size| base / size >= 1.0 }.last || (units.equal?(TIME_UNITS) ? units[3] : units[0])
      end

      # One unit for a whole table, chosen as `go tool pprof` chooses it: the unit of the
      # smallest non-zero value of all rows (`smallest`: a row's flat, else its cum, see
      # TopRows), moved up while that smallest
      # value stays at 0.01 or more of it when the total is in a larger unit.
      # nil: the values are printed bare.
      def column_unit(smallest, total, unit)
        return nil unless UNIT_FACTORS.key?(unit)

        smallest ||= total.abs
        chosen = auto_unit(smallest, unit)
        chosen = auto_unit(100 * smallest, unit) if chosen != auto_unit(total.abs, unit) && smallest * 100 < total.abs
        [*chosen, UNIT_FACTORS[unit][1]]
      end

      def in_unit(value, column_unit)
        return value.to_s unless column_unit

        name, size, factor = column_unit
        text = format("%.2f", value * factor.to_f / size).delete_suffix(".00")
        text == "0" || text == "-0" ? "0" : "#{text}#{name}"
      end

      # The rows of `top` for each of `types`, from one pass over the samples: each
      # sample's functions are found once (deduplicated for "cum") and added to every type
      # in which the sample has a value. Only the first `limit` rows are sorted; the rest are
      # counted, and searched for the smallest value the unit of the table depends on.
      def top_rows(profile, types, limit:)
        indexes = types.map { |type| profile.type_index(type) }
        count_indexes = types.map { |type| sample_count_index(profile, type) }
        names, function_of = function_ids(profile)
        flats = indexes.map { Array.new(names.size, 0) }
        flat_samples = count_indexes.map { |index| index && Array.new(names.size, 0) }
        sample_totals = count_indexes.map { |index| index && 0 }
        cumulatives = indexes.map { Array.new(names.size) } # nil: the function is not in the table
        seen_in = Array.new(names.size, -1)
        functions = []
        stacks = profile.stacks
        values = profile.values
        type_count = indexes.size
        # (while loops: this is the report's inner loop, a few million steps on big profiles)
        i = 0
        while i < stacks.size
          stack = stacks[i]
          row = values[i]
          functions.clear
          j = 0
          while j < stack.size
            function = function_of[stack[j]]
            unless seen_in[function] == i
              seen_in[function] = i
              functions << function
            end
            j += 1
          end
          t = 0
          while t < type_count
            value = row[indexes[t]]
            # (Counted where the value is 0 too: on a timeline the nanoseconds of one stack's
            # samples are carried between neighbours (pprof_timeline.c), so a sample may keep its
            # count and give its time to the next; only their sums are what was recorded.)
            if (count_index = count_indexes[t]) && (samples = row[count_index]) != 0
              sample_totals[t] += samples
              flat_samples[t][functions[0]] += samples unless functions.empty?
            end
            if value != 0 && !functions.empty?
              flats[t][functions[0]] += value
              cumulative = cumulatives[t]
              k = 0
              while k < functions.size
                function = functions[k]
                cumulative[function] = (cumulative[function] || 0) + value
                k += 1
              end
            end
            t += 1
          end
          i += 1
        end
        flats.each_index.map do |t|
          TopRows.new(names, flats[t], cumulatives[t], limit, flat_samples[t], sample_totals[t])
        end
      end

      # Function ids: names (Array) and, per frame id, the index of its function's name.
      def function_ids(profile)
        names = []
        index_of = {}
        function_of = profile.frames.map do |frame|
          frame && (index_of[frame.function_name] ||= (names << frame.function_name).size - 1)
        end
        [names, function_of]
      end

      def describe_source(profile)
        seconds = profile.duration_nanos / 1e9
        "#{profile.sample_count} records, #{profile.start_time.iso8601} + #{format("%.2fs", seconds)}"
      end
      public :describe_source
    end
  end
end
