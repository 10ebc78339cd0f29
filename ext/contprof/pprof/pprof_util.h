// Small shared pieces of the pprof core: growable byte buffers and error reporting.
// Plain C: no Ruby headers.
#pragma once

#include "pprof_profile.h"

// Makes room for `additional` more bytes, growing geometrically.
pprof_status pprof_buffer_reserve(pprof_buffer *buffer, size_t additional, pprof_error *error);
pprof_status pprof_buffer_append(pprof_buffer *buffer, const void *data, size_t len, pprof_error *error);

// Grows an array of `element_size`-byte elements so that it holds at least `needed`
// elements; `*capacity` is in elements. Leaves the array untouched on failure.
pprof_status pprof_grow_array(void **array, size_t *capacity, size_t needed, size_t element_size, pprof_error *error);

// Fills `error` (when not NULL) with a formatted message and returns `status`.
pprof_status pprof_fail(pprof_error *error, pprof_status status, const char *format, ...)
  __attribute__((format(printf, 3, 4)));
