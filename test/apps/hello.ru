# frozen_string_literal: true

# The smallest Rack app, for test/requests/requests_test.rb's signal tests under puma.
run ->(_env) { [200, { "content-type" => "text/plain" }, ["hello"]] }
