# frozen_string_literal: true

# Profiles examples/workload.rb for 3 seconds and writes the pprof to ARGV[0].
#
# Until the C collectors land, this drives the StackRecorder from Ruby: a sampler thread
# reads the main thread's backtrace every 10 ms and records it with its wall time.
require "contprof"
require_relative "workload"

output = ARGV.fetch(0, "demo.pprof")
recorder = Contprof::StackRecorder.new
main = Thread.current
sampler = Thread.new do
  last = Process.clock_gettime(Process::CLOCK_MONOTONIC, :nanosecond)
  loop do
    sleep 0.01
    now = Process.clock_gettime(Process::CLOCK_MONOTONIC, :nanosecond)
    locations = (main.backtrace_locations || []).map { |l| [l.label, l.absolute_path || l.path, l.lineno] }
    recorder.record_sample(locations, { "wall-time" => now - last, "cpu-samples" => 1 }, { "thread name" => "main" })
    last = now
  end
end

rounds = Report.new(3).run
sampler.kill.join
start, finish, pprof = recorder.serialize
File.binwrite(output, pprof)
puts "workload ran #{rounds} rounds; profile of #{(finish - start).round(2)} s written to #{output} (#{pprof.bytesize} bytes)"
