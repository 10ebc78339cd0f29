// Counting allocator for the pprof core (see pprof_alloc.h).
#include "pprof_alloc.h"

#include <stdatomic.h>
#include <stdlib.h>

static atomic_size_t current_bytes;
static atomic_size_t peak_bytes;
// -1 = never fail. Otherwise the number of allocations still allowed to succeed.
static atomic_long allocations_before_failure = -1;

static int should_fail(void) {
  long remaining = atomic_load_explicit(&allocations_before_failure, memory_order_relaxed);
  if (remaining < 0) return 0;
  if (remaining == 0) return 1;
  atomic_store_explicit(&allocations_before_failure, remaining - 1, memory_order_relaxed);
  return 0;
}

static void account_growth(size_t added) {
  size_t now = atomic_fetch_add_explicit(&current_bytes, added, memory_order_relaxed) + added;
  size_t peak = atomic_load_explicit(&peak_bytes, memory_order_relaxed);
  while (now > peak &&
         !atomic_compare_exchange_weak_explicit(&peak_bytes, &peak, now, memory_order_relaxed, memory_order_relaxed)) {
  }
}

void *pprof_malloc(size_t size) {
  if (size == 0) size = 1;
  if (should_fail()) return NULL;
  void *ptr = malloc(size);
  if (ptr) account_growth(size);
  return ptr;
}

void *pprof_realloc(void *ptr, size_t old_size, size_t new_size) {
  if (new_size == 0) new_size = 1;
  if (should_fail()) return NULL;
  void *grown = realloc(ptr, new_size);
  if (!grown) return NULL;
  if (ptr == NULL) old_size = 0;
  if (new_size >= old_size) {
    account_growth(new_size - old_size);
  } else {
    atomic_fetch_sub_explicit(&current_bytes, old_size - new_size, memory_order_relaxed);
  }
  return grown;
}

void pprof_free(void *ptr, size_t size) {
  if (!ptr) return;
  if (size == 0) size = 1;
  free(ptr);
  atomic_fetch_sub_explicit(&current_bytes, size, memory_order_relaxed);
}

size_t pprof_alloc_current_bytes(void) { return atomic_load_explicit(&current_bytes, memory_order_relaxed); }
size_t pprof_alloc_peak_bytes(void) { return atomic_load_explicit(&peak_bytes, memory_order_relaxed); }

void pprof_alloc_reset_peak(void) {
  atomic_store_explicit(&peak_bytes, atomic_load_explicit(&current_bytes, memory_order_relaxed), memory_order_relaxed);
}

void pprof_alloc_fail_after(long count) {
  atomic_store_explicit(&allocations_before_failure, count < 0 ? -1 : count, memory_order_relaxed);
}
