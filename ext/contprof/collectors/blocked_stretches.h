// Stretches off the GVL timed rather than sampled, for the ThreadContext collector's wall
// rounds (blocked_stretches.c): where the VM backend times them (Ruby 3.3+'s thread
// events), the wall time of a thread blocked in I/O, a sleep or native code that released
// the GVL is measured from the stretch's start to its end and goes to the stack the thread
// blocked at; ticks keep sampling the rest of its time.
#pragma once

#include <ruby.h>
#include <stdbool.h>
#include <stdint.h>

#include "collectors/thread_context_types.h"
#include "pprof/pprof_profile.h"

// The stretch off the GVL (vm.h's contprof_vm_thread_stretch) that a wall tick found a
// thread in.
typedef struct {
  bool active; // a tick fell in it, and its end has not been recorded yet
  uint64_t seq;
  int64_t start_ns;
  int64_t charged_until_ns; // its wall time recorded so far runs from start_ns to here
  pprof_sample_ref ref; // its record (when has_ref)
  bool has_ref;
} contprof_thread_stretch;

typedef struct {
  uint64_t timed; // stretches whose wall time was measured
  uint64_t wall_unplaced_ns; // the ends of such stretches whose record had been flushed
} contprof_stretch_counts;

// Before a wall or final round records `thread`, wall ticks coming every `interval_ns` on
// average (0: not known): records the end of the stretch it was last found in, once that
// stretch has ended by `tick_ns`.
void contprof_stretch_settle(collector_state *state, per_thread_context *context, VALUE thread, int64_t tick_ns,
                             int64_t interval_ns);

// Whether the tick at `tick_ns` fell in a stretch of `thread` off the GVL (never so for
// `calling_thread`, which holds it and has run since, nor in rounds taken by hand, which
// have no `interval_ns`); if so, `*wall` becomes that stretch's time up to the tick not
// recorded yet, to record on the thread's stack now. Its time before `recorded_until_ns`
// (the thread's wall baseline before this round: its previous round, or when its clocks
// started) is never counted.
bool contprof_stretch_at_tick(per_thread_context *context, VALUE thread, bool calling_thread, int64_t recorded_until_ns,
                              int64_t tick_ns, int64_t interval_ns, bool final_round, int64_t *wall);

// The record that time went to (`ref`, or none when `recorded` is false), where the rest
// of the stretch goes once it ends.
void contprof_stretch_recorded(per_thread_context *context, const pprof_sample_ref *ref, bool recorded);

// Adds `wall` to the record of the stretch a previous tick found the thread in, when that
// record still takes it (its labels unchanged, its timeline sample not yet a span long):
// the stack need not be read again. False: record as usual.
bool contprof_stretch_extend(collector_state *state, per_thread_context *context, int64_t wall);

// The time of `thread`'s stretch that a tick found, if it still goes on, from what was
// recorded of it up to `now_ns`, counted as recorded: the caller records it now, without a
// tick (contprof_thread_context_charge_stretches). 0 when there is none.
int64_t contprof_stretch_due(per_thread_context *context, VALUE thread, int64_t now_ns);
