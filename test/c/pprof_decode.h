// A minimal, independent pprof decoder for the C unit tests: gunzips with zlib and
// parses the protobuf wire format by hand, accepting packed and unpacked repeated
// fields alike. It shares no code with the encoder it checks.
#pragma once

#include <stddef.h>
#include <stdint.h>

typedef struct {
  int64_t key, str, num, num_unit;
} dec_label;

typedef struct {
  uint64_t *location_ids;
  size_t location_count;
  int64_t *values;
  size_t value_count;
  dec_label *labels;
  size_t label_count;
} dec_sample;

typedef struct {
  uint64_t id;
  uint64_t function_id; // of the last Line
  int64_t line;
  size_t line_count;
} dec_location;

typedef struct {
  uint64_t id;
  int64_t name, system_name, filename, start_line;
} dec_function;

typedef struct {
  int64_t type, unit;
} dec_value_type;

typedef struct {
  dec_value_type *sample_types;
  size_t sample_type_count;
  dec_sample *samples;
  size_t sample_count;
  dec_location *locations;
  size_t location_count;
  dec_function *functions;
  size_t function_count;
  char **strings; // NUL-terminated copies
  size_t *string_lens;
  size_t string_count;
  int64_t time_nanos, duration_nanos, period, default_sample_type;
  int64_t comments[16]; // string indices
  size_t comment_count;
  dec_value_type period_type;
  int has_period_type;
} dec_profile;

// Returns 0 on success; on failure returns -1 and writes a reason into `error` (200 bytes).
int dec_profile_parse(const uint8_t *gzipped, size_t len, dec_profile *out, char *error);
void dec_profile_free(dec_profile *profile);
// Whether the bytes decode (0), else -1 with the reason in `error`.
int dec_profile_check(const uint8_t *gzipped, size_t len, char *error);

// The string at `index`, or "<bad string index>".
const char *dec_string(const dec_profile *profile, int64_t index);

// Formats a sample's stack as "name@file:line;name@file:line" (leaf first) into `out`.
void dec_format_stack(const dec_profile *profile, const dec_sample *sample, char *out, size_t out_size);

// Formats a sample's labels as "key=value,key=num unit" in the order stored.
void dec_format_labels(const dec_profile *profile, const dec_sample *sample, char *out, size_t out_size);

// Sums value `value_index` over samples whose formatted stack and labels match (labels
// NULL = any labels). Returns the number of matching samples through `matches`.
int64_t dec_sum(const dec_profile *profile, const char *stack, const char *labels, size_t value_index, size_t *matches);
