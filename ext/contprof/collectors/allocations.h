// What a sampled allocation records into the ThreadContext collector's recorder (see
// allocations.c; which allocations are sampled is sampling/allocation_sampler.c).
#pragma once

#include <ruby.h>

#include "collectors/heap_tracker.h"
#include "collectors/thread_context_types.h"
#include "pprof/pprof_profile.h"
#include "vm/vm.h"

#define CONTPROF_CLASS_NAME_MAX 96

// One sampled allocation, from the NEWOBJ hook to the sampling job that records it.
typedef struct {
  VALUE thread; // the allocating thread
  VALUE object; // valid while no GC ran since (gc_count)
  size_t gc_count;
  long total; // frames the stack had
  long frame_count; // of which were read (up to the sampler's capacity)
  uint64_t weight; // the allocations this sample stands for
  uint32_t samples; // how many samples it is (more than 1: later ones merged into it, see the sampler)
  char class_name[CONTPROF_CLASS_NAME_MAX];
  size_t class_name_len;
} contprof_allocation_sample;

// What the collector keeps for allocations: where their values are in the recorder's (or
// -1; alloc-samples-unscaled is how many samples stand behind a value, its error bar), and
// counts.
typedef struct {
  int samples_index, size_index, unscaled_index;
  uint64_t records; // records of sampled allocations
  uint64_t sizes_read, bytes_read; // objects whose size was read, and their bytes
  // The live heap: the tracker of the sampled objects still alive, when the recorder has
  // heap-live types (else NULL), and where those are.
  contprof_heap_tracker *heap;
  int heap_samples_index, heap_size_index, heap_unscaled_index;
} contprof_allocation_state;

// Before the recorder is bound: no allocation values.
void contprof_allocations_init(contprof_allocation_state *allocations);
// After a fork: the sizes read so far count no more.
void contprof_allocations_reset(contprof_allocation_state *allocations);

// Why the live heap cannot be tracked here, or NULL.
const char *contprof_allocations_heap_unsupported_reason(void);
// Finds the recorder's alloc-samples and alloc-size values (a recorder without them
// records no allocation), and starts live-heap tracking when it has heap-live types.
void contprof_allocations_bind(collector_state *state);
// Records `sample` (holding the GVL, at a safe point of its thread).
PPROF_MUST_CHECK
pprof_status contprof_thread_context_record_allocation(VALUE collector, const contprof_allocation_sample *sample,
                                                       const contprof_raw_frame *frames, pprof_error *error);
