# frozen_string_literal: true

module Contprof
  class Viewer
    # The viewer's work on many files spread over a few Ruby threads: the extension reads a
    # file's summary and merges files without the GVL, so those threads run in parallel.
    module Parallel
      module_function

      # The block's answer for each of `items`, in their order, from up to `threads` threads.
      # An exception in one is raised here (by Thread#join) once every thread has ended.
      def map(items, threads)
        queue = Queue.new
        items.each_with_index { |item, i| queue << [item, i] }
        queue.close
        results = Array.new(items.size)
        Array.new([threads, items.size].min) do
          Thread.new do
            while (item, i = queue.pop)
              results[i] = yield(item)
            end
          end
        end.each(&:join)
        results
      end
    end
  end
end
