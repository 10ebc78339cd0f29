// The pprof core's encoder: a profile's tables as a gzip-compressed pprof message (see
// pprof_profile_serialize in pprof_profile.h).
#include <stdlib.h>
#include <string.h>

#include "pprof_gzip.h"
#include "pprof_profile.h"
#include "pprof_alloc.h"
#include "pprof_profile_tables.h"
#include "pprof_util.h"

// The encoder hands data to the compressor in chunks of about this size.
#define ENCODER_FLUSH_BYTES (64 * 1024)

// A streaming protobuf encoder. Every message's length is computed before
// it is written, so nothing is back-patched and the encoded bytes go to the compressor
// in chunks as they are produced.

typedef struct {
  pprof_buffer staging;
  pprof_gzip_stream *gzip;
  pprof_error *error;
  size_t written; // bytes handed to the compressor so far
} encoder;

PPROF_MUST_CHECK
static pprof_status encoder_flush(encoder *e) {
  pprof_status status = pprof_gzip_write(e->gzip, e->staging.data, e->staging.len, e->error);
  e->written += e->staging.len;
  e->staging.len = 0;
  return status;
}

// Makes room for `len` more bytes, first handing what is staged to the compressor once
// it is big enough.
PPROF_MUST_CHECK
static pprof_status encoder_reserve(encoder *e, size_t len) {
  if (e->staging.len >= ENCODER_FLUSH_BYTES) {
    pprof_status status = encoder_flush(e);
    if (status != PPROF_OK) return status;
  }
  return pprof_buffer_reserve(&e->staging, len, e->error);
}

static inline uint8_t *encoder_cursor(encoder *e) { return e->staging.data + e->staging.len; }

static inline void encoder_commit(encoder *e, const uint8_t *end) { e->staging.len = (size_t) (end - e->staging.data); }

static inline uint8_t *put_key(uint8_t *p, uint32_t field, uint32_t wire_type) {
  return put_varint(p, ((uint64_t) field << 3) | wire_type);
}

enum { WIRE_VARINT = 0, WIRE_BYTES = 2 };

static inline size_t varint_field_size(uint64_t value) { return 1 + varint_size(value); }

// Message body sizes, shared by the encoder and by encoded_size().
static inline size_t field_size(size_t body) { return 1 + varint_size(body) + body; } // field numbers < 16

static size_t value_type_body_size(const uint32_t strings[2]) {
  return varint_field_size(strings[0]) + varint_field_size(strings[1]);
}

// A timeline sample's timestamp label: Label{key, num}.
static size_t timestamp_label_body_size(const pprof_profile *profile, int64_t timestamp_ns) {
  return varint_field_size(profile->timestamp_key) + varint_field_size((uint64_t) timestamp_ns);
}

// What one serialization writes: the profile, its timeline samples as they go out, and a
// rewrite's label sets and extra strings (which go after the profile's own).
typedef struct {
  const pprof_profile *profile;
  pprof_timeline timeline;
  size_t *label_offsets; // with a rewrite of labels: label set i is rewritten_labels[i, i + 1)
  pprof_buffer rewritten_labels;
  pprof_str extra_strings[1 + PPROF_MAX_REWRITE_VALUES];
  size_t extra_string_count;
} encoding;

static byte_span labels_of(const encoding *enc, uint32_t label_set) {
  if (!enc->label_offsets) return blob_get(&enc->profile->label_sets, label_set);
  size_t from = enc->label_offsets[label_set], to = enc->label_offsets[label_set + 1];
  if (from == to) return (byte_span) {.data = NULL, .len = 0}; // (no bytes at all yet: data is NULL)
  return (byte_span) {.data = enc->rewritten_labels.data + from, .len = to - from};
}

// One Sample as it goes out: a merged sample's recorded values, or a timeline sample's on
// the grid (pprof_timeline.c).
typedef struct {
  uint32_t stack;
  byte_span labels;
  const int64_t *values;
  int64_t timestamp_ns; // 0: not a timeline sample
} sample_view;

static sample_view recorded_sample(const encoding *enc, uint32_t i) {
  const sample_key *key = &enc->profile->sample_keys[i];
  return (sample_view) {.stack = key->stack, .labels = labels_of(enc, key->label_set), .timestamp_ns = key->timestamp_ns,
                        .values = &enc->profile->sample_values[(size_t) i * enc->profile->value_count]};
}

static sample_view timeline_sample(const encoding *enc, size_t k) {
  const pprof_timed_sample *sample = &enc->timeline.order[k];
  return (sample_view) {.stack = sample->stack, .labels = labels_of(enc, sample->label_set),
                        .timestamp_ns = sample->timestamp_ns,
                        .values = &enc->timeline.values[k * enc->profile->value_count]};
}

static size_t sample_body_size(const pprof_profile *profile, const sample_view *sample, size_t *values_len) {
  *values_len = 0;
  for (size_t v = 0; v < profile->value_count; v++) *values_len += varint_size((uint64_t) sample->values[v]);
  size_t stack_len = blob_get(&profile->stacks, sample->stack).len;
  size_t body = field_size(*values_len) + sample->labels.len;
  if (stack_len > 0) body += field_size(stack_len);
  if (sample->timestamp_ns != 0) body += field_size(timestamp_label_body_size(profile, sample->timestamp_ns));
  return body;
}

static size_t location_line_body_size(const location_entry *location) {
  size_t body = varint_field_size(location->function_id);
  if (location->line != 0) body += varint_field_size((uint64_t) location->line);
  return body;
}

static size_t location_body_size(uint32_t i, const location_entry *location) {
  return varint_field_size((uint64_t) i + 1) + field_size(location_line_body_size(location));
}

// system_name is left out on purpose: pprof tools try to demangle a function whose
// system_name equals its name, and their C++ demangler turns Ruby names such as
// "<main>" or "block in <main>" into "<unknown>".
static size_t function_body_size(uint32_t i, const function_entry *function) {
  size_t body = varint_field_size((uint64_t) i + 1);
  if (function->name) body += varint_field_size(function->name);
  if (function->file) body += varint_field_size(function->file);
  return body;
}

static int64_t duration_ns(const pprof_profile *profile, int64_t finish_time_ns) {
  int64_t duration;
  if (finish_time_ns <= profile->start_time_ns) return 0;
  if (__builtin_sub_overflow(finish_time_ns, profile->start_time_ns, &duration)) return INT64_MAX;
  return duration;
}

// The exact size of the encoded (uncompressed) profile.
static size_t comments_body_size(const pprof_profile *profile) {
  size_t size = 0;
  for (size_t i = 0; i < profile->comment_count; i++) size += varint_size(profile->comments[i]);
  return size;
}

// Whether sample `i` goes out among the merged ones (in the order recorded): every sample
// but the timeline's, and those too without memory for the timeline's order.
static bool written_as_recorded(const encoding *enc, uint32_t i) {
  return !enc->timeline.order || enc->profile->sample_keys[i].timestamp_ns == 0;
}

static size_t encoded_size(const encoding *enc, int64_t finish_time_ns) {
  const pprof_profile *profile = enc->profile;
  size_t total = 0, unused;
  for (size_t i = 0; i < profile->value_count; i++) {
    total += field_size(value_type_body_size(&profile->sample_type_strings[2 * i]));
  }
  for (uint32_t i = 0; i < profile->sample_count; i++) {
    if (!written_as_recorded(enc, i)) continue;
    sample_view sample = recorded_sample(enc, i);
    total += field_size(sample_body_size(profile, &sample, &unused));
  }
  for (size_t k = 0; enc->timeline.order && k < enc->timeline.count; k++) {
    sample_view sample = timeline_sample(enc, k);
    total += field_size(sample_body_size(profile, &sample, &unused));
  }
  for (size_t i = 0; i < enc->extra_string_count; i++) total += field_size(enc->extra_strings[i].len);
  for (uint32_t i = 0; i < profile->location_count; i++) {
    total += field_size(location_body_size(i, &profile->locations[i]));
  }
  for (uint32_t i = 0; i < profile->function_count; i++) {
    total += field_size(function_body_size(i, &profile->functions[i]));
  }
  for (uint32_t i = 0; i < profile->strings.count; i++) total += field_size(blob_get(&profile->strings, i).len);
  total += varint_field_size((uint64_t) profile->start_time_ns) +
           varint_field_size((uint64_t) duration_ns(profile, finish_time_ns));
  if (profile->has_period) {
    total += field_size(value_type_body_size(profile->period_type_strings)) + varint_field_size((uint64_t) profile->period);
  }
  if (profile->has_default_sample_type) total += varint_field_size(profile->default_sample_type_string);
  if (profile->comment_count > 0) total += field_size(comments_body_size(profile));
  return total;
}

PPROF_MUST_CHECK
static pprof_status encode_value_type(encoder *e, uint32_t field, const uint32_t strings[2]) {
  pprof_status status = encoder_reserve(e, 32);
  if (status != PPROF_OK) return status;
  size_t body = value_type_body_size(strings);
  uint8_t *p = put_key(encoder_cursor(e), field, WIRE_BYTES);
  p = put_varint(p, body);
  p = put_key(p, 1, WIRE_VARINT);
  p = put_varint(p, strings[0]);
  p = put_key(p, 2, WIRE_VARINT);
  p = put_varint(p, strings[1]);
  encoder_commit(e, p);
  return PPROF_OK;
}

// The fields go out as location ids, labels, values, then the timestamp: on a timeline,
// where neighbours have the same stack and labels (pprof_timeline.c), what they share is
// then one stretch for the compressor, and what differs another.
PPROF_MUST_CHECK
static pprof_status encode_sample(const pprof_profile *profile, encoder *e, const sample_view *sample) {
  byte_span stack = blob_get(&profile->stacks, sample->stack);
  byte_span labels = sample->labels;
  size_t values_len;
  size_t body = sample_body_size(profile, sample, &values_len);

  pprof_status status = encoder_reserve(e, 1 + 10 + body);
  if (status != PPROF_OK) return status;
  uint8_t *p = put_key(encoder_cursor(e), 2, WIRE_BYTES); // Profile.sample
  p = put_varint(p, body);
  if (stack.len > 0) {
    p = put_key(p, 1, WIRE_BYTES); // Sample.location_id, packed
    p = put_varint(p, stack.len);
    memcpy(p, stack.data, stack.len);
    p += stack.len;
  }
  if (labels.len > 0) memcpy(p, labels.data, labels.len); // Sample.label fields
  p += labels.len;
  p = put_key(p, 2, WIRE_BYTES); // Sample.value, packed
  p = put_varint(p, values_len);
  for (size_t v = 0; v < profile->value_count; v++) p = put_varint(p, (uint64_t) sample->values[v]);
  if (sample->timestamp_ns != 0) {
    p = put_key(p, 3, WIRE_BYTES); // Sample.label
    p = put_varint(p, timestamp_label_body_size(profile, sample->timestamp_ns));
    p = put_key(p, 1, WIRE_VARINT); // Label.key
    p = put_varint(p, profile->timestamp_key);
    p = put_key(p, 3, WIRE_VARINT); // Label.num
    p = put_varint(p, (uint64_t) sample->timestamp_ns);
  }
  encoder_commit(e, p);
  return PPROF_OK;
}

PPROF_MUST_CHECK
static pprof_status encode_samples(const encoding *enc, encoder *e) {
  pprof_status status = PPROF_OK;
  for (uint32_t i = 0; i < enc->profile->sample_count && status == PPROF_OK; i++) {
    if (!written_as_recorded(enc, i)) continue;
    sample_view sample = recorded_sample(enc, i);
    status = encode_sample(enc->profile, e, &sample);
  }
  for (size_t k = 0; enc->timeline.order && k < enc->timeline.count && status == PPROF_OK; k++) {
    sample_view sample = timeline_sample(enc, k);
    status = encode_sample(enc->profile, e, &sample);
  }
  return status;
}

PPROF_MUST_CHECK
static pprof_status encode_locations(const pprof_profile *profile, encoder *e) {
  for (uint32_t i = 0; i < profile->location_count; i++) {
    const location_entry *location = &profile->locations[i];
    size_t line_body = location_line_body_size(location);
    size_t body = location_body_size(i, location);

    pprof_status status = encoder_reserve(e, 1 + 10 + body);
    if (status != PPROF_OK) return status;
    uint8_t *p = put_key(encoder_cursor(e), 4, WIRE_BYTES); // Profile.location
    p = put_varint(p, body);
    p = put_key(p, 1, WIRE_VARINT); // Location.id
    p = put_varint(p, (uint64_t) i + 1);
    p = put_key(p, 4, WIRE_BYTES); // Location.line
    p = put_varint(p, line_body);
    p = put_key(p, 1, WIRE_VARINT); // Line.function_id
    p = put_varint(p, location->function_id);
    if (location->line != 0) {
      p = put_key(p, 2, WIRE_VARINT); // Line.line
      p = put_varint(p, (uint64_t) location->line);
    }
    encoder_commit(e, p);
  }
  return PPROF_OK;
}

PPROF_MUST_CHECK
static pprof_status encode_functions(const pprof_profile *profile, encoder *e) {
  for (uint32_t i = 0; i < profile->function_count; i++) {
    const function_entry *function = &profile->functions[i];
    size_t body = function_body_size(i, function);

    pprof_status status = encoder_reserve(e, 1 + 10 + body);
    if (status != PPROF_OK) return status;
    uint8_t *p = put_key(encoder_cursor(e), 5, WIRE_BYTES); // Profile.function
    p = put_varint(p, body);
    p = put_key(p, 1, WIRE_VARINT); // Function.id
    p = put_varint(p, (uint64_t) i + 1);
    if (function->name) {
      p = put_key(p, 2, WIRE_VARINT); // Function.name
      p = put_varint(p, function->name);
    }
    if (function->file) {
      p = put_key(p, 4, WIRE_VARINT); // Function.filename
      p = put_varint(p, function->file);
    }
    encoder_commit(e, p);
  }
  return PPROF_OK;
}

PPROF_MUST_CHECK
static pprof_status encode_string(encoder *e, const void *data, size_t len) {
  pprof_status status = encoder_reserve(e, 1 + 10 + len);
  if (status != PPROF_OK) return status;
  uint8_t *p = put_key(encoder_cursor(e), 6, WIRE_BYTES); // Profile.string_table
  p = put_varint(p, len);
  if (len > 0) memcpy(p, data, len);
  encoder_commit(e, p + len);
  return PPROF_OK;
}

PPROF_MUST_CHECK
static pprof_status encode_strings(const encoding *enc, encoder *e) {
  pprof_status status = PPROF_OK;
  for (uint32_t i = 0; i < enc->profile->strings.count && status == PPROF_OK; i++) {
    byte_span s = blob_get(&enc->profile->strings, i);
    status = encode_string(e, s.data, s.len);
  }
  for (size_t i = 0; i < enc->extra_string_count && status == PPROF_OK; i++) {
    status = encode_string(e, enc->extra_strings[i].ptr, enc->extra_strings[i].len);
  }
  return status;
}

PPROF_MUST_CHECK
static pprof_status encode_profile(const encoding *enc, int64_t finish_time_ns, encoder *e) {
  const pprof_profile *profile = enc->profile;
  pprof_status status;
  for (size_t i = 0; i < profile->value_count; i++) {
    status = encode_value_type(e, 1, &profile->sample_type_strings[2 * i]); // Profile.sample_type
    if (status != PPROF_OK) return status;
  }
  if ((status = encode_samples(enc, e)) != PPROF_OK) return status;
  if ((status = encode_locations(profile, e)) != PPROF_OK) return status;
  if ((status = encode_functions(profile, e)) != PPROF_OK) return status;
  if ((status = encode_strings(enc, e)) != PPROF_OK) return status;

  int64_t duration = duration_ns(profile, finish_time_ns);
  if ((status = encoder_reserve(e, 64)) != PPROF_OK) return status;
  uint8_t *p = put_key(encoder_cursor(e), 9, WIRE_VARINT); // Profile.time_nanos
  p = put_varint(p, (uint64_t) profile->start_time_ns);
  p = put_key(p, 10, WIRE_VARINT); // Profile.duration_nanos
  p = put_varint(p, (uint64_t) duration);
  encoder_commit(e, p);
  if (profile->has_period) {
    if ((status = encode_value_type(e, 11, profile->period_type_strings)) != PPROF_OK) return status; // period_type
    if ((status = encoder_reserve(e, 16)) != PPROF_OK) return status;
    p = put_key(encoder_cursor(e), 12, WIRE_VARINT); // Profile.period
    p = put_varint(p, (uint64_t) profile->period);
    encoder_commit(e, p);
  }
  if (profile->has_default_sample_type) {
    if ((status = encoder_reserve(e, 16)) != PPROF_OK) return status;
    p = put_key(encoder_cursor(e), 14, WIRE_VARINT); // Profile.default_sample_type
    p = put_varint(p, profile->default_sample_type_string);
    encoder_commit(e, p);
  }
  if (profile->comment_count > 0) { // Profile.comment, packed
    if ((status = encoder_reserve(e, 16 + 10 * PPROF_MAX_COMMENTS)) != PPROF_OK) return status;
    p = put_key(encoder_cursor(e), 13, WIRE_BYTES);
    p = put_varint(p, comments_body_size(profile));
    for (size_t i = 0; i < profile->comment_count; i++) p = put_varint(p, profile->comments[i]);
    encoder_commit(e, p);
  }
  return encoder_flush(e);
}

// ---------------------------------------------------------------------------------------
// Rewrites (pprof_rewrite)

// Label set `blob` with the rewrite's key and values, appended to `out`. `key` is the old
// key's string id, `values[i]` each old value's (0: not in the profile).
PPROF_MUST_CHECK
static pprof_status rewrite_label_set(byte_span blob, uint32_t key, const uint32_t *values, size_t value_count,
                                      uint32_t first_extra, pprof_buffer *out, pprof_error *error) {
  const uint8_t *p = blob.data, *end = blob.data + blob.len;
  while (p < end) {
    label_entry label;
    if (!next_label(&p, end, &label)) return pprof_fail(error, PPROF_ERR_INVALID, "internal error: a label set could not be read");
    if (label.key == key) {
      label.key = first_extra;
      for (size_t i = 0; label.is_str && i < value_count; i++) {
        if (values[i] != 0 && label.str == values[i]) {
          label.str = first_extra + 1 + (uint32_t) i;
          break;
        }
      }
    }
    pprof_status status = pprof_buffer_reserve(out, 2 + 5 + label_body_size(&label), error);
    if (status != PPROF_OK) return status;
    out->len = (size_t) (put_label(out->data + out->len, &label) - out->data);
  }
  return PPROF_OK;
}

// The rewritten label sets, when the profile has the rewrite's key: its new key and
// values go after the profile's strings.
PPROF_MUST_CHECK
static pprof_status prepare_label_rewrite(encoding *enc, const pprof_rewrite *rewrite, pprof_error *error) {
  const pprof_profile *profile = enc->profile;
  if (rewrite->label_key.len == 0) return PPROF_OK;
  if (rewrite->value_count > PPROF_MAX_REWRITE_VALUES) {
    return pprof_fail(error, PPROF_ERR_INVALID, "a rewrite has at most %d values, got %zu", PPROF_MAX_REWRITE_VALUES,
                      rewrite->value_count);
  }
  uint32_t key = 0, values[PPROF_MAX_REWRITE_VALUES] = {0};
  for (uint32_t i = 1; i < profile->strings.count; i++) {
    byte_span text = blob_get(&profile->strings, i);
    if (key == 0 && span_equals(text, rewrite->label_key)) key = i;
    for (size_t v = 0; v < rewrite->value_count; v++) {
      if (values[v] == 0 && span_equals(text, rewrite->values[v])) values[v] = i;
    }
  }
  if (key == 0) return PPROF_OK; // no such label: nothing to rewrite
  uint32_t count = profile->label_sets.count;
  enc->label_offsets = pprof_malloc((count + 1) * sizeof(size_t));
  if (!enc->label_offsets) return pprof_fail(error, PPROF_ERR_NO_MEMORY, "out of memory rewriting labels");
  uint32_t first_extra = profile->strings.count;
  for (uint32_t i = 0; i < count; i++) {
    enc->label_offsets[i] = enc->rewritten_labels.len;
    pprof_status status = rewrite_label_set(blob_get(&profile->label_sets, i), key, values, rewrite->value_count,
                                            first_extra, &enc->rewritten_labels, error);
    if (status != PPROF_OK) return status;
  }
  enc->label_offsets[count] = enc->rewritten_labels.len;
  enc->extra_strings[enc->extra_string_count++] = rewrite->new_label_key;
  for (size_t v = 0; v < rewrite->value_count; v++) enc->extra_strings[enc->extra_string_count++] = rewrite->new_values[v];
  return PPROF_OK;
}

static void release_encoding(encoding *enc) {
  pprof_timeline_free(enc->profile, &enc->timeline);
  if (enc->label_offsets) pprof_free(enc->label_offsets, (enc->profile->label_sets.count + 1) * sizeof(size_t));
  pprof_buffer_free(&enc->rewritten_labels);
}

pprof_status pprof_profile_serialize(const pprof_profile *profile, int64_t finish_time_ns, pprof_buffer *out,
                                     pprof_error *error) {
  return pprof_profile_serialize_rewritten(profile, finish_time_ns, NULL, out, error);
}

pprof_status pprof_profile_serialize_rewritten(const pprof_profile *profile, int64_t finish_time_ns,
                                               const pprof_rewrite *rewrite, pprof_buffer *out, pprof_error *error) {
  if (!profile || !out) return pprof_fail(error, PPROF_ERR_INVALID, "profile or output buffer is NULL");
  out->len = 0;
  encoder e = {.error = error};
  encoding enc = {.profile = profile};
  pprof_timeline_build(profile, &enc.timeline); // (without memory for it: the samples as recorded)
  if (rewrite && rewrite->merge_timeline && enc.timeline.order) pprof_timeline_merge_runs(profile, &enc.timeline);
  pprof_status status = rewrite ? prepare_label_rewrite(&enc, rewrite, error) : PPROF_OK;
  size_t expected_size = encoded_size(&enc, finish_time_ns);
  if (status == PPROF_OK) status = pprof_gzip_open(&e.gzip, out, expected_size, error);
  if (status != PPROF_OK) {
    release_encoding(&enc);
    return status;
  }
  status = encode_profile(&enc, finish_time_ns, &e);
  // The size computation and the encoder must agree; checking costs nothing.
  if (status == PPROF_OK && e.written != expected_size) {
    status = pprof_fail(error, PPROF_ERR_INVALID, "internal error: encoded %zu bytes, expected %zu", e.written,
                        expected_size);
  }
  if (status == PPROF_OK) {
    status = pprof_gzip_close(e.gzip, error);
  } else {
    pprof_gzip_abort(e.gzip);
  }
  pprof_buffer_free(&e.staging);
  release_encoding(&enc);
  if (status != PPROF_OK) out->len = 0;
  return status;
}
