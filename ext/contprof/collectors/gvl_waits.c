// Waiting for the GVL: how much of a thread's wall stretch it spent ready to run Ruby code
// while another thread held the GVL, and its record (see gvl_waits.h).
//
// Where the backend measures GVL waits (Ruby 3.3+'s thread events), the part of a thread's
// wall stretch it spent waiting for the GVL is exactly what the backend counted since the
// previous round; elsewhere (Ruby 3.1), a thread found waiting for it at a wall round's
// instant stands for its whole stretch, which is unbiased for the same reason every wall
// sample is. Either way that time is recorded on the thread's stack under "Waiting for
// GVL", with the state "waiting for gvl", and leaves the rest of the stretch.
#include "collectors/gvl_waits.h"

#include "collectors/stack.h"
#include "collectors/thread_context_state.h"
#include "recorder/stack_recorder.h"

// Every blocking call ends with a short wait for the GVL, even uncontended (microseconds):
// waits are recorded once they add up to this much (the final round records the rest),
// so that they do not cost a record each.
#define GVL_RECORD_MIN_NS (1000 * 1000)

static const pprof_str gvl_frame[] = {PPROF_STR("Waiting for GVL")};

void contprof_gvl_waits_start(contprof_thread_gvl_waits *waits, VALUE thread, int64_t now_ns) {
  int64_t waited = contprof_vm_thread_gvl_waited_ns(thread, now_ns);
  waits->waited_known = waited >= 0;
  waits->waited_seen_ns = waited;
}

int64_t contprof_gvl_wait_share(collector_state *state, per_thread_context *context, VALUE thread,
                                contprof_thread_state thread_state, bool final_round, int64_t now_ns, int64_t *wall) {
  contprof_thread_gvl_waits *waits = &context->gvl;
  int64_t share = 0;
  int64_t waited = contprof_vm_thread_gvl_waited_ns(thread, now_ns);
  if (waited >= 0) {
    if (waits->waited_known && waited > waits->waited_seen_ns) share = waited - waits->waited_seen_ns;
    if (share > *wall) share = *wall;
    // (A wait that ended after the stretch did, a round charging up to its tick: the rest
    // is the next stretch's.)
    if (!waits->waited_known) waits->waited_seen_ns = waited;
    waits->waited_seen_ns += share;
    waits->waited_known = true;
  } else if (thread_state == CONTPROF_THREAD_GVL_WAIT) {
    share = *wall;
  }
  if (share > 0) {
    *wall -= share;
    waits->pending_ns += share;
  }
  if (waits->pending_ns <= 0 ||
      (waits->pending_ns < GVL_RECORD_MIN_NS && !final_round)) {
    return 0;
  }
  share = waits->pending_ns;
  waits->pending_ns = 0;
  waits->wait_ns += share;
  state->gvl.wait_ns += (uint64_t) share;
  return share;
}

pprof_status contprof_gvl_wait_record(collector_state *state, per_thread_context *context, label_set *labels,
                                      int64_t wall, int64_t earlier_ns, bool same_stack, pprof_error *error) {
  contprof_thread_gvl_waits *waits = &context->gvl;
  int64_t values[PPROF_MAX_SAMPLE_TYPES];
  contprof_fill_values(state, values, 0, wall);
  int64_t timestamp = state->timeline.round_timestamp_ns > 0 ? state->timeline.round_timestamp_ns - earlier_ns : 0;
  state->gvl.records++;
  if (same_stack && waits->has_ref &&
      (timestamp == 0 || timestamp - waits->since_ns < CONTPROF_TIMELINE_SPAN_NS) &&
      contprof_recorder_add_again(state->recorder, &waits->ref, values, state->value_count, timestamp)) {
    return PPROF_OK;
  }
  contprof_set_state(labels, CONTPROF_STATE_GVL);
  pprof_sample_ref previous = waits->ref;
  bool may_extend = waits->has_ref && timestamp - waits->since_ns < CONTPROF_TIMELINE_SPAN_NS;
  contprof_stack_add_leaves(state->sampler, gvl_frame, 1, &waits->ref);
  contprof_stamp(state, earlier_ns, wall, may_extend ? &previous : NULL);
  pprof_status status = contprof_stack_record(state->sampler, state->recorder, values, state->value_count, labels->list,
                                              labels->count, NULL, false, error);
  waits->has_ref = status == PPROF_OK && waits->ref.profile != NULL;
  bool extended = may_extend && waits->has_ref && waits->ref.sample_index == previous.sample_index &&
                  waits->ref.profile == previous.profile;
  if (!extended) waits->since_ns = timestamp;
  return status;
}
