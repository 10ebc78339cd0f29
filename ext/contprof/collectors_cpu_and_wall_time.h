// Contprof::Collectors::CpuAndWallTime: samples every live thread, recording the CPU and
// wall time each consumed since its previous sample. The worker
// (collectors_cpu_and_wall_time_worker.c) decides when; this decides what.
#pragma once

#include <ruby.h>
#include <stdbool.h>

#include "pprof_profile.h"

VALUE contprof_enforce_cpu_and_wall_time(VALUE collector);

// Samples every live thread except `skip_thread` (Qnil for none). Must hold the GVL. Does
// not raise for sampling errors (returns the first one) but may raise NoMemoryError when
// it meets a new thread and cannot allocate its state. With `read_every_cpu_clock`, no
// CPU clock read is deferred (see MAX_SKIPPED_CPU_READS): for the last round of a run.
pprof_status contprof_cpu_and_wall_time_sample(VALUE collector, VALUE skip_thread, bool read_every_cpu_clock,
                                               pprof_error *error);

// Thread lifecycle, from the worker's event hooks (on the thread concerned, holding the
// GVL): a new thread's clocks start at its birth, and a finishing thread's last slice of
// CPU and wall time is recorded rather than lost.
void contprof_cpu_and_wall_time_on_thread_begin(VALUE collector, VALUE thread);
pprof_status contprof_cpu_and_wall_time_on_thread_end(VALUE collector, VALUE thread, pprof_error *error);

// Starts the clocks of every live thread that has none yet (when sampling starts).
void contprof_cpu_and_wall_time_start_clocks(VALUE collector);

// Forgets every thread (after a fork, in the child).
void contprof_cpu_and_wall_time_reset(VALUE collector);

void contprof_collectors_cpu_and_wall_time_init(VALUE contprof_module);
