// Allocation sampling: which allocations become samples, at what cost (the design notes
// are at the top of allocation_sampler.c). Owned by the worker, used holding the GVL.
#pragma once

#include <ruby.h>
#include <stdbool.h>
#include <stdint.h>

#include "collectors/allocations.h"
#include "vm/vm.h"


typedef struct {
  uint64_t mean_interval; // asked for: mean allocations between samples (at least, when automatic)
  bool automatic; // the interval grows with the allocation rate (see "Cost" in allocation_sampler.c)
  uint64_t interval; // in use (see "Cost" in allocation_sampler.c)
  VALUE tracepoint; // the NEWOBJ hook (marked by the worker), or Qnil
  bool running, armed;
  bool busy; // the profiler itself is allocating (a round, or recording): not sampled
  uint64_t random_state;
  // The VM's allocation counter: at the latest check, and where the next sample is due.
  // While armed, the hook counts: position = armed_at + calls.
  uint64_t checked_count, target;
  // The interval the target was drawn at (the next sample's weight), and the allocations
  // no draw could reach (past a target missed), which the next sample carries too.
  uint64_t target_interval, unseen;
  uint64_t armed_at, calls_since_armed;
  int64_t checked_at_ns; // when checked_count was read (CLOCK_MONOTONIC)
  double rate; // allocations per nanosecond (the fastest lately)
  bool rate_known; // a check has measured it (until then a fixed interval keeps the hook on)
  // While quiet the hook stays on, whatever checks measure, and times every
  // QUIET_PROBE_CALLS of the program's allocations (see "Cost" in allocation_sampler.c):
  // when two windows in a row came faster, the rate of the second (burst_rate, 0 when none)
  // waits for a check the job runs, which leaves the quiet state.
  bool quiet;
  uint64_t probe_calls;
  int64_t probe_ns;
  int fast_windows;
  double burst_rate;
  // The sample the hook took, waiting for the job.
  bool pending;
  contprof_allocation_sample sample;
  contprof_raw_frame *frames;
  long capacity;
  // Statistics
  uint64_t samples, hook_calls, armings, late_armings, merged, recorded, stale, hook_lost, checks_asked, bursts;
} contprof_allocation_sampler;

// Sets the sampler up (off while mean_interval is 0); frames up to max_frames.
void contprof_allocation_sampler_init(contprof_allocation_sampler *sampler, uint64_t mean_interval, bool automatic,
                                      long max_frames);
void contprof_allocation_sampler_free(contprof_allocation_sampler *sampler);
void contprof_allocation_sampler_mark(contprof_allocation_sampler *sampler);
// Starts counting from now (the tracepoint is created once). Raises on a Ruby that cannot.
// Returns when to check first (CLOCK_MONOTONIC ns; 0: at the rounds).
int64_t contprof_allocation_sampler_start(contprof_allocation_sampler *sampler);
void contprof_allocation_sampler_stop(contprof_allocation_sampler *sampler);
// At every round, when the time it asked for has come, and when it wants one now
// (contprof_allocation_sampler_check_wanted): arms the hook when the next sample is near.
// Returns when (CLOCK_MONOTONIC ns) it wants to check again, before the rounds would (0: the
// hook is on, and its sample or its probe asks for the next check).
int64_t contprof_allocation_sampler_check(contprof_allocation_sampler *sampler, int64_t now_ns);
// Whether the hook saw a burst that the next job should check for.
static inline bool contprof_allocation_sampler_check_wanted(const contprof_allocation_sampler *sampler) {
  return sampler->burst_rate > 0;
}
// The pending sample (or NULL) and its frames, for the job to record; then done.
const contprof_allocation_sample *contprof_allocation_sampler_pending(contprof_allocation_sampler *sampler,
                                                                      const contprof_raw_frame **frames);
void contprof_allocation_sampler_done(contprof_allocation_sampler *sampler);
// Statistics into `stats` (a Hash).
void contprof_allocation_sampler_stats(const contprof_allocation_sampler *sampler, VALUE stats);
// The object's class as a label: its class path, never an address (see allocation_sampler.c).
size_t contprof_allocation_class_name(VALUE object, char *buffer, size_t capacity);
