// GC time, for the ThreadContext collector's rounds (gc_time.c): *how much* from the GC's
// own clock, *where* from the samples whose instant fell inside a GC, and the debt that
// time leaves on the clocks of the threads that ran it (see "Where time goes" in
// thread_context.c).
#pragma once

#include <ruby.h>
#include <stdbool.h>
#include <stdint.h>

#include "collectors/thread_context_types.h"
#include "pprof/pprof_profile.h"
#include "vm/vm.h"

typedef struct {
  // The GC's clock (GC.stat(:time)) when last read, and the time it counted that no
  // sample in a GC has carried yet.
  bool clock_used, clock_started;
  int64_t clock_seen_ns;
  int64_t unplaced_cpu_ns, unplaced_wall_ns;
  uint64_t time_ns; // counted by the GC's clock while sampling
  uint64_t samples; // records of GC time
  VALUE last_thread; // the thread whose sample was last in a GC (marked), or Qnil
  pprof_sample_ref last_ref; // that sample's record (when has_last_ref)
  contprof_gc_moment last_moment; // and what the GC was doing then
  bool has_last_ref;
} contprof_gc_time;

// GC time in a thread's clocks that its records have not left out yet (it went to GC
// records instead). It may go below zero meanwhile; the thread's final record settles it.
typedef struct {
  int64_t cpu_ns, wall_ns;
} contprof_thread_gc_debt;

// What of a thread's time in a round stood for GC time (its instant fell inside a GC),
// and what the GC was doing then.
typedef struct {
  int64_t cpu, wall;
  contprof_gc_moment cpu_moment, wall_moment;
} contprof_gc_share;

// When sampling starts: `clock_used` when GC.measure_total_time is on (the GC's clock then
// says how much GC time there was; else samples in a GC estimate it).
void contprof_gc_time_start(contprof_gc_time *gc, bool clock_used);
// After a fork: no GC time waits to be placed, and the clock starts again.
void contprof_gc_time_reset(contprof_gc_time *gc);
// Every round: the GC's clock since the previous round, time for samples in a GC to carry.
void contprof_gc_read_clock(contprof_gc_time *gc);

// `share` of `*amount` (a thread's CPU or wall time) stands for GC time: it leaves the
// amount and pays the GC debt `*debt`; returns what it paid. The debt may go below zero:
// the GC time a sample carries is what the GC's clock counted since the previous one, not
// its own share.
static inline int64_t contprof_gc_stands_for(int64_t *debt, int64_t *amount, int64_t share) {
  if (share > *amount) share = *amount;
  if (share <= 0) return 0;
  *debt -= share;
  *amount -= share;
  return share;
}

// The final record of a thread settles its GC debt `*debt` either way, so the totals are exact.
static inline void contprof_gc_settle(int64_t *debt, int64_t *amount) {
  *amount -= *debt;
  *debt = 0;
  if (*amount < 0) *amount = 0;
}

// Records the GC time a thread's samples in a GC carry (the sampler holds its stack, and
// `labels` are the thread's).
PPROF_MUST_CHECK
pprof_status contprof_gc_record_share(collector_state *state, VALUE thread, per_thread_context *context,
                                     const label_set *labels, const contprof_gc_share *share, pprof_error *error);

// At the end of a run: the GC time no sample placed, taken (to place on `last_thread`,
// else on the calling thread).
contprof_gc_share contprof_gc_take_unplaced(contprof_gc_time *gc);
// Adds `unplaced` to the last sample in a GC, a debt of `context` (its thread took it);
// false when there is none in the active profile.
bool contprof_gc_add_to_last_sample(collector_state *state, per_thread_context *context, const contprof_gc_share *unplaced);
// Records GC time `cpu` and `wall` on the stack the sampler holds, as a sample in a GC
// doing `moment` would.
PPROF_MUST_CHECK
pprof_status contprof_gc_record_sample(collector_state *state, VALUE thread, per_thread_context *context,
                                       const label_set *thread_labels, contprof_gc_moment moment, int64_t cpu,
                                       int64_t wall, pprof_error *error);

// `thread` is forgotten (it died, or the process forked).
static inline void contprof_gc_forget_thread(contprof_gc_time *gc, VALUE thread) {
  if (gc->last_thread == thread) gc->last_thread = Qnil;
}
// Every thread is forgotten: so is the last sample in a GC.
static inline void contprof_gc_forget_all(contprof_gc_time *gc) {
  gc->last_thread = Qnil;
  gc->has_last_ref = false;
}

// A thread's clocks start: it owes nothing.
static inline void contprof_thread_gc_debt_start(contprof_thread_gc_debt *debt) { debt->cpu_ns = debt->wall_ns = 0; }
