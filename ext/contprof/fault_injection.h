// Testing: running out of memory on demand, at the sites where it loses data (a thread
// not followed, a stack not read), so that tests can check every such loss is counted and
// said. Armed only by the Testing module (CpuAndWallTimeWorker::Testing.fail_allocations);
// otherwise one relaxed load per allocation at those sites.
#pragma once

#include <stdatomic.h>
#include <stdbool.h>

typedef enum {
  CONTPROF_ALLOC_THREAD_STATE, // a thread's collector state (collectors/thread_context.c)
  CONTPROF_ALLOC_THREAD_ENTRY, // a thread's entry in the backend's registry (Ruby 3.3+)
  CONTPROF_ALLOC_STACK_SCRATCH, // the scratch a whole stack is read into (public API)
  CONTPROF_ALLOC_SITES
} contprof_allocation_site;

extern atomic_int contprof_failing_allocations[CONTPROF_ALLOC_SITES];

// Whether this allocation at `site` is to fail (one of the next N since armed).
// Async-signal-safe.
static inline bool contprof_allocation_fails(contprof_allocation_site site) {
  atomic_int *failing = &contprof_failing_allocations[site];
  if (atomic_load_explicit(failing, memory_order_relaxed) <= 0) return false;
  return atomic_fetch_sub(failing, 1) > 0;
}
