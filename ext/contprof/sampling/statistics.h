// Helpers for the sampling layer's statistics: counters updated from several threads
// (and from signal handlers) without locks.
#pragma once

#include <stdatomic.h>
#include <stdint.h>

// Raises `*max` to `value` if it is higher (lock-free, async-signal-safe).
static inline void contprof_update_max(atomic_uint_fast64_t *max, uint64_t value) {
  uint_fast64_t seen = atomic_load(max);
  while (value > seen && !atomic_compare_exchange_weak(max, &seen, value)) {
  }
}
