# frozen_string_literal: true

# Cost of sampling another thread's stack: Contprof::Collectors::Stack.sample (walk the
# stack and record it into a StackRecorder) against Thread#backtrace_locations on the
# same 100-frame stack, in the same run, for two shapes of stack.
#
#   ruby -Ilib bench/stack_sampling.rb        (also part of `rake bench`)
require "contprof"

DEPTH = Integer(ENV.fetch("DEPTH", "100"))
BATCHES = 301
BATCH = 100

# Two stacks of about DEPTH frames: a recursion (every frame the same method, which the
# recorder sees as repeated keys), and a chain of different methods where every third
# frame calls the next through a block (Integer#times: a C frame and a block frame), as
# in an application's request.
def recurse(depth, queue)
  depth.zero? ? queue.pop : recurse(depth - 1, queue)
end

module Chain
  LINKS = (DEPTH - 3) * 3 / 5 # each block link adds two frames
  LINKS.times do |i|
    following = i + 1 == LINKS ? "queue.pop" : "link_#{i + 1}(queue)"
    body = (i % 3).zero? ? "1.times { #{following} }" : following
    module_eval("def self.link_#{i}(queue) = #{body}", __FILE__, __LINE__)
  end
end

def parked_thread(queue)
  thread = Thread.new { yield }
  Thread.pass until thread.status == "sleep"
  sleep 0.05
  thread
end

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

VALUES = { "cpu-samples" => 1, "wall-time" => 10_000_000 }.freeze
LABELS = { "thread id" => 1 }.freeze

def measure(title, thread)
  frames = thread.backtrace_locations.size
  recorder = Contprof::StackRecorder.new
  # Warm up: the first samples intern every frame.
  10.times { Contprof::Collectors::Stack.sample(thread, recorder, VALUES, LABELS) }
  3.times { GC.start } # promote the frames' VM objects to the old generation, as in a long-running app

  medians = interleaved_medians({
    contprof: ->(_) { Contprof::Collectors::Stack.sample(thread, recorder, VALUES, LABELS) },
    backtrace_locations: ->(_) { thread.backtrace_locations },
    backtrace: ->(_) { thread.backtrace },
  })
  contprof_ns = medians[:contprof]
  first_sample_ns = Array.new(21) do
    fresh = Contprof::StackRecorder.new
    start = Process.clock_gettime(Process::CLOCK_MONOTONIC, :nanosecond)
    Contprof::Collectors::Stack.sample(thread, fresh, VALUES, LABELS)
    Process.clock_gettime(Process::CLOCK_MONOTONIC, :nanosecond) - start
  end.sort[10]

  puts "Sampling another thread's #{frames}-frame stack, #{title} (median of #{BATCHES} interleaved batches of #{BATCH}):"
  printf("  %-58s %8.2f us\n", "Contprof::Collectors::Stack.sample (walk + record)", contprof_ns / 1000)
  %i[backtrace_locations backtrace].each do |name|
    printf("  %-58s %8.2f us  (%.1fx slower than Contprof)\n", "Thread##{name}", medians[name] / 1000,
           medians[name] / contprof_ns)
  end
  printf("  %-58s %8.2f us\n", "first sample into an empty recorder (every frame named)", first_sample_ns / 1000.0)
end

queue = Queue.new
# + the blocks of the thread and of parked_thread, and Thread::Queue#pop
recursion = parked_thread(queue) { recurse(DEPTH - 4, queue) }
chain = parked_thread(queue) { Chain.link_0(queue) }
measure("a recursion", recursion)
measure("a chain of different methods and blocks", chain)
2.times { queue << :done }
[recursion, chain].each(&:join)
