// C unit tests of the OTLP profiles encoder (ext/contprof/pprof/pprof_otlp.c): a profile's
// OTLP request must say what its pprof says. This file has its own small OTLP reader
// (sharing no code with the encoder); the pprof side is read by pprof_decode.c. Each
// sample's stack, labels (attributes under their pprof names again) and timestamp are
// formatted as one string, and the totals per string and per sample type must be equal.
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

#include "../../ext/contprof/pprof/pprof_alloc.h"
#include "../../ext/contprof/pprof/pprof_otlp.h"
#include "../../ext/contprof/pprof/pprof_profile.h"
#include "checks.h"
#include "pprof_decode.h"


// ---------------------------------------------------------------------------------------
// A small OTLP reader: only what the checks need, every index checked.

typedef struct {
  const uint8_t *p, *end;
  int ok;
} cursor;

static uint64_t varint(cursor *c) {
  uint64_t value = 0;
  for (int shift = 0; shift < 64; shift += 7) {
    if (c->p >= c->end) break;
    uint8_t byte = *c->p++;
    value |= (uint64_t) (byte & 0x7f) << shift;
    if (!(byte & 0x80)) return value;
  }
  c->ok = 0;
  return 0;
}

// The next field: its number, wire type, and (length-delimited) body or (varint/fixed64) value.
static int next_field(cursor *c, uint32_t *field, uint32_t *wire, cursor *body, uint64_t *value) {
  if (!c->ok || c->p >= c->end) return 0;
  uint64_t key = varint(c);
  *field = (uint32_t) (key >> 3);
  *wire = (uint32_t) (key & 7);
  if (*wire == 0) {
    *value = varint(c);
  } else if (*wire == 1) {
    if (c->end - c->p < 8) return c->ok = 0;
    *value = 0;
    for (int i = 0; i < 8; i++) *value |= (uint64_t) c->p[i] << (8 * i);
    c->p += 8;
  } else if (*wire == 2) {
    uint64_t len = varint(c);
    if (len > (uint64_t) (c->end - c->p)) return c->ok = 0;
    *body = (cursor) {c->p, c->p + len, 1};
    c->p += len;
  } else {
    return c->ok = 0;
  }
  return c->ok;
}

#define MAX_ITEMS 200000
typedef struct {
  const uint8_t *data;
  size_t len;
} span;
typedef struct {
  int64_t key, unit;
  int is_int;
  int64_t num;
  span text;
} attribute;
typedef struct {
  span strings[MAX_ITEMS];
  size_t string_count;
  int64_t function_name[MAX_ITEMS], function_file[MAX_ITEMS];
  size_t function_count;
  int64_t location_function[MAX_ITEMS], location_line[MAX_ITEMS];
  size_t location_count;
  span stacks[MAX_ITEMS];
  size_t stack_count;
  attribute attributes[MAX_ITEMS];
  size_t attribute_count;
  span profiles[16];
  size_t profile_count;
  char resource[4096];
} otlp_request;

static void read_dictionary(cursor c, otlp_request *r) {
  uint32_t field, wire;
  cursor body, inner;
  uint64_t value;
  while (next_field(&c, &field, &wire, &body, &value)) {
    if (wire != 2) continue;
    if (field == 5 && r->string_count < MAX_ITEMS) r->strings[r->string_count++] = (span) {body.p, (size_t) (body.end - body.p)};
    if (field == 3 && r->function_count < MAX_ITEMS) {
      size_t i = r->function_count++;
      r->function_name[i] = r->function_file[i] = 0;
      while (next_field(&body, &field, &wire, &inner, &value)) {
        if (field == 1) r->function_name[i] = (int64_t) value;
        if (field == 3) r->function_file[i] = (int64_t) value;
      }
    }
    if (field == 2 && r->location_count < MAX_ITEMS) {
      size_t i = r->location_count++;
      r->location_function[i] = r->location_line[i] = 0;
      while (next_field(&body, &field, &wire, &inner, &value)) {
        cursor line_field;
        if (field != 3) continue; // Location.lines
        while (next_field(&inner, &field, &wire, &line_field, &value)) {
          if (field == 1) r->location_function[i] = (int64_t) value;
          if (field == 2) r->location_line[i] = (int64_t) value;
        }
      }
    }
    if (field == 7 && r->stack_count < MAX_ITEMS) {
      r->stacks[r->stack_count] = (span) {NULL, 0};
      while (next_field(&body, &field, &wire, &inner, &value)) {
        if (field == 1 && wire == 2) r->stacks[r->stack_count] = (span) {inner.p, (size_t) (inner.end - inner.p)};
      }
      r->stack_count++;
    }
    if (field == 6 && r->attribute_count < MAX_ITEMS) {
      attribute *a = &r->attributes[r->attribute_count++];
      *a = (attribute) {0};
      while (next_field(&body, &field, &wire, &inner, &value)) {
        cursor any_field;
        if (field == 1) a->key = (int64_t) value;
        if (field == 3) a->unit = (int64_t) value;
        if (field != 2) continue;
        while (next_field(&inner, &field, &wire, &any_field, &value)) {
          if (field == 3) a->is_int = 1, a->num = (int64_t) value;
          if (field == 1) a->text = (span) {any_field.p, (size_t) (any_field.end - any_field.p)};
        }
      }
    }
  }
}

static int read_request(const uint8_t *data, size_t len, otlp_request *r) {
  memset(r, 0, sizeof(*r));
  cursor c = {data, data + len, 1}, body, scope, item;
  uint32_t field, wire;
  uint64_t value;
  while (next_field(&c, &field, &wire, &body, &value)) {
    if (field == 2) read_dictionary(body, r);
    if (field != 1) continue;
    while (next_field(&body, &field, &wire, &scope, &value)) { // ResourceProfiles
      if (field == 1) { // Resource: attributes as "key=value;"
        while (next_field(&scope, &field, &wire, &item, &value)) {
          cursor kv = item, part, any;
          size_t used = strlen(r->resource);
          while (next_field(&kv, &field, &wire, &part, &value)) {
            if (field == 1) used += (size_t) snprintf(r->resource + used, sizeof(r->resource) - used, "%.*s=", (int) (part.end - part.p), part.p);
            if (field != 2) continue;
            while (next_field(&part, &field, &wire, &any, &value)) {
              if (field == 1) used += (size_t) snprintf(r->resource + used, sizeof(r->resource) - used, "%.*s;", (int) (any.end - any.p), any.p);
              if (field == 3) used += (size_t) snprintf(r->resource + used, sizeof(r->resource) - used, "%" PRId64 ";", (int64_t) value);
            }
          }
        }
      }
      if (field != 2) continue;
      while (next_field(&scope, &field, &wire, &item, &value)) { // ScopeProfiles
        if (field == 2 && r->profile_count < 16) r->profiles[r->profile_count++] = (span) {item.p, (size_t) (item.end - item.p)};
      }
    }
  }
  return c.ok;
}

static const char *string_at(const otlp_request *r, int64_t i, char *out, size_t size) {
  if (i < 0 || (size_t) i >= r->string_count) return "<bad string>";
  snprintf(out, size, "%.*s", (int) r->strings[i].len, r->strings[i].data);
  return out;
}

// The pprof name of an attribute key (the encoder renames three).
static const char *label_name(const char *key) {
  if (strcmp(key, "thread.id") == 0) return "thread id";
  if (strcmp(key, "thread.name") == 0) return "thread name";
  if (strcmp(key, "thread.state") == 0) return "thread state";
  return key;
}

// "stack|labels" of one sample: stack as dec_format_stack writes it, labels as
// dec_format_labels (numeric ones with their unit left out on both sides).
static void format_otlp(const otlp_request *r, uint64_t stack, cursor attributes, int64_t timestamp, char *out,
                        size_t size) {
  size_t used = 0;
  char a[256], b[256];
  cursor locations = {NULL, NULL, 1};
  if (stack < r->stack_count) locations = (cursor) {r->stacks[stack].data, r->stacks[stack].data + r->stacks[stack].len, 1};
  for (int first = 1; locations.p < locations.end; first = 0) {
    uint64_t l = varint(&locations);
    int64_t f = l < r->location_count ? r->location_function[l] : -1;
    const char *name = f >= 0 && (size_t) f < r->function_count ? string_at(r, r->function_name[f], a, sizeof(a)) : "?";
    const char *file = f >= 0 && (size_t) f < r->function_count ? string_at(r, r->function_file[f], b, sizeof(b)) : "?";
    used += (size_t) snprintf(out + used, size - used, "%s%s@%s:%" PRId64, first ? "" : ";", name, file,
                              l < r->location_count ? r->location_line[l] : -1);
  }
  used += (size_t) snprintf(out + used, size - used, "|");
  for (int first = 1; attributes.p < attributes.end; first = 0) {
    uint64_t i = varint(&attributes);
    if (i >= r->attribute_count) {
      used += (size_t) snprintf(out + used, size - used, "<bad attribute>");
      continue;
    }
    const attribute *attr = &r->attributes[i];
    const char *key = label_name(string_at(r, attr->key, a, sizeof(a)));
    if (attr->is_int && attr->unit) {
      used += (size_t) snprintf(out + used, size - used, "%s%s=%" PRId64 " %s", first ? "" : ",", key, attr->num,
                                string_at(r, attr->unit, b, sizeof(b)));
    } else if (attr->is_int) {
      used += (size_t) snprintf(out + used, size - used, "%s%s=%" PRId64, first ? "" : ",", key, attr->num);
    } else {
      used += (size_t) snprintf(out + used, size - used, "%s%s=%.*s", first ? "" : ",", key, (int) attr->text.len,
                                attr->text.data);
    }
  }
  if (timestamp) snprintf(out + used, size - used, "%send_timestamp_ns=%" PRId64, used && out[used - 1] != '|' ? "," : "", timestamp);
}

// ---------------------------------------------------------------------------------------
// Totals per formatted sample, per sample type.

typedef struct {
  char *key;
  int64_t total[PPROF_MAX_SAMPLE_TYPES];
} total_entry;

typedef struct {
  total_entry *entries;
  size_t count, capacity;
} totals;

static void add_total(totals *t, const char *key, size_t type, int64_t value) {
  for (size_t i = 0; i < t->count; i++) {
    if (strcmp(t->entries[i].key, key) == 0) {
      t->entries[i].total[type] += value;
      return;
    }
  }
  if (t->count == t->capacity) {
    t->capacity = t->capacity ? 2 * t->capacity : 64;
    t->entries = realloc(t->entries, t->capacity * sizeof(total_entry));
  }
  total_entry *e = &t->entries[t->count++];
  memset(e, 0, sizeof(*e));
  e->key = malloc(strlen(key) + 1);
  strcpy(e->key, key);
  e->total[type] = value;
}

static void free_totals(totals *t) {
  for (size_t i = 0; i < t->count; i++) free(t->entries[i].key);
  free(t->entries);
}

static void pprof_totals(const dec_profile *d, totals *t) {
  static char stack[1 << 15], labels[1 << 12], key[(1 << 15) + (1 << 12) + 2];
  for (size_t s = 0; s < d->sample_count; s++) {
    dec_format_stack(d, &d->samples[s], stack, sizeof(stack));
    dec_format_labels(d, &d->samples[s], labels, sizeof(labels));
    snprintf(key, sizeof(key), "%s|%s", stack, labels);
    for (size_t v = 0; v < d->samples[s].value_count; v++) {
      if (d->samples[s].values[v] != 0) add_total(t, key, v, d->samples[s].values[v]);
    }
  }
}

static size_t otlp_totals(const otlp_request *r, totals *t) {
  static char key[(1 << 15) + (1 << 12) + 2];
  size_t timestamps = 0;
  for (size_t type = 0; type < r->profile_count; type++) {
    cursor profile = {r->profiles[type].data, r->profiles[type].data + r->profiles[type].len, 1}, sample, part;
    uint32_t field, wire;
    uint64_t value;
    while (next_field(&profile, &field, &wire, &sample, &value)) {
      if (field != 2) continue;
      uint64_t stack = 0;
      cursor attributes = {NULL, NULL, 1}, values = {NULL, NULL, 1}, times = {NULL, NULL, 1};
      while (next_field(&sample, &field, &wire, &part, &value)) {
        if (field == 1) stack = value;
        if (field == 2) attributes = part;
        if (field == 4) values = part;
        if (field == 5) times = part;
      }
      while (values.p < values.end) {
        int64_t v = (int64_t) varint(&values), timestamp = 0;
        if (times.end - times.p >= 8) {
          for (int i = 0; i < 8; i++) timestamp |= (int64_t) times.p[i] << (8 * i);
          times.p += 8;
          timestamps++;
        }
        format_otlp(r, stack, attributes, timestamp, key, sizeof(key));
        add_total(t, key, type, v);
      }
    }
  }
  return timestamps;
}

static int same_totals(const totals *a, const totals *b, size_t types) {
  if (a->count != b->count) {
    fprintf(stderr, "  %zu samples in pprof, %zu in OTLP\n", a->count, b->count);
    return 0;
  }
  for (size_t i = 0; i < a->count; i++) {
    size_t j = 0;
    while (j < b->count && strcmp(a->entries[i].key, b->entries[j].key) != 0) j++;
    if (j == b->count) {
      fprintf(stderr, "  not in OTLP: %s\n", a->entries[i].key);
      return 0;
    }
    for (size_t v = 0; v < types; v++) {
      if (a->entries[i].total[v] != b->entries[j].total[v]) {
        fprintf(stderr, "  %s: type %zu: %" PRId64 " in pprof, %" PRId64 " in OTLP\n", a->entries[i].key, v,
                a->entries[i].total[v], b->entries[j].total[v]);
        return 0;
      }
    }
  }
  return 1;
}

// ---------------------------------------------------------------------------------------

static pprof_str str(const char *s) { return (pprof_str) {s, strlen(s)}; }
static pprof_frame frame(const char *name, const char *file, int64_t line) {
  return (pprof_frame) {.function_name = str(name), .file_name = str(file), .line = line};
}
static uint64_t random_state = 42;
static uint64_t next_random(void) {
  random_state ^= random_state << 13;
  random_state ^= random_state >> 7;
  random_state ^= random_state << 17;
  return random_state;
}

static uint8_t *gunzip(const uint8_t *data, size_t len, size_t *out_len) {
  size_t capacity = len * 8 + 1024;
  uint8_t *out = malloc(capacity);
  z_stream z = {0};
  inflateInit2(&z, 16 + MAX_WBITS);
  z.next_in = (uint8_t *) data;
  z.avail_in = (uInt) len;
  z.next_out = out;
  z.avail_out = (uInt) capacity;
  int result = inflate(&z, Z_FINISH);
  *out_len = z.total_out;
  inflateEnd(&z);
  if (result != Z_STREAM_END) {
    free(out);
    return NULL;
  }
  return out;
}

static otlp_request request;

// Encodes `profile` both ways and compares them; returns the OTLP size.
static size_t check_same_as_pprof(pprof_profile *profile, size_t types, size_t want_timestamps, int gzip) {
  pprof_buffer pprof = {0}, otlp = {0};
  pprof_error error = {{0}};
  const pprof_otlp_attribute resource[] = {
    {.key = str("service.name"), .str = str("shop")},
    {.key = str("process.pid"), .num = 4242, .is_int = true},
  };
  pprof_otlp_options options = {.resource = resource, .resource_count = 2, .scope_name = str("contprof"),
                                .scope_version = str("9.9"), .gzip = gzip};
  CHECK(pprof_profile_serialize(profile, 2000, &pprof, &error) == PPROF_OK);
  CHECK(pprof_profile_serialize_otlp(profile, 2000, &options, &otlp, &error) == PPROF_OK);
  dec_profile decoded;
  char decode_error[200];
  CHECK(dec_profile_parse(pprof.data, pprof.len, &decoded, decode_error) == 0);
  size_t plain_len = otlp.len;
  uint8_t *plain = gzip ? gunzip(otlp.data, otlp.len, &plain_len) : otlp.data;
  CHECK(plain != NULL);
  CHECK(read_request(plain, plain_len, &request));
  CHECK(request.profile_count == types);
  CHECK(strcmp(request.resource, "service.name=shop;process.pid=4242;") == 0);
  CHECK(request.string_count > 0 && request.strings[0].len == 0);
  totals from_pprof = {0}, from_otlp = {0};
  pprof_totals(&decoded, &from_pprof);
  size_t timestamps = otlp_totals(&request, &from_otlp);
  CHECK(same_totals(&from_pprof, &from_otlp, types));
  CHECK(want_timestamps == SIZE_MAX || timestamps == want_timestamps); // SIZE_MAX: any
  free_totals(&from_pprof);
  free_totals(&from_otlp);
  dec_profile_free(&decoded);
  if (gzip) free(plain);
  size_t size = otlp.len;
  pprof_buffer_free(&pprof);
  pprof_buffer_free(&otlp);
  return size;
}

static pprof_profile *new_profile(void) {
  pprof_value_type types[3] = {{str("cpu-time"), str("nanoseconds")},
                               {str("cpu-samples"), str("count")},
                               {str("wall-time"), str("nanoseconds")}};
  pprof_value_type period = {str("wall-time"), str("nanoseconds")};
  pprof_profile *profile = NULL;
  pprof_error error;
  if (pprof_profile_new(&profile, types, 3, &period, 10000000, 1000, &error) != PPROF_OK) exit(2);
  return profile;
}

static void test_samples_labels_and_timeline(void) {
  current_test = __func__;
  pprof_profile *profile = new_profile();
  pprof_error error;
  pprof_frame frames[3] = {frame("leaf", "/a.rb", 3), frame("middle", "/a.rb", 2), frame("<main>", "/main.rb", 1)};
  pprof_label labels[4] = {{.key = str("thread id"), .str = str("17")},
                           {.key = str("thread name"), .str = str("worker")},
                           {.key = str("thread state"), .str = str("running")},
                           {.key = str("bytes"), .num = 640, .num_unit = str("bytes")}};
  int64_t values[3] = {5, 1, 0};
  size_t timed = 0;
  for (int i = 0; i < 40; i++) {
    // Some samples have no CPU: left out of that profile. Times are in whole ticks of the
    // timeline's grid, where rounding changes nothing (test_timeline.c tests the grid).
    values[0] = i % 3 == 0 ? 0 : i * PPROF_TIMELINE_TICK_NS;
    values[2] = (10 + i) * PPROF_TIMELINE_TICK_NS;
    pprof_sample sample = {.frames = frames + (i % 2), .frame_count = 3 - (size_t) (i % 2), .values = values,
                           .value_count = 3, .labels = labels, .label_count = (size_t) (1 + i % 4),
                           .timestamp_ns = i >= 20 ? 5000 + i : 0};
    CHECK(pprof_profile_add(profile, &sample, &error) == PPROF_OK);
    if (i >= 20) timed += (values[0] != 0) + 1 + 1; // timestamps in cpu-time, cpu-samples, wall-time
  }
  pprof_label other_thread = {.key = str("thread id"), .str = str("not a number")};
  pprof_sample odd = {.frames = frames, .frame_count = 1, .values = values, .value_count = 3, .labels = &other_thread,
                      .label_count = 1};
  CHECK(pprof_profile_add(profile, &odd, &error) == PPROF_OK);
  check_same_as_pprof(profile, 3, timed, 0);
  check_same_as_pprof(profile, 3, timed, 1);
  pprof_profile_reset(profile, 3000);
  check_same_as_pprof(profile, 3, 0, 0); // empty

  // Times off the grid, in runs of one stack and labels: both encoders round them alike.
  for (int i = 0; i < 60; i++) {
    values[0] = (int64_t) (next_random() % (20 * PPROF_TIMELINE_TICK_NS));
    values[2] = (int64_t) (next_random() % (20 * PPROF_TIMELINE_TICK_NS));
    pprof_sample sample = {.frames = frames + (i % 2), .frame_count = 3 - (size_t) (i % 2), .values = values,
                           .value_count = 3, .labels = labels, .label_count = 1,
                           .timestamp_ns = (INT64_C(1621000000) + 2 * i) * PPROF_TIMELINE_TICK_NS + i};
    CHECK(pprof_profile_add(profile, &sample, &error) == PPROF_OK);
  }
  check_same_as_pprof(profile, 3, SIZE_MAX, 1);
  pprof_profile_free(profile);
}

// The size bar's shape (bench/pprof_core.rb): many deep stacks. Also compares sizes.
static void test_many_stacks(void) {
  current_test = __func__;
  pprof_profile *profile = new_profile();
  pprof_error error;
  static char names[300][32];
  for (int i = 0; i < 300; i++) snprintf(names[i], sizeof(names[i]), "Klass%d#method_%d", i % 17, i);
  pprof_frame frames[64];
  int64_t values[3];
  pprof_label thread = {.key = str("thread id"), .str = str("1")};
  for (int s = 0; s < 3000; s++) {
    for (int d = 0; d < 64; d++) {
      int f = (int) (next_random() % 300);
      frames[d] = frame(names[f], "/app/file.rb", d == 63 ? s : f);
    }
    values[0] = (int64_t) (next_random() % 100000);
    values[1] = 1;
    values[2] = values[0] * 2;
    pprof_sample sample = {.frames = frames, .frame_count = 64, .values = values, .value_count = 3, .labels = &thread,
                           .label_count = 1};
    CHECK(pprof_profile_add(profile, &sample, &error) == PPROF_OK);
  }
  pprof_buffer pprof = {0};
  CHECK(pprof_profile_serialize(profile, 2000, &pprof, &error) == PPROF_OK);
  size_t otlp_size = check_same_as_pprof(profile, 3, 0, 1);
  printf("   3000 stacks x 64 frames: pprof %zu bytes, OTLP (gzip) %zu bytes (%.2fx)\n", pprof.len, otlp_size,
         (double) otlp_size / (double) pprof.len);
  CHECK((double) otlp_size <= 1.2 * (double) pprof.len);
  pprof_buffer_free(&pprof);
  pprof_profile_free(profile);
}

// A bad request changes nothing and fails clearly; memory is given back.
static void test_bad_arguments_and_memory(void) {
  current_test = __func__;
  pprof_buffer out = {0};
  pprof_error error = {{0}};
  pprof_otlp_options options = {0};
  CHECK(pprof_profile_serialize_otlp(NULL, 0, &options, &out, &error) == PPROF_ERR_INVALID);
  size_t before = pprof_alloc_current_bytes();
  pprof_profile *profile = new_profile();
  pprof_frame only = frame("f", "/f.rb", 1);
  int64_t values[3] = {1, 1, 1};
  pprof_sample sample = {.frames = &only, .frame_count = 1, .values = values, .value_count = 3};
  CHECK(pprof_profile_add(profile, &sample, &error) == PPROF_OK);
  CHECK(pprof_profile_serialize_otlp(profile, 10, &options, &out, &error) == PPROF_OK);
  // A period longer than int64 can hold (found by fuzzing): the duration is capped, as the pprof's.
  pprof_profile_set_start_time_ns(profile, INT64_MIN);
  CHECK(pprof_profile_serialize_otlp(profile, 1, &options, &out, &error) == PPROF_OK);
  pprof_buffer_free(&out);
  pprof_profile_free(profile);
  CHECK(pprof_alloc_current_bytes() == before);
}

int main(void) {
  test_samples_labels_and_timeline();
  test_many_stacks();
  test_bad_arguments_and_memory();
  if (failures) {
    fprintf(stderr, "%d of %d OTLP checks failed\n", failures, checks);
    return 1;
  }
  printf("OTLP encoder: %d checks passed\n", checks);
  return 0;
}
