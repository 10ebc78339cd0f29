// The pprof core's reader (see pprof_reader.h): one pass over the protobuf collects every
// table into flat arrays (strings stay in the input, as slices), then a second step checks
// string indices and turns location and function ids into indices, through a small
// open-addressing table: ids may be sparse, repeated (the last wins) or in any order.
#include "pprof_reader.h"

#include <string.h>

#include "pprof_alloc.h"
#include "pprof_gzip.h"
#include "pprof_hash.h"
#include "pprof_profile_tables.h"

enum { WIRE_VARINT = 0, WIRE_FIXED64 = 1, WIRE_BYTES = 2, WIRE_FIXED32 = 5 };

// One protobuf field: its number, wire type, and value (varints and fixed-size numbers)
// or bytes (length-delimited).
typedef struct {
  uint64_t number;
  uint64_t wire;
  uint64_t value;
  const uint8_t *data;
  size_t len;
} field;

static uint64_t load_le(const uint8_t *p, size_t bytes) {
  uint64_t value = 0;
  for (size_t i = 0; i < bytes; i++) value |= (uint64_t) p[i] << (8 * i);
  return value;
}

// Reads the field at `*p` and moves past it; false when it is truncated or of a wire type
// pprof does not use (groups).
static bool next_field(const uint8_t **p, const uint8_t *end, field *f) {
  uint64_t key;
  if (!read_varint(p, end, &key)) return false;
  f->number = key >> 3;
  f->wire = key & 7;
  switch (f->wire) {
  case WIRE_VARINT: return read_varint(p, end, &f->value);
  case WIRE_FIXED64:
  case WIRE_FIXED32: {
    size_t bytes = f->wire == WIRE_FIXED64 ? 8 : 4;
    if ((size_t) (end - *p) < bytes) return false;
    f->value = load_le(*p, bytes);
    *p += bytes;
    return true;
  }
  case WIRE_BYTES:
    if (!read_varint(p, end, &f->value) || f->value > (uint64_t) (end - *p)) return false;
    f->data = *p;
    f->len = (size_t) f->value;
    *p += f->len;
    return true;
  default: return false;
  }
}

PPROF_MUST_CHECK
static pprof_status malformed(const char *what, pprof_error *error) {
  return pprof_fail(error, PPROF_ERR_INVALID, "malformed pprof: truncated or invalid %s", what);
}

// Grows `array` (of `count` elements, `capacity` allocated) for one more element.
#define MAKE_ROOM(array, count, capacity)                                                                   \
  do {                                                                                                      \
    void *grown_ = (array);                                                                                 \
    status = pprof_grow_array(&grown_, &(capacity), (count) + 1, sizeof(*(array)), error);                 \
    (array) = grown_;                                                                                       \
  } while (0)

// Appends the varints of a repeated field, packed (one length-delimited field) or not, to
// an array of 64-bit integers (uint64_t or int64_t: the bits are kept).
PPROF_MUST_CHECK
static pprof_status append_varints(const field *f, void **array, size_t *count, size_t *capacity,
                                   pprof_error *error) {
  pprof_status status;
  if (f->wire == WIRE_VARINT) {
    if ((status = pprof_grow_array(array, capacity, *count + 1, sizeof(uint64_t), error)) != PPROF_OK) return status;
    ((uint64_t *) *array)[(*count)++] = f->value;
    return PPROF_OK;
  }
  if (f->wire != WIRE_BYTES) return PPROF_OK;
  // A packed run holds at most one varint per byte.
  if ((status = pprof_grow_array(array, capacity, *count + f->len, sizeof(uint64_t), error)) != PPROF_OK) return status;
  const uint8_t *p = f->data, *end = f->data + f->len;
  uint64_t *out = (uint64_t *) *array;
  while (p < end) {
    if (!read_varint(&p, end, &out[*count])) return malformed("packed varints", error);
    (*count)++;
  }
  return PPROF_OK;
}

// The varint fields numbered 1 to `count` of a message, into values[number - 1] (0 when
// absent, the last when repeated); other fields are skipped.
PPROF_MUST_CHECK
static pprof_status read_varint_fields(const field *f, uint64_t *values, size_t count, const char *what,
                                       pprof_error *error) {
  memset(values, 0, count * sizeof(*values));
  const uint8_t *p = f->data, *end = f->data + f->len;
  field inner;
  while (p < end) {
    if (!next_field(&p, end, &inner)) return malformed(what, error);
    if (inner.wire == WIRE_VARINT && inner.number >= 1 && inner.number <= count) values[inner.number - 1] = inner.value;
  }
  return PPROF_OK;
}

PPROF_MUST_CHECK
static pprof_status parse_value_type(const field *f, pprof_read_value_type *type, pprof_error *error) {
  uint64_t fields[2]; // ValueType: type, unit
  pprof_status status = read_varint_fields(f, fields, 2, "value type", error);
  *type = (pprof_read_value_type) {.type = fields[0], .unit = fields[1]};
  return status;
}

PPROF_MUST_CHECK
static pprof_status parse_label(pprof_reader *r, const field *f, pprof_error *error) {
  pprof_status status;
  MAKE_ROOM(r->labels, r->label_count, r->labels_capacity);
  if (status != PPROF_OK) return status;
  uint64_t fields[4]; // Label: key, str, num, num_unit
  if ((status = read_varint_fields(f, fields, 4, "label", error)) != PPROF_OK) return status;
  r->labels[r->label_count++] =
    (pprof_read_label) {.key = fields[0], .str = fields[1], .num = (int64_t) fields[2], .num_unit = fields[3]};
  return PPROF_OK;
}

PPROF_MUST_CHECK
static pprof_status parse_sample(pprof_reader *r, const field *f, pprof_read_mode mode, pprof_error *error) {
  pprof_status status;
  MAKE_ROOM(r->samples, r->sample_count, r->samples_capacity);
  if (status != PPROF_OK) return status;
  MAKE_ROOM(r->value_counts, r->sample_count, r->value_counts_capacity);
  if (status != PPROF_OK) return status;
  pprof_read_sample sample = {
    .first_location = r->frame_count, .first_value = r->value_count, .first_label = r->label_count};
  const uint8_t *p = f->data, *end = f->data + f->len;
  field inner;
  while (p < end) {
    if (!next_field(&p, end, &inner)) return malformed("sample", error);
    status = PPROF_OK;
    if (inner.number == 1 && mode == PPROF_READ_ALL) {
      void *frames = r->frames;
      status = append_varints(&inner, &frames, &r->frame_count, &r->frames_capacity, error);
      r->frames = frames;
    } else if (inner.number == 2) {
      void *values = r->values;
      status = append_varints(&inner, &values, &r->value_count, &r->values_capacity, error);
      r->values = values;
    } else if (inner.number == 3 && inner.wire == WIRE_BYTES) { // (a summary reads the timeline's reach)
      status = parse_label(r, &inner, error);
    }
    if (status != PPROF_OK) return status;
  }
  sample.location_count = r->frame_count - sample.first_location;
  sample.label_count = r->label_count - sample.first_label;
  r->value_counts[r->sample_count] = r->value_count - sample.first_value;
  r->samples[r->sample_count++] = sample;
  return PPROF_OK;
}

PPROF_MUST_CHECK
static pprof_status parse_location(pprof_reader *r, const field *f, pprof_error *error) {
  pprof_status status;
  MAKE_ROOM(r->locations, r->location_count, r->locations_capacity);
  if (status != PPROF_OK) return status;
  pprof_read_location location = {0, 0, 0, 0};
  const uint8_t *p = f->data, *end = f->data + f->len;
  field inner, line_field;
  while (p < end) {
    if (!next_field(&p, end, &inner)) return malformed("location", error);
    if (inner.number == 1 && inner.wire == WIRE_VARINT) location.id = inner.value;
    if (inner.number != 4 || inner.wire != WIRE_BYTES) continue;
    // A Line: the last one wins (with inlined frames it is the caller). Its function id
    // carries over from the previous Line when absent, its line does not.
    location.line = 0;
    const uint8_t *q = inner.data, *line_end = inner.data + inner.len;
    while (q < line_end) {
      if (!next_field(&q, line_end, &line_field)) return malformed("line", error);
      if (line_field.wire != WIRE_VARINT) continue;
      if (line_field.number == 1) location.function_id = line_field.value;
      if (line_field.number == 2) location.line = (int64_t) line_field.value;
    }
  }
  r->locations[r->location_count++] = location;
  return PPROF_OK;
}

PPROF_MUST_CHECK
static pprof_status parse_function(pprof_reader *r, const field *f, pprof_error *error) {
  pprof_status status;
  MAKE_ROOM(r->functions, r->function_count, r->functions_capacity);
  if (status != PPROF_OK) return status;
  uint64_t fields[4]; // Function: id, name, system_name, filename
  if ((status = read_varint_fields(f, fields, 4, "function", error)) != PPROF_OK) return status;
  r->functions[r->function_count++] = (pprof_read_function) {.id = fields[0], .name = fields[1], .file_name = fields[3]};
  return PPROF_OK;
}

PPROF_MUST_CHECK
static pprof_status parse_profile(pprof_reader *r, const uint8_t *data, size_t len, pprof_read_mode mode,
                                  pprof_error *error) {
  const uint8_t *p = data, *end = data + len;
  field f;
  while (p < end) {
    if (!next_field(&p, end, &f)) return malformed("field", error);
    pprof_status status = PPROF_OK;
    if (f.wire == WIRE_BYTES) {
      switch (f.number) {
      case 1:
        MAKE_ROOM(r->sample_types, r->sample_type_count, r->sample_types_capacity);
        if (status == PPROF_OK) status = parse_value_type(&f, &r->sample_types[r->sample_type_count++], error);
        break;
      case 2: status = parse_sample(r, &f, mode, error); break;
      case 4: if (mode == PPROF_READ_ALL) status = parse_location(r, &f, error); break;
      case 5: if (mode == PPROF_READ_ALL) status = parse_function(r, &f, error); break;
      case 6:
        MAKE_ROOM(r->strings, r->string_count, r->strings_capacity);
        if (status == PPROF_OK) r->strings[r->string_count++] = (pprof_str) {.ptr = (const char *) f.data, .len = f.len};
        break;
      case 11:
        r->has_period_type = true;
        status = parse_value_type(&f, &r->period_type, error);
        break;
      default: break;
      }
    } else if (f.wire == WIRE_VARINT) {
      if (f.number == 9) r->time_nanos = (int64_t) f.value;
      if (f.number == 10) r->duration_nanos = (int64_t) f.value;
      if (f.number == 12) r->period = (int64_t) f.value;
    }
    if (f.number == 13) {
      void *comments = r->comments;
      status = append_varints(&f, &comments, &r->comment_count, &r->comments_capacity, error);
      r->comments = comments;
    }
    if (status != PPROF_OK) return status;
  }
  return PPROF_OK;
}

// ---------------------------------------------------------------------------------------
// Checking indices, resolving ids.

PPROF_MUST_CHECK
static pprof_status check_string(const pprof_reader *r, uint64_t index, pprof_error *error) {
  if (index < r->string_count) return PPROF_OK;
  return pprof_fail(error, PPROF_ERR_INVALID, "string index %llu out of range (%zu strings)",
                    (unsigned long long) index, r->string_count);
}

PPROF_MUST_CHECK
static pprof_status check_strings(const pprof_reader *r, pprof_read_mode mode, pprof_error *error) {
  pprof_status status = PPROF_OK;
  for (size_t i = 0; status == PPROF_OK && i < r->sample_type_count; i++) {
    if ((status = check_string(r, r->sample_types[i].type, error)) == PPROF_OK) {
      status = check_string(r, r->sample_types[i].unit, error);
    }
  }
  if (status == PPROF_OK && r->has_period_type && (status = check_string(r, r->period_type.type, error)) == PPROF_OK) {
    status = check_string(r, r->period_type.unit, error);
  }
  for (size_t i = 0; status == PPROF_OK && i < r->comment_count; i++) status = check_string(r, r->comments[i], error);
  for (size_t i = 0; status == PPROF_OK && i < r->label_count; i++) {
    const pprof_read_label *label = &r->labels[i];
    if ((status = check_string(r, label->key, error)) == PPROF_OK &&
        (status = check_string(r, label->str, error)) == PPROF_OK) {
      status = check_string(r, label->num_unit, error);
    }
  }
  if (mode != PPROF_READ_ALL) return status;
  for (size_t i = 0; status == PPROF_OK && i < r->function_count; i++) {
    if ((status = check_string(r, r->functions[i].name, error)) == PPROF_OK) {
      status = check_string(r, r->functions[i].file_name, error);
    }
  }
  return status;
}

// The id => index table: slots hold index + 1 (0: empty), of entries whose first member
// is their uint64_t id.
static size_t id_position(uint64_t id, size_t mask) { return (size_t) pprof_hash_combine(PPROF_HASH_K0, id) & mask; }

static uint64_t entry_id(const void *entries, size_t stride, size_t index) {
  uint64_t id;
  memcpy(&id, (const uint8_t *) entries + index * stride, sizeof(id));
  return id;
}

PPROF_MUST_CHECK
static pprof_status build_id_table(pprof_reader *r, const void *entries, size_t stride, size_t count,
                                   pprof_error *error) {
  size_t capacity = 16;
  while (capacity < 2 * count) capacity *= 2;
  if (capacity > r->id_slots_capacity) {
    uint32_t *slots = pprof_realloc(r->id_slots, r->id_slots_capacity * sizeof(uint32_t), capacity * sizeof(uint32_t));
    if (!slots) return pprof_fail(error, PPROF_ERR_NO_MEMORY, "out of memory reading a profile's ids");
    r->id_slots = slots;
    r->id_slots_capacity = capacity;
  }
  memset(r->id_slots, 0, r->id_slots_capacity * sizeof(uint32_t));
  size_t mask = r->id_slots_capacity - 1;
  for (size_t i = 0; i < count; i++) {
    uint64_t id = entry_id(entries, stride, i);
    size_t position = id_position(id, mask);
    while (r->id_slots[position] != 0 && entry_id(entries, stride, r->id_slots[position] - 1) != id) {
      position = (position + 1) & mask;
    }
    r->id_slots[position] = (uint32_t) i + 1; // a repeated id: the last one wins
  }
  return PPROF_OK;
}

// The index of the entry with `id`, or false.
static bool find_id(const pprof_reader *r, const void *entries, size_t stride, uint64_t id, size_t *index) {
  size_t mask = r->id_slots_capacity - 1;
  for (size_t position = id_position(id, mask); r->id_slots[position] != 0; position = (position + 1) & mask) {
    if (entry_id(entries, stride, r->id_slots[position] - 1) == id) {
      *index = r->id_slots[position] - 1;
      return true;
    }
  }
  return false;
}

PPROF_MUST_CHECK
static pprof_status resolve_ids(pprof_reader *r, pprof_error *error) {
  if (r->location_count >= UINT32_MAX || r->function_count >= UINT32_MAX) {
    return pprof_fail(error, PPROF_ERR_INVALID, "too many locations or functions");
  }
  pprof_status status = build_id_table(r, r->functions, sizeof(*r->functions), r->function_count, error);
  if (status != PPROF_OK) return status;
  for (size_t i = 0; i < r->location_count; i++) {
    size_t index;
    if (!find_id(r, r->functions, sizeof(*r->functions), r->locations[i].function_id, &index)) {
      return pprof_fail(error, PPROF_ERR_INVALID, "unknown function id %llu",
                        (unsigned long long) r->locations[i].function_id);
    }
    r->locations[i].function = (uint32_t) index;
  }
  if ((status = build_id_table(r, r->locations, sizeof(*r->locations), r->location_count, error)) != PPROF_OK) {
    return status;
  }
  for (size_t i = 0; i < r->frame_count; i++) {
    size_t index;
    if (!find_id(r, r->locations, sizeof(*r->locations), r->frames[i], &index)) {
      return pprof_fail(error, PPROF_ERR_INVALID, "unknown location id %llu", (unsigned long long) r->frames[i]);
    }
    r->frames[i] = index;
  }
  return PPROF_OK;
}

// ---------------------------------------------------------------------------------------

static void forget(pprof_reader *r) {
  r->string_count = r->sample_type_count = r->sample_count = r->frame_count = r->value_count = 0;
  r->label_count = r->location_count = r->function_count = r->comment_count = 0;
  r->time_nanos = r->duration_nanos = r->period = 0;
  r->has_period_type = false;
  r->period_type = (pprof_read_value_type) {0, 0};
}

pprof_status pprof_reader_read(pprof_reader *r, const uint8_t *data, size_t len, pprof_read_mode mode,
                               pprof_error *error) {
  forget(r);
  if (!data && len > 0) return pprof_fail(error, PPROF_ERR_INVALID, "profile data is NULL");
  if (len == 0) data = (const uint8_t *) ""; // (no arithmetic on NULL)
  pprof_status status;
  if (pprof_is_gzip(data, len)) {
    if ((status = pprof_gunzip(data, len, &r->inflated, error)) != PPROF_OK) return status;
    data = r->inflated.data;
    len = r->inflated.len;
  }
  if ((status = parse_profile(r, data, len, mode, error)) != PPROF_OK) return status;
  if (mode == PPROF_READ_ALL && (r->string_count == 0 || r->strings[0].len != 0)) {
    return pprof_fail(error, PPROF_ERR_INVALID, "string_table[0] must be the empty string");
  }
  for (size_t i = 0; i < r->sample_count; i++) {
    if (r->value_counts[i] != r->sample_type_count) {
      return pprof_fail(error, PPROF_ERR_INVALID, "a sample has %zu values for %zu sample types", r->value_counts[i],
                        r->sample_type_count);
    }
  }
  if ((status = check_strings(r, mode, error)) != PPROF_OK) return status;
  return mode == PPROF_READ_ALL ? resolve_ids(r, error) : PPROF_OK;
}

void pprof_reader_free(pprof_reader *r) {
  pprof_buffer_free(&r->inflated);
  pprof_free(r->strings, r->strings_capacity * sizeof(*r->strings));
  pprof_free(r->sample_types, r->sample_types_capacity * sizeof(*r->sample_types));
  pprof_free(r->samples, r->samples_capacity * sizeof(*r->samples));
  pprof_free(r->frames, r->frames_capacity * sizeof(*r->frames));
  pprof_free(r->values, r->values_capacity * sizeof(*r->values));
  pprof_free(r->value_counts, r->value_counts_capacity * sizeof(*r->value_counts));
  pprof_free(r->labels, r->labels_capacity * sizeof(*r->labels));
  pprof_free(r->locations, r->locations_capacity * sizeof(*r->locations));
  pprof_free(r->functions, r->functions_capacity * sizeof(*r->functions));
  pprof_free(r->comments, r->comments_capacity * sizeof(*r->comments));
  pprof_free(r->id_slots, r->id_slots_capacity * sizeof(*r->id_slots));
  memset(r, 0, sizeof(*r));
}

size_t pprof_reader_held_bytes(const pprof_reader *r) {
  return r->inflated.capacity + r->strings_capacity * sizeof(*r->strings) +
         r->sample_types_capacity * sizeof(*r->sample_types) + r->samples_capacity * sizeof(*r->samples) +
         r->frames_capacity * sizeof(*r->frames) + r->values_capacity * sizeof(*r->values) +
         r->value_counts_capacity * sizeof(*r->value_counts) + r->labels_capacity * sizeof(*r->labels) +
         r->locations_capacity * sizeof(*r->locations) + r->functions_capacity * sizeof(*r->functions) +
         r->comments_capacity * sizeof(*r->comments) + r->id_slots_capacity * sizeof(*r->id_slots);
}

bool pprof_reader_is_timestamp(const pprof_reader *r, const pprof_read_label *label) {
  pprof_str key = pprof_reader_string(r, label->key);
  return label->str == 0 && key.len == sizeof(PPROF_TIMESTAMP_LABEL) - 1 &&
         memcmp(key.ptr, PPROF_TIMESTAMP_LABEL, key.len) == 0;
}

size_t pprof_reader_wall_type(const pprof_reader *r) {
  for (size_t t = 0; t < r->sample_type_count; t++) {
    pprof_str type = pprof_reader_string(r, r->sample_types[t].type);
    if (type.len == sizeof(PPROF_WALL_TIME_TYPE) - 1 && memcmp(type.ptr, PPROF_WALL_TIME_TYPE, type.len) == 0) return t;
  }
  return SIZE_MAX;
}

// The time the timeline samples cover: a sample's stretch is its wall time ending at its
// timestamp, and may begin before the profile's period (a stretch recorded just after the
// previous flush).
static void summarize_reach(const pprof_reader *r, pprof_summary *summary) {
  size_t wall = pprof_reader_wall_type(r);
  summary->reach_start = INT64_MAX;
  summary->reach_end = INT64_MIN;
  for (size_t i = 0; i < r->sample_count; i++) {
    const pprof_read_sample *sample = &r->samples[i];
    for (size_t l = 0; l < sample->label_count; l++) {
      const pprof_read_label *label = &r->labels[sample->first_label + l];
      if (!pprof_reader_is_timestamp(r, label)) continue;
      int64_t length = wall == SIZE_MAX ? 0 : r->values[sample->first_value + wall];
      int64_t start = length > 0 && label->num >= INT64_MIN + length ? label->num - length : label->num;
      if (start < summary->reach_start) summary->reach_start = start;
      if (label->num > summary->reach_end) summary->reach_end = label->num;
      summary->has_reach = true;
      break;
    }
  }
}

pprof_status pprof_summarize(pprof_reader *r, const uint8_t *data, size_t len, pprof_summary *summary,
                             pprof_error *error) {
  memset(summary, 0, sizeof(*summary));
  pprof_status status = pprof_reader_read(r, data, len, PPROF_READ_SUMMARY, error);
  if (status != PPROF_OK) return status;
  if (r->sample_type_count > PPROF_MAX_SAMPLE_TYPES) {
    return pprof_fail(error, PPROF_ERR_INVALID, "%zu sample types; at most %d are read", r->sample_type_count,
                      PPROF_MAX_SAMPLE_TYPES);
  }
  summary->sample_type_count = r->sample_type_count;
  for (size_t t = 0; t < r->sample_type_count; t++) {
    summary->sample_types[t] = (pprof_value_type) {.type = pprof_reader_string(r, r->sample_types[t].type),
                                                   .unit = pprof_reader_string(r, r->sample_types[t].unit)};
  }
  for (size_t i = 0; r->sample_type_count > 0 && i < r->sample_count; i++) {
    const int64_t *values = &r->values[r->samples[i].first_value];
    for (size_t t = 0; t < r->sample_type_count; t++) summary->totals[t] = saturating_add(summary->totals[t], values[t]);
  }
  summarize_reach(r, summary);
  summary->time_nanos = r->time_nanos;
  summary->duration_nanos = r->duration_nanos;
  summary->reader = r;
  return PPROF_OK;
}
