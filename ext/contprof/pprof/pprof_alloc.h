// Memory allocation for the pprof core: thin wrappers over malloc/realloc/free that
// count the bytes the core holds (current and peak), so that benchmarks and tests can
// report exactly how much memory a profile uses, and so that unit tests can inject
// allocation failures to prove that every failure path returns an error cleanly.
//
// Plain C: no Ruby headers. The counters are process-wide relaxed atomics: the sampler
// and the serializer may allocate at the same time from different threads.
#pragma once

#include <stddef.h>
#include <stdint.h>

void *pprof_malloc(size_t size);
void *pprof_realloc(void *ptr, size_t old_size, size_t new_size);
void pprof_free(void *ptr, size_t size);

// Bytes currently held by the core, and the highest value seen since the last reset.
size_t pprof_alloc_current_bytes(void);
size_t pprof_alloc_peak_bytes(void);
void pprof_alloc_reset_peak(void);

// Testing hook: the next `count` allocations succeed, every later one fails, until
// pprof_alloc_fail_after(-1) restores normal behaviour. Not thread-safe with respect to
// other allocating threads; meant for single-threaded unit tests only.
void pprof_alloc_fail_after(long count);
