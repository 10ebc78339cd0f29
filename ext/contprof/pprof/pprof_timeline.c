// The timeline samples as both encoders write them (pprof_encode.c, pprof_otlp.c): in
// which order, and on which grid.
//
// Order: by stack, label set (a thread, in one state), then time. Neighbours then share
// most of their bytes, the stack and the labels, and the compressor turns each into one
// back-reference. The OTLP encoder writes each run of one stack and label set as one
// Sample.
//
// Grid: timestamps, and the values whose unit is nanoseconds, go out in whole ticks of
// PPROF_TIMELINE_TICK_NS (2^20 ns, 1.05 ms; a tenth of the default wall interval). A
// timestamp at full resolution is some 4 bytes of noise to the compressor, a time value
// another 2 or 3; on ticks, their low bytes are zeros. On a minute of Rails under load
// (bench/timeline_size.rb) the grid takes the timeline's profile from 3.6x the merged one
// to 2.7x.
//
// Nothing adds up differently for it: within each run of one stack and label set, values
// are rounded in time order with the remainder carried on, and the run's last sample takes
// what is left. Every run's total, and so every total a reader can form (per function,
// thread, label, state), is the recorded one to the nanosecond; each sample is within one
// tick of what it recorded; a timestamp is floored to its tick, so a thread's timestamps
// stay in order. Samples of one stack and label set that fall in one tick become one:
// nothing would tell them apart (pprof readers merge such samples).
#include <stdlib.h>
#include <string.h>

#include "pprof_alloc.h"
#include "pprof_profile_tables.h"

static int compare_timed(const void *a, const void *b) {
  const pprof_timed_sample *x = a, *y = b;
  if (x->stack != y->stack) return x->stack < y->stack ? -1 : 1;
  if (x->label_set != y->label_set) return x->label_set < y->label_set ? -1 : 1;
  if (x->timestamp_ns != y->timestamp_ns) return x->timestamp_ns < y->timestamp_ns ? -1 : 1;
  return x->index < y->index ? -1 : (x->index > y->index);
}

// A timestamp on the grid.
static int64_t on_grid(int64_t timestamp_ns) {
  int64_t floored = timestamp_ns & ~(int64_t) (PPROF_TIMELINE_TICK_NS - 1);
  return floored > 0 ? floored : timestamp_ns; // 0 would mean "not on the timeline"
}

// Rounds the run order[first, last)'s time values down to ticks, carrying each
// remainder to the next sample of the run; the last takes the rest.
static void round_run(const pprof_profile *profile, pprof_timeline *timeline, size_t first, size_t last) {
  size_t value_count = profile->value_count;
  for (size_t type = 0; type < value_count; type++) {
    if (!profile->time_valued[type]) continue;
    int64_t carried = 0;
    for (size_t k = first; k < last; k++) {
      int64_t *value = &timeline->values[k * value_count + type];
      int64_t owed;
      if (__builtin_add_overflow(*value, carried, &owed)) owed = *value; // saturated values stay as they are
      int64_t rounded = k + 1 == last ? owed : owed - (owed & (PPROF_TIMELINE_TICK_NS - 1));
      if (owed < 0) rounded = owed; // never recorded; kept exactly
      carried = owed - rounded;
      *value = rounded;
    }
  }
}

// Joins neighbours of one stack and label set into the first of them, summing their
// values: those of one tick (`whole_runs` false: nothing tells them apart once on the
// grid, and pprof readers would merge them anyway), or whole runs.
static void join_neighbours(const pprof_profile *profile, pprof_timeline *timeline, bool whole_runs) {
  size_t value_count = profile->value_count, kept = 0;
  for (size_t first = 0; first < timeline->count; kept++) {
    int64_t *sum = &timeline->values[kept * value_count];
    if (kept != first) memmove(sum, &timeline->values[first * value_count], value_count * sizeof(int64_t));
    timeline->order[kept] = timeline->order[first];
    const pprof_timed_sample *head = &timeline->order[first];
    size_t k = first + 1;
    for (; k < timeline->count && timeline->order[k].stack == head->stack &&
           timeline->order[k].label_set == head->label_set &&
           (whole_runs || timeline->order[k].timestamp_ns == head->timestamp_ns);
         k++) {
      for (size_t v = 0; v < value_count; v++) sum[v] = saturating_add(sum[v], timeline->values[k * value_count + v]);
    }
    first = k;
  }
  timeline->count = kept;
}

bool pprof_timeline_build(const pprof_profile *profile, pprof_timeline *timeline) {
  *timeline = (pprof_timeline) {0};
  size_t count = 0;
  for (uint32_t i = 0; i < profile->sample_count; i++) count += profile->sample_keys[i].timestamp_ns != 0;
  if (count == 0) return true;
  size_t value_count = profile->value_count;
  pprof_timed_sample *order = pprof_malloc(count * sizeof(pprof_timed_sample));
  int64_t *values = pprof_malloc(count * value_count * sizeof(int64_t));
  if (!order || !values) {
    if (order) pprof_free(order, count * sizeof(pprof_timed_sample));
    if (values) pprof_free(values, count * value_count * sizeof(int64_t));
    return false;
  }
  size_t n = 0;
  for (uint32_t i = 0; i < profile->sample_count; i++) {
    const sample_key *key = &profile->sample_keys[i];
    if (key->timestamp_ns != 0) {
      order[n++] = (pprof_timed_sample) {.stack = key->stack, .label_set = key->label_set, .index = i,
                                         .timestamp_ns = key->timestamp_ns};
    }
  }
  qsort(order, n, sizeof(pprof_timed_sample), compare_timed);
  for (size_t k = 0; k < n; k++) {
    memcpy(&values[k * value_count], &profile->sample_values[(size_t) order[k].index * value_count],
           value_count * sizeof(int64_t));
    order[k].timestamp_ns = on_grid(order[k].timestamp_ns);
  }
  *timeline = (pprof_timeline) {.order = order, .values = values, .count = n, .allocated = n};
  join_neighbours(profile, timeline, false);
  for (size_t first = 0; first < timeline->count;) {
    size_t last = pprof_timeline_run_end(timeline, first);
    round_run(profile, timeline, first, last);
    first = last;
  }
  return true;
}

void pprof_timeline_merge_runs(const pprof_profile *profile, pprof_timeline *timeline) {
  join_neighbours(profile, timeline, true);
  for (size_t k = 0; k < timeline->count; k++) timeline->order[k].timestamp_ns = 0;
}

void pprof_timeline_free(const pprof_profile *profile, pprof_timeline *timeline) {
  if (timeline->order) pprof_free(timeline->order, timeline->allocated * sizeof(pprof_timed_sample));
  if (timeline->values) pprof_free(timeline->values, timeline->allocated * profile->value_count * sizeof(int64_t));
  *timeline = (pprof_timeline) {0};
}
