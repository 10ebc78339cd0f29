# frozen_string_literal: true

# How many allocation samples the automatic interval gives, what they cost and how right
# they are, for other choices of the sampler's two constants (sampling/allocation_sampler.c,
# "Cost"): the arming lead (how late a check may come: the hook is on from what the program
# allocates in that time before the target) and the armed share (the interval is kept at
# least its inverse times that margin).
#
#   ruby -Ilib bench/allocation_density.rb   # LEADS_US=250,500,1000 SHARES=100,50 PACES=1.25 SLACKS_US=0 ARM_NOW_US=0 SECONDS=4 RUNS=2
#
# Each (lead, share, pace, slack) is a build of the extension (tmp/density-LEAD-SHARE-PACE-SLACK-ARMNOW,
# -DCONTPROF_...; the pace and slack: how checks are asked for, see ALARM_PACE there).
# A run: a fresh process allocates for SECONDS from three sites in turn (Strings, Arrays,
# retained-then-dropped Hashes: a known count each, read from the VM's counter around each
# call) with allocation profiling at `auto`; it prints the samples a second, the share of
# allocations the hook saw, the late armings and each site's estimate against its truth
# (the largest error, and the standard error the sample count allows). The cost is
# bounded as bench/rails_features.rb bounds it: `armed` (a fixed interval far below the
# margin: the hook on for every allocation) is measured against time profiling alone in
# alternating segments; a variant's hook calls per allocation times armed's cost bounds its
# own (armed also records 100x more samples per hook call).
require "open3"
require "rbconfig"
require_relative "support/statistics"
include BenchStatistics # rubocop:disable Style/MixinUsage

TREE = File.expand_path("..", __dir__)
SECONDS = Float(ENV.fetch("SECONDS", "4"))
RUNS = Integer(ENV.fetch("RUNS", "2"))
LEADS_US = ENV.fetch("LEADS_US", "250,500,1000").split(",").map { |l| Integer(l) }
SHARES = ENV.fetch("SHARES", "100,50").split(",").map { |s| Integer(s) }
PACES = ENV.fetch("PACES", "1.25").split(",").map { |s| Float(s) }
SLACKS_US = ENV.fetch("SLACKS_US", "0").split(",").map { |s| Integer(s) } # 0: none
ARM_NOW_US = Integer(ENV.fetch("ARM_NOW_US", "0")) # a check closer than this arms at once (0: none)

# --- In the child: the workload -------------------------------------------------------
if ARGV[0] == "--child"
  require "contprof"
  mode = ARGV[1]
  def allocated = GC.stat(:total_allocated_objects)
  def site_strings(count) = count.times { |i| "s#{i}" }
  def site_arrays(count) = count.times { |i| [i, i] }
  def site_hashes(count, kept) = count.times { |i| kept << { i => i } }
  sites = { "site_strings" => ->(kept) { site_strings(120) }, "site_arrays" => ->(kept) { site_arrays(60) },
            "site_hashes" => lambda { |kept|
              site_hashes(30, kept)
              kept.clear if kept.size > 3_000
            } }
  cpu = -> { Process.clock_gettime(Process::CLOCK_PROCESS_CPUTIME_ID) }
  # For `seconds`, or `turns` turns of the three sites.
  run_sites = lambda do |truth, seconds: nil, turns: nil|
    kept = []
    deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + seconds if seconds
    done = 0
    while seconds ? Process.clock_gettime(Process::CLOCK_MONOTONIC) < deadline : done < turns
      sites.each do |name, site|
        before = allocated
        site.(kept)
        truth[name] += allocated - before
      end
      done += 1
    end
    done
  end
  start = lambda do |allocation_interval|
    recorder = Contprof::StackRecorder.new(sample_types: Contprof::Collectors::Allocations.sample_types(allocation_interval ? true : nil))
    worker = Contprof::Collectors::CpuAndWallTimeWorker.new(recorder: recorder, allocation_interval: allocation_interval)
    worker.start
    [recorder, worker]
  end
  if mode == "cost" # armed (interval 2,000, the hook always on) against time profiling alone
    ratios = []
    calls = allocations = 0
    turns = run_sites.(Hash.new(0), seconds: 0.5)
    Integer(ARGV[2]).times do
      pair = [true, false].shuffle.to_h do |armed|
        GC.start
        _, worker = start.(armed ? 2_000 : nil)
        sleep 0.05 # (the first check)
        before = cpu.()
        counted = allocated
        run_sites.(Hash.new(0), turns: turns)
        used = cpu.() - before
        worker.stop
        if armed
          calls += worker.stats[:allocation_hook_calls]
          allocations += allocated - counted
        end
        [armed, used]
      end
      ratios << pair[true] / pair[false]
    end
    puts "armed=#{median(ratios)} share=#{calls.fdiv(allocations)}"
  else
    recorder, worker = start.(:auto)
    truth = Hash.new(0)
    before = allocated
    run_sites.(truth, seconds: SECONDS)
    total = allocated - before
    worker.stop
    stats = worker.stats
    estimates = Hash.new(0)
    Contprof::Pprof.decode(recorder.serialize[2]).samples.each do |sample|
      site = sample.locations.map(&:function_name).find { |name| name.match?(/#site_\w+\z/) }
      estimates[site[/site_\w+/]] += sample.values["alloc-samples"] if site
    end
    interval = stats[:allocation_interval]
    # (A sample weighs the interval: a site's estimate is a Poisson count of its samples,
    # relative variance 1 / (n p) for n samples, p its share.)
    samples = stats[:allocation_samples]
    errors = truth.map do |name, expected|
      share = expected.fdiv(total)
      [(estimates[name] - expected).fdiv(expected), Math.sqrt(1.0 / [samples * share, 1].max)]
    end
    worst = errors.max_by { |error, _| error.abs }
    puts "samples_per_s=#{stats[:allocation_samples] / SECONDS} share=#{stats[:allocation_hook_calls].fdiv(total)} " \
         "late=#{stats[:allocation_late_armings]} checks=#{stats[:allocation_checks_asked]} samples=#{stats[:allocation_samples]} interval=#{interval} " \
         "wakeups=#{stats[:clock_thread_wakeups] - stats[:clock_wakeups]} " \
         "rate=#{total / SECONDS} worst_error=#{worst[0]} its_se=#{worst[1]}"
  end
  exit
end

# --- In the parent ---------------------------------------------------------------------
require "rake"
load File.join(TREE, "Rakefile")

def child(lib, *args)
  out, err, status = Open3.capture3(RbConfig.ruby, "-I#{lib}", "-I#{File.join(TREE, "lib")}", __FILE__, "--child", *args)
  abort "#{args.join(" ")} failed: #{err}" unless status.success?
  out.scan(/(\w+)=(\S+)/).to_h { |key, value| [key, Float(value)] }
end

puts "Ruby #{RUBY_VERSION}; #{SECONDS} s of allocation per run, #{RUNS} runs per variant"
default_lib = File.join(TREE, "lib")
cost = child(default_lib, "cost", "10")
armed = cost["armed"] - 1
puts format("armed (the hook on for %.0f%% of allocations) costs %.1f%% beyond time profiling (median of 10 pairs)",
            100 * cost["share"], 100 * armed)
# (Wakeups: the clock thread's, beyond its ticks: alarms, and changes of its plan.)
puts format("%5s %8s %8s %6s %10s %9s %7s %13s %15s %12s %16s %10s", "pace", "slack", "lead", "share", "samples/s",
            "hook on", "late", "alarms/sample", "wakeups/sample", "cost bound", "worst site error", "its 1 SE")
LEADS_US.each do |lead|
  SHARES.product(PACES, SLACKS_US).each do |share, pace, slack|
    Rake.verbose(false)
    lib = build_variant("density-#{lead}-#{share}-#{pace}-#{slack}-#{ARM_NOW_US}",
                        "-DCONTPROF_ARMING_LEAD_NS=#{lead * 1000} -DCONTPROF_ARMED_SHARE_INVERSE=#{share} " \
                        "-DCONTPROF_ALARM_PACE=#{pace} -DCONTPROF_ALARM_SLACK_NS=#{slack * 1000} " \
                        "-DCONTPROF_ALARM_ARM_NOW_NS=#{ARM_NOW_US * 1000}")
    results = Array.new(RUNS) { child(lib, "run") }
    pick = ->(key) { median(results.map { |r| r[key] }) }
    late = results.sum { |r| r["late"] }.fdiv(results.sum { |r| r["samples"] })
    worst = results.max_by { |r| r["worst_error"].abs }
    alarms = results.sum { |r| r["checks"] }.fdiv(results.sum { |r| r["samples"] })
    wakeups = results.sum { |r| r["wakeups"] }.fdiv(results.sum { |r| r["samples"] })
    puts format("%5.2f %6dus %6dus %5s%% %10.1f %8.2f%% %6.1f%% %13.1f %15.1f %11.2f%% %15.1f%% %9.1f%%", pace, slack,
                lead, format("%.1f", 100.0 / share), pick.("samples_per_s"), 100 * pick.("share"), 100 * late, alarms,
                wakeups,
                100 * pick.("share") * armed,
                100 * worst["worst_error"], 100 * worst["its_se"])
  end
end
