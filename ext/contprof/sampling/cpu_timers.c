// Per-thread CPU-time timers (see cpu_timers.h): the collector's view of them, holding
// the GVL. A round reads each thread's expirations since the previous reading, the CPU time
// at the latest of them, and the stack a signal captured, if any (the slots and the
// capture lock: cpu_timers_internal.h). The signal handler's part is cpu_timers_signal.c;
// creating and deleting timers, cpu_timers_arming.c; builds without timer_create use
// cpu_timers_unavailable.c.
#include "sampling/cpu_timers.h"

#ifdef CONTPROF_HAVE_CPU_TIMERS

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "sampling/cpu_timers_internal.h"
#include "vm/vm.h"

bool contprof_cpu_timers_built(void) { return true; }

// Gives the slot a capture buffer when its handler asked for one (lock held by the reader).
static void provide_buffer(timer_slot *slot, long capacity) {
  if (!atomic_load(&slot->capture_wanted) && slot->frames) return;
  atomic_store(&slot->capture_wanted, false);
  if (slot->frames && slot->capacity >= capacity) return;
  // Plain malloc: no Ruby allocation (and so no GC) inside a round. Kept for the slot's
  // next owners; without memory the thread's native CPU just goes uncaptured.
  // (One block: the frames, then the backend's scratch.)
  size_t frames_size = 2 * (size_t) capacity * sizeof(contprof_raw_frame);
  contprof_raw_frame *frames = malloc(frames_size + contprof_vm_capture_scratch_size(capacity));
  if (!frames) return;
  free(slot->frames);
  slot->frames = frames;
  slot->vm_scratch = (char *) frames + frames_size;
  slot->capacity = capacity;
  slot->captured = 0;
}

// A capture stays valid while no GC ran since (its frames' objects can be neither freed
// nor moved), or, when they were all old, while no major GC started (minor GCs leave old
// objects alone). The handler notes the major GCs a round counted before the capture: the
// same count now means none started since that round, so none since the capture.
static bool capture_valid(const contprof_stack_capture_info *info) {
  return rb_gc_count() == info->gc_count ||
         (info->all_old && contprof_vm_major_gc_count() == info->major_gc_count && !contprof_vm_during_gc());
}

// The thread's CPU time at its latest expiry. A perf event's handler read its counter
// then (see "Random periods" in cpu_timers_signal.c); should it not have (no expiry
// handled yet), the counter, which counts every period even when signals merged, gives
// the periods so far. A POSIX timer armed at CPU time A with period P that expired n
// times: A + nP. (SIGPROF is a standard signal: the overflows that come while one is
// pending, as while the thread blocks it, become one signal, and a perf event's signal
// says nothing of how many: its si_overrun is a POLL_ signal's si_band.) Not the clock
// itself: the CPU since the latest expiry belongs to wherever the next one lands, not to
// where the thread is when a round reads it.
static int64_t timer_cpu_ns(const timer_slot *slot, cpu_timer *timer, uint64_t expirations) {
#ifdef CONTPROF_HAVE_PERF_EVENTS
  if (timer->perf_fd >= 0) {
    uint64_t counted = atomic_load(&slot->perf_counted);
    if (counted > 0) return timer->armed_at_cpu_ns + (int64_t) counted;
    if (read(timer->perf_fd, &counted, sizeof(counted)) == (ssize_t) sizeof(counted)) {
      uint64_t periods = counted / (uint64_t) timer->period_ns;
      if (periods > expirations) expirations = periods;
    }
  }
#else
  (void) slot;
#endif
  return timer->armed_at_cpu_ns + (int64_t) expirations * timer->period_ns;
}

static bool read_timer(void *context, VALUE thread, contprof_cpu_timer_reading *reading) {
  contprof_cpu_timers *timers = context;
  st_data_t value;
  // A thread sharing native threads (M:N) has none (it may have been found sharing since
  // it got one): not a thread waiting for its timer either.
  if (contprof_vm_thread_shares_native(thread)) {
    contprof_cpu_timers_delete(timers, thread);
    return false;
  }
  if (!st_lookup(timers->threads, (st_data_t) thread, &value)) {
    timers->unarmed_seen++;
    return false;
  }
  int index = (int) value;
  timer_slot *slot = &contprof_timer_slots[index];
  cpu_timer *timer = &contprof_timer_entries[index];
  memset(reading, 0, sizeof(*reading));
  uint64_t word = atomic_load(&slot->word);
  if ((word >> SLOT_COUNT_BITS) != timer->lease) return true; // (cannot happen: a live timer owns its slot)
  uint64_t expirations = word & SLOT_COUNT_MASK;
  uint64_t in_gc = atomic_load(&slot->in_gc);
  reading->expirations = expirations - timer->expirations_read;
  reading->in_gc = in_gc - timer->in_gc_read;
  if (reading->in_gc > reading->expirations) reading->in_gc = reading->expirations;
  if (reading->in_gc > 0) reading->gc_moment = atomic_load(&slot->gc_moment);
  timer->expirations_read = expirations;
  timer->in_gc_read = in_gc;
  if (reading->expirations > 0) reading->cpu_ns = timer_cpu_ns(slot, timer, expirations);
  reading->timer_generation = (uint64_t) index << 32 | timer->lease;
  reading->period_ns = timer->period_ns;
  reading->tid = timer->tid;

  int expected = CAPTURE_FREE;
  if (!atomic_compare_exchange_strong(&slot->capture_lock, &expected, CAPTURE_READING)) return true;
  provide_buffer(slot, timers->capture_frames);
  if (slot->captured > 0 && slot->capture_lease == timer->lease) {
    reading->captured = slot->captured;
    if (reading->captured > reading->expirations) reading->captured = reading->expirations;
    reading->captured_cpu_ns = slot->captured_cpu_ns;
    if (reading->captured < slot->captured) { // (expirations the reading does not cover yet)
      reading->captured_cpu_ns = (int64_t) ((double) slot->captured_cpu_ns * (double) reading->captured / (double) slot->captured);
    }
    reading->captured_holding_gvl = slot->captured_holding_gvl;
    reading->captured_frames = slot->frames;
    reading->captured_total = slot->captured_total < slot->capacity ? slot->captured_total : slot->capacity;
    reading->capture_valid = capture_valid(&slot->capture_info);
    if (!reading->capture_valid) atomic_fetch_add(&contprof_timer_stats.captures_stale, reading->captured);
  }
  return true;
}

static void reading_done(void *context, VALUE thread) {
  contprof_cpu_timers *timers = context;
  st_data_t value;
  if (!st_lookup(timers->threads, (st_data_t) thread, &value)) return;
  timer_slot *slot = &contprof_timer_slots[(int) value];
  if (atomic_load(&slot->capture_lock) != CAPTURE_READING) return;
  slot->captured = 0;
  atomic_store(&slot->capture_lock, CAPTURE_FREE);
}

contprof_cpu_timer_source contprof_cpu_timers_source(contprof_cpu_timers *timers) {
  atomic_store(&contprof_timer_major_gcs_seen, contprof_vm_major_gc_count());
  timers->unarmed_seen = 0; // (counted afresh by each round)
  return (contprof_cpu_timer_source) {
    .read = read_timer, .done = reading_done, .context = timers, .period_ns = timers->period_ns};
}

bool contprof_cpu_timers_count_expiry(contprof_cpu_timers *timers, VALUE thread) {
  st_data_t index;
  if (!timers->threads || !st_lookup(timers->threads, (st_data_t) thread, &index)) return false;
  atomic_fetch_add(&contprof_timer_slots[index].word, 1);
  return true;
}

contprof_cpu_timers_stats contprof_cpu_timers_get_stats(void) {
  contprof_cpu_timers_stats stats;
#define READ_STAT(name) stats.name = atomic_load(&contprof_timer_stats.name);
  CONTPROF_CPU_TIMERS_STATS(READ_STAT)
#undef READ_STAT
  return stats;
}

void contprof_cpu_timers_reset_stats(void) {
#define RESET_STAT(name) atomic_store(&contprof_timer_stats.name, 0);
  CONTPROF_CPU_TIMERS_STATS(RESET_STAT)
#undef RESET_STAT
}

#endif
