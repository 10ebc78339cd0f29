// The pprof core's reader: parses a perftools.profiles.Profile (gzip-compressed or plain
// protobuf) written by any writer, for the merger (pprof_merge.h) and for summaries of
// profiles (a viewer's index). Packed and unpacked repeated fields, fields in any order,
// unknown fields and sparse ids are accepted; anything inconsistent (truncated fields,
// string indices or ids out of range, a sample with the wrong number of values) is
// PPROF_ERR_INVALID with a message. Work and memory are linear in the input's size.
//
// What is read follows the Ruby reader (lib/contprof/pprof/reader.rb): a location is its
// LAST Line's function and line (with inlined frames the last is the caller).
//
// Plain C: no Ruby headers. A reader is reused from one profile to the next (its arrays
// keep their capacity); what it gives is valid until its next read or its free.
#pragma once

#include "pprof_profile.h"
#include "pprof_util.h"

typedef struct {
  uint64_t key, str, num_unit; // string indices (str 0: a number label)
  int64_t num;
} pprof_read_label;

typedef struct {
  size_t first_location, location_count; // in `frames`: indices of `locations`, leaf first
  size_t first_value; // in `values`: one per sample type
  size_t first_label, label_count; // in `labels`
} pprof_read_sample;

typedef struct {
  uint64_t id;
  uint64_t function_id;
  int64_t line;
  uint32_t function; // index in `functions`
} pprof_read_location;

typedef struct {
  uint64_t id;
  uint64_t name, file_name; // string indices
} pprof_read_function;

typedef struct {
  uint64_t type, unit; // string indices
} pprof_read_value_type;

typedef struct {
  pprof_buffer inflated; // the protobuf, when the input was gzip

  pprof_str *strings;
  size_t string_count, strings_capacity;
  pprof_read_value_type *sample_types;
  size_t sample_type_count, sample_types_capacity;
  pprof_read_sample *samples;
  size_t sample_count, samples_capacity;
  uint64_t *frames; // location ids while parsing, then indices of `locations`
  size_t frame_count, frames_capacity;
  int64_t *values;
  size_t value_count, values_capacity;
  size_t *value_counts; // per sample while parsing, checked against the sample types
  size_t value_counts_capacity;
  pprof_read_label *labels;
  size_t label_count, labels_capacity;
  pprof_read_location *locations;
  size_t location_count, locations_capacity;
  pprof_read_function *functions;
  size_t function_count, functions_capacity;
  uint64_t *comments; // string indices
  size_t comment_count, comments_capacity;
  uint32_t *id_slots; // scratch: an id => index table for locations and functions
  size_t id_slots_capacity;

  int64_t time_nanos, duration_nanos, period;
  bool has_period_type;
  pprof_read_value_type period_type;
} pprof_reader;

// What to read: everything, or only what a summary needs (sample types, values, labels,
// times, comments: no frames).
typedef enum { PPROF_READ_ALL, PPROF_READ_SUMMARY } pprof_read_mode;

// Reads the profile in `data` (gzip when it starts with 1f 8b, else protobuf). `reader`
// starts zeroed, or holds a previous read.
PPROF_MUST_CHECK
pprof_status pprof_reader_read(pprof_reader *reader, const uint8_t *data, size_t len, pprof_read_mode mode,
                               pprof_error *error);
void pprof_reader_free(pprof_reader *reader);
size_t pprof_reader_held_bytes(const pprof_reader *reader);

// String `index` of a read profile (indices were checked by the read).
static inline pprof_str pprof_reader_string(const pprof_reader *reader, uint64_t index) {
  return reader->strings[index];
}

// A profile's summary: its sample types, period, the total of each sample type (signed,
// saturating sums) and its comments. Strings point into the reader.
typedef struct {
  pprof_value_type sample_types[PPROF_MAX_SAMPLE_TYPES];
  int64_t totals[PPROF_MAX_SAMPLE_TYPES];
  size_t sample_type_count;
  int64_t time_nanos, duration_nanos;
  // Whether it has timeline samples (a numeric PPROF_TIMESTAMP_LABEL), and the time they
  // cover: from the earliest stretch's start (its timestamp less its wall time) to the
  // latest timestamp.
  bool has_reach;
  int64_t reach_start, reach_end;
  const pprof_reader *reader; // for the comments: pprof_reader_string(reader, reader->comments[i])
} pprof_summary;

#define PPROF_WALL_TIME_TYPE "wall-time"

// Whether a label is a timeline sample's timestamp (numeric, key PPROF_TIMESTAMP_LABEL).
bool pprof_reader_is_timestamp(const pprof_reader *reader, const pprof_read_label *label);
// The index of the sample type PPROF_WALL_TIME_TYPE (a timeline sample's length), or SIZE_MAX.
size_t pprof_reader_wall_type(const pprof_reader *reader);

// Reads `data` with `reader` (PPROF_READ_SUMMARY) and sums it up. More than
// PPROF_MAX_SAMPLE_TYPES sample types is PPROF_ERR_INVALID.
PPROF_MUST_CHECK
pprof_status pprof_summarize(pprof_reader *reader, const uint8_t *data, size_t len, pprof_summary *summary,
                             pprof_error *error);
