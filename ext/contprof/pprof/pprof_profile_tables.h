// The tables a pprof_profile is made of, shared by the file that fills them
// (pprof_profile.c, which explains the design) and the file that encodes them
// (pprof_encode.c). Not part of the pprof core's interface.
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "pprof_intern.h"
#include "pprof_profile.h"
#include "pprof_util.h"

typedef struct {
  uint32_t name; // string ids
  uint32_t file;
} function_entry;

typedef struct {
  uint32_t function_id; // 1-based, as in pprof
  uint32_t name; // the function's strings, copied here so that a lookup need not visit the function
  uint32_t file;
  int64_t line;
} location_entry;

// The table of frame keys stores its entries in its slots: a lookup touches one cache
// line per frame, which matters because samples often arrive with cold caches. The
// all-zero key marks an empty slot (it is never stored: it means "no key").
typedef struct {
  pprof_frame_key key;
  uint32_t location_id;
  uint32_t unused;
} keyed_slot;

typedef struct {
  uint32_t stack;
  uint32_t label_set;
  int64_t timestamp_ns; // a timeline sample's (not in sample_index), else 0
} sample_key;

struct pprof_profile {
  size_t value_count;
  uint32_t sample_type_strings[2 * PPROF_MAX_SAMPLE_TYPES];
  bool time_valued[PPROF_MAX_SAMPLE_TYPES]; // the unit is nanoseconds: on the timeline's grid
  bool has_default_sample_type;
  uint32_t default_sample_type_string;
  bool has_period;
  uint32_t period_type_strings[2];
  int64_t period;
  uint32_t reserved_strings; // strings interned at creation, kept across resets
  uint32_t comments[PPROF_MAX_COMMENTS]; // string ids
  size_t comment_count;
  int64_t start_time_ns;

  blob_table strings;

  function_entry *functions;
  size_t functions_capacity;
  uint32_t function_count;
  intern_index function_index;

  location_entry *locations;
  size_t locations_capacity;
  uint32_t location_count;
  intern_index location_index;

  keyed_slot *keyed_slots; // a power of two of them, at most 3/4 used
  size_t keyed_capacity;
  size_t keyed_count;
  uint64_t frame_key_epoch;

  blob_table stacks; // packed varint location ids, leaf first
  blob_table label_sets; // encoded Sample.label fields

  sample_key *sample_keys;
  size_t sample_keys_capacity;
  int64_t *sample_values; // value_count per sample
  size_t sample_values_capacity;
  uint32_t sample_count;
  intern_index sample_index; // the aggregated samples only
  intern_index timed_index; // the latest timeline sample of each (stack, label set)
  uint32_t timed_count, timeline_limit; // timeline samples, and how many may be
  uint64_t timeline_merged; // timeline samples merged for want of room since the reset
  uint32_t timestamp_key; // the string id of PPROF_TIMESTAMP_LABEL, once a timeline sample needed it
  uint64_t reset_count; // invalidates pprof_sample_refs

  pprof_buffer stack_scratch;
  pprof_buffer label_scratch;
};

// A timeline sample as both encoders write it (pprof_timeline.c).
typedef struct {
  uint32_t stack;
  uint32_t label_set;
  uint32_t index; // in sample_keys
  int64_t timestamp_ns; // on the timeline's grid
} pprof_timed_sample;

// The profile's timeline samples in the order both encoders write them, with their
// values (value_count each, time values on the grid).
typedef struct {
  pprof_timed_sample *order;
  int64_t *values;
  size_t count;
  size_t allocated; // entries allocated (count, until merged)
} pprof_timeline;

// Fills `timeline` (all zero when there are no timeline samples); false without memory,
// when the encoders write timeline samples as they were recorded. Release with
// pprof_timeline_free.
bool pprof_timeline_build(const pprof_profile *profile, pprof_timeline *timeline);
void pprof_timeline_free(const pprof_profile *profile, pprof_timeline *timeline);
// Each run of one stack and label set becomes its first entry, with the run's values
// summed and no timestamp.
void pprof_timeline_merge_runs(const pprof_profile *profile, pprof_timeline *timeline);

static inline size_t varint_size(uint64_t value) {
  size_t size = 1;
  while (value >= 0x80) {
    value >>= 7;
    size++;
  }
  return size;
}

static inline uint8_t *put_varint(uint8_t *p, uint64_t value) {
  while (value >= 0x80) {
    *p++ = (uint8_t) (value | 0x80);
    value >>= 7;
  }
  *p++ = (uint8_t) value;
  return p;
}
