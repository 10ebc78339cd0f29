# frozen_string_literal: true

# Shared by the request-label test apps: two endpoints of known CPU cost (3:1 by
# construction) and a middleware that measures the truth, the CPU time each request's thread
# spent in the app, per path, served at /__truth as JSON.
require "json"

module EndpointTruth
  HEAVY_SECONDS = 0.009
  LIGHT_SECONDS = 0.003

  def self.burn(seconds)
    deadline = Process.clock_gettime(Process::CLOCK_THREAD_CPUTIME_ID) + seconds
    nil while Process.clock_gettime(Process::CLOCK_THREAD_CPUTIME_ID) < deadline
  end

  class Middleware
    def initialize(app)
      @app = app
      @lock = Mutex.new
      @cpu = Hash.new(0.0)
      @requests = Hash.new(0)
    end

    def call(env)
      path = env["PATH_INFO"].sub(%r{/\d+\z}, "/:id")
      if path == "/__truth"
        body = @lock.synchronize { JSON.generate("cpu" => @cpu, "requests" => @requests) }
        return [200, { "content-type" => "application/json" }, [body]]
      end
      before = Process.clock_gettime(Process::CLOCK_THREAD_CPUTIME_ID)
      response = @app.call(env)
      spent = Process.clock_gettime(Process::CLOCK_THREAD_CPUTIME_ID) - before
      @lock.synchronize do
        @cpu[path] += spent
        @requests[path] += 1
      end
      response
    end
  end
end
