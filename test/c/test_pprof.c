// Unit tests for the pprof core (ext/contprof/pprof/pprof_*.c). Every profile is checked by
// decoding its serialized bytes with the independent decoder in pprof_decode.c.
// Run with `make -C test/c` (plain) or `make -C test/c sanitize` (ASan + UBSan).
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../ext/contprof/pprof/pprof_alloc.h"
#include "../../ext/contprof/pprof/pprof_profile.h"
#include "checks.h"
#include "pprof_decode.h"
#include "round_trip.h"


static const pprof_value_type default_types[3] = {
  {PPROF_STR("cpu-time"), PPROF_STR("nanoseconds")},
  {PPROF_STR("cpu-samples"), PPROF_STR("count")},
  {PPROF_STR("wall-time"), PPROF_STR("nanoseconds")},
};

static pprof_str str(const char *s) { return (pprof_str) {.ptr = s, .len = strlen(s)}; }

static pprof_frame frame(const char *name, const char *file, int64_t line) {
  return (pprof_frame) {.function_name = str(name), .file_name = str(file), .line = line};
}

static pprof_label string_label(const char *key, const char *value) {
  return (pprof_label) {.key = str(key), .str = str(value)};
}

static pprof_label number_label(const char *key, int64_t num, const char *unit) {
  return (pprof_label) {.key = str(key), .num = num, .num_unit = str(unit)};
}

static pprof_profile *new_profile(int64_t start) {
  pprof_profile *profile = NULL;
  pprof_error error = {{0}};
  pprof_status status = pprof_profile_new(&profile, default_types, 3, NULL, 0, start, &error);
  if (status != PPROF_OK) {
    fprintf(stderr, "pprof_profile_new failed: %s\n", error.message);
    exit(1);
  }
  return profile;
}

PPROF_MUST_CHECK
static pprof_status add(pprof_profile *profile, const pprof_frame *frames, size_t frame_count, int64_t cpu,
                        int64_t samples, int64_t wall, const pprof_label *labels, size_t label_count,
                        pprof_error *error) {
  int64_t values[3] = {cpu, samples, wall};
  pprof_sample sample = {.frames = frames, .frame_count = frame_count, .values = values, .value_count = 3, .labels = labels, .label_count = label_count};
  return pprof_profile_add(profile, &sample, error);
}

// Serializes and decodes; exits the test run if the output cannot be decoded.
static void test_new_rejects_bad_arguments(void) {
  current_test = __func__;
  pprof_profile *profile = (pprof_profile *) 1;
  pprof_error error = {{0}};
  CHECK_EQ_INT(PPROF_ERR_INVALID, pprof_profile_new(&profile, default_types, 0, NULL, 0, 0, &error));
  CHECK(profile == NULL);
  CHECK(strstr(error.message, "sample types") != NULL);
  CHECK_EQ_INT(PPROF_ERR_INVALID, pprof_profile_new(&profile, NULL, 2, NULL, 0, 0, &error));
  pprof_value_type too_many[PPROF_MAX_SAMPLE_TYPES + 1];
  for (int i = 0; i <= PPROF_MAX_SAMPLE_TYPES; i++) too_many[i] = default_types[0];
  CHECK_EQ_INT(PPROF_ERR_INVALID, pprof_profile_new(&profile, too_many, PPROF_MAX_SAMPLE_TYPES + 1, NULL, 0, 0, &error));
  pprof_value_type unnamed = {PPROF_STR(""), PPROF_STR("count")};
  CHECK_EQ_INT(PPROF_ERR_INVALID, pprof_profile_new(&profile, &unnamed, 1, NULL, 0, 0, &error));
  pprof_value_type bad = {{NULL, 3}, PPROF_STR("count")};
  CHECK_EQ_INT(PPROF_ERR_INVALID, pprof_profile_new(&profile, &bad, 1, NULL, 0, 0, &error));
  CHECK_EQ_INT(PPROF_ERR_INVALID, pprof_profile_new(NULL, default_types, 3, NULL, 0, 0, NULL));
}

static void test_empty_profile(void) {
  current_test = __func__;
  pprof_profile *profile = new_profile(1000000000123);
  dec_profile decoded;
  serialize_and_decode(profile, 1000000000123 + 60000000000, &decoded);
  CHECK_EQ_INT(3, decoded.sample_type_count);
  CHECK_EQ_STR("cpu-time", dec_string(&decoded, decoded.sample_types[0].type));
  CHECK_EQ_STR("nanoseconds", dec_string(&decoded, decoded.sample_types[0].unit));
  CHECK_EQ_STR("cpu-samples", dec_string(&decoded, decoded.sample_types[1].type));
  CHECK_EQ_STR("count", dec_string(&decoded, decoded.sample_types[1].unit));
  CHECK_EQ_STR("wall-time", dec_string(&decoded, decoded.sample_types[2].type));
  CHECK_EQ_INT(0, decoded.sample_count);
  CHECK_EQ_INT(0, decoded.location_count);
  CHECK_EQ_INT(0, decoded.function_count);
  CHECK_EQ_STR("", decoded.strings[0]);
  CHECK_EQ_INT(1000000000123, decoded.time_nanos);
  CHECK_EQ_INT(60000000000, decoded.duration_nanos);
  CHECK_EQ_INT(0, decoded.has_period_type);
  CHECK_EQ_INT(0, decoded.default_sample_type);
  dec_profile_free(&decoded);

  pprof_error error = {{0}};
  CHECK_EQ_INT(PPROF_ERR_INVALID, pprof_profile_set_default_sample_type(profile, 3, &error));
  CHECK_EQ_INT(PPROF_OK, pprof_profile_set_default_sample_type(profile, 2, &error));
  serialize_and_decode(profile, 1000000000123, &decoded);
  CHECK_EQ_STR("wall-time", dec_string(&decoded, decoded.default_sample_type));
  dec_profile_free(&decoded);
  pprof_profile_free(profile);
}

static void test_comments(void) {
  current_test = __func__;
  pprof_profile *profile = new_profile(1000);
  pprof_error error = {{0}};
  CHECK_EQ_INT(PPROF_OK, pprof_profile_add_comment(profile, PPROF_STR("first comment"), &error));
  CHECK_EQ_INT(PPROF_OK, pprof_profile_add_comment(profile, PPROF_STR("cpu-time"), &error)); // an interned string
  dec_profile decoded;
  serialize_and_decode(profile, 2000, &decoded);
  CHECK_EQ_INT(2, decoded.comment_count);
  CHECK_EQ_STR("first comment", dec_string(&decoded, decoded.comments[0]));
  CHECK_EQ_STR("cpu-time", dec_string(&decoded, decoded.comments[1]));
  dec_profile_free(&decoded);
  for (int i = 2; i < PPROF_MAX_COMMENTS; i++) {
    CHECK_EQ_INT(PPROF_OK, pprof_profile_add_comment(profile, PPROF_STR("more"), &error));
  }
  CHECK_EQ_INT(PPROF_ERR_LIMIT, pprof_profile_add_comment(profile, PPROF_STR("one too many"), &error));
  pprof_profile_reset(profile, 3000); // comments belong to one period
  serialize_and_decode(profile, 4000, &decoded);
  CHECK_EQ_INT(0, decoded.comment_count);
  dec_profile_free(&decoded);
  pprof_profile_free(profile);
}

static void test_aggregation(void) {
  current_test = __func__;
  pprof_profile *profile = new_profile(0);
  pprof_error error = {{0}};
  pprof_frame stack_a[] = {frame("Foo#bar", "/app/foo.rb", 10), frame("<main>", "/app/main.rb", 3)};
  pprof_frame stack_a_other_line[] = {frame("Foo#bar", "/app/foo.rb", 11), frame("<main>", "/app/main.rb", 3)};
  pprof_frame stack_b[] = {frame("Kernel#sleep", "/app/foo.rb", 10), frame("Foo#bar", "/app/foo.rb", 10),
                           frame("<main>", "/app/main.rb", 3)};
  CHECK_EQ_INT(PPROF_OK, add(profile, stack_a, 2, 100, 1, 1000, NULL, 0, &error));
  CHECK_EQ_INT(PPROF_OK, add(profile, stack_a, 2, 50, 1, 2000, NULL, 0, &error));
  CHECK_EQ_INT(PPROF_OK, add(profile, stack_a_other_line, 2, 7, 1, 7, NULL, 0, &error));
  CHECK_EQ_INT(PPROF_OK, add(profile, stack_b, 3, 0, 0, 5000, NULL, 0, &error));
  CHECK_EQ_INT(PPROF_OK, add(profile, stack_b, 3, 0, 0, 5000, NULL, 0, &error));

  pprof_profile_stats stats = pprof_profile_get_stats(profile);
  CHECK_EQ_INT(3, stats.samples);
  CHECK_EQ_INT(3, stats.stacks);
  CHECK_EQ_INT(4, stats.locations); // Foo#bar:10, Foo#bar:11, <main>:3, Kernel#sleep:10
  CHECK_EQ_INT(3, stats.functions);

  dec_profile decoded;
  serialize_and_decode(profile, 10, &decoded);
  CHECK_EQ_INT(3, decoded.sample_count);
  size_t matches;
  const char *a = "Foo#bar@/app/foo.rb:10;<main>@/app/main.rb:3";
  CHECK_EQ_INT(150, dec_sum(&decoded, a, NULL, 0, &matches));
  CHECK_EQ_INT(1, matches);
  CHECK_EQ_INT(2, dec_sum(&decoded, a, NULL, 1, NULL));
  CHECK_EQ_INT(3000, dec_sum(&decoded, a, NULL, 2, NULL));
  CHECK_EQ_INT(7, dec_sum(&decoded, "Foo#bar@/app/foo.rb:11;<main>@/app/main.rb:3", NULL, 0, NULL));
  const char *b = "Kernel#sleep@/app/foo.rb:10;Foo#bar@/app/foo.rb:10;<main>@/app/main.rb:3";
  CHECK_EQ_INT(10000, dec_sum(&decoded, b, NULL, 2, &matches));
  CHECK_EQ_INT(1, matches);
  CHECK_EQ_INT(0, dec_sum(&decoded, b, NULL, 0, NULL));
  // Functions carry a name and a file name, and no system name (see encode_functions).
  CHECK_EQ_INT(3, decoded.function_count);
  for (size_t i = 0; i < decoded.function_count; i++) {
    CHECK(decoded.functions[i].id != 0);
    CHECK(decoded.functions[i].name != 0);
    CHECK_EQ_INT(0, decoded.functions[i].system_name);
  }
  for (size_t i = 0; i < decoded.location_count; i++) CHECK_EQ_INT(1, decoded.locations[i].line_count);
  dec_profile_free(&decoded);
  pprof_profile_free(profile);
}

static void test_labels(void) {
  current_test = __func__;
  pprof_profile *profile = new_profile(0);
  pprof_error error = {{0}};
  pprof_frame stack[] = {frame("work", "/w.rb", 1)};
  pprof_label thread_1[] = {string_label("thread name", "worker-1"), number_label("thread id", 1, "")};
  pprof_label thread_1_reordered[] = {number_label("thread id", 1, ""), string_label("thread name", "worker-1")};
  pprof_label thread_2[] = {string_label("thread name", "worker-2"), number_label("thread id", 2, "")};
  pprof_label with_unit[] = {number_label("bytes", 4096, "bytes")};
  CHECK_EQ_INT(PPROF_OK, add(profile, stack, 1, 10, 1, 10, thread_1, 2, &error));
  CHECK_EQ_INT(PPROF_OK, add(profile, stack, 1, 20, 1, 20, thread_1_reordered, 2, &error));
  CHECK_EQ_INT(PPROF_OK, add(profile, stack, 1, 40, 1, 40, thread_2, 2, &error));
  CHECK_EQ_INT(PPROF_OK, add(profile, stack, 1, 80, 1, 80, with_unit, 1, &error));
  CHECK_EQ_INT(PPROF_OK, add(profile, stack, 1, 160, 1, 160, NULL, 0, &error));

  dec_profile decoded;
  serialize_and_decode(profile, 10, &decoded);
  CHECK_EQ_INT(4, decoded.sample_count);
  size_t matches;
  // Labels are stored in a canonical order: by key, in the order keys were first seen.
  CHECK_EQ_INT(30, dec_sum(&decoded, "work@/w.rb:1", "thread name=worker-1,thread id=1", 0, &matches));
  CHECK_EQ_INT(1, matches);
  CHECK_EQ_INT(40, dec_sum(&decoded, "work@/w.rb:1", "thread name=worker-2,thread id=2", 0, &matches));
  CHECK_EQ_INT(80, dec_sum(&decoded, "work@/w.rb:1", "bytes=4096 bytes", 0, &matches));
  CHECK_EQ_INT(160, dec_sum(&decoded, "work@/w.rb:1", "", 0, &matches));
  CHECK_EQ_INT(1, matches);
  dec_profile_free(&decoded);
  pprof_profile_free(profile);
}

static void test_invalid_samples_change_nothing(void) {
  current_test = __func__;
  pprof_profile *profile = new_profile(0);
  pprof_error error = {{0}};
  pprof_frame good[] = {frame("ok", "/ok.rb", 1)};
  CHECK_EQ_INT(PPROF_OK, add(profile, good, 1, 1, 1, 1, NULL, 0, &error));

  int64_t two_values[2] = {1, 2};
  pprof_sample mismatch = {.frames = good, .frame_count = 1, .values = two_values, .value_count = 2};
  CHECK_EQ_INT(PPROF_ERR_INVALID, pprof_profile_add(profile, &mismatch, &error));
  CHECK(strstr(error.message, "2 values") != NULL);
  CHECK(strstr(error.message, "3 sample types") != NULL);

  pprof_frame bad_frame[] = {{.function_name = {NULL, 4}, .file_name = PPROF_STR("/x.rb"), .line = 1}};
  CHECK_EQ_INT(PPROF_ERR_INVALID, add(profile, bad_frame, 1, 1, 1, 1, NULL, 0, &error));
  CHECK_EQ_INT(PPROF_ERR_INVALID, add(profile, NULL, 3, 1, 1, 1, NULL, 0, &error));
  pprof_label empty_key[] = {string_label("", "v")};
  CHECK_EQ_INT(PPROF_ERR_INVALID, add(profile, good, 1, 1, 1, 1, empty_key, 1, &error));
  pprof_label empty_value[] = {string_label("thread name", "")};
  CHECK_EQ_INT(PPROF_ERR_INVALID, add(profile, good, 1, 1, 1, 1, empty_value, 1, &error));
  CHECK(strstr(error.message, "empty string value") != NULL);
  pprof_label many[PPROF_MAX_LABELS + 1];
  for (int i = 0; i <= PPROF_MAX_LABELS; i++) many[i] = string_label("k", "v");
  CHECK_EQ_INT(PPROF_ERR_INVALID, add(profile, good, 1, 1, 1, 1, many, PPROF_MAX_LABELS + 1, &error));
  CHECK_EQ_INT(PPROF_ERR_INVALID, pprof_profile_add(profile, NULL, &error));
  CHECK_EQ_INT(PPROF_ERR_INVALID, pprof_profile_add(NULL, &mismatch, NULL));

  dec_profile decoded;
  serialize_and_decode(profile, 10, &decoded);
  CHECK_EQ_INT(1, decoded.sample_count);
  CHECK_EQ_INT(1, dec_sum(&decoded, "ok@/ok.rb:1", NULL, 0, NULL));
  dec_profile_free(&decoded);
  pprof_profile_free(profile);
}

static void test_reset_starts_a_new_period(void) {
  current_test = __func__;
  pprof_profile *profile = new_profile(1000);
  pprof_error error = {{0}};
  pprof_frame old_stack[] = {frame("old", "/old.rb", 1)};
  pprof_frame new_stack[] = {frame("new", "/new.rb", 2)};
  pprof_label label[] = {string_label("thread name", "main")};
  CHECK_EQ_INT(PPROF_OK, add(profile, old_stack, 1, 5, 1, 5, label, 1, &error));
  dec_profile first;
  serialize_and_decode(profile, 2000, &first);
  CHECK_EQ_INT(1, first.sample_count);
  CHECK_EQ_INT(1000, first.time_nanos);
  CHECK_EQ_INT(1000, first.duration_nanos);
  dec_profile_free(&first);

  pprof_profile_reset(profile, 2000);
  CHECK_EQ_INT(2000, pprof_profile_start_time_ns(profile));
  CHECK_EQ_INT(PPROF_OK, add(profile, new_stack, 1, 9, 1, 9, label, 1, &error));
  dec_profile second;
  serialize_and_decode(profile, 2500, &second);
  CHECK_EQ_INT(1, second.sample_count);
  CHECK_EQ_INT(9, dec_sum(&second, "new@/new.rb:2", "thread name=main", 0, NULL));
  CHECK_EQ_INT(0, dec_sum(&second, "old@/old.rb:1", NULL, 0, NULL));
  CHECK_EQ_INT(2000, second.time_nanos);
  CHECK_EQ_INT(500, second.duration_nanos);
  CHECK_EQ_STR("cpu-time", dec_string(&second, second.sample_types[0].type));
  CHECK_EQ_STR("wall-time", dec_string(&second, second.sample_types[2].type));
  for (size_t i = 0; i < second.string_count; i++) CHECK(strcmp(second.strings[i], "old") != 0);
  dec_profile_free(&second);

  // A finish before the start is clamped to a zero duration.
  pprof_profile_set_start_time_ns(profile, 9000);
  dec_profile third;
  serialize_and_decode(profile, 8000, &third);
  CHECK_EQ_INT(0, third.duration_nanos);
  dec_profile_free(&third);
  pprof_profile_free(profile);
}

static void test_period_and_edge_values(void) {
  current_test = __func__;
  pprof_profile *profile = NULL;
  pprof_value_type period_type = {PPROF_STR("wall-time"), PPROF_STR("nanoseconds")};
  CHECK_EQ_INT(PPROF_OK, pprof_profile_new(&profile, default_types, 3, &period_type, 10000000, 5, NULL));
  pprof_error error = {{0}};
  pprof_frame stack[] = {frame("x", "/x.rb", 1)};
  CHECK_EQ_INT(PPROF_OK, add(profile, stack, 1, INT64_MAX - 5, -3, INT64_MIN + 5, NULL, 0, &error));
  CHECK_EQ_INT(PPROF_OK, add(profile, stack, 1, 100, -4, -100, NULL, 0, &error));
  // A sample with no frames is valid pprof.
  CHECK_EQ_INT(PPROF_OK, add(profile, NULL, 0, 1, 1, 1, NULL, 0, &error));
  // Negative and zero lines, empty names.
  pprof_frame odd[] = {frame("", "", 0), frame("neg", "/n.rb", -7)};
  CHECK_EQ_INT(PPROF_OK, add(profile, odd, 2, 2, 2, 2, NULL, 0, &error));
  dec_profile decoded;
  serialize_and_decode(profile, 10, &decoded);
  CHECK_EQ_INT(1, decoded.has_period_type);
  CHECK_EQ_STR("wall-time", dec_string(&decoded, decoded.period_type.type));
  CHECK_EQ_INT(10000000, decoded.period);
  CHECK_EQ_INT(INT64_MAX, dec_sum(&decoded, "x@/x.rb:1", NULL, 0, NULL)); // saturated
  CHECK_EQ_INT(-7, dec_sum(&decoded, "x@/x.rb:1", NULL, 1, NULL));
  CHECK_EQ_INT(INT64_MIN, dec_sum(&decoded, "x@/x.rb:1", NULL, 2, NULL));
  CHECK_EQ_INT(1, dec_sum(&decoded, "", NULL, 0, NULL));
  CHECK_EQ_INT(2, dec_sum(&decoded, "@:0;neg@/n.rb:-7", NULL, 0, NULL));
  dec_profile_free(&decoded);
  pprof_profile_free(profile);
}

// The resolver used by the keyed tests: frame i of the current sample is
// resolver_frames[i]; counts its calls and can be told to fail.
static pprof_frame resolver_frames[8];
static int resolver_calls;
static int resolver_fail_at = -1;

static bool resolver_forbids_keys;

PPROF_MUST_CHECK
static pprof_status test_resolver(void *context, size_t index, pprof_frame *frame, bool *remember_key,
                                  pprof_error *error) {
  (void) context;
  resolver_calls++;
  if (resolver_forbids_keys) *remember_key = false;
  if ((int) index == resolver_fail_at) {
    snprintf(error->message, sizeof(error->message), "resolver refused frame %zu", index);
    return PPROF_ERR_RESOLVE;
  }
  *frame = resolver_frames[index];
  return PPROF_OK;
}

PPROF_MUST_CHECK
static pprof_status add_keyed(pprof_profile *profile, const pprof_frame_key *keys, size_t count, uint64_t epoch,
                              int64_t cpu, pprof_error *error) {
  int64_t values[3] = {cpu, 1, 0};
  pprof_sample sample = {.frame_keys = keys, .frame_key_epoch = epoch, .resolve_frame = test_resolver,
                         .frame_count = count, .values = values, .value_count = 3};
  return pprof_profile_add(profile, &sample, error);
}

static void test_keyed_frames(void) {
  current_test = __func__;
  pprof_profile *profile = new_profile(0);
  pprof_error error = {{0}};
  resolver_frames[0] = frame("Foo#bar", "/foo.rb", 10);
  resolver_frames[1] = frame("<main>", "/main.rb", 1);
  pprof_frame_key keys[2] = {{.a = 1, .b = 2, .c = 3}, {.a = 4}};

  resolver_calls = 0;
  CHECK_EQ_INT(PPROF_OK, add_keyed(profile, keys, 2, 7, 10, &error));
  CHECK_EQ_INT(2, resolver_calls); // both keys new
  CHECK_EQ_INT(PPROF_OK, add_keyed(profile, keys, 2, 7, 20, &error));
  CHECK_EQ_INT(2, resolver_calls); // both known: no strings needed
  CHECK_EQ_INT(2, pprof_profile_get_stats(profile).frame_keys);

  // A different key for the same frame content shares the location.
  pprof_frame_key other[2] = {{.a = 99}, {.a = 4}};
  CHECK_EQ_INT(PPROF_OK, add_keyed(profile, other, 2, 7, 40, &error));
  CHECK_EQ_INT(3, resolver_calls);
  CHECK_EQ_INT(2, pprof_profile_get_stats(profile).locations);

  // The all-zero key is "no key": resolved every time, never remembered.
  pprof_frame_key unkeyed[2] = {{0, 0, 0}, {.a = 4}};
  CHECK_EQ_INT(PPROF_OK, add_keyed(profile, unkeyed, 2, 7, 80, &error));
  CHECK_EQ_INT(PPROF_OK, add_keyed(profile, unkeyed, 2, 7, 160, &error));
  CHECK_EQ_INT(5, resolver_calls);
  CHECK_EQ_INT(3, pprof_profile_get_stats(profile).frame_keys);

  // A resolver can forbid remembering a key: that frame is resolved again next time.
  resolver_forbids_keys = true;
  pprof_frame_key transient[2] = {{.a = 1234}, {.a = 4}};
  CHECK_EQ_INT(PPROF_OK, add_keyed(profile, transient, 2, 7, 0, &error));
  CHECK_EQ_INT(PPROF_OK, add_keyed(profile, transient, 2, 7, 0, &error));
  CHECK_EQ_INT(7, resolver_calls);
  CHECK_EQ_INT(3, pprof_profile_get_stats(profile).frame_keys);
  resolver_forbids_keys = false;
  resolver_calls = 5;

  // A new epoch forgets the keys: the same key may now denote another frame.
  resolver_frames[0] = frame("Baz#qux", "/baz.rb", 5);
  CHECK_EQ_INT(PPROF_OK, add_keyed(profile, keys, 2, 8, 1000, &error));
  CHECK_EQ_INT(7, resolver_calls);

  // A resolver failure abandons the sample and reports the resolver's message.
  resolver_fail_at = 1;
  pprof_frame_key fresh[2] = {{.a = 500}, {.a = 501}};
  CHECK_EQ_INT(PPROF_ERR_RESOLVE, add_keyed(profile, fresh, 2, 8, 5000, &error));
  CHECK(strstr(error.message, "resolver refused frame 1") != NULL);
  resolver_fail_at = -1;
  // Keys without frames or resolver are rejected.
  int64_t values[3] = {1, 1, 1};
  pprof_sample no_resolver = {.frame_keys = keys, .frame_count = 2, .values = values, .value_count = 3};
  CHECK_EQ_INT(PPROF_ERR_INVALID, pprof_profile_add(profile, &no_resolver, &error));
  // Keys with frames given need no resolver.
  pprof_frame given[1] = {frame("Given#frame", "/g.rb", 3)};
  pprof_frame_key given_key[1] = {{.a = 777}};
  pprof_sample with_frames = {.frames = given, .frame_keys = given_key, .frame_key_epoch = 8, .frame_count = 1,
                              .values = values, .value_count = 3};
  CHECK_EQ_INT(PPROF_OK, pprof_profile_add(profile, &with_frames, &error));

  dec_profile decoded;
  serialize_and_decode(profile, 10, &decoded);
  const char *foo = "Foo#bar@/foo.rb:10;<main>@/main.rb:1";
  CHECK_EQ_INT(10 + 20 + 40 + 80 + 160, dec_sum(&decoded, foo, NULL, 0, NULL));
  CHECK_EQ_INT(1000, dec_sum(&decoded, "Baz#qux@/baz.rb:5;<main>@/main.rb:1", NULL, 0, NULL));
  CHECK_EQ_INT(1, dec_sum(&decoded, "Given#frame@/g.rb:3", NULL, 0, NULL));
  int64_t total = 0;
  for (size_t i = 0; i < decoded.sample_count; i++) total += decoded.samples[i].values[0];
  CHECK_EQ_INT(10 + 20 + 40 + 80 + 160 + 1000 + 1, total); // the failed sample left nothing
  dec_profile_free(&decoded);

  // Reset forgets keys too.
  pprof_profile_reset(profile, 0);
  CHECK_EQ_INT(0, pprof_profile_get_stats(profile).frame_keys);
  pprof_profile_free(profile);
}

// A resolver may run code that moves what the labels point at (the public-API VM backend
// names frames with Ruby calls that allocate, and a compacting GC can move a label's
// string): the labels must be read before any frame is resolved.
static char moving_label[16];
PPROF_MUST_CHECK
static pprof_status resolver_moving_labels(void *context, size_t index, pprof_frame *frame, bool *remember_key,
                                           pprof_error *error) {
  (void) context;
  (void) remember_key;
  (void) error;
  memcpy(moving_label, "moved!", 7); // what a compaction leaves where a string was
  *frame = resolver_frames[index];
  return PPROF_OK;
}

static void test_labels_are_read_before_frames_are_named(void) {
  current_test = __func__;
  pprof_profile *profile = new_profile(0);
  pprof_error error = {{0}};
  memcpy(moving_label, "worker-1", 9);
  resolver_frames[0] = frame("Foo#bar", "/foo.rb", 10);
  pprof_frame_key keys[1] = {{.a = 42}};
  pprof_label labels[1] = {{.key = str("thread name"), .str = {moving_label, 8}}};
  int64_t values[3] = {5, 1, 5};
  pprof_sample sample = {.frame_keys = keys, .frame_key_epoch = 1, .resolve_frame = resolver_moving_labels,
                         .frame_count = 1, .values = values, .value_count = 3, .labels = labels, .label_count = 1};
  CHECK_EQ_INT(PPROF_OK, pprof_profile_add(profile, &sample, &error));
  dec_profile decoded;
  serialize_and_decode(profile, 10, &decoded);
  CHECK_EQ_INT(5, dec_sum(&decoded, "Foo#bar@/foo.rb:10", "thread name=worker-1", 0, NULL));
  dec_profile_free(&decoded);
  pprof_profile_free(profile);
}

// Omitted frames leave the stack (keyed or not), and a keyed answer is remembered.
static void test_omitted_frames(void) {
  current_test = __func__;
  pprof_profile *profile = new_profile(0);
  pprof_error error = {{0}};
  pprof_frame hidden = frame("Profiler#stop", "/lib/profiler.rb", 3);
  hidden.omit = true;
  pprof_frame stack[3] = {frame("leaf", "/app.rb", 1), hidden, frame("<main>", "/app.rb", 9)};
  CHECK_EQ_INT(PPROF_OK, add(profile, stack, 3, 5, 1, 0, NULL, 0, &error));

  resolver_frames[0] = hidden;
  resolver_frames[1] = frame("work", "/app.rb", 4);
  pprof_frame_key keys[2] = {{.a = 11}, {.a = 12}};
  resolver_calls = 0;
  CHECK_EQ_INT(PPROF_OK, add_keyed(profile, keys, 2, 1, 7, &error));
  CHECK_EQ_INT(PPROF_OK, add_keyed(profile, keys, 2, 1, 7, &error));
  CHECK_EQ_INT(2, resolver_calls); // the omitted frame's key is remembered too
  pprof_frame_key only_hidden[1] = {{.a = 11}};
  CHECK_EQ_INT(PPROF_OK, add_keyed(profile, only_hidden, 1, 1, 100, &error));
  int64_t values[3] = {1, 1, 1};
  pprof_sample all_omitted = {.frames = &hidden, .frame_count = 1, .values = values, .value_count = 3};
  pprof_sample_ref ref;
  CHECK_EQ_INT(PPROF_OK, pprof_profile_add_with_ref(profile, &all_omitted, &ref, &error));
  CHECK(!pprof_profile_add_again(profile, &ref, values, 3, 0)); // its ref denotes nothing

  dec_profile decoded;
  serialize_and_decode(profile, 10, &decoded);
  CHECK_EQ_INT(5, dec_sum(&decoded, "leaf@/app.rb:1;<main>@/app.rb:9", NULL, 0, NULL));
  CHECK_EQ_INT(14, dec_sum(&decoded, "work@/app.rb:4", NULL, 0, NULL));
  CHECK_EQ_INT(0, dec_sum(&decoded, "", NULL, 0, NULL)); // every frame omitted: not recorded
  CHECK_EQ_INT(2, decoded.sample_count);
  CHECK_EQ_INT(3, pprof_profile_get_stats(profile).locations); // none for the omitted frame
  dec_profile_free(&decoded);
  pprof_profile_free(profile);
}

static void test_sample_refs(void) {
  current_test = __func__;
  pprof_profile *profile = new_profile(0);
  pprof_profile *other = new_profile(0);
  pprof_error error = {{0}};
  pprof_frame stack[] = {frame("again", "/a.rb", 1)};
  int64_t values[3] = {5, 1, 7};
  pprof_sample sample = {.frames = stack, .frame_count = 1, .values = values, .value_count = 3};
  pprof_sample_ref ref;
  CHECK_EQ_INT(PPROF_OK, pprof_profile_add_with_ref(profile, &sample, &ref, &error));
  CHECK(pprof_profile_add_again(profile, &ref, values, 3, 0));
  CHECK(pprof_profile_add_again(profile, &ref, values, 3, 0));
  CHECK(!pprof_profile_add_again(other, &ref, values, 3, 0)); // another profile
  CHECK(!pprof_profile_add_again(profile, &ref, values, 2, 0)); // wrong value count
  pprof_sample_ref again_ref;
  CHECK_EQ_INT(PPROF_OK, pprof_profile_add_with_ref(profile, &sample, &again_ref, &error)); // found by lookup
  CHECK_EQ_INT(ref.sample_index, again_ref.sample_index);
  dec_profile decoded;
  serialize_and_decode(profile, 10, &decoded);
  CHECK_EQ_INT(1, decoded.sample_count);
  CHECK_EQ_INT(20, dec_sum(&decoded, "again@/a.rb:1", NULL, 0, NULL));
  CHECK_EQ_INT(28, dec_sum(&decoded, "again@/a.rb:1", NULL, 2, NULL));
  dec_profile_free(&decoded);
  pprof_profile_reset(profile, 0);
  CHECK(!pprof_profile_add_again(profile, &ref, values, 3, 0)); // stale after reset
  pprof_profile_free(profile);
  pprof_profile_free(other);
}

// Timeline samples: never merged (with each other or with aggregated ones), serialized
// with their timestamp as the numeric label end_timestamp_ns after their own labels; a ref
// counts one again and moves its timestamp on, never back. Sums are of cpu-samples (a
// count: time values go out on the timeline's grid, tested in test_timeline.c), and
// timestamps are on the grid.
static void test_timeline_samples(void) {
  current_test = __func__;
  const int64_t T0 = INT64_C(1621000000) * PPROF_TIMELINE_TICK_NS; // late 2023, on the grid
  pprof_profile *profile = new_profile(0);
  pprof_error error = {{0}};
  pprof_frame stack[] = {frame("tick", "/t.rb", 1)};
  pprof_label thread_1[] = {string_label("thread id", "1")};
  int64_t values[3] = {10, 1, 10};
  pprof_sample sample = {.frames = stack, .frame_count = 1, .values = values, .value_count = 3,
                         .labels = thread_1, .label_count = 1};
  CHECK_EQ_INT(PPROF_OK, pprof_profile_add(profile, &sample, &error)); // aggregated
  CHECK_EQ_INT(PPROF_OK, pprof_profile_add(profile, &sample, &error));
  sample.timestamp_ns = T0;
  pprof_sample_ref ref;
  CHECK_EQ_INT(PPROF_OK, pprof_profile_add_with_ref(profile, &sample, &ref, &error));
  CHECK(pprof_profile_add_again(profile, &ref, values, 3, T0 + 48 * PPROF_TIMELINE_TICK_NS));
  CHECK(pprof_profile_add_again(profile, &ref, values, 3, T0 + 19 * PPROF_TIMELINE_TICK_NS)); // earlier: stays
  CHECK_EQ_INT(PPROF_OK, pprof_profile_add(profile, &sample, &error)); // same moment, still apart
  sample.timestamp_ns = -1;
  CHECK_EQ_INT(PPROF_ERR_INVALID, pprof_profile_add(profile, &sample, &error));
  CHECK_EQ_INT(3, pprof_profile_get_stats(profile).samples);

  dec_profile decoded;
  serialize_and_decode(profile, 10, &decoded);
  CHECK_EQ_INT(3, decoded.sample_count);
  size_t matches;
  CHECK_EQ_INT(2, dec_sum(&decoded, "tick@/t.rb:1", "thread id=1", 1, &matches));
  CHECK_EQ_INT(1, matches);
  char labels[96];
  snprintf(labels, sizeof(labels), "thread id=1,end_timestamp_ns=%" PRId64, T0 + 48 * PPROF_TIMELINE_TICK_NS);
  CHECK_EQ_INT(3, dec_sum(&decoded, "tick@/t.rb:1", labels, 1, &matches));
  CHECK_EQ_INT(1, matches);
  snprintf(labels, sizeof(labels), "thread id=1,end_timestamp_ns=%" PRId64, T0);
  CHECK_EQ_INT(1, dec_sum(&decoded, "tick@/t.rb:1", labels, 1, &matches));
  CHECK_EQ_INT(1, matches);
  dec_profile_free(&decoded);

  // Extending an earlier timeline sample: only one with the same frames and labels.
  pprof_profile_reset(profile, 0);
  sample.timestamp_ns = 100;
  pprof_sample_ref first;
  CHECK_EQ_INT(PPROF_OK, pprof_profile_add_with_ref(profile, &sample, &first, &error));
  sample.timestamp_ns = 200;
  sample.extend = &first;
  pprof_sample_ref second;
  CHECK_EQ_INT(PPROF_OK, pprof_profile_add_with_ref(profile, &sample, &second, &error));
  CHECK_EQ_INT(first.sample_index, second.sample_index); // extended, its end moved to 200
  sample.timestamp_ns = 300;
  sample.keep_end = true;
  CHECK_EQ_INT(PPROF_OK, pprof_profile_add(profile, &sample, &error)); // extended, its end kept
  sample.keep_end = false;
  pprof_label thread_2[] = {string_label("thread id", "2")};
  sample.labels = thread_2;
  CHECK_EQ_INT(PPROF_OK, pprof_profile_add_with_ref(profile, &sample, &second, &error));
  CHECK(first.sample_index != second.sample_index); // other labels: a sample of its own
  sample.labels = thread_1;
  sample.extend = NULL;
  CHECK_EQ_INT(2, pprof_profile_get_stats(profile).samples);
  serialize_and_decode(profile, 10, &decoded);
  CHECK_EQ_INT(3, dec_sum(&decoded, "tick@/t.rb:1", "thread id=1,end_timestamp_ns=200", 1, &matches));
  CHECK_EQ_INT(1, dec_sum(&decoded, "tick@/t.rb:1", "thread id=2,end_timestamp_ns=300", 1, &matches));
  dec_profile_free(&decoded);

  // A merge window: joins the latest timeline sample of the same frames and labels taken
  // within it (which keeps its timestamp), whatever came between.
  pprof_profile_reset(profile, 0);
  sample.timestamp_ns = 1000;
  CHECK_EQ_INT(PPROF_OK, pprof_profile_add(profile, &sample, &error));
  sample.labels = thread_2;
  sample.timestamp_ns = 1100;
  CHECK_EQ_INT(PPROF_OK, pprof_profile_add(profile, &sample, &error)); // between: another thread
  sample.labels = thread_1;
  sample.merge_window_ns = 500;
  sample.timestamp_ns = 1400;
  CHECK_EQ_INT(PPROF_OK, pprof_profile_add(profile, &sample, &error)); // joins the one at 1000
  sample.timestamp_ns = 1600;
  CHECK_EQ_INT(PPROF_OK, pprof_profile_add(profile, &sample, &error)); // 600 after it: one of its own
  sample.timestamp_ns = 1700;
  CHECK_EQ_INT(PPROF_OK, pprof_profile_add(profile, &sample, &error)); // joins the latest, at 1600
  sample.merge_window_ns = 0;
  CHECK_EQ_INT(3, pprof_profile_get_stats(profile).samples);
  serialize_and_decode(profile, 10, &decoded);
  CHECK_EQ_INT(2, dec_sum(&decoded, "tick@/t.rb:1", "thread id=1,end_timestamp_ns=1000", 1, &matches));
  CHECK_EQ_INT(2, dec_sum(&decoded, "tick@/t.rb:1", "thread id=1,end_timestamp_ns=1600", 1, &matches));
  CHECK_EQ_INT(1, dec_sum(&decoded, "tick@/t.rb:1", "thread id=2,end_timestamp_ns=1100", 1, &matches));
  dec_profile_free(&decoded);

  pprof_profile_reset(profile, 0); // the label's string is interned again in the next period
  sample.timestamp_ns = 5;
  CHECK_EQ_INT(PPROF_OK, pprof_profile_add(profile, &sample, &error));
  serialize_and_decode(profile, 10, &decoded);
  CHECK_EQ_INT(1, dec_sum(&decoded, "tick@/t.rb:1", "thread id=1,end_timestamp_ns=5", 1, &matches));
  dec_profile_free(&decoded);
  pprof_profile_free(profile);
}

// Regressions found by the fuzzer (test/fuzz): an empty first sample (blob tables with no
// bytes yet), and a period too long for int64 arithmetic.
static void test_fuzzer_findings(void) {
  current_test = __func__;
  pprof_profile *profile = new_profile(INT64_MIN + 10);
  pprof_error error = {{0}};
  CHECK_EQ_INT(PPROF_OK, add(profile, NULL, 0, 1, 1, 1, NULL, 0, &error));
  dec_profile decoded;
  serialize_and_decode(profile, INT64_MAX - 10, &decoded);
  CHECK_EQ_INT(1, decoded.sample_count);
  CHECK_EQ_INT(INT64_MAX, decoded.duration_nanos);
  dec_profile_free(&decoded);
  pprof_profile_free(profile);
}

static void test_long_strings(void) {
  current_test = __func__;
  pprof_profile *profile = new_profile(0);
  size_t len = 300000;
  char *name = malloc(len + 1);
  for (size_t i = 0; i < len; i++) name[i] = (char) ('a' + i % 26);
  name[len] = 0;
  pprof_frame stack[] = {frame(name, "/long.rb", 1)};
  pprof_error error = {{0}};
  CHECK_EQ_INT(PPROF_OK, add(profile, stack, 1, 1, 1, 1, NULL, 0, &error));
  CHECK_EQ_INT(PPROF_OK, add(profile, stack, 1, 1, 1, 1, NULL, 0, &error));
  dec_profile decoded;
  serialize_and_decode(profile, 10, &decoded);
  CHECK_EQ_INT(1, decoded.sample_count);
  CHECK_EQ_INT(1, decoded.function_count);
  CHECK_EQ_STR(name, dec_string(&decoded, decoded.functions[0].name));
  dec_profile_free(&decoded);
  pprof_profile_free(profile);
  free(name);
}

// A deterministic generator, so that failures reproduce.
static uint64_t rng_state = 42;
static uint64_t next_random(void) {
  rng_state += UINT64_C(0x9e3779b97f4a7c15);
  uint64_t z = rng_state;
  z = (z ^ (z >> 30)) * UINT64_C(0xbf58476d1ce4e5b9);
  z = (z ^ (z >> 27)) * UINT64_C(0x94d049bb133111eb);
  return z ^ (z >> 31);
}

// Many random stacks (with repeats): the decoded totals per stack must equal what the
// test itself summed, and every stack must come back intact.
static void test_many_stacks_match_reference_totals(void) {
  current_test = __func__;
  enum { UNIQUE = 3000, DEPTH = 40, FUNCTIONS = 500, ADDS = 12000 };
  static char names[FUNCTIONS][48];
  static char files[FUNCTIONS / 10][48];
  for (int i = 0; i < FUNCTIONS; i++) snprintf(names[i], sizeof(names[i]), "Mod::Klass%d#method_%d", i % 37, i);
  for (int i = 0; i < FUNCTIONS / 10; i++) snprintf(files[i], sizeof(files[i]), "/app/lib/file_%d.rb", i);
  static int choice[UNIQUE][DEPTH];
  static int depth[UNIQUE];
  static int64_t expected[UNIQUE];
  for (int s = 0; s < UNIQUE; s++) {
    depth[s] = 1 + (int) (next_random() % DEPTH);
    for (int d = 0; d < depth[s]; d++) choice[s][d] = (int) (next_random() % FUNCTIONS);
    choice[s][0] = s % FUNCTIONS; // distinct leaves make most stacks distinct...
    choice[s][depth[s] - 1] = s; // ...and a distinct root line makes all of them distinct
    expected[s] = 0;
  }
  pprof_profile *profile = new_profile(0);
  pprof_error error = {{0}};
  pprof_frame frames[DEPTH];
  for (int i = 0; i < ADDS; i++) {
    int s = i < UNIQUE ? i : (int) (next_random() % UNIQUE);
    for (int d = 0; d < depth[s]; d++) {
      int f = choice[s][d] % FUNCTIONS;
      frames[d] = frame(names[f], files[f % (FUNCTIONS / 10)], d == depth[s] - 1 ? choice[s][d] + 1000 : f);
    }
    int64_t value = (int64_t) (next_random() % 1000000);
    expected[s] += value;
    if (add(profile, frames, (size_t) depth[s], value, 1, value * 2, NULL, 0, &error) != PPROF_OK) {
      fprintf(stderr, "add failed: %s\n", error.message);
      failures++;
      break;
    }
  }
  CHECK_EQ_INT(UNIQUE, pprof_profile_get_stats(profile).samples);
  dec_profile decoded;
  serialize_and_decode(profile, 10, &decoded);
  CHECK_EQ_INT(UNIQUE, decoded.sample_count);
  // Sample order follows first insertion, so sample s is stack s.
  static char want[1 << 14], got[1 << 14];
  int mismatches = 0;
  for (int s = 0; s < UNIQUE && s < (int) decoded.sample_count; s++) {
    size_t used = 0;
    for (int d = 0; d < depth[s]; d++) {
      int f = choice[s][d] % FUNCTIONS;
      used += (size_t) snprintf(want + used, sizeof(want) - used, "%s%s@%s:%d", d ? ";" : "", names[f],
                                files[f % (FUNCTIONS / 10)], d == depth[s] - 1 ? choice[s][d] + 1000 : f);
    }
    dec_format_stack(&decoded, &decoded.samples[s], got, sizeof(got));
    if (strcmp(want, got) != 0 || decoded.samples[s].values[0] != expected[s] ||
        decoded.samples[s].values[2] != 2 * expected[s]) {
      mismatches++;
    }
  }
  CHECK_EQ_INT(0, mismatches);
  dec_profile_free(&decoded);
  pprof_profile_free(profile);
}

// Every allocation, in turn, is made to fail. Each call must either succeed or report
// PPROF_ERR_NO_MEMORY; the profile must stay usable and hold exactly the samples whose
// add succeeded; nothing may leak (the allocation counter returns to its start).
static void test_allocation_failures(void) {
  current_test = __func__;
  size_t baseline = pprof_alloc_current_bytes();
  int exercised_failures = 0;
  for (long budget = 0; budget < 400; budget++) {
    pprof_alloc_fail_after(budget);
    pprof_profile *profile = NULL;
    pprof_error error = {{0}};
    pprof_status status = pprof_profile_new(&profile, default_types, 3, NULL, 0, 0, &error);
    if (status != PPROF_OK) {
      CHECK_EQ_INT(PPROF_ERR_NO_MEMORY, status);
      CHECK(profile == NULL);
      CHECK(strlen(error.message) > 0);
      exercised_failures++;
      pprof_alloc_fail_after(-1);
      continue;
    }
    int64_t recorded = 0;
    char name[32];
    for (int i = 0; i < 200; i++) {
      snprintf(name, sizeof(name), "f%d", i);
      pprof_frame frames[] = {frame(name, "/a.rb", i), frame("main", "/main.rb", 1)};
      pprof_label labels[] = {string_label("thread name", name)};
      status = add(profile, frames, 2, 1, 1, 1, labels, 1, &error);
      if (status == PPROF_OK) {
        recorded++;
      } else {
        CHECK_EQ_INT(PPROF_ERR_NO_MEMORY, status);
        exercised_failures++;
      }
    }
    pprof_buffer out = {0};
    status = pprof_profile_serialize(profile, 1, &out, &error);
    pprof_alloc_fail_after(-1);
    if (status != PPROF_OK) {
      CHECK_EQ_INT(PPROF_ERR_NO_MEMORY, status);
      CHECK_EQ_INT(0, out.len);
      exercised_failures++;
      status = pprof_profile_serialize(profile, 1, &out, &error); // retry with memory available
      CHECK_EQ_INT(PPROF_OK, status);
    }
    dec_profile decoded;
    char decode_error[200];
    if (dec_profile_parse(out.data, out.len, &decoded, decode_error) == 0) {
      int64_t total = 0;
      for (size_t i = 0; i < decoded.sample_count; i++) total += decoded.samples[i].values[0];
      CHECK_EQ_INT(recorded, total);
      dec_profile_free(&decoded);
    } else {
      CHECK(!"serialized profile decodes after allocation failures");
    }
    pprof_buffer_free(&out);
    pprof_profile_free(profile);
  }
  pprof_alloc_fail_after(-1);
  CHECK(exercised_failures > 100);
  CHECK_EQ_INT(baseline, pprof_alloc_current_bytes());
}

static void test_memory_is_released(void) {
  current_test = __func__;
  size_t baseline = pprof_alloc_current_bytes();
  pprof_profile *profile = new_profile(0);
  pprof_error error = {{0}};
  char name[32];
  for (int i = 0; i < 5000; i++) {
    snprintf(name, sizeof(name), "fn_%d", i);
    pprof_frame frames[] = {frame(name, "/m.rb", i)};
    CHECK_EQ_INT(PPROF_OK, add(profile, frames, 1, 1, 1, 1, NULL, 0, &error));
  }
  pprof_profile_stats stats = pprof_profile_get_stats(profile);
  CHECK_EQ_INT(stats.held_bytes, pprof_alloc_current_bytes() - baseline);
  size_t held = stats.held_bytes;
  pprof_profile_reset(profile, 0);
  // Reset keeps capacity: the next period of the same shape allocates nothing more.
  for (int i = 0; i < 5000; i++) {
    snprintf(name, sizeof(name), "fn_%d", i);
    pprof_frame frames[] = {frame(name, "/m.rb", i)};
    CHECK_EQ_INT(PPROF_OK, add(profile, frames, 1, 1, 1, 1, NULL, 0, &error));
  }
  CHECK_EQ_INT(held, pprof_profile_get_stats(profile).held_bytes);
  pprof_profile_free(profile);
  CHECK_EQ_INT(baseline, pprof_alloc_current_bytes());
}

int main(void) {
  printf("pprof core tests (compressor: %s)\n", pprof_compressor_name());
  test_new_rejects_bad_arguments();
  test_empty_profile();
  test_comments();
  test_aggregation();
  test_labels();
  test_invalid_samples_change_nothing();
  test_reset_starts_a_new_period();
  test_period_and_edge_values();
  test_keyed_frames();
  test_omitted_frames();
  test_labels_are_read_before_frames_are_named();
  test_sample_refs();
  test_timeline_samples();
  test_fuzzer_findings();
  test_long_strings();
  test_many_stacks_match_reference_totals();
  test_allocation_failures();
  test_memory_is_released();
  printf("%d checks, %d failures\n", checks, failures);
  return failures == 0 ? 0 : 1;
}
