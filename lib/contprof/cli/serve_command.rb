# frozen_string_literal: true

require "optparse"

module Contprof
  class CLI
    # `contprof serve DIR... [--bind ADDR] [--port N]`: Contprof::Viewer over the
    # directories, on WEBrick or else puma (whichever is installed; neither is a runtime
    # dependency of Contprof), bound to 127.0.0.1 unless told otherwise. Runs until
    # interrupted (Ctrl-C, SIGTERM).
    class ServeCommand
      DEFAULT_PORT = 8754

      def initialize(out:, err:)
        @out = out
        @err = err
      end

      def run(arguments)
        options = { bind: "127.0.0.1", port: DEFAULT_PORT }
        directories = parser(options).parse(arguments)
        return 0 if options[:help]
        raise UsageError, "serve needs at least one profile directory (see contprof serve --help)" if directories.empty?

        directories.each do |directory|
          raise UsageError, "#{directory} is not a directory" unless File.directory?(directory)
        end
        require_relative "../viewer/viewer"
        serve(Viewer.new(directories), options, directories)
      end

      private

      def parser(options)
        OptionParser.new do |o|
          o.banner = "usage: contprof serve DIR... [--bind ADDR] [--port N]\n\n" \
                     "Serves a viewer of the profile directories: their profiles over time, and for a range the " \
                     "flame graph,\nthe top functions, the endpoints and live-heap growth, compared with another " \
                     "range if asked.\n\noptions:"
          o.on("--bind ADDR", "address to listen on (default 127.0.0.1: this machine only)") { |a| options[:bind] = a }
          o.on("--port N", Integer, "port (default #{DEFAULT_PORT}; 0: any free one)") do |port|
            raise UsageError, "--port takes 0 to 65535 (got #{port})" unless (0..65_535).cover?(port)

            options[:port] = port
          end
          o.on("-h", "--help", "show this help") do
            @out.puts(o)
            options[:help] = true
          end
        end
      end

      def serve(app, options, directories)
        begin
          require "webrick"
        rescue LoadError
          return serve_with_puma(app, options, directories)
        end
        server = WEBrick::HTTPServer.new(BindAddress: options[:bind], Port: options[:port], AccessLog: [],
                                         Logger: WEBrick::Log.new(@err, WEBrick::Log::WARN))
        server.mount_proc("/") do |request, response|
          status, headers, body = app.call("REQUEST_METHOD" => request.request_method, "PATH_INFO" => request.path,
                                           "QUERY_STRING" => request.query_string.to_s)
          response.status = status
          headers.each { |name, value| response[name] = value }
          response.body = body.join
        end
        %w[INT TERM].each { |signal| trap(signal) { server.shutdown } }
        announce(options[:bind], server.config[:Port], directories)
        server.start
        0
      end

      def serve_with_puma(app, options, directories)
        require "puma"
        require "puma/server"
        server = Puma::Server.new(app)
        server.add_tcp_listener(options[:bind], options[:port])
        port = server.connected_ports.first
        %w[INT TERM].each { |signal| trap(signal) { server.stop } }
        announce(options[:bind], port, directories)
        server.run.join
        0
      rescue LoadError
        @err.puts("contprof serve needs a web server: install WEBrick (gem install webrick, or Debian's ruby-webrick) " \
                  "or puma")
        1
      end

      def announce(bind, port, directories)
        host = bind.include?(":") ? "[#{bind}]" : bind
        @out.puts("contprof: serving #{directories.join(", ")} at http://#{host}:#{port}/ (Ctrl-C to stop)")
        @out.flush
      end
    end
  end
end
