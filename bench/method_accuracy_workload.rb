# frozen_string_literal: true

# The known-answer workload behind bench/method_accuracy.rb: many distinct methods, each
# called for 10-100 ms at a time, whose own time the program measures around every call
# (CLOCK_MONOTONIC and the thread's CPU clock). A profile is right when each method gets
# its share of the time the methods took together.
#
# Workloads (one per run), eight methods each, on the main thread:
#   c_busy      C code burning CPU holding the GVL (test/support/native_workload)   cpu
#   c_sleep     nanosleep with the GVL released (blocking I/O's shape)              wall
#   ruby_busy   Ruby code burning CPU                                               cpu
#   mixed       Ruby, C holding the GVL, sleeps without it, ConditionVariable waits wall
#   c_gvl_wall  C code holding the GVL (busy, or asleep) between Ruby methods       wall
#   short_long  C code holding the GVL, calls of 2-6 ms after calls of 10-100 ms    cpu
#               (where a sample's weight is the time since the previous sample, taken
#               at safe points, the short calls' time moves to the long ones)
#
# Run as a program it profiles itself and prints JSON:
#   ruby -Ilib bench/method_accuracy_workload.rb PROFILER WORKLOAD HZ SECONDS
# PROFILER: contprof, stackprof, datadog (its own rate), vernier, rperf (Ruby 3.4+), none.
require_relative "../test/support/native_workload"

module MethodAccuracy
  WORKLOADS = {
    "c_busy" => ["cpu", %w[c_busy] * 8],
    "c_sleep" => ["wall", %w[c_sleep] * 8],
    "ruby_busy" => ["cpu", %w[ruby_busy] * 8],
    "mixed" => ["wall", %w[ruby_busy c_busy c_sleep wait] * 2],
    "c_gvl_wall" => ["wall", %w[ruby_busy c_busy_gvl_wall c_sleep_gvl ruby_busy] * 2],
    "short_long" => ["cpu", %w[c_busy_short c_busy] * 4],
  }.freeze

  def self.cpu_now = Process.clock_gettime(Process::CLOCK_THREAD_CPUTIME_ID)
  def self.wall_now = Process.clock_gettime(Process::CLOCK_MONOTONIC)

  # What each kind of method does for `seconds`.
  module Kinds
    module_function

    def ruby_busy(seconds)
      deadline = MethodAccuracy.cpu_now + seconds
      x = 0
      while MethodAccuracy.cpu_now < deadline
        i = 0
        while i < 2000
          x = (x * 31 + i) & 0xffff
          i += 1
        end
      end
      x
    end

    def c_busy(seconds) = NativeWorkload.busy_with_gvl(seconds)
    def c_busy_short(seconds) = NativeWorkload.busy_with_gvl(seconds)
    def c_busy_gvl_wall(seconds) = NativeWorkload.busy_with_gvl(seconds)
    def c_sleep(seconds) = NativeWorkload.sleep_without_gvl(seconds)
    def c_sleep_gvl(seconds) = NativeWorkload.sleep_with_gvl(seconds)

    MUTEX = Mutex.new
    CONDITION = ConditionVariable.new
    def wait(seconds) = MUTEX.synchronize { CONDITION.wait(MUTEX, seconds) }
  end

  # The workload's methods: m00_<kind> .. m07_<kind>, each with its nominal length.
  class Methods
    def self.define(kinds)
      random = Random.new(11)
      kinds.each_with_index.map do |kind, index|
        name = format("m%02d_%s", index, kind)
        class_eval "def #{name}(seconds) = Kinds.#{kind}(seconds)", __FILE__, __LINE__ # rubocop:disable Style/DocumentDynamicEvalDefinition
        [name, kind.end_with?("_short") ? random.rand(0.002..0.006) : random.rand(0.01..0.1)]
      end
    end
  end

  # Runs the workload for `seconds`: every round calls each method once, in a random order,
  # for its nominal length times 0.8-1.2. Returns per method its wall and CPU seconds.
  def self.run(methods, seconds)
    object = Methods.new
    random = Random.new(5)
    truth = Hash.new { |hash, key| hash[key] = { "wall" => 0.0, "cpu" => 0.0 } }
    deadline = wall_now + seconds
    while wall_now < deadline
      methods.shuffle(random: random).each do |name, length|
        cpu_before = cpu_now
        wall_before = wall_now
        object.public_send(name, length * random.rand(0.8..1.2))
        wall_after = wall_now
        truth[name]["cpu"] += cpu_now - cpu_before
        truth[name]["wall"] += wall_after - wall_before
      end
    end
    truth
  end

  # Whether a frame's name is the method's (profilers qualify it, or not).
  def self.frame_of?(frame_name, method)
    frame_name == method || frame_name.end_with?("##{method}") || frame_name.end_with?(".#{method}")
  end

  # Each method's time in a decoded pprof profile: samples with its frame on the stack.
  def self.pprof_times(profile, type, methods)
    methods.to_h do |name, _|
      seconds = profile.samples.sum do |sample|
        sample.locations.any? { |frame| frame_of?(frame.function_name, name) } ? sample.values[type].to_f : 0.0
      end
      [name, seconds]
    end
  end

  def self.vernier_times(result, methods)
    times = Hash.new(0.0)
    result.threads.each_value do |thread|
      next unless thread[:is_main]

      thread[:samples].zip(thread[:weights]) do |stack_index, weight|
        labels = result.stack(stack_index).frames.map(&:label)
        methods.each { |name, _| times[name] += weight if labels.any? { |label| frame_of?(label, name) } }
      end
    end
    methods.to_h { |name, _| [name, times[name]] }
  end

  def self.stackprof_times(result, methods)
    require_relative "support/peers"
    times = Hash.new(0.0)
    Peers.each_stackprof_sample(result) do |names, count|
      methods.each { |name, _| times[name] += count if names.any? { |label| label && frame_of?(label, name) } }
    end
    methods.to_h { |name, _| [name, times[name]] }
  end

  # The per-method error: each method's share of the methods' total, profiled against
  # measured, relative to the measured share, in percent; and its mean over the methods.
  def self.errors(profiled, truth, type)
    profiled_total = profiled.values.sum
    true_total = truth.values.sum { |values| values[type] }
    truth.to_h do |name, values|
      true_share = values[type] / true_total
      share = profiled_total.zero? ? 0.0 : profiled[name] / profiled_total
      [name, 100.0 * (share - true_share).abs / true_share]
    end
  end
end

if $PROGRAM_NAME == __FILE__
  require "json"
  require "tmpdir"
  profiler, workload, hz, seconds = ARGV
  hz = Integer(hz)
  seconds = Float(seconds)
  NativeWorkloadBuild.load
  type, kinds = MethodAccuracy::WORKLOADS.fetch(workload)
  methods = MethodAccuracy::Methods.define(kinds)
  $LOAD_PATH.unshift(File.expand_path("../lib", __dir__))
  require_relative "support/peers"
  truth = nil
  profiled =
    case profiler
    when "contprof"
      require "contprof"
      recorder = Contprof::StackRecorder.new
      worker = Contprof::Collectors::CpuAndWallTimeWorker.new(recorder: recorder, interval: 1.0 / hz)
      worker.start
      truth = MethodAccuracy.run(methods, seconds)
      worker.stop
      profile = Contprof::Pprof.decode(recorder.serialize[2])
      MethodAccuracy.pprof_times(profile, "#{type}-time", methods)
    when "rperf"
      Peers.use_gem_dir!
      require "rperf"
      require "contprof"
      Rperf.start(frequency: hz, mode: type.to_sym)
      truth = MethodAccuracy.run(methods, seconds)
      data = Rperf.stop
      path = File.join(Dir.tmpdir, "rperf-#{Process.pid}.pb.gz")
      Rperf.save(path, data)
      profile = Contprof::Pprof.decode(File.binread(path))
      File.delete(path)
      MethodAccuracy.pprof_times(profile, profile.sample_type_names.first, methods)
    when "datadog"
      require "contprof"
      bytes, truth = Peers.datadog_profile { MethodAccuracy.run(methods, seconds) }
      MethodAccuracy.pprof_times(Contprof::Pprof.decode(bytes), "#{type}-time", methods)
    when "vernier"
      Peers.use_gem_dir!
      require "vernier"
      result = Vernier.profile(mode: :wall, interval: 1_000_000 / hz) { truth = MethodAccuracy.run(methods, seconds) }
      MethodAccuracy.vernier_times(result, methods)
    when "stackprof"
      Peers.use_gem_dir!
      require "stackprof"
      data = StackProf.run(mode: type.to_sym, interval: 1_000_000 / hz, raw: true) { truth = MethodAccuracy.run(methods, seconds) }
      MethodAccuracy.stackprof_times(data, methods)
    else
      truth = MethodAccuracy.run(methods, seconds)
      nil
    end
  result = { "profiler" => profiler, "workload" => workload, "hz" => hz, "type" => type,
             "truth" => truth.transform_values { |values| values[type] } }
  if profiled
    errors = MethodAccuracy.errors(profiled, truth, type)
    result["errors"] = errors
    result["mean_error"] = errors.values.sum / errors.size
  end
  puts JSON.generate(result)
end
