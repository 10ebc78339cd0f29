// The two profile slots of a StackRecorder (see profile_slots.h).
#include "recorder/profile_slots.h"

#include <errno.h>

#define MAX_SAMPLER_ATTEMPTS 16

static void measure(contprof_profile_slots *slots, int slot) {
  atomic_store(&slots->held_bytes[slot], pprof_profile_get_stats(slots->profile[slot]).held_bytes);
}

static int init_locks(contprof_profile_slots *slots) {
  // Slot 0 starts active (free to take); slot 1 starts taken.
  if (sem_init(&slots->taken[0], 0, 1) != 0 || sem_init(&slots->taken[1], 0, 0) != 0) return errno;
  slots->active = 0;
  return pthread_mutex_init(&slots->serializer_mutex, NULL);
}

// sem_wait, again when a signal interrupts it.
static int take(sem_t *semaphore) {
  while (sem_wait(semaphore) != 0) {
    if (errno != EINTR) return errno;
  }
  return 0;
}

int contprof_slots_init(contprof_profile_slots *slots, pprof_profile *first, pprof_profile *second) {
  slots->profile[0] = first;
  slots->profile[1] = second;
  measure(slots, 0);
  measure(slots, 1);
  return init_locks(slots);
}

void contprof_slots_destroy(contprof_profile_slots *slots) {
  sem_destroy(&slots->taken[0]);
  sem_destroy(&slots->taken[1]);
  pthread_mutex_destroy(&slots->serializer_mutex);
  pprof_profile_free(slots->profile[0]);
  pprof_profile_free(slots->profile[1]);
  slots->profile[0] = slots->profile[1] = NULL;
}

int contprof_slots_reset_after_fork(contprof_profile_slots *slots, int64_t now_ns) {
  int error = init_locks(slots);
  for (int slot = 0; slot < 2; slot++) {
    pprof_profile_reset(slots->profile[slot], now_ns);
    measure(slots, slot);
  }
  return error;
}

pprof_profile *contprof_slots_lock_active(contprof_profile_slots *slots, int *slot) {
  for (int attempt = 0; attempt < MAX_SAMPLER_ATTEMPTS; attempt++) {
    for (int candidate = 0; candidate < 2; candidate++) {
      if (sem_trywait(&slots->taken[candidate]) == 0) {
        *slot = candidate;
        return slots->profile[candidate];
      }
    }
  }
  return NULL;
}

void contprof_slots_unlock(contprof_profile_slots *slots, int slot) {
  measure(slots, slot); // (still holding the slot)
  sem_post(&slots->taken[slot]);
}

int contprof_slots_begin_serialize(contprof_profile_slots *slots) { return pthread_mutex_lock(&slots->serializer_mutex); }

pprof_profile *contprof_slots_flip(contprof_profile_slots *slots, int64_t now_ns, int *error) {
  int was_active = slots->active, becoming_active = 1 - was_active;
  pprof_profile_set_start_time_ns(slots->profile[becoming_active], now_ns);
  if (sem_post(&slots->taken[becoming_active]) != 0) {
    *error = errno;
    return NULL;
  }
  if ((*error = take(&slots->taken[was_active])) != 0) return NULL;
  slots->active = becoming_active;
  return slots->profile[was_active];
}

void contprof_slots_end_serialize(contprof_profile_slots *slots, pprof_profile *serialized) {
  for (int slot = 0; slot < 2; slot++) {
    if (slots->profile[slot] == serialized) measure(slots, slot);
  }
  pthread_mutex_unlock(&slots->serializer_mutex);
}

size_t contprof_slots_held_bytes(const contprof_profile_slots *slots) {
  return atomic_load(&slots->held_bytes[0]) + atomic_load(&slots->held_bytes[1]);
}

bool contprof_slots_taken(contprof_profile_slots *slots, int slot) {
  int value = 0;
  sem_getvalue(&slots->taken[slot], &value);
  return value == 0;
}
