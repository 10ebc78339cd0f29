// The profiler's own threads (worker, scheduler, uploads): never sampled. The registry is
// process-wide, and a thread made by Contprof::Native.profiler_thread is in it before any
// sampling round can see it.
#pragma once

#include <ruby.h>
#include <stdbool.h>

// Whether `thread` is one of the profiler's (holding the GVL; allocates nothing).
bool contprof_profiler_thread(VALUE thread);
// Registers `thread` as the profiler's (holding the GVL).
void contprof_profiler_threads_add(VALUE thread);

// Defines Contprof::Native.profiler_thread { ... } and .profiler_threads.
void contprof_profiler_threads_init(VALUE contprof_module);
