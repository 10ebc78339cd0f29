// What every backend of vm/vm.h shares because it needs only Ruby's public API. Private to
// the vm/ folder.
#pragma once

#include <stdbool.h>
#include <stddef.h>

#include "vm/vm.h"

// Called by each backend's contprof_vm_init (holding the GVL; allocates).
void contprof_vm_common_init(void);

// A Ruby String as a slice pointing into it; "" for anything else (nil, a missing name).
pprof_str contprof_vm_string(VALUE string);

// Builds a frame name in a caller's fixed buffer; what does not fit is cut off.
typedef struct {
  char *buffer;
  size_t size;
  size_t len;
} contprof_name_writer;
void contprof_name_write(contprof_name_writer *w, const char *bytes, size_t len);

// Walks the calling thread's stack into `frames` with `walk` (from a signal handler, the
// thread off the GVL) and fills `info`. A GC running on the GVL holder may move what the
// frames point to: the GC counter is read around the walk, and the walk is given up (-1)
// if a GC ran or started meanwhile. Async-signal-safe when `walk` is. `walk` returns the
// frame count (as contprof_vm_read_stack) and whether every frame kept may be remembered
// by its key (contprof_vm_frame_key_rememberable).
typedef long (*contprof_vm_stack_walk)(void *context, contprof_raw_frame *frames, long capacity, bool *all_old);
long contprof_vm_walk_between_gcs(contprof_vm_stack_walk walk, void *context, contprof_raw_frame *frames,
                                  long capacity, contprof_stack_capture_info *info);

// In CONTPROF_ROUND_CHECKS builds, aborts when a round is running (see
// contprof_vm_round_begin): `event` is what the backend saw. Async-signal-safe.
void contprof_vm_check_no_round(const char *event);
