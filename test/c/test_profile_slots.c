// Tests of the StackRecorder's profile slots (ext/contprof/recorder/profile_slots.c): a
// sampler records, a serializer flips and encodes, a third thread asks how much memory
// they hold, all at once; every sample must be serialized exactly once. Built plainly,
// with ASan/UBSan and with ThreadSanitizer (`make -C test/c tsan`), which checks that the
// three never race.
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../ext/contprof/pprof/pprof_profile.h"
#include "../../ext/contprof/recorder/profile_slots.h"
#include "pprof_decode.h"

#define SAMPLES 20000
#define STACKS 50

static contprof_profile_slots slots;
static atomic_bool sampling_done;
static int64_t recorded, dropped, serialized_total, serializations;
static atomic_uint_fast64_t memsize_reads;
static int failures;

static pprof_str str(const char *s) { return (pprof_str) {.ptr = s, .len = strlen(s)}; }

// Records SAMPLES samples, and more until the serializer has flipped at least FLIPS times.
#define FLIPS 200
static atomic_int flips_done;

static void *sampler(void *unused) {
  (void) unused;
  char name[32];
  for (int i = 0; i < SAMPLES || atomic_load(&flips_done) < FLIPS; i++) {
    snprintf(name, sizeof(name), "work_%d", i % STACKS);
    pprof_frame frames[2] = {{.function_name = str(name), .file_name = str("/app.rb"), .line = i % STACKS},
                             {.function_name = str("<main>"), .file_name = str("/app.rb"), .line = 1}};
    int64_t values[1] = {1};
    pprof_sample sample = {.frames = frames, .frame_count = 2, .values = values, .value_count = 1};
    int slot;
    pprof_profile *profile = contprof_slots_lock_active(&slots, &slot);
    if (!profile) {
      dropped++;
      continue;
    }
    pprof_error error;
    if (pprof_profile_add(profile, &sample, &error) == PPROF_OK) recorded++;
    contprof_slots_unlock(&slots, slot);
  }
  atomic_store(&sampling_done, true);
  return NULL;
}

static int64_t serialize_once(int64_t now) {
  int error = contprof_slots_begin_serialize(&slots);
  if (error) {
    fprintf(stderr, "FAIL: serializer mutex: %d\n", error);
    failures++;
    return 0;
  }
  pprof_profile *profile = contprof_slots_flip(&slots, now, &error);
  int64_t total = 0;
  if (!profile) {
    fprintf(stderr, "FAIL: flip: %d\n", error);
    failures++;
  } else {
    pprof_buffer out = {0};
    pprof_error pprof_error;
    if (pprof_profile_serialize(profile, now, &out, &pprof_error) != PPROF_OK) {
      fprintf(stderr, "FAIL: serialize: %s\n", pprof_error.message);
      failures++;
    } else {
      dec_profile decoded;
      char message[200];
      if (dec_profile_parse(out.data, out.len, &decoded, message) != 0) {
        fprintf(stderr, "FAIL: decode: %s\n", message);
        failures++;
      } else {
        for (size_t i = 0; i < decoded.sample_count; i++) total += decoded.samples[i].values[0];
        dec_profile_free(&decoded);
      }
    }
    pprof_buffer_free(&out);
    pprof_profile_reset(profile, now);
  }
  contprof_slots_end_serialize(&slots, profile);
  return total;
}

static void *serializer(void *unused) {
  (void) unused;
  int64_t now = 1000;
  while (!atomic_load(&sampling_done)) {
    serialized_total += serialize_once(now++);
    serializations++;
    atomic_fetch_add(&flips_done, 1);
  }
  return NULL;
}

static void *memsize_reader(void *unused) {
  (void) unused;
  while (!atomic_load(&sampling_done)) {
    if (contprof_slots_held_bytes(&slots) == 0) {
      fprintf(stderr, "FAIL: two profiles hold no bytes\n");
      failures++;
      break;
    }
    atomic_fetch_add(&memsize_reads, 1);
  }
  return NULL;
}

int main(void) {
  pprof_value_type types[1] = {{str("samples"), str("count")}};
  pprof_profile *first = NULL, *second = NULL;
  pprof_error error;
  if (pprof_profile_new(&first, types, 1, NULL, 0, 0, &error) != PPROF_OK ||
      pprof_profile_new(&second, types, 1, NULL, 0, 0, &error) != PPROF_OK || contprof_slots_init(&slots, first, second)) {
    fprintf(stderr, "setup failed\n");
    return 1;
  }
  pthread_t threads[3];
  pthread_create(&threads[0], NULL, sampler, NULL);
  pthread_create(&threads[1], NULL, serializer, NULL);
  pthread_create(&threads[2], NULL, memsize_reader, NULL);
  for (int i = 0; i < 3; i++) pthread_join(threads[i], NULL);
  serialized_total += serialize_once(1000000); // the last period
  serialized_total += serialize_once(1000001); // (both slots: a flip may have left samples in either)
  contprof_slots_destroy(&slots);
  printf("profile slots: %lld recorded, %lld dropped, %lld serialized in %lld serializations, %llu memsize reads\n",
         (long long) recorded, (long long) dropped, (long long) serialized_total, (long long) serializations,
         (unsigned long long) atomic_load(&memsize_reads));
  if (serialized_total != recorded) {
    fprintf(stderr, "FAIL: %lld samples recorded, %lld serialized\n", (long long) recorded, (long long) serialized_total);
    failures++;
  }
  if (serializations < FLIPS) failures++;
  printf("%d failures\n", failures);
  return failures == 0 ? 0 : 1;
}
