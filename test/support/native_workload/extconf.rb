# frozen_string_literal: true

# Builds the tests' native workload (see native_workload.c).
require "mkmf"
$CFLAGS << " -std=gnu11 -Wall -Wextra -Wno-unused-parameter"
create_makefile("native_workload")
