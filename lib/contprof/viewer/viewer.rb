# frozen_string_literal: true

require "uri"
require "time"
require "erb"
require_relative "profile_index"
require_relative "parallel"
require_relative "../reports/report"
require_relative "../reports/profiles"
require_relative "../reports/merged_profiles"

module Contprof
  # A Rack application over profile directories (`contprof serve`, or mounted in an app
  # behind its own authentication, as Sidekiq::Web is): a page with the directories'
  # profiles on a time axis where a range is chosen, and for that range the flame graph,
  # the top table, a table by label (endpoint) and live-heap growth, each filtered by
  # thread and label, and compared with a base range. Every view is a GET whose query holds
  # its state, so links keep it.
  #
  # It reads only the files the index (ProfileIndex) places in the range, never a path
  # from the request: nothing outside the directories is read, and nothing is written
  # but the index. A range's profiles are merged by the extension (MergedProfiles), and
  # each whole hour's merge is kept (HOUR_PARTS_BYTES at most), so a range of many hours
  # reads only the files at its edges once its hours have been seen; only a flame graph
  # of at most TIMELINE_FILES files keeps the timeline (lanes per thread), whose samples
  # are each their own record and are read in Ruby. Bad input gets a 4xx with a one-line reason: an unknown path (404), a
  # method other than GET or HEAD (405), a malformed or unknown parameter (400), a range
  # of more than MAX_FILES files or MAX_BYTES bytes (413: narrow it).
  class Viewer
    MAX_FILES = 20_000
    MAX_BYTES = 4 * 1024 * 1024 * 1024
    CACHED_RESPONSES = 16
    TIMELINE_FILES = 16
    HOUR_PARTS_BYTES = 64 * 1024 * 1024
    HOUR_NANOS = 3600 * 1_000_000_000
    MERGERS = 4
    GROWTH_FILES = 2_000
    PARAMETERS = %w[from to base_from base_to version base_version type thread label key limit service span_from span_to].freeze
    # The base of a comparison: its own range, or its own version (before a deploy), or both.
    BASE_KEYS = { from_key: "base_from", to_key: "base_to", version_key: "base_version" }.freeze
    ROUTES = { "/" => :home, "/flamegraph" => :flamegraph, "/top" => :top, "/by" => :by, "/growth" => :growth }.freeze

    class BadRequest < StandardError
      attr_reader :status

      def initialize(message, status = 400)
        super(message)
        @status = status
      end
    end

    # max_files, max_bytes: what one view may read (MAX_FILES, MAX_BYTES by default);
    # growth_files: how many files the growth view reads at most (GROWTH_FILES).
    def initialize(*directories, max_files: MAX_FILES, max_bytes: MAX_BYTES, growth_files: GROWTH_FILES)
      raise ArgumentError, "Contprof::Viewer needs at least one profile directory" if directories.flatten.empty?

      @indexes = directories.flatten.map { |directory| ProfileIndex.new(directory) }
      @max_files = max_files
      @growth_files = growth_files
      @max_bytes = max_bytes
      @cache = {}
      @hour_parts = {} # [directory, hour, files] => MergedProfiles::Part, oldest use first
      @hour_parts_bytes = 0
      @lock = Mutex.new
    end

    def call(env)
      route = ROUTES[env["PATH_INFO"].to_s.empty? ? "/" : env["PATH_INFO"]]
      raise BadRequest.new("no such page: #{printable(env["PATH_INFO"])} (pages: #{ROUTES.keys.join(", ")})", 404) unless route
      unless %w[GET HEAD].include?(env["REQUEST_METHOD"])
        raise BadRequest.new("#{printable(env["REQUEST_METHOD"])} is not allowed: the viewer only reads (GET)", 405)
      end

      query = parse_query(env["QUERY_STRING"].to_s)
      validate(query)
      @script_name = env["SCRIPT_NAME"].to_s # (where the app is mounted: the page's links start there)
      status, type, body = @lock.synchronize do
        # (Each directory is listed once per request: every step below reads this.)
        @entries = @indexes.map { |index| [index, index.entries] }
        cached(route, query) { send(route, query) }
      end
      [status, { "content-type" => type, "cache-control" => "no-store" }, env["REQUEST_METHOD"] == "HEAD" ? [] : [body]]
    rescue BadRequest => e
      [e.status, { "content-type" => "text/plain; charset=utf-8" }, ["#{e.message}\n"]]
    rescue Report::InputError, KeyError => e
      [422, { "content-type" => "text/plain; charset=utf-8" }, ["#{e.message}\n"]]
    end

    private

    def parse_query(string)
      pairs = URI.decode_www_form(string)
      unknown = pairs.map(&:first).uniq - PARAMETERS
      raise BadRequest, "unknown parameter #{printable(unknown.first)} (parameters: #{PARAMETERS.join(", ")})" unless unknown.empty?

      pairs.each_with_object(Hash.new { |h, k| h[k] = [] }) { |(key, value), query| query[key] << value }
    rescue ArgumentError => e
      raise BadRequest, "malformed query string (#{e.message})"
    end

    # Every parameter's form, before any file is read.
    def validate(query)
      %w[from to base_from base_to span_from span_to].each { |key| time(query, key) }
      %w[type key service version base_version].each { |key| single(query, key) }
      limit(query)
      labels(query)
    end

    # A response is kept while the files it read (the range's and the base's) are unchanged;
    # the first page while the indexes' entries are the same objects (an index sorts them
    # anew when a file changes; object ids are never reused).
    def cached(route, query)
      key = if route == :home
              [route, query.sort, @script_name, @entries.map { |index, entries| [entries.object_id, index.unreadable] }]
            else
              picked = selection(query) + (base?(query) ? selection(query, **BASE_KEYS) : [])
              [route, query.sort, picked.map { |index, entry| [index.directory, entry.name, entry.mtime] }]
            end
      return @cache[key] if @cache.key?(key)

      @cache.shift while @cache.size >= CACHED_RESPONSES
      @cache[key] = yield
    end

    def home(query)
      require_relative "home_page"
      page = HomePage.new(@indexes, entries: @entries.flat_map(&:last), max_files: @max_files, mounted_at: @script_name,
                                    span: [time(query, "span_from"), time(query, "span_to")])
      [200, "text/html; charset=utf-8", page.html]
    end

    def flamegraph(query)
      require_relative "../reports/flamegraph"
      profile = load(query, timeline: true)
      base = base_profile(query)
      title = "#{describe(query)} — Contprof"
      if !Report::Profiles.timeline?(profile) && selection(query).any? { |_, entry| entry.reach != [] }
        title += " (timeline lanes for at most #{TIMELINE_FILES} files: narrow the range to see them)"
      end
      [200, "text/html; charset=utf-8", Flamegraph.html(profile, title: title, base: base)]
    end

    def top(query)
      profile = load(query)
      type = types(profile, query)
      limit = limit(query)
      base = base_profile(query)
      text = if base
               require_relative "../reports/comparison"
               Report::Comparison.format_top(profile, base, limit: limit, types: type)
             else
               Report.format_top(profile, limit: limit, types: type)
             end
      [200, "text/plain; charset=utf-8", text]
    end

    def by(query)
      require_relative "../reports/by_label"
      key = single(query, "key") || "endpoint"
      profile = load(query)
      [200, "text/plain; charset=utf-8", Report::ByLabel.format(profile, key, types: types(profile, query), limit: limit(query))]
    end

    # Growth reads each file whole (a series per process): over more than GROWTH_FILES
    # files, evenly spaced files of each process stand for the range (a line fitted to
    # every k-th point of a series has the same slope to expect), as its first line says.
    def growth(query)
      require_relative "../reports/growth"
      picked = selection(query)
      step = (picked.size.to_f / @growth_files).ceil
      if step > 1
        picked = picked.group_by { |index, entry| [index, entry.service, entry.pid] }.values.flat_map do |series|
          series.sort_by { |_, entry| entry.start }.each_slice(step).map(&:last)
        end
      end
      profiles = picked.lazy.map do |index, entry|
        [entry.name, Report::Profiles.each_file([index.path_of(entry)], leaf_frames: 2).first.last]
      end
      type = single(query, "type") || "heap-live-size"
      text = Report::Growth.format(profiles, type, labels: labels(query), limit: limit(query))
      text = "(one profile in #{step} of each process read: at most #{@growth_files} for this view)\n#{text}" if step > 1
      [200, "text/plain; charset=utf-8", text]
    end

    # The entries of every directory in the range [from, to) (of the service and the
    # deploy's version, when given), as [index, entry]; refused when too many to read for
    # one response.
    def selection(query, from_key: "from", to_key: "to", version_key: "version")
      from = time(query, from_key)
      to = time(query, to_key)
      service = single(query, "service")
      version = single(query, version_key)
      picked = @entries.flat_map do |index, entries|
        entries.select do |entry|
          (from.nil? || entry.finish > from) && (to.nil? || entry.start < to) &&
            (service.nil? || entry.service == service) && (version.nil? || entry.version == version)
        end.map { |entry| [index, entry] }
      end
      bytes = picked.sum { |_, entry| entry.size }
      if picked.size > @max_files || bytes > @max_bytes
        raise BadRequest.new("the range holds #{picked.size} profiles (#{bytes} bytes); at most #{@max_files} " \
                             "(#{@max_bytes} bytes) are read for one view: narrow the range (from, to) or pick a service", 413)
      end
      picked
    end

    # The range's profiles, merged and filtered; with `timeline` (a flame graph), kept
    # sample by sample when the range is short enough to draw its lanes.
    def load(query, from_key: "from", to_key: "to", version_key: "version", timeline: false)
      picked = selection(query, from_key: from_key, to_key: to_key, version_key: version_key)
      if picked.empty?
        raise BadRequest.new("no profile in #{from_key}..#{to_key}#{describe_version(query, version_key)} #{describe(query)}", 404)
      end

      profile = merged(picked, time(query, from_key), time(query, to_key)) unless timeline && picked.size <= TIMELINE_FILES
      profile ||= Report::Profiles.load(picked.map { |index, entry| index.path_of(entry) },
                                        from: time_of(query, from_key), to: time_of(query, to_key))
      Report::Profiles.filter(profile, threads: query["thread"], labels: labels(query))
    end

    # `picked` merged over [from, to) (nanoseconds; nil: open): the files of each hour
    # that lie wholly in the range (every timeline stretch too: see ProfileIndex::Entry)
    # from that hour's kept merge, the others cut to the range. Nil when the extension
    # cannot (Profiles.load then reads them in Ruby).
    def merged(picked, from, to)
      return nil unless Report::MergedProfiles.available?

      hours = []
      edges = []
      picked.group_by { |index, entry| [index, entry.start.div(HOUR_NANOS)] }.each do |(index, hour), group|
        inside, partial = group.partition { |_, entry| entry.within?(from, to) }
        edges.concat(partial)
        hours << [index, hour, inside.map(&:last)] unless inside.empty?
      end
      parts = hour_parts(hours) or return nil
      Report::MergedProfiles.load(edges.map { |index, entry| index.path_of(entry) }, from, to, parts: parts)
    end

    # The merge of each hour's `entries` ([index, hour, entries]: the files of one hour of
    # `index` wholly in a range), kept while they are unchanged (least recently used dropped
    # first beyond HOUR_PARTS_BYTES). Hours not kept are merged by up to MERGERS threads at
    # once (the extension merges without the GVL). Nil when one cannot be merged in C.
    def hour_parts(hours)
      keys = hours.map { |index, hour, entries| [index.directory, hour, entries.map { |e| [e.name, e.mtime, e.size] }] }
      missing = keys.each_index.reject { |i| @hour_parts.key?(keys[i]) }
      made = missing.zip(Parallel.map(missing, MERGERS) do |i|
        index, hour, entries = hours[i]
        Report::MergedProfiles.merge(entries.map { |entry| index.path_of(entry) }, nil, nil, name: "#{index.directory} (hour #{hour})")
      end).to_h
      return nil if made.any? { |_, part| part.nil? }

      keys.each_with_index.map do |key, i|
        part = made[i] || @hour_parts.delete(key)
        @hour_parts_bytes += part.bytesize if made[i]
        @hour_parts[key] = part # (last: the most recently used)
      end.tap do
        while @hour_parts_bytes > HOUR_PARTS_BYTES && @hour_parts.size > 1
          _, dropped = @hour_parts.shift
          @hour_parts_bytes -= dropped.bytesize
        end
      end
    end

    def base?(query)
      BASE_KEYS.each_value.any? { |key| !single(query, key).nil? }
    end

    def base_profile(query)
      return nil unless base?(query)

      load(query, **BASE_KEYS)
    end

    def describe_version(query, key)
      (version = single(query, key)) ? " of version #{printable(version)}" : ""
    end

    def types(profile, query)
      type = single(query, "type")
      return nil unless type
      raise BadRequest, "no sample type #{printable(type)} (types: #{profile.sample_type_names.join(", ")})" unless profile.sample_type_names.include?(type)

      [type]
    end

    def labels(query)
      query["label"].map do |pair|
        key, separator, value = pair.partition("=")
        raise BadRequest, "label takes KEY=VALUE (got #{printable(pair)})" if separator.empty? || key.empty?

        [key, value]
      end
    end

    def limit(query)
      text = single(query, "limit") || "50"
      value = Integer(text, 10)
      raise ArgumentError unless (1..10_000).cover?(value)

      value
    rescue ArgumentError
      raise BadRequest, "limit takes a number of rows from 1 to 10000 (got #{printable(text)})"
    end

    def single(query, key)
      values = query[key]
      raise BadRequest, "#{key} is given #{values.size} times (once at most)" if values.size > 1

      values.first
    end

    # A time parameter as nanoseconds since the epoch: ISO 8601, or a number of nanoseconds.
    def time(query, key)
      time = time_of(query, key)
      time && time.to_i * 1_000_000_000 + time.nsec
    end

    def time_of(query, key)
      text = single(query, key)
      return nil if text.nil? || text.empty?
      return Time.at(Integer(text, 10) / 1_000_000_000, Integer(text, 10) % 1_000_000_000, :nsec).utc if text.match?(/\A\d{1,20}\z/)

      Time.iso8601(text)
    rescue ArgumentError
      raise BadRequest, "#{key} takes an ISO 8601 time (2026-12-07T14:05:00Z) or nanoseconds since the epoch (got #{printable(text)})"
    end

    def describe(query)
      parts = %w[from to service version].filter_map { |key| (value = single(query, key)) && "#{key} #{value}" }
      parts.empty? ? "all profiles" : parts.join(", ")
    end

    # A request's text made safe for a one-line reason: printable ASCII, at most 100 characters.
    def printable(text)
      text.to_s.b.gsub(/[^\x20-\x7e]/n, "?")[0, 100].inspect
    end
  end
end
