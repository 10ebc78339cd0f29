# frozen_string_literal: true

require_relative "../test_helper"
require "objspace"
require "timeout"
require "json"

# Allocation profiling: known-answer tests (sites that allocate known numbers of objects of
# known classes and sizes, the truth measured around each site with the VM's own counter),
# the hook's cost bound in automatic mode, the exporters' names, and the VM bugs guarded.
class AllocationsTest < Minitest::Test
  include ProfileAssertions

  class Small; end

  class Holder
    def initialize(text)
      @text = text
    end
  end

  # A class never assigned to a constant of its own: its instances are labelled by ancestor.
  UNNAMED = [Class.new(Small)].freeze

  def teardown
    @worker&.stop
  end

  def start_worker(allocation_interval)
    @recorder = Contprof::StackRecorder.new(sample_types: Contprof::Collectors::Allocations.sample_types(true))
    @worker = Contprof::Collectors::CpuAndWallTimeWorker.new(recorder: @recorder, allocation_interval: allocation_interval)
    @worker.start
  end

  def allocated
    GC.stat(:total_allocated_objects)
  end

  # Each site is a method of its own; the truth is the VM's counter around it.
  def allocate_smalls(count) = count.times { Small.new }
  def allocate_holders(count) = count.times { Holder.new("x" * 200) } # two objects each
  def allocate_arrays(count) = count.times { |i| [i, i] }
  def allocate_anonymous(count) = count.times { UNNAMED.first.new }
  def allocate_few(count) = count.times { Small.new }

  SITES = { "allocate_smalls" => 120_000, "allocate_holders" => 60_000, "allocate_arrays" => 90_000,
            "allocate_anonymous" => 30_000, "allocate_few" => 2_000 }.freeze

  def run_sites(rounds)
    truth = Hash.new(0)
    rounds.times do
      SITES.each do |site, count|
        before = allocated
        send(site, count)
        truth[site] += allocated - before
      end
    end
    truth
  end

  def site_of(sample)
    sample.locations.map(&:function_name).each do |name|
      site = SITES.keys.find { |key| name.end_with?("##{key}") }
      return site if site
    end
    nil
  end

  # Counts per site within 5% (and 4 binomial standard deviations, which the sample count
  # keeps below that) for every site above 1% of allocations; classes right; bytes within 10%.
  def test_counts_classes_and_bytes_per_site_match_the_truth
    rounds = Instrumented.count(4, 1)
    interval = 10
    start_worker(interval)
    truth = run_sites(rounds)
    @worker.stop
    stats = @worker.stats
    profile = decode_profile(@recorder.serialize[2])
    counts = Hash.new(0)
    bytes = Hash.new(0)
    classes = Hash.new { |hash, key| hash[key] = Hash.new(0) }
    profile.samples.each do |sample|
      count = sample.values["alloc-samples"]
      next if count.zero?

      refute_match(/0x\h/, sample.labels["allocation class"].to_s, "a class label never holds an address")
      site = site_of(sample) or next
      counts[site] += count
      bytes[site] += sample.values["alloc-size"]
      classes[site][sample.labels["allocation class"]] += count
    end
    all = truth.values.sum
    truth.each do |site, expected|
      next if expected < all * 0.01

      samples = expected.to_f / interval
      tolerance = [4 * Math.sqrt(samples) / samples, 0.05].max
      assert_operator tolerance, :<=, 0.05, "#{site}: too few samples for the bar"
      assert_in_delta expected, counts[site], expected * tolerance,
                      "#{site}: estimated allocations (#{stats.select { |key, _| key.start_with?("allocation_") }})"
    end
    # (Ruby 3.3 allocates a few VM-internal objects of its own in these sites: classes
    # under 1% of a site are not the site's.)
    main_classes = ->(site) { classes[site].select { |_, count| count > counts[site] * 0.01 }.keys.sort }
    assert_equal %w[AllocationsTest::Small], main_classes.("allocate_smalls")
    assert_equal %w[AllocationsTest::Holder String], main_classes.("allocate_holders")
    assert_equal %w[Array], main_classes.("allocate_arrays")
    assert_equal ["(anonymous < AllocationsTest::Small)"], main_classes.("allocate_anonymous")
    # Bytes: each class's size by construction, read with ObjectSpace.memsize_of.
    holder_bytes = ObjectSpace.memsize_of(Holder.new(nil)) + ObjectSpace.memsize_of("x" * 200)
    expected_bytes = { "allocate_smalls" => truth["allocate_smalls"] * ObjectSpace.memsize_of(Small.new),
                       "allocate_holders" => truth["allocate_holders"] / 2 * holder_bytes,
                       "allocate_arrays" => truth["allocate_arrays"] * ObjectSpace.memsize_of([1, 2]) }
    expected_bytes.each do |site, expected|
      assert_in_delta expected, bytes[site], expected * 0.10, "#{site}: estimated bytes"
    end
    assert_equal 0, stats[:allocation_hook_lost]
  end

  def allocate_burst(count) = count.times { Small.new }

  # A burst shorter than a round after a quiet phase gets its share: a steady site allocates
  # 2,000 objects a second for a second (slowly: the sampler measures a low rate), then a
  # burst of as many objects from another site takes a millisecond, three times. Each
  # site's estimate within 4 standard deviations of the VM's count (a sample weighs the
  # geometric gap before it: relative variance (2 - p) / (n p), p = 1/2 here); a burst the
  # hook missed would have its weight land on the steady site's next sample.
  def test_a_burst_after_a_quiet_phase_gets_its_share
    interval = 25
    start_worker(interval)
    truth = Hash.new(0)
    3.times do
      before = allocated
      1_000.times do
        allocate_few(2)
        sleep 0.001
      end
      truth["allocate_few"] += allocated - before
      before = allocated
      allocate_burst(2_000)
      truth["allocate_burst"] += allocated - before
    end
    @worker.stop
    stats = @worker.stats
    counts = Hash.new(0)
    decode_profile(@recorder.serialize[2]).samples.each do |sample|
      site = sample.locations.map(&:function_name).find { |name| name =~ /#allocate_(few|burst)\z/ }
      counts[site[/allocate_\w+/]] += sample.values["alloc-samples"] if site
    end
    truth.each do |site, expected|
      samples = expected.to_f / interval
      assert_in_delta expected, counts[site], expected * 4 * Math.sqrt(1.5 / samples),
                      "#{site}: estimated allocations (#{counts}, truth #{truth}; " \
                      "#{stats.select { |key, _| key.start_with?("allocation_") }})"
    end
  end

  # The hook stays on while the program is quiet, but a burst (a request of 4,000 objects
  # after 0.3 s of nothing) turns it off within a few hundred of its allocations: a count,
  # not a timing (before, it stayed on for 2,900 of the 4,000 on 3.4).
  def test_a_burst_after_a_quiet_phase_pays_the_hook_for_few_allocations
    start_worker(:auto)
    requests = 10
    requests.times do
      sleep 0.3
      allocate_burst(4_000)
    end
    @worker.stop
    stats = @worker.stats
    assert_operator stats[:allocation_bursts], :>=, requests / 2, stats.inspect
    assert_operator stats[:allocation_hook_calls], :<=, requests * 1_500, stats.inspect
  end

  # What the profiler allocates (its flushes, on its own threads) is not the program's: in a
  # program that allocates slowly (the hook then stays on) with a flush every second, every
  # estimated allocation is at the program's site, and the total is the site's count within
  # 4 standard deviations (before, a fifth of the total was at the flush's `Kernel#loop`).
  def test_the_profilers_own_allocations_are_not_the_programs
    skip Contprof.unsupported_reason unless Contprof.supported?
    dir = Dir.mktmpdir("contprof-own-allocations")
    program = <<~RUBY
      require "contprof"
      Contprof.start(output: #{dir.inspect}, allocation: true, allocation_interval: 20, upload_period: 1, log_level: "error")
      def slow_site = 4.times { Object.new }
      750.times { slow_site; sleep 0.004 }
      Contprof.stop
    RUBY
    _, err, status = Open3.capture3(RbConfig.ruby, "-I#{File.expand_path("../../lib", __dir__)}", "-e", program)
    assert status.success?, err
    profiles = Dir[File.join(dir, "*.pprof")].map { |path| decode_profile(File.binread(path)) }
    assert_operator profiles.size, :>=, 3, "a flush every second"
    at_site = profiles.sum { |profile| profile.total("alloc-samples") { |sample| sample.locations.any? { |l| l.function_name == "Object#slow_site" } } }
    total = profiles.sum { |profile| profile.total("alloc-samples") }
    truth = 3_000
    # (The main thread's loop and Contprof.stop allocate a little beside the site: that is
    # the program's. What no stack from <main> holds is another thread's: the profiler's.)
    outside = profiles.flat_map(&:samples).select do |sample|
      sample.values["alloc-samples"].positive? && sample.locations.none? { |location| location.function_name == "<main>" }
    end
    assert_operator outside.sum { |sample| sample.values["alloc-samples"] }, :<=, total * 0.02,
                    "allocations outside the program's site: #{outside.map { |sample| sample.locations.map(&:function_name).first(3) }}"
    assert_in_delta truth, at_site, truth * 4 * Math.sqrt(2.0 * 20 / truth)
  ensure
    FileUtils.rm_rf(dir) if dir
  end

  # Live heap after a full GC: per site, the objects still alive, within 10% (and the
  # binomial spread of the samples); none of the garbage; and once the program lets go of
  # them, none at all (the profiler retains nothing: WeakRefs to them die too).
  def test_live_heap_per_site_matches_the_truth_and_retains_nothing
    skip Contprof::Collectors::Allocations.heap_unsupported_reason unless Contprof::Collectors::Allocations.heap_supported?
    require "weakref"
    interval = 10
    kept, kept_count = keep_and_drop_under_heap_tracking(interval)
    weak = WeakRef.new(kept.last)
    @worker.stop
    GC.start(full_mark: true, immediate_sweep: true)
    @worker.collector.record_heap_live
    profile = decode_profile(@recorder.serialize[2])
    live = Hash.new(0)
    profile.samples.each do |sample|
      count = sample.values["heap-live-samples"]
      live[site_of(sample) || sample.locations.map(&:function_name).find { |n| n.include?("keep_holders") }] += count
    end
    samples = kept_count.to_f / interval
    tolerance = [4 / Math.sqrt(samples), 0.10].max
    assert_operator tolerance, :<=, 0.10
    assert_in_delta kept_count, live.select { |site, _| site.to_s.include?("keep_holders") }.values.sum, kept_count * tolerance
    # (A conservative GC may keep one or two through stale words on the machine stack.)
    assert_operator live["allocate_smalls"], :<=, 100_000 * 0.005, "garbage is not live"
    stats = @worker.collector.stats
    assert_operator stats[:heap_tracked], :>, 0
    # Let go: nothing stays alive, and the next snapshot is empty.
    kept.clear
    3.times { GC.start(full_mark: true, immediate_sweep: true) }
    refute weak.weakref_alive?, "a tracked object outlived the program's references"
    @worker.collector.record_heap_live
    profile = decode_profile(@recorder.serialize[2])
    still = profile.samples.select { |sample| sample.locations.any? { |f| f.function_name.include?("keep_holders") } }
    # (As above, a stale word on the machine stack may keep one or two of the 20,000 alive:
    # seen once on 3.3, one sample of weight 9. A leak would leave thousands.)
    assert_operator still.sum { |sample| sample.values["heap-live-samples"] }, :<=, 2 * interval,
                    "released objects are not live"
  end

  def keep_holders(kept, count) = count.times { kept << Holder.new("x" * 100) }

  # With live-heap tracking at `interval`: 20,000 holders kept, then 100,000 objects of
  # garbage. Returns the holders and the objects they are made of.
  def keep_and_drop_under_heap_tracking(interval)
    @recorder = Contprof::StackRecorder.new(sample_types: Contprof::Collectors::Allocations.sample_types(true, true))
    @worker = Contprof::Collectors::CpuAndWallTimeWorker.new(recorder: @recorder, allocation_interval: interval)
    @worker.start
    kept = []
    before = allocated
    keep_holders(kept, 20_000)
    kept_count = allocated - before
    allocate_smalls(100_000)
    [kept, kept_count]
  end

  # The tracker stays bounded: beyond CONTPROF_HEAP_MAX_TRACKED live objects, new samples are
  # counted as dropped, and its memory does not grow with the program's heap.
  def test_heap_tracking_is_bounded
    skip Contprof::Collectors::Allocations.heap_unsupported_reason unless Contprof::Collectors::Allocations.heap_supported?
    @recorder = Contprof::StackRecorder.new(sample_types: Contprof::Collectors::Allocations.sample_types(true, true))
    @worker = Contprof::Collectors::CpuAndWallTimeWorker.new(recorder: @recorder, allocation_interval: 1)
    @worker.start
    kept = []
    15_000.times { kept << Small.new }
    bytes_at_limit = @worker.collector.stats[:heap_tracker_bytes]
    30_000.times { kept << Small.new }
    @worker.stop
    stats = @worker.collector.stats
    assert_equal 10_000, stats[:heap_tracked]
    assert_operator stats[:heap_tracking_dropped], :>=, 30_000
    assert_operator stats[:heap_tracker_bytes], :<=, bytes_at_limit * 1.1
  end

  # With the automatic interval the hook sees a bounded share of the allocations (a count,
  # not a timing: see sampling/allocation_sampler.c, "Cost"; 1% by design, 10% allowed for
  # the start and a slow machine), armed by the checks the sampler asks the clock for
  # between rounds, and samples still come.
  def test_automatic_interval_arms_the_hook_for_few_allocations
    start_worker(:auto)
    before = allocated
    deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + Instrumented.count(2.0, 4.0)
    allocate_smalls(20_000) while Process.clock_gettime(Process::CLOCK_MONOTONIC) < deadline
    total = allocated - before
    @worker.stop
    stats = @worker.stats
    assert_operator stats[:allocation_samples], :>, 0, stats.inspect
    assert_operator stats[:allocation_hook_calls], :<, total * 0.1,
                    "the hook saw #{stats[:allocation_hook_calls]} of #{total} allocations (#{stats.inspect})"
    assert_operator stats[:allocation_checks_asked], :>, 0, stats.inspect
    assert_operator stats[:allocation_interval], :>=, Contprof::Limits::ALLOCATION_INTERVAL
  end

  # No sample keeps its object alive (a WeakMap, which holds nothing, sees them all go).
  def test_sampled_objects_are_not_kept_alive
    start_worker(1)
    weak = ObjectSpace::WeakMap.new
    deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + 5
    index = 0
    while @worker.stats[:allocation_samples] < 100 && Process.clock_gettime(Process::CLOCK_MONOTONIC) < deadline
      1_000.times { weak[index += 1] = Small.new }
    end
    @worker.stop
    assert_operator @worker.stats[:allocation_samples], :>=, 100
    3.times { GC.start(full_mark: true, immediate_sweep: true) }
    alive = (1..index).count { |key| weak.key?(key) }
    # A conservative GC may see a few through stale words on the machine stack.
    assert_operator alive, :<=, 5, "#{alive} of #{index} sampled-or-not objects still alive"
  end

  def test_compaction_stress_and_threads_with_allocation_sampling_on
    start_worker(3)
    threads = Array.new(4) { |i| Thread.new { 2_000.times { |j| Holder.new("t#{i}-#{j}") } } }
    GC.stress = true
    200.times { Small.new }
    GC.stress = false
    GC.compact if GC.respond_to?(:compact)
    threads.each(&:join)
    allocate_holders(5_000)
    @worker.stop
    profile = decode_profile(@recorder.serialize[2])
    assert_operator profile.total("alloc-samples"), :>, 10_000
  ensure
    GC.stress = false
  end

  def test_settings
    error = assert_raises(ArgumentError) { Contprof::Settings.resolve({ heap: true, allocation: false }, env: {}) }
    assert_match(/setting heap \(CONTPROF_HEAP\) needs allocation/, error.message)
    assert Contprof::Settings.resolve({ heap: true, allocation: true }, env: {}).heap?
    assert Contprof::Settings.resolve({ heap: true }, env: {}).heap?
    assert_equal :auto, Contprof::Settings.resolve({}, env: {}).allocation_interval
    # Allocation profiling is on by default wherever no known VM bug can meet it.
    assert_equal :auto, Contprof::Settings.resolve({}, env: {}).allocation
    assert_equal Contprof::Collectors::Allocations.on_by_default?, Contprof::Settings.resolve({}, env: {}).allocation?
    assert_equal :auto, Contprof::Settings.resolve({}, env: { "CONTPROF_ALLOCATION" => " Auto" }).allocation
    refute Contprof::Settings.resolve({}, env: { "CONTPROF_ALLOCATION" => "off" }).allocation?
    { "3.1.2" => false, "3.1.4" => true, "3.2.2" => false, "3.2.3" => true, "3.4.1" => true, "4.0.0" => true }.each do |version, on|
      assert_equal on, Contprof::Collectors::Allocations.on_by_default?(version), version
    end
    error = assert_raises(ArgumentError) { Contprof::Settings.resolve({ allocation: "sometimes" }, env: {}) }
    assert_match(/setting allocation \(allocation\) accepts auto, true or false; got "sometimes"/, error.message)
    settings = Contprof::Settings.resolve({}, env: { "CONTPROF_ALLOCATION" => "true", "CONTPROF_ALLOCATION_INTERVAL" => "500" })
    assert settings.allocation?
    assert_equal 500, settings.allocation_interval
    error = assert_raises(ArgumentError) { Contprof::Settings.resolve({ allocation_interval: 0 }, env: {}) }
    assert_match(/allocation_interval/, error.message)
    assert_match(/auto, or an Integer from 1/, error.message)
    error = assert_raises(ArgumentError) do
      Contprof::Collectors::CpuAndWallTimeWorker.new(recorder: Contprof::StackRecorder.new, allocation_interval: :sometimes)
    end
    assert_match(/allocation_interval must be nil, :auto or an Integer/, error.message)
  end

  # Where live-heap tracking is not available (Ruby 3.1: the GC event hook it needs would
  # slow every allocation), a recorder with its types is refused by the collector, with the
  # reason.
  def test_live_heap_where_unavailable_is_refused_with_the_reason
    reason = Contprof::Collectors::Allocations.heap_unsupported_reason
    assert_match(/Ruby 3\.1 any GC event hook/, reason) if Contprof::Native.vm_backend == "ruby31"
    skip "this Ruby has live-heap profiling" unless reason

    types = Contprof::Collectors::Allocations::TIME_SAMPLE_TYPES + Contprof::Collectors::Allocations::HEAP_SAMPLE_TYPES
    error = assert_raises(ArgumentError) do
      Contprof::Collectors::ThreadContext.new(recorder: Contprof::StackRecorder.new(sample_types: types))
    end
    assert_match(/heap-live-samples\/heap-live-size are not available: /, error.message)
  end

  # Live-heap tracking runs inside sampling rounds and GCs: it never calls a Ruby method (an
  # application's own WeakMap, redefined here, is not the profiler's business), and a
  # Timeout raised into the program while it samples is never swallowed.
  def test_heap_tracking_calls_no_ruby_method_and_swallows_no_timeout
    skip Contprof::Collectors::Allocations.heap_unsupported_reason unless Contprof::Collectors::Allocations.heap_supported?
    calls = 0
    spy = Module.new do
      define_method(:[]=) { |*arguments| calls += 1; super(*arguments) }
      define_method(:[]) { |*arguments| calls += 1; super(*arguments) }
    end
    ObjectSpace::WeakMap.prepend(spy)
    @recorder = Contprof::StackRecorder.new(sample_types: Contprof::Collectors::Allocations.sample_types(true, true))
    @worker = Contprof::Collectors::CpuAndWallTimeWorker.new(recorder: @recorder, allocation_interval: 1)
    @worker.start
    kept = []
    timeouts = 0
    30.times do
      # (Swallowed, the Timeout would leave this loop running: it gives up after a second.)
      give_up = Process.clock_gettime(Process::CLOCK_MONOTONIC) + 1
      Timeout.timeout(0.01) do
        loop do
          kept << Holder.new("x") if kept.size < 5_000
          Small.new
          break if Process.clock_gettime(Process::CLOCK_MONOTONIC) > give_up
        end
      end
    rescue Timeout::Error
      timeouts += 1
    end
    @worker.collector.record_heap_live
    @worker.stop
    assert_equal 30, timeouts, "every Timeout reached the program"
    assert_equal 0, calls, "WeakMap's methods were called"
    assert_operator @worker.collector.stats[:heap_tracked], :>, 1_000
  ensure
    spy&.instance_methods(false)&.each { |name| spy.send(:remove_method, name) }
  end

  # GC.compact moves tracked objects: their records follow them (the collector's
  # compaction callback), and the live heap after it is as before.
  def test_live_heap_follows_objects_that_compaction_moves
    skip Contprof::Collectors::Allocations.heap_unsupported_reason unless Contprof::Collectors::Allocations.heap_supported?
    skip "GC.compact is not available here" unless GC.respond_to?(:compact)
    interval = 10
    kept, kept_count = keep_and_drop_under_heap_tracking(interval) # (the garbage leaves holes to fill)
    @worker.stop
    compactions = GC.stat(:compact_count)
    GC.compact
    assert_operator GC.stat(:compact_count), :>, compactions
    @worker.collector.record_heap_live
    profile = decode_profile(@recorder.serialize[2])
    live = profile.samples.select { |sample| sample.locations.any? { |f| f.function_name.include?("keep_holders") } }
                  .sum { |sample| sample.values["heap-live-samples"] }
    tolerance = [4 / Math.sqrt(kept_count.to_f / interval), 0.10].max
    assert_in_delta kept_count, live, kept_count * tolerance
    assert_nil @worker.collector.stats[:heap_tracking_stopped]
    kept.each { |holder| holder.instance_variable_get(:@text).bytesize } # (still there)
  end

  # Ruby bug #19482: the NEWOBJ tracepoint crashes 3.2.0 to 3.2.2, which get no allocation
  # profiling; bug #18464 (a Ractor's GC before 3.1.4) is warned about.
  def test_known_vm_bugs_are_guarded
    allocations = Contprof::Collectors::Allocations
    %w[3.2.0 3.2.1 3.2.2].each { |version| assert_match(/#19482/, allocations.unsupported_reason(version)) }
    %w[3.1.2 3.2.3 3.3.8 3.4.1 4.0.0].each { |version| assert_nil allocations.unsupported_reason(version) }
    assert_match(/#18464/, allocations.caveat("3.1.2"))
    assert_nil allocations.caveat("3.1.4")
  end

  # A profile taken with allocation on has the allocation types, which Go reads.
  def test_profiles_from_the_profiler_have_the_allocation_types
    kept = []
    heap = Contprof::Collectors::Allocations.heap_supported?
    result = Contprof.profile(allocation: true, heap: true, allocation_interval: 50, log_level: "error") do
      allocate_smalls(50_000)
      keep_holders(kept, 10_000)
      GC.start(full_mark: true, immediate_sweep: true) # else the garbage is still there
    end
    decoded = decode_profile(result.pprof)
    heap_types = heap ? %w[heap-live-samples heap-live-size heap-live-samples-unscaled] : []
    assert_equal %w[cpu-time cpu-samples wall-time wall-samples alloc-samples alloc-size alloc-samples-unscaled] + heap_types,
                 decoded.sample_type_names
    assert_in_delta 70_000, decoded.total("alloc-samples"), 70_000 * 0.1
    # The samples behind the estimate: each stands for the interval, 50, and one taken after
    # allocations the hook did not see for those too: n samples weigh 50 n or more. (Alone
    # this block's weigh 50 n to the sample; after other tests in one process, 3.3 and 3.4
    # have shown 50 n + 20%, unexplained: see the closing note of 2026-12-07.)
    sampled = decoded.total("alloc-samples-unscaled")
    assert_operator sampled, :>=, 100
    assert_operator 50 * sampled, :<=, decoded.total("alloc-samples")
    assert_match(/allocate_smalls/, go_pprof(result.pprof, "-top", "-sample_index=alloc-samples"))
    return unless heap

    assert_in_delta 20_000, decoded.total("heap-live-samples"), 20_000 * 0.2
    live_sampled = decoded.total("heap-live-samples-unscaled")
    assert_operator live_sampled, :>=, 100
    assert_operator 50 * live_sampled, :<=, decoded.total("heap-live-samples")
    assert_match(/keep_holders/, go_pprof(result.pprof, "-top", "-sample_index=heap-live-size"))
  end

  # GC.auto_compact moving objects under the tracker at every major GC, then Process.daemon
  # (the profiler restarts in the daemon), with allocation and live-heap sampling on.
  def test_auto_compaction_and_a_daemon_with_allocation_and_heap_on
    skip Contprof.unsupported_reason unless Contprof.supported?
    dir = Dir.mktmpdir("contprof-alloc-daemon")
    program = <<~RUBY
      require "contprof"
      require "json"
      GC.auto_compact = true if GC.respond_to?(:auto_compact=)
      heap = Contprof::Collectors::Allocations.heap_supported?
      Contprof.start(output: #{dir.inspect}, allocation: true, heap: heap, allocation_interval: 50, upload_period: 1,
                     log_level: "error")
      parent = Process.pid
      Process.daemon(true)
      kept = []
      40.times do
        kept << Array.new(3_000) { |j| "kept \#{j}" }
        kept.shift if kept.size > 5
        GC.start(full_mark: true, immediate_sweep: true)
      end
      File.write(#{File.join(dir, "daemon.json").inspect},
                 JSON.generate(pid: Process.pid, parent: parent, heap: heap, compactions: GC.stat(:compact_count).to_i))
      Contprof.stop
    RUBY
    _, err, status = Open3.capture3(RbConfig.ruby, "-I#{File.expand_path("../../lib", __dir__)}", "-e", program)
    assert status.success?, err
    result = nil
    Timeout.timeout(60) do
      sleep 0.05 until (text = File.read(File.join(dir, "daemon.json")) rescue "") && !text.empty? &&
                       Dir[File.join(dir, "*-#{(result = JSON.parse(text))["pid"]}-*.pprof")].any?
    end
    refute_equal result["parent"], result["pid"]
    assert_operator result["compactions"], :>, 0, "GC.auto_compact compacted" if GC.respond_to?(:auto_compact=)
    profiles = Dir[File.join(dir, "*-#{result["pid"]}-*.pprof")].map { |path| decode_profile(File.binread(path)) }
    assert_operator profiles.sum { |profile| profile.total("alloc-samples") }, :>, 100_000
    return unless result["heap"]

    assert_operator profiles.last.total("heap-live-samples"), :>, 5_000, "what the daemon keeps, at its last flush"
  ensure
    FileUtils.rm_rf(dir) if dir
  end
end
