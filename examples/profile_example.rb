# frozen_string_literal: true

# Profiles examples/workload.rb for 3 seconds with Contprof's sampling worker and writes
# the pprof to ARGV[0].
require "contprof"
require_relative "workload"

output = ARGV.fetch(0, "demo.pprof")
abort "contprof cannot profile here: #{Contprof.unsupported_reason}" unless Contprof.supported?

recorder = Contprof::StackRecorder.new
worker = Contprof::Collectors::CpuAndWallTimeWorker.new(recorder: recorder)
worker.start
rounds = Report.new(3).run
worker.stop
start, finish, pprof = recorder.serialize
File.binwrite(output, pprof)
stats = worker.stats
puts "workload ran #{rounds} rounds; #{stats[:sample_rounds]} sampling rounds; " \
     "profile of #{(finish - start).round(2)} s written to #{output} (#{pprof.bytesize} bytes)"
