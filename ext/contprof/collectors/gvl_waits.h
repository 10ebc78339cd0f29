// Waiting for the GVL, for the ThreadContext collector's rounds (gvl_waits.c): what part of
// a thread's wall stretch was a wait for the GVL, and its "Waiting for GVL" record.
#pragma once

#include <ruby.h>
#include <stdbool.h>
#include <stdint.h>

#include "collectors/thread_context_types.h"
#include "pprof/pprof_profile.h"
#include "vm/vm.h"

// All threads' GVL waits recorded.
typedef struct {
  uint64_t wait_ns; // recorded as "Waiting for GVL", all threads
  uint64_t records;
} contprof_gvl_wait_totals;

// A thread's GVL waits, where the backend measures them: the backend's total when last
// read, what is not recorded yet, and its "Waiting for GVL" record.
typedef struct {
  bool waited_known;
  int64_t waited_seen_ns;
  int64_t pending_ns; // not recorded yet (see GVL_RECORD_MIN_NS)
  int64_t wait_ns; // recorded as "Waiting for GVL" while profiled
  pprof_sample_ref ref; // its last "Waiting for GVL" record, on the stack of its memo
  bool has_ref;
  int64_t since_ns; // that record's first timestamp (timeline)
} contprof_thread_gvl_waits;

// When the thread's clocks start (at `now_ns`): its waits count from there.
void contprof_gvl_waits_start(contprof_thread_gvl_waits *waits, VALUE thread, int64_t now_ns);

// Its last "Waiting for GVL" record no longer takes more (recorded on a stack its memo
// does not hold, or that record failed).
static inline void contprof_gvl_waits_forget_record(contprof_thread_gvl_waits *waits) { waits->has_ref = false; }

// Its last "Waiting for GVL" record is no longer its latest on the timeline: it is not
// extended any more (see contprof_end_extensions).
static inline void contprof_gvl_waits_end_extension(contprof_thread_gvl_waits *waits) { waits->since_ns = 0; }

// The GVL wait to record now for `thread` (in `thread_state` at this round, taken at
// `now_ns`), taken out of `*wall`: what the backend measured since the previous round, or
// (where it does not measure) the whole stretch of a thread found waiting. Waits add up
// until they reach a millisecond, or the thread's final round.
int64_t contprof_gvl_wait_share(collector_state *state, per_thread_context *context, VALUE thread,
                                contprof_thread_state thread_state, bool final_round, int64_t now_ns, int64_t *wall);

// Records `wall` of GVL wait on the stack just read, with the thread's `labels` (their state
// becomes "waiting for gvl"), its timeline timestamp `earlier_ns` before the round's.
// `same_stack`: the stack is the one of the thread's previous GVL wait record, which is
// then counted again (as a timeline sample while that spans less than
// CONTPROF_TIMELINE_SPAN_NS).
PPROF_MUST_CHECK
pprof_status contprof_gvl_wait_record(collector_state *state, per_thread_context *context, label_set *labels,
                                      int64_t wall, int64_t earlier_ns, bool same_stack, pprof_error *error);
