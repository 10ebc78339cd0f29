// The tables a pprof_profile is made of, shared by the files that fill them
// (pprof_profile.c and pprof_samples.c, which explain the design) and the encoders
// (pprof_encode.c, pprof_otlp.c). Not part of the pprof core's interface.
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "pprof_hash.h"
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

// For the files that fill the tables (pprof_profile.c, pprof_samples.c).

static inline bool str_valid(pprof_str s) { return s.ptr != NULL || s.len == 0; }

static inline uint64_t hash_str(pprof_str s) { return pprof_hash_bytes(s.ptr, s.len, 0); }

// The id of string `s` (`hash`: hash_str's), interned if new.
PPROF_MUST_CHECK
static inline pprof_status intern_string(pprof_profile *profile, pprof_str s, uint64_t hash, uint32_t *id,
                                         pprof_error *error) {
  if (s.len == 0) {
    *id = 0; // "" is always string 0
    return PPROF_OK;
  }
  return pprof_blob_intern(&profile->strings, s.ptr, s.len, hash, id, error);
}

// The frame keys' table (pprof_samples.c) is created with the profile, and emptied by a
// reset as by a new frame key epoch.
PPROF_MUST_CHECK
pprof_status pprof_keyed_table_init(pprof_profile *profile, pprof_error *error);
void pprof_keyed_table_clear(pprof_profile *profile);

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
// The end of the run of one stack and label set that starts at entry `first`.
static inline size_t pprof_timeline_run_end(const pprof_timeline *timeline, size_t first) {
  size_t last = first + 1;
  while (last < timeline->count && timeline->order[last].stack == timeline->order[first].stack &&
         timeline->order[last].label_set == timeline->order[first].label_set) {
    last++;
  }
  return last;
}
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

static inline bool read_varint(const uint8_t **p, const uint8_t *end, uint64_t *value) {
  uint64_t result = 0;
  for (int shift = 0; shift < 64 && *p < end; shift += 7) {
    uint8_t byte = *(*p)++;
    result |= (uint64_t) (byte & 0x7f) << shift;
    if (!(byte & 0x80)) {
      *value = result;
      return true;
    }
  }
  return false;
}

static inline int64_t saturating_add(int64_t a, int64_t b) {
  int64_t sum;
  if (__builtin_add_overflow(a, b, &sum)) return b > 0 ? INT64_MAX : INT64_MIN;
  return sum;
}

static inline bool span_equals(byte_span span, pprof_str text) {
  return span.len == text.len && (span.len == 0 || memcmp(span.data, text.ptr, span.len) == 0);
}

// One Label of a label set, its strings interned. A label set's bytes are its Labels as
// Sample.label fields (put_label), in a canonical order, so that equal sets are equal
// bytes; the encoders read them back with next_label.
typedef struct {
  uint32_t key;
  uint32_t str;
  uint32_t num_unit;
  bool is_str;
  int64_t num;
} label_entry;

static inline size_t label_body_size(const label_entry *label) {
  size_t body = 1 + varint_size(label->key);
  if (label->is_str) return body + 1 + varint_size(label->str);
  body += 1 + varint_size((uint64_t) label->num);
  if (label->num_unit) body += 1 + varint_size(label->num_unit);
  return body;
}

// The Sample.label field of `label` at `p` (at most 2 + 5 + label_body_size bytes).
static inline uint8_t *put_label(uint8_t *p, const label_entry *label) {
  *p++ = (3 << 3) | 2; // Sample.label
  p = put_varint(p, label_body_size(label));
  *p++ = (1 << 3) | 0; // Label.key
  p = put_varint(p, label->key);
  if (label->is_str) {
    *p++ = (2 << 3) | 0; // Label.str
    return put_varint(p, label->str);
  }
  *p++ = (3 << 3) | 0; // Label.num
  p = put_varint(p, (uint64_t) label->num);
  if (label->num_unit) {
    *p++ = (4 << 3) | 0; // Label.num_unit
    p = put_varint(p, label->num_unit);
  }
  return p;
}

// Reads the Label at `*p` of a label set ending at `end` and moves past it; false when
// the bytes are not what put_label writes.
static inline bool next_label(const uint8_t **p, const uint8_t *end, label_entry *label) {
  uint64_t tag, length;
  if (!read_varint(p, end, &tag) || tag != ((3 << 3) | 2) || !read_varint(p, end, &length) ||
      length > (uint64_t) (end - *p)) {
    return false;
  }
  const uint8_t *q = *p, *label_end = *p + length;
  *p = label_end;
  *label = (label_entry) {0};
  while (q < label_end) {
    uint64_t value;
    if (!read_varint(&q, label_end, &tag) || (tag & 7) != 0 || !read_varint(&q, label_end, &value)) return false;
    if ((tag >> 3) != 3 && value > UINT32_MAX) return false; // string ids
    switch (tag >> 3) {
    case 1: label->key = (uint32_t) value; break;
    case 2: label->str = (uint32_t) value; label->is_str = true; break;
    case 3: label->num = (int64_t) value; break;
    case 4: label->num_unit = (uint32_t) value; break;
    default: break;
    }
  }
  return true;
}
