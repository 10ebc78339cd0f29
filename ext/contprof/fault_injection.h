// Testing: running out of memory on demand, at the sites where it loses data (a thread
// not followed, a stack not read), so that tests can check every such loss is counted and
// said. Armed only by the Testing module (CpuAndWallTimeWorker::Testing.fail_allocations);
// otherwise one relaxed load per allocation at those sites.
#pragma once

#include <stdatomic.h>
#include <stdbool.h>

extern atomic_int contprof_failing_allocations;

// Whether this allocation is to fail (one of the next N since armed). Async-signal-safe.
static inline bool contprof_allocation_fails(void) {
  if (atomic_load_explicit(&contprof_failing_allocations, memory_order_relaxed) <= 0) return false;
  return atomic_fetch_sub(&contprof_failing_allocations, 1) > 0;
}
