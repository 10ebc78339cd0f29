# frozen_string_literal: true

module Contprof
  # The Ruby side of the HTTP transport (the request itself is C: ext/contprof/transport/http_transport.c). What
  # every exporter's upload shares: the User-Agent, and a non-2xx answer as an error.
  module HttpTransport
    USER_AGENT = "contprof/#{Contprof::VERSION} ruby/#{RUBY_VERSION}"

    # (Defined by the extension.) #kind: the failure without what changes from one upload
    # to the next (the profiler logs each kind once per destination): "HTTP 500", or what
    # libcurl calls it ("Couldn't connect to server", "Timeout was reached"); nil when
    # unknown.
    class Error
      attr_accessor :kind
    end

    # POSTs `parts` (see _native_post: multipart parts, or a String sent as it is) with the
    # User-Agent and `headers`.
    # Returns the status when it is 2xx; otherwise raises Error naming `target` (the URL by
    # default), the status and the beginning of the answer.
    def self.post(url, parts, timeout:, headers: [], unix_socket: nil, target: display_url(url))
      begin
        status, body = _native_post(url, unix_socket, [["User-Agent", USER_AGENT], *headers], parts, timeout)
      rescue Error => e
        # libcurl's errors name the URL as given, credentials (user:password@) included.
        message = e.message.gsub(url, target)
        error = Error.new(message)
        # "POST <url>: <libcurl's name for it>[: <its details>]", or "... cancelled (...)".
        error.kind = message.delete_prefix("POST #{target}: ").split(": ", 2).first.sub(/\s*\(.*/m, "")
        raise error, cause: nil
      end
      return status if (200..299).cover?(status)

      excerpt = printable_excerpt(body, headers)
      error = Error.new("POST #{target}: HTTP #{status}#{": #{excerpt}" unless excerpt.empty?}")
      error.kind = "HTTP #{status}"
      raise error
    end

    # `url` without its credentials (http://user:password@host → http://[redacted]@host), for
    # logs, errors and inspect.
    def self.display_url(url)
      url.to_s.sub(%r{\A([a-z][a-z0-9+.-]*://)[^/@]*@}i, '\1[redacted]@')
    end

    # The beginning of an answer, safe for one log line: an intake may echo the request (its
    # credentials with it) and put newlines in its body (forged log lines). The values of
    # the headers sent are blanked wherever they appear, and control characters become
    # spaces.
    def self.printable_excerpt(body, headers)
      text = body.dup.force_encoding(Encoding::BINARY)
      headers.each do |_, value|
        text = text.gsub(value.b, "[redacted]") if value.is_a?(String) && value.size >= 4
      end
      text.gsub(/[[:cntrl:]]+/n, " ").strip[0, 200].force_encoding(Encoding::UTF_8).scrub("?")
    end
    private_class_method :printable_excerpt
  end
end
