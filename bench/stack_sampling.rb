# frozen_string_literal: true

# Cost of sampling another thread's stack: Contprof::Collectors::Stack.sample (walk the
# stack and record it into a StackRecorder) against Thread#backtrace_locations on the
# same 100-frame stack, in the same run.
#
#   ruby -Ilib bench/stack_sampling.rb        (also part of `rake bench`)
require "contprof"

DEPTH = Integer(ENV.fetch("DEPTH", "100"))
BATCHES = 301
BATCH = 100

def recurse(depth, queue)
  depth.zero? ? queue.pop : recurse(depth - 1, queue)
end

queue = Queue.new
thread = Thread.new { recurse(DEPTH - 3, queue) } # + the thread's block and Thread::Queue#pop
Thread.pass until thread.status == "sleep"
sleep 0.05
frames = thread.backtrace_locations.size

# Runs the candidates' batches interleaved, so that GC and machine noise hit them alike;
# returns each candidate's median time per call in nanoseconds.
def interleaved_medians(candidates, batches: BATCHES, batch: BATCH)
  times = Hash.new { |h, k| h[k] = [] }
  batches.times do
    candidates.each do |name, work|
      start = Process.clock_gettime(Process::CLOCK_MONOTONIC, :nanosecond)
      batch.times(&work)
      times[name] << (Process.clock_gettime(Process::CLOCK_MONOTONIC, :nanosecond) - start) / batch.to_f
    end
  end
  times.transform_values { |list| list.sort[list.size / 2] }
end

recorder = Contprof::StackRecorder.new
values = { "cpu-samples" => 1, "wall-time" => 10_000_000 }
labels = { "thread id" => 1 }
# Warm up: the first samples intern every frame.
10.times { Contprof::Collectors::Stack.sample(thread, recorder, values, labels) }
3.times { GC.start } # promote the frames' VM objects to the old generation, as in a long-running app

medians = interleaved_medians({
  contprof: ->(_) { Contprof::Collectors::Stack.sample(thread, recorder, values, labels) },
  backtrace_locations: ->(_) { thread.backtrace_locations },
  backtrace: ->(_) { thread.backtrace },
})
contprof_ns = medians[:contprof]
backtrace_ns = medians[:backtrace_locations]
backtrace_strings_ns = medians[:backtrace]
first_sample_ns = Array.new(21) do
  fresh = Contprof::StackRecorder.new
  start = Process.clock_gettime(Process::CLOCK_MONOTONIC, :nanosecond)
  Contprof::Collectors::Stack.sample(thread, fresh, values, labels)
  Process.clock_gettime(Process::CLOCK_MONOTONIC, :nanosecond) - start
end.sort[10]

puts "Sampling another thread's #{frames}-frame stack (median of #{BATCHES} interleaved batches of #{BATCH}):"
printf("  %-58s %8.2f us\n", "Contprof::Collectors::Stack.sample (walk + record)", contprof_ns / 1000)
printf("  %-58s %8.2f us  (%.1fx slower than Contprof)\n", "Thread#backtrace_locations", backtrace_ns / 1000,
       backtrace_ns / contprof_ns)
printf("  %-58s %8.2f us  (%.1fx slower than Contprof)\n", "Thread#backtrace", backtrace_strings_ns / 1000,
       backtrace_strings_ns / contprof_ns)
printf("  %-58s %8.2f us\n", "first sample into an empty recorder (every frame named)", first_sample_ns / 1000.0)
queue << :done
thread.join
