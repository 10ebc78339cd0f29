// Contprof::Collectors::CpuAndWallTime: samples every live thread, recording the CPU and
// wall time each consumed since its previous sample. The worker
// (sampling/cpu_and_wall_time_worker.c) decides when; this decides what.
#pragma once

#include <ruby.h>
#include <stdbool.h>

#include "pprof/pprof_profile.h"

VALUE contprof_enforce_cpu_and_wall_time(VALUE collector);

// Samples every live thread except the ignored ones. Must hold the GVL. Does not raise
// for sampling errors (returns the first one) but may raise NoMemoryError when it meets a
// new thread and cannot allocate its state. `final_round` is for the last round of a run:
// no CPU clock read is deferred (see MAX_SKIPPED_CPU_READS), and the calling thread's CPU
// goes to its last sample taken outside the profiler, not to the profiler's stop call.
//
// `calling_thread_cpu` (may be NULL) offers the calling thread's CPU time without a system
// call: it returns true and the thread's CPU clock value at some recent moment (the
// worker: its CPU timer's latest expiry), or false. It is used instead of reading that
// thread's CPU clock when it is ahead of the thread's previous sample; the CPU used
// since that moment then counts in the thread's next sample.
typedef bool (*contprof_cpu_time_source)(VALUE thread, int64_t *cpu_ns);
pprof_status contprof_cpu_and_wall_time_sample(VALUE collector, bool final_round,
                                               contprof_cpu_time_source calling_thread_cpu, pprof_error *error);

// Leaves `thread` out of every sample (the profiler's own threads).
void contprof_cpu_and_wall_time_ignore_thread(VALUE collector, VALUE thread);

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
