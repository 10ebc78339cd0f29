// Independent pprof decoder for the C unit tests (see pprof_decode.h).
#include "pprof_decode.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

typedef struct {
  const uint8_t *p;
  const uint8_t *end;
  int failed;
} reader;

static uint64_t read_varint(reader *r) {
  uint64_t value = 0;
  for (int shift = 0; shift < 64; shift += 7) {
    if (r->p >= r->end) {
      r->failed = 1;
      return 0;
    }
    uint8_t byte = *r->p++;
    value |= (uint64_t) (byte & 0x7f) << shift;
    if (!(byte & 0x80)) return value;
  }
  r->failed = 1;
  return 0;
}

static reader read_bytes(reader *r) {
  uint64_t len = read_varint(r);
  reader sub = {r->p, r->p, 0};
  if (r->failed || len > (uint64_t) (r->end - r->p)) {
    r->failed = 1;
    return sub;
  }
  sub.end = r->p + len;
  r->p += len;
  return sub;
}

static void skip_field(reader *r, int wire_type) {
  switch (wire_type) {
    case 0: read_varint(r); break;
    case 1: if (r->end - r->p < 8) r->failed = 1; else r->p += 8; break;
    case 2: read_bytes(r); break;
    case 5: if (r->end - r->p < 4) r->failed = 1; else r->p += 4; break;
    default: r->failed = 1;
  }
}

static void *grow(void *array, size_t count, size_t element_size) {
  void *grown = realloc(array, (count + 1) * element_size);
  if (!grown) abort();
  return grown;
}

// Reads a repeated varint field occurrence (packed or not) into a growing array.
static void read_repeated(reader *r, int wire_type, uint64_t **array, size_t *count) {
  if (wire_type == 2) {
    reader packed = read_bytes(r);
    while (!r->failed && packed.p < packed.end) {
      *array = grow(*array, *count, sizeof(uint64_t));
      (*array)[(*count)++] = read_varint(&packed);
      if (packed.failed) r->failed = 1;
    }
  } else if (wire_type == 0) {
    *array = grow(*array, *count, sizeof(uint64_t));
    (*array)[(*count)++] = read_varint(r);
  } else {
    r->failed = 1;
  }
}

static dec_value_type parse_value_type(reader r, int *failed) {
  dec_value_type vt = {0, 0};
  while (!r.failed && r.p < r.end) {
    uint64_t key = read_varint(&r);
    int field = (int) (key >> 3), wire = (int) (key & 7);
    if (field == 1 && wire == 0) vt.type = (int64_t) read_varint(&r);
    else if (field == 2 && wire == 0) vt.unit = (int64_t) read_varint(&r);
    else skip_field(&r, wire);
  }
  if (r.failed) *failed = 1;
  return vt;
}

static dec_label parse_label(reader r, int *failed) {
  dec_label label = {0, 0, 0, 0};
  while (!r.failed && r.p < r.end) {
    uint64_t key = read_varint(&r);
    int field = (int) (key >> 3), wire = (int) (key & 7);
    if (wire != 0) {
      skip_field(&r, wire);
      continue;
    }
    int64_t v = (int64_t) read_varint(&r);
    if (field == 1) label.key = v;
    else if (field == 2) label.str = v;
    else if (field == 3) label.num = v;
    else if (field == 4) label.num_unit = v;
  }
  if (r.failed) *failed = 1;
  return label;
}

static dec_sample parse_sample(reader r, int *failed) {
  dec_sample sample;
  memset(&sample, 0, sizeof(sample));
  uint64_t *values = NULL;
  while (!r.failed && r.p < r.end) {
    uint64_t key = read_varint(&r);
    int field = (int) (key >> 3), wire = (int) (key & 7);
    if (field == 1) read_repeated(&r, wire, &sample.location_ids, &sample.location_count);
    else if (field == 2) read_repeated(&r, wire, &values, &sample.value_count);
    else if (field == 3 && wire == 2) {
      sample.labels = grow(sample.labels, sample.label_count, sizeof(dec_label));
      sample.labels[sample.label_count++] = parse_label(read_bytes(&r), failed);
    } else skip_field(&r, wire);
  }
  sample.values = (int64_t *) values;
  if (r.failed) *failed = 1;
  return sample;
}

static dec_location parse_location(reader r, int *failed) {
  dec_location location = {0, 0, 0, 0};
  while (!r.failed && r.p < r.end) {
    uint64_t key = read_varint(&r);
    int field = (int) (key >> 3), wire = (int) (key & 7);
    if (field == 1 && wire == 0) location.id = read_varint(&r);
    else if (field == 4 && wire == 2) {
      reader line = read_bytes(&r);
      location.line_count++;
      location.line = 0;
      while (!line.failed && line.p < line.end) {
        uint64_t line_key = read_varint(&line);
        int line_field = (int) (line_key >> 3), line_wire = (int) (line_key & 7);
        if (line_field == 1 && line_wire == 0) location.function_id = read_varint(&line);
        else if (line_field == 2 && line_wire == 0) location.line = (int64_t) read_varint(&line);
        else skip_field(&line, line_wire);
      }
      if (line.failed) *failed = 1;
    } else skip_field(&r, wire);
  }
  if (r.failed) *failed = 1;
  return location;
}

static dec_function parse_function(reader r, int *failed) {
  dec_function function = {0, 0, 0, 0, 0};
  while (!r.failed && r.p < r.end) {
    uint64_t key = read_varint(&r);
    int field = (int) (key >> 3), wire = (int) (key & 7);
    if (wire != 0) {
      skip_field(&r, wire);
      continue;
    }
    uint64_t v = read_varint(&r);
    if (field == 1) function.id = v;
    else if (field == 2) function.name = (int64_t) v;
    else if (field == 3) function.system_name = (int64_t) v;
    else if (field == 4) function.filename = (int64_t) v;
    else if (field == 5) function.start_line = (int64_t) v;
  }
  if (r.failed) *failed = 1;
  return function;
}

static int gunzip(const uint8_t *in, size_t len, uint8_t **out, size_t *out_len, char *error) {
  z_stream z;
  memset(&z, 0, sizeof(z));
  if (inflateInit2(&z, 15 + 16) != Z_OK) {
    snprintf(error, 200, "inflateInit2 failed");
    return -1;
  }
  size_t capacity = len * 4 + 1024, used = 0;
  uint8_t *buffer = malloc(capacity);
  z.next_in = (Bytef *) in;
  z.avail_in = (uInt) len;
  int result;
  do {
    if (used == capacity) {
      capacity *= 2;
      buffer = realloc(buffer, capacity);
    }
    z.next_out = buffer + used;
    z.avail_out = (uInt) (capacity - used);
    result = inflate(&z, Z_NO_FLUSH);
    used = capacity - z.avail_out;
  } while (result == Z_OK);
  inflateEnd(&z);
  if (result != Z_STREAM_END || z.avail_in != 0) {
    free(buffer);
    snprintf(error, 200, "gzip data is invalid or has trailing bytes (zlib result %d)", result);
    return -1;
  }
  *out = buffer;
  *out_len = used;
  return 0;
}

int dec_profile_parse(const uint8_t *gzipped, size_t len, dec_profile *out, char *error) {
  memset(out, 0, sizeof(*out));
  if (len < 2 || gzipped[0] != 0x1f || gzipped[1] != 0x8b) {
    snprintf(error, 200, "not gzip data");
    return -1;
  }
  uint8_t *raw;
  size_t raw_len;
  if (gunzip(gzipped, len, &raw, &raw_len, error) != 0) return -1;
  reader r = {raw, raw + raw_len, 0};
  int failed = 0;
  while (!r.failed && !failed && r.p < r.end) {
    uint64_t key = read_varint(&r);
    int field = (int) (key >> 3), wire = (int) (key & 7);
    if (wire == 2 && (field == 1 || field == 2 || field == 4 || field == 5 || field == 6 || field == 11)) {
      reader body = read_bytes(&r);
      if (r.failed) break;
      switch (field) {
        case 1:
          out->sample_types = grow(out->sample_types, out->sample_type_count, sizeof(dec_value_type));
          out->sample_types[out->sample_type_count++] = parse_value_type(body, &failed);
          break;
        case 2:
          out->samples = grow(out->samples, out->sample_count, sizeof(dec_sample));
          out->samples[out->sample_count++] = parse_sample(body, &failed);
          break;
        case 4:
          out->locations = grow(out->locations, out->location_count, sizeof(dec_location));
          out->locations[out->location_count++] = parse_location(body, &failed);
          break;
        case 5:
          out->functions = grow(out->functions, out->function_count, sizeof(dec_function));
          out->functions[out->function_count++] = parse_function(body, &failed);
          break;
        case 6: {
          size_t n = (size_t) (body.end - body.p);
          out->strings = grow(out->strings, out->string_count, sizeof(char *));
          out->string_lens = grow(out->string_lens, out->string_count, sizeof(size_t));
          char *copy = malloc(n + 1);
          memcpy(copy, body.p, n);
          copy[n] = 0;
          out->string_lens[out->string_count] = n;
          out->strings[out->string_count++] = copy;
          break;
        }
        case 11:
          out->period_type = parse_value_type(body, &failed);
          out->has_period_type = 1;
          break;
      }
    } else if (field == 13 && (wire == 2 || wire == 0)) { // comments, packed or not
      if (wire == 0) {
        uint64_t v = read_varint(&r);
        if (out->comment_count < 16) out->comments[out->comment_count++] = (int64_t) v;
      } else {
        reader body = read_bytes(&r);
        while (!r.failed && !body.failed && body.p < body.end) {
          uint64_t v = read_varint(&body);
          if (out->comment_count < 16) out->comments[out->comment_count++] = (int64_t) v;
        }
        failed |= body.failed;
      }
    } else if (wire == 0 && (field == 9 || field == 10 || field == 12 || field == 14)) {
      int64_t v = (int64_t) read_varint(&r);
      if (field == 9) out->time_nanos = v;
      else if (field == 10) out->duration_nanos = v;
      else if (field == 12) out->period = v;
      else out->default_sample_type = v;
    } else {
      skip_field(&r, wire);
    }
  }
  free(raw);
  if (r.failed || failed) {
    snprintf(error, 200, "malformed protobuf");
    dec_profile_free(out);
    return -1;
  }
  if (out->string_count == 0 || out->string_lens[0] != 0) {
    snprintf(error, 200, "string_table[0] must be the empty string");
    dec_profile_free(out);
    return -1;
  }
  return 0;
}

int dec_profile_check(const uint8_t *gzipped, size_t len, char *error) {
  dec_profile profile;
  if (dec_profile_parse(gzipped, len, &profile, error) != 0) return -1;
  dec_profile_free(&profile);
  return 0;
}

void dec_profile_free(dec_profile *profile) {
  for (size_t i = 0; i < profile->sample_count; i++) {
    free(profile->samples[i].location_ids);
    free(profile->samples[i].values);
    free(profile->samples[i].labels);
  }
  for (size_t i = 0; i < profile->string_count; i++) free(profile->strings[i]);
  free(profile->sample_types);
  free(profile->samples);
  free(profile->locations);
  free(profile->functions);
  free(profile->strings);
  free(profile->string_lens);
  memset(profile, 0, sizeof(*profile));
}

const char *dec_string(const dec_profile *profile, int64_t index) {
  if (index < 0 || (size_t) index >= profile->string_count) return "<bad string index>";
  return profile->strings[index];
}

static const dec_location *find_location(const dec_profile *profile, uint64_t id) {
  for (size_t i = 0; i < profile->location_count; i++) {
    if (profile->locations[i].id == id) return &profile->locations[i];
  }
  return NULL;
}

static const dec_function *find_function(const dec_profile *profile, uint64_t id) {
  for (size_t i = 0; i < profile->function_count; i++) {
    if (profile->functions[i].id == id) return &profile->functions[i];
  }
  return NULL;
}

void dec_format_stack(const dec_profile *profile, const dec_sample *sample, char *out, size_t out_size) {
  size_t used = 0;
  out[0] = 0;
  for (size_t i = 0; i < sample->location_count && used < out_size; i++) {
    const dec_location *location = find_location(profile, sample->location_ids[i]);
    const dec_function *function = location ? find_function(profile, location->function_id) : NULL;
    int n = snprintf(out + used, out_size - used, "%s%s@%s:%lld", i ? ";" : "",
                     function ? dec_string(profile, function->name) : "<missing>",
                     function ? dec_string(profile, function->filename) : "<missing>",
                     location ? (long long) location->line : -1LL);
    if (n < 0) break;
    used += (size_t) n;
  }
}

void dec_format_labels(const dec_profile *profile, const dec_sample *sample, char *out, size_t out_size) {
  size_t used = 0;
  out[0] = 0;
  for (size_t i = 0; i < sample->label_count && used < out_size; i++) {
    const dec_label *label = &sample->labels[i];
    int n;
    if (label->str) {
      n = snprintf(out + used, out_size - used, "%s%s=%s", i ? "," : "", dec_string(profile, label->key),
                   dec_string(profile, label->str));
    } else {
      n = snprintf(out + used, out_size - used, "%s%s=%lld%s%s", i ? "," : "", dec_string(profile, label->key),
                   (long long) label->num, label->num_unit ? " " : "",
                   label->num_unit ? dec_string(profile, label->num_unit) : "");
    }
    if (n < 0) break;
    used += (size_t) n;
  }
}

int64_t dec_sum(const dec_profile *profile, const char *stack, const char *labels, size_t value_index, size_t *matches) {
  static char formatted[1 << 16];
  int64_t total = 0;
  size_t found = 0;
  for (size_t i = 0; i < profile->sample_count; i++) {
    const dec_sample *sample = &profile->samples[i];
    dec_format_stack(profile, sample, formatted, sizeof(formatted));
    if (strcmp(formatted, stack) != 0) continue;
    if (labels) {
      dec_format_labels(profile, sample, formatted, sizeof(formatted));
      if (strcmp(formatted, labels) != 0) continue;
    }
    if (value_index < sample->value_count) total += sample->values[value_index];
    found++;
  }
  if (matches) *matches = found;
  return total;
}
