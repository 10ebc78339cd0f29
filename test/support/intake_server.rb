# frozen_string_literal: true

require "webrick"
require "socket"
require "tmpdir"

# A local HTTP server standing in for a Datadog agent or a Pyroscope server. It parses
# each request's multipart body with WEBrick's own (stock) parser and keeps what it got.
# Over TCP (an ephemeral port) or over a Unix socket.
class IntakeServer
  Request = Struct.new(:method, :path, :query, :headers, :form, keyword_init: true)

  attr_reader :requests, :url, :socket_path

  # status: the HTTP status to answer; delay: seconds to wait before answering; echo: an
  # error answer echoes the request's headers, as some proxies do.
  def initialize(unix_socket: false, status: 202, delay: 0, echo: false)
    @echo = echo
    @requests = Queue.new
    @handlers = [] # WEBrick's connection threads that ran our handler
    @handlers_lock = Mutex.new
    @status = status
    @delay = delay
    options = { Logger: WEBrick::Log.new(File::NULL), AccessLog: [] }
    if unix_socket
      @socket_path = File.join(Dir.mktmpdir("contprof-intake"), "agent.sock")
      @server = WEBrick::HTTPServer.new(options.merge(DoNotListen: true))
      @server.listeners << UNIXServer.new(@socket_path)
      @url = "unix://#{@socket_path}"
    else
      @server = WEBrick::HTTPServer.new(options.merge(BindAddress: "127.0.0.1", Port: 0))
      @url = "http://127.0.0.1:#{@server.config[:Port]}"
    end
    @server.mount_proc("/") { |request, response| handle(request, response) }
    @thread = Thread.new { @server.start }
  end

  def handle(request, response)
    @handlers_lock.synchronize { @handlers << Thread.current }
    form = request.content_type.to_s.start_with?("multipart/form-data") ? request.query : {}
    @requests << Request.new(method: request.request_method, path: request.path,
                             query: WEBrick::HTTPUtils.parse_query(request.query_string.to_s),
                             headers: request.header.transform_values(&:first), form: form)
    sleep @delay if @delay.positive?
    response.status = @status
    response.body = @status >= 300 ? "intake says no (#{@status})" : "{}"
    response.body = "you sent:\n#{request.raw_header.join}" if @echo && @status >= 300
  end

  # The next request received, waiting up to `timeout` seconds.
  def next_request(timeout: 10)
    deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + timeout
    while @requests.empty?
      raise "no request reached the intake server within #{timeout} s" if Process.clock_gettime(Process::CLOCK_MONOTONIC) > deadline

      sleep 0.01
    end
    @requests.pop
  end

  # Stops the server and every connection thread it started: a handler still sleeping its
  # delay would otherwise outlive the test and end in the middle of another one.
  def stop
    @server.shutdown
    @thread.kill unless @thread.join(1)
    @handlers_lock.synchronize { @handlers.dup }.each { |thread| thread.kill.join(1) }
    File.unlink(@socket_path) if @socket_path && File.exist?(@socket_path)
  end
end
