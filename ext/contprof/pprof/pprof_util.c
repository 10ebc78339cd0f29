// Growable buffers, array growth and error messages for the pprof core (see pprof_util.h).
#include "pprof_util.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "pprof_alloc.h"

pprof_status pprof_fail(pprof_error *error, pprof_status status, const char *format, ...) {
  if (error) {
    va_list args;
    va_start(args, format);
    vsnprintf(error->message, sizeof(error->message), format, args);
    va_end(args);
  }
  return status;
}

pprof_status pprof_grow_array(void **array, size_t *capacity, size_t needed, size_t element_size, pprof_error *error) {
  if (needed <= *capacity) return PPROF_OK;
  // Grow by half: at most a third of an array is slack, which matters because a profile's
  // biggest arrays (stack bytes, sample values) are most of its memory.
  size_t new_capacity = *capacity < 16 ? 16 : *capacity;
  if (new_capacity <= SIZE_MAX / 3 * 2) new_capacity += new_capacity / 2;
  if (new_capacity < needed) new_capacity = needed;
  if (new_capacity > SIZE_MAX / element_size) {
    return pprof_fail(error, PPROF_ERR_LIMIT, "array would exceed the address space");
  }
  void *grown = pprof_realloc(*array, *capacity * element_size, new_capacity * element_size);
  if (!grown) {
    return pprof_fail(error, PPROF_ERR_NO_MEMORY, "out of memory growing a table to %zu bytes",
                      new_capacity * element_size);
  }
  *array = grown;
  *capacity = new_capacity;
  return PPROF_OK;
}

pprof_status pprof_buffer_reserve(pprof_buffer *buffer, size_t additional, pprof_error *error) {
  if (additional > SIZE_MAX - buffer->len) return pprof_fail(error, PPROF_ERR_LIMIT, "buffer would exceed the address space");
  void *data = buffer->data;
  pprof_status status = pprof_grow_array(&data, &buffer->capacity, buffer->len + additional, 1, error);
  buffer->data = data;
  return status;
}

pprof_status pprof_buffer_append(pprof_buffer *buffer, const void *data, size_t len, pprof_error *error) {
  if (len == 0) return PPROF_OK;
  pprof_status status = pprof_buffer_reserve(buffer, len, error);
  if (status != PPROF_OK) return status;
  memcpy(buffer->data + buffer->len, data, len);
  buffer->len += len;
  return PPROF_OK;
}

void pprof_buffer_free(pprof_buffer *buffer) {
  pprof_free(buffer->data, buffer->capacity);
  buffer->data = NULL;
  buffer->len = 0;
  buffer->capacity = 0;
}
