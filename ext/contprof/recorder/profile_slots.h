// The two profiles of a StackRecorder and how they change hands between the sampler and
// the serializer, without the sampler ever waiting. Plain C (pthreads and the pprof core):
// tested on its own, under ThreadSanitizer, by test/c/test_profile_slots.c.
//
// ## Who touches the slots
//
// - The **sampler**: whoever records a sample. Samples are only ever recorded by a thread
//   holding Ruby's GVL, so there is exactly one sampler at any instant. It never blocks.
// - The **serializer**: a thread serializing, with the GVL released, so truly in
//   parallel with the sampler. `serializer_mutex` admits one serializer at a time.
// - **Anyone** may ask how many bytes the slots hold (ObjectSpace.memsize_of, from a GC):
//   that answer never touches a profile (see contprof_slots_held_bytes).
//
// ## Which slot is active
//
// Exactly one slot is *active* (samples go there); the other is *inactive* (it is being
// serialized, or waits to become active again). The state is encoded in one binary
// semaphore per slot: **the active slot is the one whose semaphore is available**; the
// inactive slot's semaphore stays taken between serializations. (Semaphores, not mutexes:
// a slot is taken by one thread and given back by another, e.g. taken by the serializer
// of one period and given back by the next one's; unlocking a mutex some other thread
// locked is undefined behaviour, which ThreadSanitizer reports.) Slot 0 starts active.
// `active` mirrors the state for the serializer and for tests; the sampler never reads it.
//
// ## The sampler's side
//
// The sampler try-takes slot 0, then slot 1; the first it gets is the active slot. It
// records, then gives it back. sem_trywait never waits. Both fail only when a flip lands
// exactly between them; the sampler then tries again, at most MAX_SAMPLER_ATTEMPTS times
// (only a few flips fit in one attempt: each needs a serializer admitted after the
// previous one returned), then gives up: the sample is dropped, never the application
// stalled.
//
// ## The serializer's side: the flip
//
// 1. Set the inactive profile's start time to now (its slot is taken: no race). It was
//    reset after its last serialization, so it is empty.
// 2. Give the inactive slot back: it becomes active; samplers start recording into it.
// 3. Take the previously active slot: this waits only while a sampler records into it,
//    microseconds; from here on it is inactive.
// 4. Update `active`.
//
// Between 2 and 3 both slots are available and a sampler may pick either: a sample in
// the new slot belongs to the next period, one in the old slot to the profile about to
// be serialized. None is lost or counted twice. The serializer then encodes the inactive
// profile, resets it and keeps its slot taken until the next flip. Periods are
// contiguous: a profile's finish time is the flip time, the next one's start time.
#pragma once

#include <pthread.h>
#include <semaphore.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "pprof/pprof_profile.h"

typedef struct {
  sem_t taken[2]; // binary: 1 while the slot is free to take
  pprof_profile *profile[2];
  pthread_mutex_t serializer_mutex;
  int active; // 0 or 1. NEVER read by the sampler: see above.
  // Each slot's held bytes as its owner (the sampler holding it, or the serializer) last
  // measured them.
  atomic_size_t held_bytes[2];
} contprof_profile_slots;

// Takes `first` and `second` (slot 0, active, and slot 1). Returns 0 or an errno.
int contprof_slots_init(contprof_profile_slots *slots, pprof_profile *first, pprof_profile *second);
// Destroys the semaphores and the serializer's mutex, and frees both profiles.
void contprof_slots_destroy(contprof_profile_slots *slots);
// In a forked child (only the forking thread survives, possibly leaving a slot taken):
// fresh semaphores and mutex, slot 0 active, both profiles emptied, starting at `now_ns`.
int contprof_slots_reset_after_fork(contprof_profile_slots *slots, int64_t now_ns);

// The sampler: takes the active slot without waiting; returns its profile and sets
// `*slot`, or returns NULL when none could be had (the sample is to be dropped).
pprof_profile *contprof_slots_lock_active(contprof_profile_slots *slots, int *slot);
void contprof_slots_unlock(contprof_profile_slots *slots, int slot);

// The serializer: admits one at a time (returns 0 or a pthread error), flips (returns the
// previously active profile, now the serializer's, or NULL with `*error` an errno), and once
// the profile is encoded and reset, lets the next serializer in.
int contprof_slots_begin_serialize(contprof_profile_slots *slots);
pprof_profile *contprof_slots_flip(contprof_profile_slots *slots, int64_t now_ns, int *error);
void contprof_slots_end_serialize(contprof_profile_slots *slots, pprof_profile *serialized);

// Bytes both profiles hold, as last measured by their owners: never reads a profile,
// which the sampler or the serializer may be changing meanwhile. Any thread.
size_t contprof_slots_held_bytes(const contprof_profile_slots *slots);

// Whether slot `slot` (0 or 1) is taken right now (for tests).
bool contprof_slots_taken(contprof_profile_slots *slots, int slot);
