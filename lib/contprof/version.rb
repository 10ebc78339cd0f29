# frozen_string_literal: true

module Contprof
  VERSION = "0.1.0"
end
