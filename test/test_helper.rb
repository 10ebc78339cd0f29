# frozen_string_literal: true

# Shared setup for the Ruby test suite (minitest, shipped with Ruby).
#
# Every serialized profile a test checks is decoded twice: by Contprof::Pprof (our
# reader) and by Go's reference reader (`go tool pprof -raw`). `decode_profile` returns
# our decoding after asserting that Go's reading has exactly the same samples, stacks,
# values and labels.
# Under `rake test:sanitized` this process runs with the sanitizer runtimes preloaded;
# the programs the tests start (Chromium, Go, other Rubies) must not inherit them.
ENV.delete("LD_PRELOAD") if ENV["CONTPROF_SANITIZED"]

require "minitest/autorun"
require "open3"
require "tempfile"
require "contprof"

# Under `rake test:sanitized` (AddressSanitizer keeps freed memory in quarantine) and
# `rake test:valgrind` (every thread runs on one core, 50x slower) memory and timing figures
# mean nothing; tests skip those assertions there and, under valgrind, shrink their counts.
module Instrumented
  def self.sanitized? = ENV["CONTPROF_SANITIZED"] == "1"
  def self.valgrind? = ENV["CONTPROF_VALGRIND"] == "1"
  def self.any? = sanitized? || valgrind?
  def self.count(normal, under_valgrind) = valgrind? ? under_valgrind : normal
  # CONTPROF_TEST_ALLOCATION=N (rake test:ruby's second pass of the hardening tests): the
  # workers those tests start also sample one allocation in N, and track the live heap.
  def self.allocation_interval = ENV["CONTPROF_TEST_ALLOCATION"]&.then { |n| Integer(n) }

  # Under the sanitizer, waits (up to 10 s) until this process has no native thread beyond
  # its Ruby threads and `extra` threads of its own. Ruby 3.1 keeps the native thread of an
  # ended Ruby thread for 3 s, for reuse, and then ends it; ending, a thread hands its cache
  # back to AddressSanitizer's allocator under that allocator's locks, which GCC 12's ASan
  # does not take around fork (LLVM added that in 2023): a child forked at that moment
  # hangs in its first malloc. Tests that fork many children call this first.
  def self.settle_native_threads(extra: 0)
    return unless sanitized?

    deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + 10
    while Dir.children("/proc/self/task").size > Thread.list.size + extra
      break if Process.clock_gettime(Process::CLOCK_MONOTONIC) > deadline

      sleep 0.05
    end
  end
end

# How the extension reads the VM (vm/vm.h): on Ruby 3.3+ threads are known through the
# public thread API (which cannot tell a wait in Ruby from native code); stacks through
# the frame layout, or (public_api?) the public API, where a block's or rescue clause's
# frame inside a method carries its method's name.
module VMBackend
  def self.public_api? = Contprof::Native.vm_backend == "public_api"
  def self.public_thread_api? = %w[public_api frame_layout].include?(Contprof::Native.vm_backend)

  # The name this backend gives a frame Ruby's backtraces label `label`.
  def self.frame_label(label)
    return label unless public_api?

    label.sub(/\A(?:block(?: \(\d+ levels\))?|rescue|ensure) in (?=[^<])/, "")
  end
end

module ProfileAssertions
  GoSample = Struct.new(:values, :stack, :labels)

  def go_command
    @go_command ||= begin
      go = ENV.fetch("GO", "go")
      _, status = Open3.capture2e(go, "version")
      raise "Go is needed by the tests as the reference pprof reader (Debian package golang-go)" unless status.success?

      go
    rescue Errno::ENOENT
      raise "Go is needed by the tests as the reference pprof reader (Debian package golang-go; `bin/setup` installs it)"
    end
  end

  # Runs `go tool pprof` with the given arguments on the profile bytes; returns stdout.
  def go_pprof(bytes, *args)
    Tempfile.create(["contprof", ".pprof"]) do |file|
      file.binmode
      file.write(bytes)
      file.close
      out, err, status = Open3.capture3({ "HOME" => Dir.tmpdir }, go_command, "tool", "pprof", *args, file.path)
      assert status.success?, "go tool pprof #{args.join(" ")} failed: #{err}"
      out
    end
  end

  # Parses the samples of `go tool pprof -raw`.
  def go_raw_samples(bytes)
    text = go_pprof(bytes, "-raw")
    locations = {}
    text[/^Locations\n(.*?)^Mappings/m, 1].to_s.each_line do |line|
      # (Newer Go versions print file:line:column.)
      match = line.match(/^\s*(\d+): 0x\h+ M=\d+ (.*) (\S*?):(-?\d+)(?::-?\d+)? s=\d+/)
      assert match, "unexpected location line in go tool pprof -raw output: #{line.inspect}"
      locations[match[1].to_i] = [match[2], match[3], match[4].to_i]
    end
    samples = []
    text[/^Samples:\n.*?\n(.*?)^Locations/m, 1].to_s.each_line do |line|
      if (match = line.match(/^\s*((?:-?\d+\s+)*-?\d+): ?([\d ]*)$/))
        samples << GoSample.new(match[1].split.map(&:to_i), match[2].split.map { |id| locations.fetch(id.to_i) }, {})
      elsif line.match?(/^\s+.+?:\[.*\]$/)
        # One line holds every string label (`key:[value] key:[value]`), another the numbers.
        line.scan(/\s*(.+?):\[([^\]]*)\]/) { |key, value| samples.last.labels[key] = value }
      else
        flunk "unexpected sample line in go tool pprof -raw output: #{line.inspect}"
      end
    end
    samples
  end

  # Decodes with our reader, checks Go's reading agrees, and returns our decoding.
  def decode_profile(bytes)
    profile = Contprof::Pprof.decode(bytes)
    # Go's reader drops samples whose values are all zero, and numeric labels whose value
    # is zero (it cannot tell them from absent ones).
    # `-raw` prints "name file:line": where a file name has a space ("(eval at FILE:LINE)"),
    # where the name ends is Go's guess, so names and files are compared joined.
    joined = ->(stack) { stack.map { |name, file, line| ["#{name} #{file}", line] } }
    ours = profile.samples.reject { |sample| sample.values.values.all?(&:zero?) }.map do |sample|
      labels = sample.labels.reject { |_, value| value == 0 }.transform_values(&:to_s)
      [sample.values.values, joined.call(sample.locations.map(&:to_a)), labels]
    end
    # (Newer Go versions keep all-zero samples: they are left out on both sides.)
    theirs = go_raw_samples(bytes).reject { |sample| sample.values.all?(&:zero?) }
                                  .map { |sample| [sample.values, joined.call(sample.stack), sample.labels] }
    only_ours = ours - theirs
    only_theirs = theirs - ours
    assert only_ours.empty? && only_theirs.empty? && ours.size == theirs.size,
           "go tool pprof reads different samples (#{ours.size} ours, #{theirs.size} Go's); " \
           "only ours: #{only_ours.first(3).inspect}; only Go's: #{only_theirs.first(3).inspect}"
    profile
  end

  # Values of `type` per stack, where a stack is an Array of "name@file:line" (leaf first)
  # and samples with equal stacks are summed.
  def totals_by_stack(profile, type)
    totals = Hash.new(0)
    profile.samples.each do |sample|
      totals[sample.locations.map { |f| "#{f.function_name}@#{f.file_name}:#{f.line}" }] += sample.values.fetch(type)
    end
    totals
  end
end

# Ground truth for the accuracy tests: the calling thread's own CPU clock.
module CpuHelpers
  def thread_cpu_time
    Process.clock_gettime(Process::CLOCK_THREAD_CPUTIME_ID)
  end

  # Burns `seconds` of the calling thread's CPU.
  def burn_cpu(seconds)
    start = thread_cpu_time
    nil while thread_cpu_time - start < seconds
  end
end

# For servers the tests start: ports on loopback (or one where nothing answers), their logs.
module Ports
  # A TCP port nobody listens on now (bound, then released).
  def free_port
    require "socket"
    TCPServer.open("127.0.0.1", 0) { |server| server.addr[1] }
  end
  alias closed_port free_port

  # The end of a server's log, for a failure message (all of it when shorter).
  def log_tail(path, characters = 3000)
    text = File.read(path)
    text.size > characters ? text[-characters..] : text
  end
end

module Minitest
  class Test
    include ProfileAssertions
    include CpuHelpers
    include Ports
  end
end
