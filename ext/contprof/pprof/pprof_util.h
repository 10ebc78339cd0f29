// Small shared pieces of the pprof core: growable byte buffers and error reporting.
// Plain C: no Ruby headers.
#pragma once

#include "pprof_profile.h"

// Makes room for `additional` more bytes, growing geometrically.
PPROF_MUST_CHECK
pprof_status pprof_buffer_reserve(pprof_buffer *buffer, size_t additional, pprof_error *error);
PPROF_MUST_CHECK
pprof_status pprof_buffer_append(pprof_buffer *buffer, const void *data, size_t len, pprof_error *error);

// Grows an array of `element_size`-byte elements so that it holds at least `needed`
// elements; `*capacity` is in elements. Leaves the array untouched on failure.
PPROF_MUST_CHECK
pprof_status pprof_grow_array(void **array, size_t *capacity, size_t needed, size_t element_size, pprof_error *error);

// Fills `error` (when not NULL) with a formatted message and returns `status`.
PPROF_MUST_CHECK
pprof_status pprof_fail(pprof_error *error, pprof_status status, const char *format, ...)
  __attribute__((format(printf, 3, 4)));

// Counts that may add up past what a sample value holds (weights of merged samples, a
// weight times a size) saturate at INT64_MAX instead of wrapping.
static inline int64_t pprof_saturated_int64(uint64_t value) {
  return value > (uint64_t) INT64_MAX ? INT64_MAX : (int64_t) value;
}

// a * b for a, b >= 0, saturated at INT64_MAX (a negative operand counts as 0).
static inline int64_t pprof_saturated_product(int64_t a, int64_t b) {
  if (a <= 0 || b <= 0) return 0;
  int64_t product;
  return __builtin_mul_overflow(a, b, &product) ? INT64_MAX : product;
}
