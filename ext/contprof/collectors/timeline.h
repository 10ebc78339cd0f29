// The timeline of the ThreadContext collector's records: whether they carry timestamps, and
// the current round's (timestamps are the rounds' CLOCK_MONOTONIC instants, moved to the
// epoch).
#pragma once

#include <stdbool.h>
#include <stdint.h>

#include "ruby_helpers.h"

typedef struct {
  bool on;
  int64_t realtime_offset_ns; // CLOCK_REALTIME minus CLOCK_MONOTONIC, when sampling started
  int64_t round_timestamp_ns; // the current round's timestamp (0 when off)
} contprof_timeline;

// When sampling starts: the offset from monotonic instants to the epoch.
static inline void contprof_timeline_start(contprof_timeline *timeline) {
  timeline->realtime_offset_ns = contprof_realtime_ns() - contprof_monotonic_ns();
}

// The timestamp of a monotonic instant (0 when off).
static inline int64_t contprof_timeline_at(const contprof_timeline *timeline, int64_t monotonic_ns) {
  return timeline->on ? monotonic_ns + timeline->realtime_offset_ns : 0;
}

// A round (or a record taken outside rounds) at the monotonic instant `now_ns`.
static inline void contprof_timeline_begin_round(contprof_timeline *timeline, int64_t now_ns) {
  timeline->round_timestamp_ns = contprof_timeline_at(timeline, now_ns);
}
