# frozen_string_literal: true

# Allocation profiles against the truth, side by side with stackprof's object mode, in one
# run: sites that allocate known numbers of objects (the truth from the VM's own counter
# around each site), one of them in step with a fixed stride.
#
#   ruby -Ilib bench/allocation_accuracy.rb   # INTERVAL=1000 ROUNDS=60
#
# Each profiler runs in a fresh process of its own, sampling one allocation in INTERVAL:
# Contprof (allocation_interval: INTERVAL, random gaps) and stackprof (mode: :object,
# interval: INTERVAL, every INTERVAL-th allocation). The table gives each site's share of
# the allocations: the truth, and each profiler's error in points. The "lockstep" site
# allocates one object per INTERVAL allocations of its loop, always at the same position:
# a fixed stride sees it always or never.
require "json"
require "open3"
require "rbconfig"
require_relative "support/peers"

INTERVAL = Integer(ENV.fetch("INTERVAL", "1000"))
ROUNDS = Integer(ENV.fetch("ROUNDS", "60"))

if ARGV[0] == "--child"
  profiler = ARGV[1]
  class Small; end
  class Marker; end
  def make_marker = Marker.new
  # One method per site (profiles find sites by name).
  def site_strings = 40_000.times { |i| "s#{i}" }
  def site_smalls = 60_000.times { Small.new }
  def site_arrays = 30_000.times { |i| [i] }
  # One Marker, then INTERVAL - 1 Smalls, 200 times: 1/INTERVAL of this site's objects.
  def site_lockstep = 200.times { make_marker; (INTERVAL - 1).times { Small.new } }
  sites = %w[strings smalls arrays lockstep].to_h { |name| [name, true] }
  site_of = lambda do |names|
    names.each do |name|
      key = sites.keys.find { |site| name.to_s.include?("site_#{site}") }
      return key if key
    end
    nil
  end
  truth = Hash.new(0)
  markers_truth = 0
  run_all = lambda do
    ROUNDS.times do
      sites.each_key do |name|
        before = GC.stat(:total_allocated_objects)
        send("site_#{name}")
        truth[name] += GC.stat(:total_allocated_objects) - before
      end
      markers_truth += 200
    end
  end
  estimates = Hash.new(0)
  markers = 0
  case profiler
  when "contprof"
    require "contprof"
    recorder = Contprof::StackRecorder.new(sample_types: Contprof::Collectors::Allocations.sample_types(true))
    worker = Contprof::Collectors::CpuAndWallTimeWorker.new(recorder: recorder, allocation_interval: INTERVAL)
    worker.start
    run_all.call
    worker.stop
    Contprof::Pprof.decode(recorder.serialize[2]).samples.each do |sample|
      count = sample.values["alloc-samples"]
      next if count.zero?

      site = site_of.call(sample.locations.map(&:function_name)) or next
      estimates[site] += count
      markers += count if sample.locations.any? { |frame| frame.function_name.to_s.include?("make_marker") }
    end
  when "stackprof"
    require "stackprof"
    StackProf.start(mode: :object, interval: INTERVAL, raw: true)
    run_all.call
    StackProf.stop
    Peers.each_stackprof_sample(StackProf.results) do |names, count|
      site = site_of.call(names) or next
      estimates[site] += count * INTERVAL
      markers += count * INTERVAL if names.any? { |name| name.to_s.include?("make_marker") }
    end
  end
  puts JSON.generate("truth" => truth, "estimates" => estimates, "markers" => markers, "markers_truth" => markers_truth)
  exit
end

profilers = ["contprof"]
profilers << "stackprof" if Peers.available?("stackprof")
results = profilers.to_h do |profiler|
  out, err, status = Open3.capture3(Peers.env, RbConfig.ruby, "-I#{File.expand_path("../lib", __dir__)}", __FILE__,
                                    "--child", profiler)
  abort "#{profiler}: #{err}" unless status.success?
  [profiler, JSON.parse(out)]
end
truth = results["contprof"]["truth"]
total = truth.values.sum.to_f
puts "Ruby #{RUBY_VERSION}; one allocation in #{INTERVAL} sampled; #{total.to_i} allocations in #{ROUNDS} rounds"
printf("  %-10s %8s %s\n", "site", "truth %", profilers.map { |p| format("%16s", "#{p} error") }.join)
truth.each do |site, count|
  errors = profilers.map do |profiler|
    r = results[profiler]
    estimated = r["estimates"][site].to_f / r["estimates"].values.sum * 100
    format("%16.1f", estimated - count / total * 100)
  end
  printf("  %-10s %8.1f %s\n", site, count / total * 100, errors.join)
end
profilers.each do |profiler|
  r = results[profiler]
  printf("  %-10s Marker objects: truth %d, estimated %d\n", profiler, r["markers_truth"], r["markers"])
end
