// Live-heap profiling: of the sampled allocations, which objects are still alive when a
// profile is serialized, with their allocation stack (see heap_tracker.c).
#pragma once

#include <ruby.h>

#include "collectors/stack.h"
#include "pprof/pprof_profile.h"

#define CONTPROF_HEAP_MAX_TRACKED 10000 // objects tracked at most; beyond, new ones are not

typedef struct contprof_heap_tracker contprof_heap_tracker;

typedef struct {
  uint64_t tracked; // objects tracked now
  uint64_t dropped; // sampled objects not tracked (the table was full of live ones)
  uint64_t live_recorded; // in the latest serialization, live objects recorded
  uint64_t died; // tracked objects the GC freed
  uint64_t replaced; // records dropped after a compaction moved another object into their slot
  size_t bytes; // memory the tracker holds
  const char *stopped_because; // why tracking stopped for good, or NULL
} contprof_heap_tracker_stats;

// Why this build cannot track the live heap (which GC functions it lacks), or NULL.
const char *contprof_heap_tracker_unsupported_reason(void);

// A tracker, or NULL where contprof_heap_tracker_unsupported_reason. Holding the GVL.
contprof_heap_tracker *contprof_heap_tracker_new(void);
void contprof_heap_tracker_free(contprof_heap_tracker *tracker);
// From the owner's compaction callback (dcompact): tracked objects may have moved.
void contprof_heap_tracker_update_references(contprof_heap_tracker *tracker);
contprof_heap_tracker_stats contprof_heap_tracker_stats_of(const contprof_heap_tracker *tracker);

// Starts tracking `object` (alive, just sampled: no GC since its allocation), allocated at
// the stack `sampler` holds (just read or used), standing for `weight` allocations. In a
// sampling round: calls no Ruby method, allocates nothing Ruby counts.
PPROF_MUST_CHECK
pprof_status contprof_heap_tracker_track(contprof_heap_tracker *tracker, contprof_stack_sampler *sampler, VALUE object,
                                         const char *class_name, size_t class_name_len, uint64_t weight,
                                         uint32_t samples, pprof_error *error);

// Records every tracked object (all alive: dead ones were dropped at the GC that freed
// them) into `recorder`'s heap-live-samples (`weight`), heap-live-size (weight x its
// size now) and heap-live-samples-unscaled (the samples it was) values (an index of -1:
// not recorded).
// Holding the GVL, outside a GC.
PPROF_MUST_CHECK
pprof_status contprof_heap_tracker_record_live(contprof_heap_tracker *tracker, VALUE recorder, int samples_index,
                                               int size_index, int unscaled_index, size_t value_count,
                                               pprof_error *error);
