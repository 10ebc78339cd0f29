// Known-answer tests of the timeline as serialized (ext/contprof/pprof/pprof_timeline.c),
// and of its limit. On the grid, a serialized timeline sample has its timestamp floored to
// a tick and its time values in whole ticks, except the last of its stack and labels, and
// every total is still the recorded one to the nanosecond. Each sample here is recorded
// with its own timestamp, and found again in the decoded profile by its stack, thread and
// tick.
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../ext/contprof/pprof/pprof_profile.h"
#include "checks.h"
#include "pprof_decode.h"
#include "round_trip.h"

#define THREADS 4
#define STACKS 6
#define SAMPLES 3000
#define TICK PPROF_TIMELINE_TICK_NS

static const pprof_value_type types[3] = {
  {PPROF_STR("cpu-time"), PPROF_STR("nanoseconds")},
  {PPROF_STR("cpu-samples"), PPROF_STR("count")},
  {PPROF_STR("wall-time"), PPROF_STR("nanoseconds")},
};

static uint64_t random_state = 7;
static uint64_t next_random(void) {
  random_state ^= random_state << 13;
  random_state ^= random_state >> 7;
  random_state ^= random_state << 17;
  return random_state;
}

static pprof_str str(const char *s) { return (pprof_str) {s, strlen(s)}; }

typedef struct {
  int thread, stack;
  int64_t timestamp_ns;
  int64_t values[3];
  int found;
} recorded;

static recorded samples[SAMPLES];

static int group_of(int thread, int stack) { return thread * STACKS + stack; }

static void test_values_on_the_grid_and_totals_exact(void) {
  current_test = __func__;
  static const char *names[STACKS] = {"a", "b", "c", "d", "e", "f"};
  static const char *thread_ids[THREADS] = {"1", "2", "3", "4"};
  pprof_profile *profile;
  pprof_error error = {{0}};
  CHECK(pprof_profile_new(&profile, types, 3, NULL, 0, 0, &error) == PPROF_OK);
  const int64_t start = INT64_C(1621000000) * TICK;
  int64_t group_totals[THREADS * STACKS][3] = {{0}};
  int64_t last_timestamp[THREADS * STACKS] = {0};
  for (int k = 0; k < SAMPLES; k++) {
    recorded *sample = &samples[k];
    sample->thread = (int) (next_random() % THREADS);
    sample->stack = (int) (next_random() % STACKS);
    // Every sample in a tick of its own, anywhere in it.
    sample->timestamp_ns = start + 3 * k * TICK + (int64_t) (next_random() % TICK);
    sample->values[0] = next_random() % 4 == 0 ? 0 : (int64_t) (next_random() % (30 * TICK));
    sample->values[1] = 1 + (int64_t) (next_random() % 3);
    sample->values[2] = (int64_t) (next_random() % (30 * TICK));
    pprof_frame frames[2] = {{.function_name = str(names[sample->stack]), .file_name = str("/t.rb"), .line = 1},
                             {.function_name = str("<main>"), .file_name = str("/t.rb"), .line = 9}};
    pprof_label thread = {.key = str("thread id"), .str = str(thread_ids[sample->thread])};
    pprof_sample one = {.frames = frames, .frame_count = 2, .values = sample->values, .value_count = 3,
                        .labels = &thread, .label_count = 1, .timestamp_ns = sample->timestamp_ns};
    CHECK(pprof_profile_add(profile, &one, &error) == PPROF_OK);
    int group = group_of(sample->thread, sample->stack);
    for (int v = 0; v < 3; v++) group_totals[group][v] += sample->values[v];
    last_timestamp[group] = sample->timestamp_ns;
  }

  dec_profile decoded;
  serialize_and_decode(profile, start + 3 * SAMPLES * TICK, &decoded);
  CHECK_EQ_INT(SAMPLES, decoded.sample_count);
  int64_t decoded_totals[THREADS * STACKS][3] = {{0}};
  int off_grid = 0, off_grid_last = 0, too_far = 0, counts_changed = 0, unmatched = 0;
  for (size_t i = 0; i < decoded.sample_count; i++) {
    const dec_sample *sample = &decoded.samples[i];
    char stack[256], labels[256];
    dec_format_stack(&decoded, sample, stack, sizeof(stack));
    dec_format_labels(&decoded, sample, labels, sizeof(labels));
    int thread;
    int64_t timestamp;
    if (sscanf(labels, "thread id=%d,end_timestamp_ns=%" SCNd64, &thread, &timestamp) != 2) {
      unmatched++;
      continue;
    }
    int stack_index = stack[0] - 'a';
    int64_t k = (timestamp - start) / (3 * TICK);
    if (timestamp % TICK != 0 || k < 0 || k >= SAMPLES || samples[k].thread != thread - 1 ||
        samples[k].stack != stack_index || samples[k].found) {
      unmatched++;
      continue;
    }
    recorded *truth = &samples[k];
    truth->found = 1;
    CHECK(timestamp == truth->timestamp_ns - truth->timestamp_ns % TICK);
    int group = group_of(truth->thread, truth->stack);
    bool last_of_run = truth->timestamp_ns == last_timestamp[group];
    for (int v = 0; v < 3; v++) {
      int64_t value = sample->values[v];
      decoded_totals[group][v] += value;
      if (v == 1) {
        counts_changed += value != truth->values[v];
        continue;
      }
      if (value % TICK != 0) *(last_of_run ? &off_grid_last : &off_grid) += 1;
      if (llabs(value - truth->values[v]) >= TICK) too_far++;
    }
  }
  CHECK_EQ_INT(0, unmatched);
  CHECK_EQ_INT(0, off_grid); // only a run's last sample may be off the grid
  CHECK(off_grid_last > 0); // (the random values make some)
  CHECK_EQ_INT(0, too_far);
  CHECK_EQ_INT(0, counts_changed);
  for (int group = 0; group < THREADS * STACKS; group++) {
    for (int v = 0; v < 3; v++) CHECK_EQ_INT(group_totals[group][v], decoded_totals[group][v]);
  }
  dec_profile_free(&decoded);
  pprof_profile_free(profile);
}

// A timestamp below one tick (only tests make them) stays as it is: 0 would mean "not on
// the timeline". Merged samples keep their values to the nanosecond.
static void test_small_timestamps_and_merged_samples(void) {
  current_test = __func__;
  pprof_profile *profile;
  pprof_error error = {{0}};
  CHECK(pprof_profile_new(&profile, types, 3, NULL, 0, 0, &error) == PPROF_OK);
  pprof_frame frame = {.function_name = str("a"), .file_name = str("/t.rb"), .line = 1};
  int64_t values[3] = {1234567, 1, 7654321};
  pprof_sample sample = {.frames = &frame, .frame_count = 1, .values = values, .value_count = 3, .timestamp_ns = 5};
  CHECK(pprof_profile_add(profile, &sample, &error) == PPROF_OK);
  sample.timestamp_ns = 0;
  CHECK(pprof_profile_add(profile, &sample, &error) == PPROF_OK);
  // Two of one stack and labels in one tick: one sample (nothing tells them apart).
  pprof_label thread = {.key = str("thread id"), .str = str("2")};
  sample.labels = &thread;
  sample.label_count = 1;
  sample.timestamp_ns = 7 * TICK + 10;
  CHECK(pprof_profile_add(profile, &sample, &error) == PPROF_OK);
  sample.timestamp_ns = 7 * TICK + 20;
  CHECK(pprof_profile_add(profile, &sample, &error) == PPROF_OK);
  dec_profile decoded;
  serialize_and_decode(profile, 10, &decoded);
  size_t matches;
  CHECK_EQ_INT(1234567, dec_sum(&decoded, "a@/t.rb:1", "end_timestamp_ns=5", 0, &matches));
  CHECK_EQ_INT(1, matches);
  CHECK_EQ_INT(7654321, dec_sum(&decoded, "a@/t.rb:1", "", 2, &matches));
  CHECK_EQ_INT(1, matches);
  char labels[64];
  snprintf(labels, sizeof(labels), "thread id=2,end_timestamp_ns=%" PRId64, 7 * TICK);
  CHECK_EQ_INT(2 * 1234567, dec_sum(&decoded, "a@/t.rb:1", labels, 0, &matches));
  CHECK_EQ_INT(1, matches);
  dec_profile_free(&decoded);
  pprof_profile_free(profile);
}

// A full timeline: further timeline samples are merged with equal stacks (counted in
// the stats), extending one still works, and every total counts everything.
static void test_a_full_timeline_merges(void) {
  current_test = __func__;
  pprof_profile *profile;
  pprof_error error = {{0}};
  CHECK(pprof_profile_new(&profile, types, 3, NULL, 0, 0, &error) == PPROF_OK);
  pprof_profile_set_timeline_limit(profile, 100);
  pprof_frame frame = {.function_name = str("a"), .file_name = str("/t.rb"), .line = 1};
  pprof_label threads[2] = {{.key = str("thread id"), .str = str("1")}, {.key = str("thread id"), .str = str("2")}};
  int64_t values[3] = {TICK, 1, 2 * TICK};
  pprof_sample_ref first;
  for (int k = 0; k < 150; k++) {
    pprof_sample sample = {.frames = &frame, .frame_count = 1, .values = values, .value_count = 3,
                           .labels = &threads[k % 2], .label_count = 1, .timestamp_ns = (1000 + k) * TICK};
    CHECK(pprof_profile_add_with_ref(profile, &sample, k == 0 ? &first : NULL, &error) == PPROF_OK);
  }
  pprof_profile_stats stats = pprof_profile_get_stats(profile);
  CHECK_EQ_INT(102, stats.samples); // 100 on the timeline, one merged per thread
  CHECK_EQ_INT(50, stats.timeline_merged);
  pprof_sample extending = {.frames = &frame, .frame_count = 1, .values = values, .value_count = 3,
                            .labels = &threads[0], .label_count = 1, .timestamp_ns = 2000 * TICK, .extend = &first};
  CHECK(pprof_profile_add(profile, &extending, &error) == PPROF_OK);
  CHECK_EQ_INT(102, pprof_profile_get_stats(profile).samples);

  dec_profile decoded;
  serialize_and_decode(profile, 3000 * TICK, &decoded);
  size_t matches;
  CHECK_EQ_INT(151, dec_sum(&decoded, "a@/t.rb:1", NULL, 1, &matches));
  CHECK_EQ_INT(102, matches);
  CHECK_EQ_INT(25, dec_sum(&decoded, "a@/t.rb:1", "thread id=1", 1, &matches)); // the merged ones
  CHECK_EQ_INT(25, dec_sum(&decoded, "a@/t.rb:1", "thread id=2", 1, &matches));
  char labels[64];
  snprintf(labels, sizeof(labels), "thread id=1,end_timestamp_ns=%" PRId64, 2000 * TICK);
  CHECK_EQ_INT(2, dec_sum(&decoded, "a@/t.rb:1", labels, 1, &matches)); // the first, extended
  dec_profile_free(&decoded);

  pprof_profile_reset(profile, 0); // a new period has room again
  CHECK_EQ_INT(0, pprof_profile_get_stats(profile).timeline_merged);
  pprof_sample sample = {.frames = &frame, .frame_count = 1, .values = values, .value_count = 3,
                         .labels = &threads[0], .label_count = 1, .timestamp_ns = 5000 * TICK};
  CHECK(pprof_profile_add(profile, &sample, &error) == PPROF_OK);
  CHECK_EQ_INT(0, pprof_profile_get_stats(profile).timeline_merged);
  pprof_profile_free(profile);
}

// The same samples for Pyroscope (timeline merged, no timestamps) and for Datadog (the
// thread state's key and values renamed, a user label with an equal value left alone):
// every total unchanged.
static void test_rewritten_pprofs(void) {
  current_test = __func__;
  pprof_profile *profile;
  pprof_error error = {{0}};
  CHECK(pprof_profile_new(&profile, types, 3, NULL, 0, 0, &error) == PPROF_OK);
  pprof_frame frames[2] = {{.function_name = str("a"), .file_name = str("/t.rb"), .line = 1},
                           {.function_name = str("b"), .file_name = str("/t.rb"), .line = 2}};
  pprof_label labels[2][3] = {
    {{.key = str("thread id"), .str = str("1")}, {.key = str("thread state"), .str = str("running")},
     {.key = str("phase"), .str = str("running")}},
    {{.key = str("thread id"), .str = str("2")}, {.key = str("thread state"), .str = str("io")},
     {.key = str("phase"), .str = str("io")}},
  };
  for (int k = 0; k < 40; k++) {
    int64_t values[3] = {k * 1000 + 1, 1, k * 3000 + 7};
    pprof_sample sample = {.frames = &frames[k % 2], .frame_count = 1, .values = values, .value_count = 3,
                           .labels = labels[(k / 2) % 2], .label_count = 3,
                           .timestamp_ns = k < 30 ? (2000 + k) * TICK : 0};
    CHECK(pprof_profile_add(profile, &sample, &error) == PPROF_OK);
  }
  pprof_buffer plain = {0}, merged = {0}, renamed = {0};
  CHECK(pprof_profile_serialize(profile, 3000 * TICK, &plain, &error) == PPROF_OK);
  pprof_rewrite for_pyroscope = {.merge_timeline = true};
  CHECK(pprof_profile_serialize_rewritten(profile, 3000 * TICK, &for_pyroscope, &merged, &error) == PPROF_OK);
  const pprof_str ours[] = {PPROF_STR("running"), PPROF_STR("io"), PPROF_STR("sleeping")};
  const pprof_str theirs[] = {PPROF_STR("had cpu"), PPROF_STR("network"), PPROF_STR("sleeping")};
  pprof_rewrite for_datadog = {.label_key = PPROF_STR("thread state"), .new_label_key = PPROF_STR("state"),
                               .values = ours, .new_values = theirs, .value_count = 3};
  CHECK(pprof_profile_serialize_rewritten(profile, 3000 * TICK, &for_datadog, &renamed, &error) == PPROF_OK);

  dec_profile a, b, c;
  char decode_error[200];
  CHECK(dec_profile_parse(plain.data, plain.len, &a, decode_error) == 0);
  CHECK(dec_profile_parse(merged.data, merged.len, &b, decode_error) == 0);
  CHECK(dec_profile_parse(renamed.data, renamed.len, &c, decode_error) == 0);
  CHECK_EQ_INT(a.sample_count, c.sample_count);
  CHECK_EQ_INT(8, b.sample_count); // 2 stacks x 2 label sets, merged and timeline apart
  size_t matches;
  for (size_t v = 0; v < 3; v++) {
    for (int f = 0; f < 2; f++) {
      const char *stack = f == 0 ? "a@/t.rb:1" : "b@/t.rb:2";
      int64_t total = dec_sum(&a, stack, NULL, v, &matches);
      CHECK_EQ_INT(total, dec_sum(&b, stack, NULL, v, &matches));
      CHECK_EQ_INT(total, dec_sum(&c, stack, NULL, v, &matches));
    }
  }
  int timestamps = 0, renamed_states = 0, old_states = 0, user_labels_kept = 0;
  for (size_t i = 0; i < b.sample_count; i++) {
    char text[256];
    dec_format_labels(&b, &b.samples[i], text, sizeof(text));
    timestamps += strstr(text, "end_timestamp_ns") != NULL;
  }
  for (size_t i = 0; i < c.sample_count; i++) {
    char text[256];
    dec_format_labels(&c, &c.samples[i], text, sizeof(text));
    renamed_states += strstr(text, "state=had cpu") != NULL || strstr(text, "state=network") != NULL;
    old_states += strstr(text, "thread state") != NULL;
    user_labels_kept += strstr(text, "phase=running") != NULL || strstr(text, "phase=io") != NULL;
    timestamps -= strstr(text, "end_timestamp_ns") != NULL;
  }
  CHECK_EQ_INT(0, old_states);
  CHECK_EQ_INT((long long) c.sample_count, renamed_states);
  CHECK_EQ_INT((long long) c.sample_count, user_labels_kept);
  CHECK_EQ_INT(-30, timestamps); // none in Pyroscope's, all 30 in Datadog's
  dec_profile_free(&a);
  dec_profile_free(&b);
  dec_profile_free(&c);

  // Without the key, the rewrite changes nothing.
  pprof_rewrite absent = {.label_key = PPROF_STR("no such key"), .new_label_key = PPROF_STR("x")};
  pprof_buffer same = {0};
  CHECK(pprof_profile_serialize_rewritten(profile, 3000 * TICK, &absent, &same, &error) == PPROF_OK);
  CHECK(same.len == plain.len && memcmp(same.data, plain.data, plain.len) == 0);
  pprof_buffer_free(&plain);
  pprof_buffer_free(&merged);
  pprof_buffer_free(&renamed);
  pprof_buffer_free(&same);
  pprof_profile_free(profile);
}

int main(void) {
  test_values_on_the_grid_and_totals_exact();
  test_small_timestamps_and_merged_samples();
  test_a_full_timeline_merges();
  test_rewritten_pprofs();
  if (failures) {
    fprintf(stderr, "%d of %d timeline checks failed\n", failures, checks);
    return 1;
  }
  printf("timeline grid: %d checks ok\n", checks);
  return 0;
}
