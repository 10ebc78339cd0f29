# frozen_string_literal: true

require "contprof"
require "zlib"
require "contprof/pprof/protobuf"

# Profiles of known shape for the report tests and bench/report.rb, recorded through
# Contprof::StackRecorder (so they are the pprof our own writer produces) with a fixed
# random seed (so every run sees the same profile).
module SyntheticProfiles
  IDLE_LEAVES = [["Kernel#sleep", "<internal:kernel>", 0], ["Thread::Queue#pop", "<internal:thread_sync>", 0],
                 ["IO.select", "<internal:io>", 0]].freeze
  THREADS = 4

  module_function

  # A serialized profile (gzip'd pprof, as StackRecorder#serialize gives it) with its period
  # set: time_nanos and duration_nanos (the Profile's fields 9 and 10) replaced.
  def retimed(gzipped, time_nanos, duration_nanos)
    Zlib.gzip(with_period(untimed(gzipped), time_nanos, duration_nanos))
  end

  # The plain protobuf of a serialized profile without its period (fields 9 and 10).
  def untimed(gzipped)
    data = Zlib.gunzip(gzipped).b
    reader = Contprof::Protobuf::Reader.new(data, RuntimeError)
    out = +"".b
    while reader.pos < data.bytesize
      field, _, start, _, finish = reader.next_field(data.bytesize)
      out << data.byteslice(start, finish - start) unless [9, 10].include?(field)
    end
    out
  end

  # `untimed` with a period appended (plain protobuf: fields may come in any order).
  def with_period(untimed, time_nanos, duration_nanos)
    out = untimed.dup
    Contprof::Protobuf::Writer.varint_field(out, 9, time_nanos)
    Contprof::Protobuf::Writer.varint_field(out, 10, duration_nanos)
    out
  end

  # A server-like profile of `stacks` unique stacks, 20 to 90 frames deep, over about
  # 2,000 functions, on THREADS threads labelled "puma srv tp 00N" / thread id N. Each stack
  # walks a call graph where low-numbered callees are called much more often (as in a real
  # program), so the merged tree has wide frames although no single stack is more than a
  # sliver of the total. About one stack in `idle_one_in` is a thread waiting (IDLE_LEAVES,
  # a few levels down as a thread pool waits for work; at the full depth with `deep_idle`)
  # with much wall time and no CPU. `idle_one_in: 4, deep_idle: true` is a worst case for the
  # flame graph: thousands of deep stacks, each wide enough to be drawn in some view.
  def wide(stacks: 20_000, seed: 16, idle_one_in: 50, deep_idle: false)
    random = Random.new(seed)
    recorder = Contprof::StackRecorder.new
    seen = {}
    while seen.size < stacks
      thread = random.rand(THREADS) + 1
      frames = [["<main>", "/app/config.ru", 1], ["Puma::ThreadPool#spawn_thread", "/gems/puma/thread_pool.rb", 150]]
      depth = 18 + random.rand(70)
      choice = 0
      depth.times do |level|
        choice = (choice * 7 + skewed(random, 50)) % 50
        frames << ["App::Layer#{level}#step_#{choice}", "/app/layer#{level}.rb", choice + 1]
      end
      idle = random.rand(idle_one_in).zero?
      if idle
        frames = frames.first(3 + random.rand(4)) unless deep_idle
        frames << IDLE_LEAVES[random.rand(IDLE_LEAVES.size)]
      end
      next if seen.key?([frames, thread])

      seen[[frames, thread]] = true
      cpu = idle ? 0 : 1_000_000 * (1 + random.rand(20))
      wall = idle ? (deep_idle ? 10_000_000 : 100_000_000) * (1 + random.rand(50)) : cpu + 1_000_000 * random.rand(5)
      recorder.record_sample(frames.reverse, { "cpu-time" => cpu, "cpu-samples" => idle ? 0 : 1, "wall-time" => wall },
                             { "thread id" => thread, "thread name" => format("puma srv tp %03d", thread) })
    end
    recorder.serialize.last
  end

  # A profile of many distinct functions, as a large application with many gems gives:
  # `stacks` unique stacks of `depth` frames, each frame one of `functions` functions spread
  # over `files` files (each stack draws most of its frames fresh, so almost every function
  # appears), on THREADS threads.
  def many_functions(stacks: 20_000, depth: 40, functions: 120_000, files: 300, seed: 23)
    random = Random.new(seed)
    recorder = Contprof::StackRecorder.new
    names = Array.new(functions) { |i| ["Gem#{i % 97}::Module#{i % 1013}#method_#{i}", "/gems/lib#{i % files}/file.rb", 1 + i % 500] }
    stacks.times do |n|
      thread = n % THREADS + 1
      frames = [["<main>", "/app/config.ru", 1]]
      (depth - 1).times { |level| frames << names[(n * (depth - 1) + level * 7919 + random.rand(5)) % functions] }
      cpu = 1_000_000 * (1 + random.rand(20))
      recorder.record_sample(frames.reverse, { "cpu-time" => cpu, "cpu-samples" => 1, "wall-time" => cpu + 1_000_000 * random.rand(5) },
                             { "thread id" => thread, "thread name" => format("puma srv tp %03d", thread) })
    end
    recorder.serialize.last
  end

  # One stack `depth` frames deep (a recursion: "Deep#level_0" at the root down to
  # "Deep#leaf"), plus a short sibling stack so the root has two children.
  def deep(depth: 10_000)
    recorder = Contprof::StackRecorder.new
    frames = Array.new(depth - 1) { |i| ["Deep#level_#{i}", "/app/deep.rb", i + 1] } << ["Deep#leaf", "/app/deep.rb", 0]
    labels = { "thread id" => 1, "thread name" => "main" }
    recorder.record_sample(frames.reverse, { "cpu-time" => 90_000_000, "cpu-samples" => 9, "wall-time" => 90_000_000 }, labels)
    recorder.record_sample([["Shallow#work", "/app/shallow.rb", 3], ["Deep#level_0", "/app/deep.rb", 1]],
                           { "cpu-time" => 10_000_000, "cpu-samples" => 1, "wall-time" => 10_000_000 }, labels)
    recorder.serialize.last
  end

  # A number from 0 to `limit` - 1, small ones much more likely (about 1/(n+1)).
  def skewed(random, limit)
    (limit**random.rand).to_i - 1
  end
end
