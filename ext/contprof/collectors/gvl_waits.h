// Waiting for the GVL, for the ThreadContext collector's rounds (gvl_waits.c): what part of
// a thread's wall stretch was a wait for the GVL, and its "Waiting for GVL" record.
#pragma once

#include <stdbool.h>
#include <stdint.h>

#include "collectors/thread_context_state.h"

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
