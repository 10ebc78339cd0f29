// The OTLP profiles encoder (see pprof_otlp.h).
//
// Messages are written into one buffer with a 5-byte placeholder for each length, closed
// once their body is known: the varint is then written in place and the body moved down
// over the unused placeholder bytes. That moves every byte about once per nesting level,
// which costs less than computing every size first (as the pprof encoder does to stream
// into the compressor), because OTLP nests deeper (request, resource, scope, profile,
// sample) and repeats the samples once per sample type.
#include "pprof_otlp.h"

#include <stdlib.h>
#include <string.h>

#include "pprof_alloc.h"
#include "pprof_gzip.h"
#include "pprof_hash.h"
#include "pprof_profile_tables.h"
#include "pprof_util.h"

enum { WIRE_VARINT = 0, WIRE_FIXED64 = 1, WIRE_BYTES = 2 };
#define LENGTH_PLACEHOLDER 5 // bytes: a varint of up to 2^35 - 1

typedef struct {
  pprof_buffer *out;
  pprof_status status; // the first failure; writes after it do nothing
  pprof_error *error;
} writer;

static bool room(writer *w, size_t bytes) {
  if (w->status != PPROF_OK) return false;
  w->status = pprof_buffer_reserve(w->out, bytes, w->error);
  return w->status == PPROF_OK;
}

static inline uint8_t *cursor(writer *w) { return w->out->data + w->out->len; }
static inline void advance(writer *w, const uint8_t *end) { w->out->len = (size_t) (end - w->out->data); }

static inline uint8_t *put_key(uint8_t *p, uint32_t field, uint32_t wire_type) {
  return put_varint(p, ((uint64_t) field << 3) | wire_type);
}

static void write_varint(writer *w, uint32_t field, uint64_t value) {
  if (!room(w, 16)) return;
  uint8_t *p = put_key(cursor(w), field, WIRE_VARINT);
  advance(w, put_varint(p, value));
}

static uint8_t *put_fixed64(uint8_t *p, uint64_t value) {
  for (int i = 0; i < 8; i++) *p++ = (uint8_t) (value >> (8 * i));
  return p;
}

static void write_fixed64(writer *w, uint32_t field, uint64_t value) {
  if (!room(w, 16)) return;
  advance(w, put_fixed64(put_key(cursor(w), field, WIRE_FIXED64), value));
}

static void write_bytes(writer *w, uint32_t field, const void *data, size_t len) {
  if (!room(w, 16 + len)) return;
  uint8_t *p = put_varint(put_key(cursor(w), field, WIRE_BYTES), len);
  if (len > 0) memcpy(p, data, len);
  advance(w, p + len);
}

// Starts a length-delimited field; returns where its body starts, for close_message.
static size_t open_message(writer *w, uint32_t field) {
  if (!room(w, 16 + LENGTH_PLACEHOLDER)) return 0;
  advance(w, put_key(cursor(w), field, WIRE_BYTES) + LENGTH_PLACEHOLDER);
  return w->out->len;
}

static void close_message(writer *w, size_t body_start) {
  if (w->status != PPROF_OK) return;
  size_t body = w->out->len - body_start;
  uint8_t length[10];
  size_t length_size = (size_t) (put_varint(length, body) - length);
  uint8_t *length_at = w->out->data + body_start - LENGTH_PLACEHOLDER;
  if (length_size < LENGTH_PLACEHOLDER) memmove(length_at + length_size, length_at + LENGTH_PLACEHOLDER, body);
  memcpy(length_at, length, length_size);
  w->out->len -= LENGTH_PLACEHOLDER - length_size;
}

// ---------------------------------------------------------------------------------------
// Attributes: the label sets' labels, interned as encoded KeyValueAndUnit bodies.

// Keys renamed to the semantic conventions' names; their strings follow the profile's own
// in the string table.
typedef struct {
  pprof_str label;
  pprof_str attribute;
  bool as_int; // the value, a decimal string in pprof, is an integer attribute
} key_rename;

static const key_rename renames[] = {
  {PPROF_STR("thread id"), PPROF_STR("thread.id"), true},
  {PPROF_STR("thread name"), PPROF_STR("thread.name"), false},
  {PPROF_STR("thread state"), PPROF_STR("thread.state"), false},
};
#define RENAME_COUNT (sizeof(renames) / sizeof(renames[0]))

typedef struct {
  blob_table attributes; // encoded KeyValueAndUnit bodies; attribute index = id + 1
  pprof_buffer indices; // per label set, its attribute indices as packed varints
  size_t *offsets; // label set i: indices[offsets[i], offsets[i + 1])
  pprof_buffer scratch;
} attribute_tables;

static bool parse_int(byte_span s, int64_t *out) {
  if (s.len == 0 || s.len > 18) return false;
  int64_t value = 0;
  for (size_t i = 0; i < s.len; i++) {
    if (s.data[i] < '0' || s.data[i] > '9') return false;
    value = value * 10 + (s.data[i] - '0');
  }
  *out = value;
  return true;
}

// The KeyValueAndUnit of `label`, encoded into the scratch buffer.
static void encode_attribute(const pprof_profile *profile, const label_entry *label, pprof_buffer *scratch,
                             pprof_status *status, pprof_error *error) {
  scratch->len = 0;
  writer w = {.out = scratch, .status = PPROF_OK, .error = error};
  byte_span key = blob_get(&profile->strings, label->key);
  uint64_t key_index = label->key;
  bool as_int = false;
  for (size_t r = 0; r < RENAME_COUNT; r++) {
    if (span_equals(key, renames[r].label)) {
      key_index = profile->strings.count + r;
      as_int = renames[r].as_int;
    }
  }
  write_varint(&w, 1, key_index); // KeyValueAndUnit.key_strindex
  size_t value = open_message(&w, 2); // KeyValueAndUnit.value: AnyValue
  int64_t number;
  if (!label->is_str) {
    write_varint(&w, 3, (uint64_t) label->num); // AnyValue.int_value
  } else if (as_int && parse_int(blob_get(&profile->strings, label->str), &number)) {
    write_varint(&w, 3, (uint64_t) number);
  } else {
    byte_span text = blob_get(&profile->strings, label->str);
    write_bytes(&w, 1, text.data, text.len); // AnyValue.string_value
  }
  close_message(&w, value);
  if (!label->is_str && label->num_unit) write_varint(&w, 3, label->num_unit); // unit_strindex
  *status = w.status;
}

PPROF_MUST_CHECK
static pprof_status build_attributes(const pprof_profile *profile, attribute_tables *tables, pprof_error *error) {
  pprof_status status = pprof_blob_table_init(&tables->attributes, error);
  if (status != PPROF_OK) return status;
  uint32_t sets = profile->label_sets.count;
  tables->offsets = pprof_malloc((sets + 1) * sizeof(size_t));
  if (!tables->offsets) return pprof_fail(error, PPROF_ERR_NO_MEMORY, "out of memory encoding OTLP attributes");
  for (uint32_t s = 0; s < sets && status == PPROF_OK; s++) {
    tables->offsets[s] = tables->indices.len;
    byte_span set = blob_get(&profile->label_sets, s);
    const uint8_t *p = set.data, *end = set.data + set.len;
    while (p < end && status == PPROF_OK) {
      label_entry label;
      if (!next_label(&p, end, &label) || label.key >= profile->strings.count ||
          (label.is_str && label.str >= profile->strings.count) || label.num_unit >= profile->strings.count) {
        return pprof_fail(error, PPROF_ERR_INVALID, "internal error: a label set could not be read");
      }
      encode_attribute(profile, &label, &tables->scratch, &status, error);
      uint32_t id = 0;
      if (status == PPROF_OK) {
        status = pprof_blob_intern(&tables->attributes, tables->scratch.data, tables->scratch.len,
                                   pprof_hash_bytes(tables->scratch.data, tables->scratch.len, 0), &id, error);
      }
      if (status == PPROF_OK) status = pprof_buffer_reserve(&tables->indices, 10, error);
      if (status == PPROF_OK) {
        uint8_t *q = put_varint(tables->indices.data + tables->indices.len, (uint64_t) id + 1);
        tables->indices.len = (size_t) (q - tables->indices.data);
      }
    }
  }
  tables->offsets[sets] = tables->indices.len;
  return status;
}

static void release_attributes(const pprof_profile *profile, attribute_tables *tables) {
  pprof_blob_table_release(&tables->attributes);
  pprof_buffer_free(&tables->indices);
  pprof_buffer_free(&tables->scratch);
  if (tables->offsets) pprof_free(tables->offsets, (profile->label_sets.count + 1) * sizeof(size_t));
}

// ---------------------------------------------------------------------------------------
// The dictionary

static void write_dictionary(writer *w, const pprof_profile *profile, const attribute_tables *tables) {
  size_t dictionary = open_message(w, 2); // ExportProfilesServiceRequest.dictionary
  write_bytes(w, 1, NULL, 0); // mapping_table[0]: Mapping{}
  write_bytes(w, 2, NULL, 0); // location_table[0]: Location{}
  for (uint32_t i = 0; i < profile->location_count; i++) {
    const location_entry *location = &profile->locations[i];
    size_t message = open_message(w, 2);
    size_t line = open_message(w, 3); // Location.lines
    write_varint(w, 1, location->function_id); // Line.function_index (pprof's id: same index)
    if (location->line != 0) write_varint(w, 2, (uint64_t) location->line);
    close_message(w, line);
    close_message(w, message);
  }
  write_bytes(w, 3, NULL, 0); // function_table[0]: Function{}
  for (uint32_t i = 0; i < profile->function_count; i++) {
    const function_entry *function = &profile->functions[i];
    size_t message = open_message(w, 3);
    if (function->name) write_varint(w, 1, function->name); // name_strindex
    if (function->file) write_varint(w, 3, function->file); // filename_strindex
    close_message(w, message);
  }
  // link_table[0]: the zero Link, with zero-filled ids of the right sizes.
  static const uint8_t zeros[16] = {0};
  size_t link = open_message(w, 4);
  write_bytes(w, 1, zeros, 16);
  write_bytes(w, 2, zeros, 8);
  close_message(w, link);
  for (uint32_t i = 0; i < profile->strings.count; i++) {
    byte_span s = blob_get(&profile->strings, i);
    write_bytes(w, 5, s.data, s.len); // string_table (string 0 is "", as both formats want)
  }
  for (size_t r = 0; r < RENAME_COUNT; r++) write_bytes(w, 5, renames[r].attribute.ptr, renames[r].attribute.len);
  write_bytes(w, 6, NULL, 0); // attribute_table[0]: KeyValueAndUnit{}
  for (uint32_t i = 0; i < tables->attributes.count; i++) {
    byte_span attribute = blob_get(&tables->attributes, i);
    write_bytes(w, 6, attribute.data, attribute.len);
  }
  write_bytes(w, 7, NULL, 0); // stack_table[0]: Stack{}
  for (uint32_t i = 0; i < profile->stacks.count; i++) {
    byte_span stack = blob_get(&profile->stacks, i); // packed location ids, leaf first
    size_t message = open_message(w, 7);
    if (stack.len > 0) write_bytes(w, 1, stack.data, stack.len); // Stack.location_indices, packed
    close_message(w, message);
  }
  close_message(w, dictionary);
}

// ---------------------------------------------------------------------------------------
// Profiles

static inline int64_t row_value(const pprof_profile *profile, const int64_t *rows, size_t row, size_t type) {
  return rows[row * profile->value_count + type];
}

static void write_sample_identity(writer *w, const attribute_tables *tables, const pprof_timed_sample *sample) {
  write_varint(w, 1, (uint64_t) sample->stack + 1); // Sample.stack_index
  size_t from = tables->offsets[sample->label_set], to = tables->offsets[sample->label_set + 1];
  if (to > from) write_bytes(w, 2, tables->indices.data + from, to - from); // attribute_indices, packed
}

// The samples[first, last) of one stack and label set (one, when not timeline samples)
// as one Sample of `type`, their values (rows of `values`, value_count each, parallel to
// `samples`) and timestamps those that are not 0.
static void write_sample(writer *w, const pprof_profile *profile, const attribute_tables *tables,
                         const pprof_timed_sample *samples, const int64_t *values, size_t first, size_t last,
                         size_t type) {
  size_t nonzero = 0, values_len = 0;
  for (size_t k = first; k < last; k++) {
    int64_t value = row_value(profile, values, k, type);
    if (value != 0) {
      nonzero++;
      values_len += varint_size((uint64_t) value);
    }
  }
  if (nonzero == 0) return;
  size_t message = open_message(w, 2); // Profile.samples
  write_sample_identity(w, tables, &samples[first]);
  if (!room(w, 32 + values_len + 8 * nonzero)) return;
  uint8_t *p = put_varint(put_key(cursor(w), 4, WIRE_BYTES), values_len); // values, packed
  for (size_t k = first; k < last; k++) {
    int64_t value = row_value(profile, values, k, type);
    if (value != 0) p = put_varint(p, (uint64_t) value);
  }
  if (samples[first].timestamp_ns != 0) {
    p = put_varint(put_key(p, 5, WIRE_BYTES), 8 * nonzero); // timestamps_unix_nano, packed
    for (size_t k = first; k < last; k++) {
      if (row_value(profile, values, k, type) != 0) p = put_fixed64(p, (uint64_t) samples[k].timestamp_ns);
    }
  }
  advance(w, p);
  close_message(w, message);
}

static void write_value_type(writer *w, uint32_t field, const uint32_t strings[2]) {
  size_t message = open_message(w, field);
  write_varint(w, 1, strings[0]);
  write_varint(w, 2, strings[1]);
  close_message(w, message);
}

// Each run of one stack and label set in the timeline's order is one Sample; without that
// order (no timeline samples, or no memory for it) every sample is a Sample of its own, as
// it was recorded.
static void write_profile(writer *w, const pprof_profile *profile, const attribute_tables *tables,
                          const pprof_timeline *timed, size_t type, int64_t finish_time_ns) {
  size_t message = open_message(w, 2); // ScopeProfiles.profiles
  write_value_type(w, 1, &profile->sample_type_strings[2 * type]);
  for (uint32_t i = 0; i < profile->sample_count; i++) {
    const sample_key *key = &profile->sample_keys[i];
    if (timed->order && key->timestamp_ns != 0) continue;
    pprof_timed_sample one = {.stack = key->stack, .label_set = key->label_set, .index = i,
                              .timestamp_ns = key->timestamp_ns};
    write_sample(w, profile, tables, &one, &profile->sample_values[(size_t) i * profile->value_count], 0, 1, type);
  }
  for (size_t first = 0; timed->order && first < timed->count;) {
    size_t last = pprof_timeline_run_end(timed, first);
    write_sample(w, profile, tables, timed->order, timed->values, first, last, type);
    first = last;
  }
  write_fixed64(w, 3, (uint64_t) profile->start_time_ns); // time_unix_nano
  if (finish_time_ns > profile->start_time_ns) { // duration_nano, as the pprof's (at most INT64_MAX)
    int64_t duration;
    if (__builtin_sub_overflow(finish_time_ns, profile->start_time_ns, &duration)) duration = INT64_MAX;
    write_varint(w, 4, (uint64_t) duration);
  }
  if (profile->has_period) {
    write_value_type(w, 5, profile->period_type_strings);
    write_varint(w, 6, (uint64_t) profile->period);
  }
  close_message(w, message);
}

static void write_any_value(writer *w, const pprof_otlp_attribute *attribute) {
  size_t value = open_message(w, 2); // KeyValue.value
  if (attribute->is_int) {
    write_varint(w, 3, (uint64_t) attribute->num); // int_value
  } else {
    write_bytes(w, 1, attribute->str.ptr, attribute->str.len); // string_value
  }
  close_message(w, value);
}

static void write_request(writer *w, const pprof_profile *profile, const attribute_tables *tables,
                          const pprof_timeline *timed, const pprof_otlp_options *options, int64_t finish_time_ns) {
  size_t resource_profiles = open_message(w, 1); // ExportProfilesServiceRequest.resource_profiles
  size_t resource = open_message(w, 1); // ResourceProfiles.resource
  for (size_t i = 0; i < options->resource_count; i++) {
    size_t attribute = open_message(w, 1); // Resource.attributes
    write_bytes(w, 1, options->resource[i].key.ptr, options->resource[i].key.len);
    write_any_value(w, &options->resource[i]);
    close_message(w, attribute);
  }
  close_message(w, resource);
  size_t scope_profiles = open_message(w, 2); // ResourceProfiles.scope_profiles
  size_t scope = open_message(w, 1); // ScopeProfiles.scope
  if (options->scope_name.len) write_bytes(w, 1, options->scope_name.ptr, options->scope_name.len);
  if (options->scope_version.len) write_bytes(w, 2, options->scope_version.ptr, options->scope_version.len);
  close_message(w, scope);
  for (size_t type = 0; type < profile->value_count; type++) {
    write_profile(w, profile, tables, timed, type, finish_time_ns);
  }
  close_message(w, scope_profiles);
  close_message(w, resource_profiles);
  write_dictionary(w, profile, tables);
}

PPROF_MUST_CHECK
static pprof_status compress(pprof_buffer *plain, pprof_buffer *out, pprof_error *error) {
  pprof_gzip_stream *gzip;
  pprof_status status = pprof_gzip_open(&gzip, out, plain->len, error);
  if (status != PPROF_OK) return status;
  status = pprof_gzip_write(gzip, plain->data, plain->len, error);
  if (status != PPROF_OK) {
    pprof_gzip_abort(gzip);
    return status;
  }
  return pprof_gzip_close(gzip, error);
}

pprof_status pprof_profile_serialize_otlp(const pprof_profile *profile, int64_t finish_time_ns,
                                          const pprof_otlp_options *options, pprof_buffer *out, pprof_error *error) {
  if (!profile || !options || !out) return pprof_fail(error, PPROF_ERR_INVALID, "profile, options or output is NULL");
  out->len = 0;
  attribute_tables tables = {0};
  pprof_timeline timed;
  pprof_timeline_build(profile, &timed); // (without memory for it: the samples as recorded)
  pprof_status status = build_attributes(profile, &tables, error);
  if (status == PPROF_OK) {
    pprof_buffer plain = {0};
    writer w = {.out = options->gzip ? &plain : out, .status = PPROF_OK, .error = error};
    write_request(&w, profile, &tables, &timed, options, finish_time_ns);
    status = w.status;
    if (status == PPROF_OK && options->gzip) status = compress(&plain, out, error);
    pprof_buffer_free(&plain);
  }
  pprof_timeline_free(profile, &timed);
  release_attributes(profile, &tables);
  if (status != PPROF_OK) out->len = 0;
  return status;
}
