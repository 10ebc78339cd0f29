// Tests of the pprof reader, summary and merger (ext/contprof/pprof/pprof_reader.c,
// pprof_merge.c, and pprof_gunzip in pprof_gzip.c): profiles written by the core (and one
// written by hand, as other writers write them) are merged, and the result is checked
// with the tests' independent decoder (pprof_decode.c): values summed, frames unified,
// labels kept but the timestamp label, timeline samples cut to a range with Ruby's
// rounding, files outside the range skipped, and every kind of bad input refused cleanly.
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../ext/contprof/pprof/pprof_alloc.h"
#include "../../ext/contprof/pprof/pprof_gzip.h"
#include "../../ext/contprof/pprof/pprof_merge.h"
#include "../../ext/contprof/pprof/pprof_profile.h"
#include "../../ext/contprof/pprof/pprof_reader.h"
#include "checks.h"
#include "pprof_decode.h"

#define SECOND INT64_C(1000000000)
#define T0 (INT64_C(1800000000) * SECOND)

static const pprof_value_type types[3] = {
  {PPROF_STR("cpu-time"), PPROF_STR("nanoseconds")},
  {PPROF_STR("cpu-samples"), PPROF_STR("count")},
  {PPROF_STR("wall-time"), PPROF_STR("nanoseconds")},
};

static pprof_str str(const char *s) { return (pprof_str) {s, strlen(s)}; }

// A sample to write: its frames (leaf first, by function name, file /t.rb, line = the
// name's first letter), values, thread, and end timestamp (0: none).
typedef struct {
  const char *stack[4];
  int64_t values[3];
  const char *thread;
  int64_t end_ns;
} spec;

static pprof_buffer write_profile(const pprof_value_type *sample_types, size_t type_count, int64_t start,
                                  int64_t duration, const spec *samples, size_t count, const char *comment) {
  pprof_profile *profile;
  pprof_error error = {{0}};
  pprof_value_type period_type = {PPROF_STR("wall-time"), PPROF_STR("nanoseconds")};
  CHECK(pprof_profile_new(&profile, sample_types, type_count, &period_type, 10000000, start, &error) == PPROF_OK);
  for (size_t i = 0; i < count; i++) {
    pprof_frame frames[4];
    size_t depth = 0;
    for (; depth < 4 && samples[i].stack[depth]; depth++) {
      frames[depth] = (pprof_frame) {.function_name = str(samples[i].stack[depth]), .file_name = str("/t.rb"),
                                     .line = samples[i].stack[depth][0]};
    }
    pprof_label labels[2] = {{.key = str("thread id"), .str = str(samples[i].thread)},
                             {.key = str(PPROF_TIMESTAMP_LABEL), .num = samples[i].end_ns}};
    pprof_sample sample = {.frames = frames, .frame_count = depth, .values = samples[i].values,
                           .value_count = type_count, .labels = labels, .label_count = samples[i].end_ns ? 2 : 1};
    CHECK(pprof_profile_add(profile, &sample, &error) == PPROF_OK);
  }
  if (comment) CHECK(pprof_profile_add_comment(profile, str(comment), &error) == PPROF_OK);
  pprof_buffer out = {0};
  CHECK(pprof_profile_serialize(profile, start + duration, &out, &error) == PPROF_OK);
  pprof_profile_free(profile);
  return out;
}

static pprof_merge *new_merge(int64_t from, int64_t to) {
  pprof_merge *merge;
  pprof_error error = {{0}};
  CHECK(pprof_merge_new(&merge, from, to, &error) == PPROF_OK);
  return merge;
}

static bool add(pprof_merge *merge, const pprof_buffer *data, const char *name) {
  bool merged = false;
  pprof_error error = {{0}};
  pprof_status status = pprof_merge_add(merge, data->data, data->len, name, &merged, &error);
  if (status != PPROF_OK) fprintf(stderr, "FAIL %s: adding %s: %s\n", current_test, name, error.message);
  CHECK_EQ_INT(PPROF_OK, status);
  return merged;
}

static void finish(pprof_merge *merge, dec_profile *decoded) {
  pprof_buffer out = {0};
  pprof_error error = {{0}};
  CHECK_EQ_INT(PPROF_OK, pprof_merge_finish(merge, &out, &error));
  char decode_error[200];
  if (dec_profile_parse(out.data, out.len, decoded, decode_error) != 0) {
    fprintf(stderr, "FAIL %s: merged profile does not decode: %s\n", current_test, decode_error);
    exit(1);
  }
  pprof_buffer_free(&out);
}

static int64_t sum(const dec_profile *p, const char *stack, const char *labels, size_t type) {
  return dec_sum(p, stack, labels, type, NULL);
}

static const spec first_file[] = {
  {{"a", "main"}, {10, 1, 12}, "1", 0},
  {{"b", "main"}, {20, 2, 25}, "1", 0},
  {{"a", "main"}, {5, 1, 6}, "2", 0},
};
static const spec second_file[] = {
  {{"a", "main"}, {1, 1, 2}, "1", 0},
  {{"c", "b", "main"}, {7, 1, 9}, "2", 0},
};

#define A_MAIN "a@/t.rb:97;main@/t.rb:109"

static void test_sums_and_unifies_frames(void) {
  current_test = __func__;
  pprof_buffer one = write_profile(types, 3, T0, 60 * SECOND, first_file, 3, "version=1");
  pprof_buffer two = write_profile(types, 3, T0 + 60 * SECOND, 60 * SECOND, second_file, 2, "version=1");
  pprof_merge *merge = new_merge(INT64_MIN, INT64_MAX);
  CHECK(add(merge, &one, "one.pprof"));
  CHECK(add(merge, &two, "two.pprof"));
  CHECK_EQ_INT(2, pprof_merge_profile_count(merge));
  CHECK_EQ_INT(4, pprof_merge_sample_count(merge)); // a;main twice (threads 1, 2), b;main, c;b;main
  CHECK_EQ_INT(1, pprof_merge_comment_count(merge));
  dec_profile p;
  finish(merge, &p);
  CHECK_EQ_INT(11, sum(&p, A_MAIN, "thread id=1", 0));
  CHECK_EQ_INT(14, sum(&p, A_MAIN, "thread id=1", 2));
  CHECK_EQ_INT(5, sum(&p, A_MAIN, "thread id=2", 0));
  CHECK_EQ_INT(7, sum(&p, "c@/t.rb:99;b@/t.rb:98;main@/t.rb:109", "thread id=2", 0));
  CHECK_EQ_INT(4, p.location_count); // a, b, c, main: unified across files
  CHECK_EQ_INT(4, p.function_count);
  CHECK_EQ_INT(T0, p.time_nanos);
  CHECK_EQ_INT(120 * SECOND, p.duration_nanos);
  CHECK_EQ_INT(10000000, p.period);
  CHECK_EQ_STR("wall-time", dec_string(&p, p.period_type.type));
  CHECK_EQ_INT(3, p.sample_type_count);
  CHECK_EQ_STR("cpu-samples", dec_string(&p, p.sample_types[1].type));
  CHECK_EQ_INT(0, p.comment_count); // comments are the caller's (pprof_merge_comment)
  dec_profile_free(&p);
  pprof_merge_free(merge);

  // Only the two innermost frames kept: c;b;main is summed as c;b, a;main stays whole.
  merge = new_merge(INT64_MIN, INT64_MAX);
  pprof_merge_set_max_frames(merge, 2);
  CHECK(add(merge, &one, "one.pprof"));
  CHECK(add(merge, &two, "two.pprof"));
  finish(merge, &p);
  CHECK_EQ_INT(11, sum(&p, A_MAIN, "thread id=1", 0));
  CHECK_EQ_INT(7, sum(&p, "c@/t.rb:99;b@/t.rb:98", "thread id=2", 0));
  CHECK_EQ_INT(0, sum(&p, "c@/t.rb:99;b@/t.rb:98;main@/t.rb:109", "thread id=2", 0));
  dec_profile_free(&p);
  pprof_merge_free(merge);
  pprof_buffer_free(&one);
  pprof_buffer_free(&two);
}

// Timeline samples: stretch [end - wall, end]; the range is [T0 + 25, T0 + 75).
static void test_timeline_cut_to_the_range(void) {
  current_test = __func__;
  const spec samples[] = {
    {{"half"}, {3, -3, 100}, "1", T0 + 100}, // [T0, T0+100]: half in; 1.5 -> 2, -1.5 -> -2, 50
    {{"half"}, {1, 0, 100}, "1", T0 + 110}, // [T0+10, T0+110]: 50 of 100 in: 0.5 -> 1, 50
    {{"third"}, {10, 1, 3}, "1", T0 + 27}, // [T0+24, T0+27]: 2 of 3: 6.67 -> 7, 0.67 -> 1, 2
    {{"out"}, {5, 1, 10}, "1", T0 + 25}, // [T0+15, T0+25]: no overlap
    {{"instant"}, {4, 1, 0}, "1", T0 + 25}, // no wall time, end in range: kept
    {{"instant"}, {4, 1, 0}, "1", T0 + 75}, // end at `to`: dropped
    {{"whole"}, {8, 1, 20}, "1", T0 + 60}, // [T0+40, T0+60]: all in
    {{"untimed"}, {9, 1, 900}, "1", 0}, // no timestamp: kept whole
  };
  pprof_buffer data = write_profile(types, 3, T0, 60 * SECOND, samples, sizeof(samples) / sizeof(samples[0]), NULL);
  pprof_merge *merge = new_merge(T0 + 25, T0 + 75);
  CHECK(add(merge, &data, "timeline.pprof"));
  dec_profile p;
  finish(merge, &p);
  CHECK_EQ_INT(5, p.sample_count); // half, third, instant, whole, untimed
  CHECK_EQ_INT(3, sum(&p, "half@/t.rb:104", "thread id=1", 0));
  CHECK_EQ_INT(-2, sum(&p, "half@/t.rb:104", "thread id=1", 1));
  CHECK_EQ_INT(100, sum(&p, "half@/t.rb:104", "thread id=1", 2));
  CHECK_EQ_INT(7, sum(&p, "third@/t.rb:116", "thread id=1", 0));
  CHECK_EQ_INT(1, sum(&p, "third@/t.rb:116", "thread id=1", 1));
  CHECK_EQ_INT(2, sum(&p, "third@/t.rb:116", "thread id=1", 2));
  CHECK_EQ_INT(0, sum(&p, "out@/t.rb:111", NULL, 1));
  CHECK_EQ_INT(4, sum(&p, "instant@/t.rb:105", "thread id=1", 0));
  CHECK_EQ_INT(20, sum(&p, "whole@/t.rb:119", "thread id=1", 2));
  CHECK_EQ_INT(900, sum(&p, "untimed@/t.rb:117", "thread id=1", 2));
  dec_profile_free(&p);
  pprof_merge_free(merge);

  // Without a range nothing is cut, and the timestamp label is gone all the same.
  merge = new_merge(INT64_MIN, INT64_MAX);
  CHECK(add(merge, &data, "timeline.pprof"));
  finish(merge, &p);
  CHECK_EQ_INT(6, p.sample_count);
  CHECK_EQ_INT(8, sum(&p, "instant@/t.rb:105", "thread id=1", 0));
  CHECK_EQ_INT(200, sum(&p, "half@/t.rb:104", "thread id=1", 2));
  dec_profile_free(&p);
  // An open side: from T0 + 50 on.
  pprof_merge_free(merge);
  merge = new_merge(T0 + 50, INT64_MAX);
  CHECK(add(merge, &data, "timeline.pprof"));
  finish(merge, &p);
  CHECK_EQ_INT(3, sum(&p, "half@/t.rb:104", "thread id=1", 0)); // 1.5 -> 2, 0.6 -> 1
  CHECK_EQ_INT(0, sum(&p, "third@/t.rb:116", NULL, 2));
  CHECK_EQ_INT(4, sum(&p, "instant@/t.rb:105", "thread id=1", 0)); // the one at T0 + 75
  dec_profile_free(&p);
  pprof_merge_free(merge);
  pprof_buffer_free(&data);
}

static void test_profiles_outside_the_range_are_skipped(void) {
  current_test = __func__;
  pprof_buffer early = write_profile(types, 3, T0, 60 * SECOND, first_file, 3, NULL);
  pprof_buffer late = write_profile(types, 3, T0 + 60 * SECOND, 60 * SECOND, second_file, 2, NULL);
  pprof_merge *merge = new_merge(T0 + 60 * SECOND, T0 + 120 * SECOND); // `early` ends at `from`
  CHECK(!add(merge, &early, "early.pprof"));
  CHECK(add(merge, &late, "late.pprof"));
  CHECK_EQ_INT(1, pprof_merge_skipped_count(merge));
  dec_profile p;
  finish(merge, &p);
  CHECK_EQ_INT(1, sum(&p, A_MAIN, "thread id=1", 0));
  CHECK_EQ_INT(T0 + 60 * SECOND, p.time_nanos);
  dec_profile_free(&p);
  pprof_merge_free(merge);

  merge = new_merge(INT64_MIN, T0 + 60 * SECOND); // `late` starts at `to`
  CHECK(add(merge, &early, "early.pprof"));
  CHECK(!add(merge, &late, "late.pprof"));
  pprof_merge_free(merge);

  merge = new_merge(T0 + 500 * SECOND, INT64_MAX); // nothing merged: no result
  CHECK(!add(merge, &early, "early.pprof"));
  pprof_buffer out = {0};
  pprof_error error = {{0}};
  CHECK_EQ_INT(PPROF_ERR_INVALID, pprof_merge_finish(merge, &out, &error));
  pprof_merge_free(merge);
  pprof_buffer_free(&out);
  pprof_buffer_free(&early);
  pprof_buffer_free(&late);
}

static void test_sample_types_must_be_the_same(void) {
  current_test = __func__;
  pprof_buffer three = write_profile(types, 3, T0, 60 * SECOND, first_file, 3, NULL);
  const spec one_value[] = {{{"a", "main"}, {5}, "1", 0}};
  pprof_buffer one = write_profile(types, 1, T0, 60 * SECOND, one_value, 1, NULL);
  pprof_merge *merge = new_merge(INT64_MIN, INT64_MAX);
  CHECK(add(merge, &three, "/profiles/three.pprof"));
  bool merged = true;
  pprof_error error = {{0}};
  CHECK_EQ_INT(PPROF_ERR_INVALID, pprof_merge_add(merge, one.data, one.len, "/profiles/one.pprof", &merged, &error));
  CHECK(!merged);
  const char *message = pprof_merge_types_differ(merge);
  CHECK(message != NULL);
  if (message) {
    CHECK_EQ_STR("sample types differ: /profiles/three.pprof has cpu-time (nanoseconds), cpu-samples (count), "
                 "wall-time (nanoseconds), /profiles/one.pprof has cpu-time (nanoseconds) "
                 "(merge only profiles of the same kind)",
                 message);
  }
  CHECK(strncmp(error.message, "sample types differ: /profiles/three.pprof", 42) == 0);
  CHECK(add(merge, &three, "again.pprof")); // the merge goes on
  CHECK(pprof_merge_types_differ(merge) == NULL);
  CHECK_EQ_INT(2, pprof_merge_profile_count(merge));
  pprof_merge_free(merge);
  pprof_buffer_free(&three);
  pprof_buffer_free(&one);
}

// A profile as other writers may write it: strings first, samples last, location ids
// unpacked, sparse ids, a location with an inlined frame (two Lines), unknown fields.
typedef struct {
  uint8_t bytes[1024];
  size_t len;
} wire;

static void put(wire *w, uint64_t v) {
  while (v >= 0x80) {
    w->bytes[w->len++] = (uint8_t) (v | 0x80);
    v >>= 7;
  }
  w->bytes[w->len++] = (uint8_t) v;
}
static void put_field(wire *w, int field, uint64_t v) {
  put(w, (uint64_t) field << 3);
  put(w, v);
}
static void put_message(wire *w, int field, const wire *inner) {
  put(w, ((uint64_t) field << 3) | 2);
  put(w, inner->len);
  memcpy(w->bytes + w->len, inner->bytes, inner->len);
  w->len += inner->len;
}
static void put_string(wire *w, const char *s) {
  wire text = {.len = strlen(s)};
  memcpy(text.bytes, s, text.len);
  put_message(w, 6, &text);
}

static wire handwritten_profile(void) {
  static const char *strings[] = {"", "samples", "count", "inner", "outer", "/x.go", "thread", "7", "leaf"};
  wire w = {.len = 0};
  for (size_t i = 0; i < sizeof(strings) / sizeof(strings[0]); i++) put_string(&w, strings[i]);
  put_field(&w, 100, 42); // unknown
  wire function = {.len = 0};
  put_field(&function, 1, 900);
  put_field(&function, 2, 3); // inner
  put_field(&function, 4, 5);
  put_message(&w, 5, &function);
  function.len = 0;
  put_field(&function, 1, 7);
  put_field(&function, 2, 4); // outer
  put_field(&function, 4, 5);
  put_message(&w, 5, &function);
  function.len = 0;
  put_field(&function, 1, 8);
  put_field(&function, 2, 8); // leaf
  put_field(&function, 4, 5);
  put_message(&w, 5, &function);
  wire location = {.len = 0}, line = {.len = 0};
  put_field(&location, 1, 1000000);
  put_field(&line, 1, 900);
  put_field(&line, 2, 3);
  put_message(&location, 4, &line); // inlined: inner, line 3
  line.len = 0;
  put_field(&line, 1, 7);
  put_field(&line, 2, 12);
  put_message(&location, 4, &line); // its caller: outer, line 12 (this one counts)
  put_message(&w, 4, &location);
  location.len = 0;
  put_field(&location, 1, 5);
  line.len = 0;
  put_field(&line, 1, 8);
  put_field(&line, 2, 1);
  put_message(&location, 4, &line);
  put_message(&w, 4, &location);
  for (int k = 0; k < 2; k++) {
    wire sample = {.len = 0}, label = {.len = 0};
    put_field(&sample, 1, 5); // unpacked location ids
    put_field(&sample, 1, 1000000);
    put_field(&sample, 2, (uint64_t) (k ? 3 : -1)); // unpacked value, negative
    put_field(&label, 1, 6);
    put_field(&label, 2, 7);
    put_message(&sample, 3, &label);
    put_message(&w, 2, &sample);
  }
  wire type = {.len = 0};
  put_field(&type, 1, 1);
  put_field(&type, 2, 2);
  put_message(&w, 1, &type); // the sample type after the samples
  put_field(&w, 9, (uint64_t) T0);
  put_field(&w, 10, (uint64_t) SECOND);
  return w;
}

static void test_any_writer_and_plain_protobuf(void) {
  current_test = __func__;
  wire w = handwritten_profile();
  pprof_buffer plain = {.data = w.bytes, .len = w.len};
  pprof_merge *merge = new_merge(INT64_MIN, INT64_MAX);
  CHECK(add(merge, &plain, "go.pprof"));
  CHECK(add(merge, &plain, "go.pprof"));
  dec_profile p;
  finish(merge, &p);
  CHECK_EQ_INT(1, p.sample_count);
  CHECK_EQ_INT(4, sum(&p, "leaf@/x.go:1;outer@/x.go:12", "thread=7", 0)); // (-1 + 3) twice
  dec_profile_free(&p);
  pprof_merge_free(merge);

  // A core-written profile, gunzipped: plain protobuf reads the same as gzip.
  pprof_buffer gzipped = write_profile(types, 3, T0, 60 * SECOND, first_file, 3, NULL), unzipped = {0};
  pprof_error error = {{0}};
  CHECK_EQ_INT(PPROF_OK, pprof_gunzip(gzipped.data, gzipped.len, &unzipped, &error));
  merge = new_merge(INT64_MIN, INT64_MAX);
  CHECK(add(merge, &unzipped, "plain.pprof"));
  CHECK(add(merge, &gzipped, "gzip.pprof"));
  finish(merge, &p);
  CHECK_EQ_INT(20, sum(&p, A_MAIN, "thread id=1", 0));
  dec_profile_free(&p);
  pprof_merge_free(merge);
  pprof_buffer_free(&gzipped);
  pprof_buffer_free(&unzipped);
}

// Every prefix of a profile, and bytes changed at random: refused with a message, or
// read; never a crash (the sanitized builds), never a leak; the merge stays usable.
static void test_truncated_and_garbage_input(void) {
  current_test = __func__;
  pprof_buffer gzipped = write_profile(types, 3, T0, 60 * SECOND, first_file, 3, "c"), plain = {0};
  pprof_error error = {{0}};
  CHECK_EQ_INT(PPROF_OK, pprof_gunzip(gzipped.data, gzipped.len, &plain, &error));
  pprof_merge *merge = new_merge(INT64_MIN, INT64_MAX);
  size_t refused = 0;
  for (size_t cut = 0; cut < gzipped.len; cut++) {
    bool merged;
    if (pprof_merge_add(merge, gzipped.data, cut, "cut.pprof", &merged, &error) != PPROF_OK) {
      refused++;
      CHECK(error.message[0] != 0);
    }
  }
  CHECK_EQ_INT(gzipped.len, refused); // every truncated gzip stream (and the empty input)
  for (size_t cut = 1; cut < plain.len; cut++) {
    bool merged;
    if (pprof_merge_add(merge, plain.data, cut, "cut.pprof", &merged, &error) != PPROF_OK) refused++;
  }
  uint64_t state = 99;
  for (int round = 0; round < 2000; round++) {
    pprof_buffer copy = {0};
    CHECK(pprof_buffer_append(&copy, plain.data, plain.len, &error) == PPROF_OK);
    for (int k = 0; k < 3; k++) {
      state = state * 6364136223846793005u + 1442695040888963407u;
      copy.data[(state >> 33) % copy.len] = (uint8_t) (state >> 20);
    }
    bool merged;
    pprof_status status = pprof_merge_add(merge, copy.data, copy.len, "garbage.pprof", &merged, &error);
    CHECK(status == PPROF_OK || status == PPROF_ERR_INVALID);
    pprof_buffer_free(&copy);
  }
  const uint8_t garbage[] = {0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff};
  bool merged;
  CHECK_EQ_INT(PPROF_ERR_INVALID, pprof_merge_add(merge, garbage, sizeof(garbage), "x", &merged, &error));
  const uint8_t bad_gzip[] = {0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 0, 3, 0xde, 0xad, 0xbe, 0xef, 1, 2, 3, 4, 5, 6, 7, 8};
  CHECK_EQ_INT(PPROF_ERR_INVALID, pprof_merge_add(merge, bad_gzip, sizeof(bad_gzip), "x", &merged, &error));
  pprof_merge_free(merge);
  pprof_buffer_free(&gzipped);
  pprof_buffer_free(&plain);
}

// The core keeps a sample without frames (a stack of nothing): so does the merge.
static void test_empty_stacks_are_kept(void) {
  current_test = __func__;
  const spec samples[] = {{{NULL}, {6, 1, 6}, "1", 0}, {{"a", "main"}, {1, 1, 1}, "1", 0}};
  pprof_buffer data = write_profile(types, 3, T0, SECOND, samples, 2, NULL);
  pprof_merge *merge = new_merge(INT64_MIN, INT64_MAX);
  CHECK(add(merge, &data, "empty.pprof"));
  CHECK(add(merge, &data, "empty.pprof"));
  dec_profile p;
  finish(merge, &p);
  CHECK_EQ_INT(12, sum(&p, "", "thread id=1", 0));
  dec_profile_free(&p);
  pprof_merge_free(merge);
  pprof_buffer_free(&data);
}

static void test_comments_distinct_in_first_seen_order(void) {
  current_test = __func__;
  pprof_buffer b = write_profile(types, 3, T0, SECOND, first_file, 1, "b");
  pprof_buffer a = write_profile(types, 3, T0, SECOND, first_file, 1, "a");
  pprof_merge *merge = new_merge(INT64_MIN, INT64_MAX);
  CHECK(add(merge, &b, "b"));
  CHECK(add(merge, &a, "a"));
  CHECK(add(merge, &b, "b"));
  CHECK_EQ_INT(2, pprof_merge_comment_count(merge));
  pprof_str first = pprof_merge_comment(merge, 0), second = pprof_merge_comment(merge, 1);
  CHECK(first.len == 1 && first.ptr[0] == 'b');
  CHECK(second.len == 1 && second.ptr[0] == 'a');
  pprof_merge_free(merge);
  pprof_buffer_free(&a);
  pprof_buffer_free(&b);
}

static void test_summary(void) {
  current_test = __func__;
  pprof_buffer data = write_profile(types, 3, T0, 60 * SECOND, first_file, 3, "version=2");
  pprof_reader reader = {0};
  pprof_summary summary;
  pprof_error error = {{0}};
  CHECK_EQ_INT(PPROF_OK, pprof_summarize(&reader, data.data, data.len, &summary, &error));
  CHECK_EQ_INT(3, summary.sample_type_count);
  CHECK(summary.sample_types[2].type.len == 9 && memcmp(summary.sample_types[2].type.ptr, "wall-time", 9) == 0);
  CHECK_EQ_INT(35, summary.totals[0]);
  CHECK_EQ_INT(4, summary.totals[1]);
  CHECK_EQ_INT(43, summary.totals[2]);
  CHECK_EQ_INT(T0, summary.time_nanos);
  CHECK_EQ_INT(60 * SECOND, summary.duration_nanos);
  CHECK_EQ_INT(1, reader.comment_count);
  CHECK(!summary.has_reach); // no timeline sample
  // The reach of timeline samples: from the earliest stretch's start (end less wall time;
  // an instant is its end) to the latest end, reaching before the period.
  const spec timeline[] = {
    {{"a"}, {1, 1, 30}, "1", T0 + 100},
    {{"b"}, {1, 1, 0}, "1", T0 + 200},
    {{"c"}, {1, 1, 500}, "1", T0 + 20},
    {{"d"}, {1, 1, 999}, "1", 0},
  };
  pprof_buffer timed = write_profile(types, 3, T0, 60 * SECOND, timeline, 4, NULL);
  CHECK_EQ_INT(PPROF_OK, pprof_summarize(&reader, timed.data, timed.len, &summary, &error));
  CHECK(summary.has_reach);
  CHECK_EQ_INT(T0 - 480, summary.reach_start);
  CHECK_EQ_INT(T0 + 200, summary.reach_end);
  pprof_buffer_free(&timed);
  wire w = handwritten_profile();
  CHECK_EQ_INT(PPROF_OK, pprof_summarize(&reader, w.bytes, w.len, &summary, &error));
  CHECK_EQ_INT(2, summary.totals[0]);
  CHECK_EQ_INT(PPROF_ERR_INVALID, pprof_summarize(&reader, data.data, data.len / 2, &summary, &error));
  pprof_reader_free(&reader);
  pprof_buffer_free(&data);
}

// Every allocation of an add failing in turn: an error, no leak, the merge still usable.
static void test_allocation_failures(void) {
  current_test = __func__;
  pprof_buffer one = write_profile(types, 3, T0, 60 * SECOND, first_file, 3, "x");
  pprof_buffer two = write_profile(types, 3, T0, 60 * SECOND, second_file, 2, "y");
  bool succeeded = false;
  for (long allowed = 0; !succeeded && allowed < 500; allowed++) {
    pprof_merge *merge = NULL;
    pprof_error error = {{0}};
    bool merged;
    pprof_alloc_fail_after(allowed);
    if (pprof_merge_new(&merge, INT64_MIN, INT64_MAX, &error) == PPROF_OK) {
      pprof_buffer out = {0};
      succeeded = pprof_merge_add(merge, one.data, one.len, "one", &merged, &error) == PPROF_OK &&
                  pprof_merge_add(merge, two.data, two.len, "two", &merged, &error) == PPROF_OK &&
                  pprof_merge_finish(merge, &out, &error) == PPROF_OK;
      pprof_alloc_fail_after(-1);
      pprof_buffer_free(&out);
      pprof_merge_free(merge);
    }
    pprof_alloc_fail_after(-1);
  }
  CHECK(succeeded);
  pprof_buffer_free(&one);
  pprof_buffer_free(&two);
}

int main(void) {
  test_sums_and_unifies_frames();
  test_timeline_cut_to_the_range();
  test_profiles_outside_the_range_are_skipped();
  test_sample_types_must_be_the_same();
  test_any_writer_and_plain_protobuf();
  test_truncated_and_garbage_input();
  test_empty_stacks_are_kept();
  test_comments_distinct_in_first_seen_order();
  test_summary();
  test_allocation_failures();
  if (failures) {
    fprintf(stderr, "%d of %d merge checks failed\n", failures, checks);
    return 1;
  }
  printf("pprof merge (%s): %d checks ok\n", pprof_compressor_name(), checks);
  return 0;
}
