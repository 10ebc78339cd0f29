// Stretches off the GVL timed rather than sampled (see blocked_stretches.h).
//
// ## Why not simply carve the measured stretch out of the sampled wall time
//
// Wall ticks come at instants that do not depend on the threads, and each charges the
// time since the previous tick to the stack it finds: for any set of instants fixed apart
// from the ticks, the ticks that fall in it charge, on average, its length. Subtracting a
// measured stretch from that would break it: the tick after a blocking call would charge
// the code before the call with the call's share of its interval, a bias of about half an
// interval per call, where the calls are.
//
// ## What is done instead
//
// The time of a thread splits into its stretches off the GVL (from giving it up to wanting
// it back: the backend's SUSPENDED and READY events) and the rest. The rest keeps the
// sampled estimate: a tick there charges its interval, unbiased as above, since that set
// of instants is the thread's own doing. A tick in a stretch charges nothing of its
// interval; it reads the stack the thread blocked at (which cannot change while the
// thread is off the GVL) and from then on the stretch's own clock runs: each tick in it
// records the stretch's time up to that tick on that stack, and its end is recorded at the
// first round after it (on the same record, with the timeline's end moved to it).
//
// A stretch no tick falls in is not seen, so a seen stretch of length B stands for B / p(B),
// p(B) being the chance that a tick falls in a stretch of that length (Horvitz-Thompson):
// unbiased whatever B. With intervals drawn uniformly in [aT, bT] (jitter.h) and
// instants independent of the ticks, p(B) is B / T up to aT, then a + u - u^2 / (2(b - a))
// with u = (B - aT) / T, reaching 1 at bT: a stretch longer than the longest interval is
// always seen and counts exactly its length; a short one seen counts, on average, what a
// tick would have charged it. A thread's wall total is therefore unbiased rather than
// exact, and the time of a long blocking call, which sampling would estimate to within a
// tick either side, is exact.
#include "collectors/blocked_stretches.h"

#include "collectors/thread_context_state.h"
#include "jitter.h"

// What a seen stretch of `length_ns` counts beyond its length (see above).
static int64_t unseen_share(int64_t length_ns, int64_t interval_ns) {
  if (interval_ns <= 0 || length_ns <= 0) return 0;
  double chance = contprof_tick_chance(length_ns, interval_ns, CONTPROF_JITTER);
  if (chance >= 1.0) return 0;
  return (int64_t) ((double) length_ns / chance) - length_ns;
}

void contprof_stretch_settle(collector_state *state, per_thread_context *context, VALUE thread, int64_t tick_ns,
                             int64_t interval_ns) {
  contprof_thread_stretch *stretch = &context->stretch;
  if (!stretch->active) return;
  contprof_vm_stretch latest;
  int64_t end_ns;
  if (contprof_vm_thread_stretch(thread, &latest) && latest.seq == stretch->seq) {
    end_ns = latest.end_ns;
    if (end_ns == 0 || end_ns > tick_ns) return; // it goes on past this tick
  } else {
    end_ns = contprof_vm_thread_marked_stretch_end(thread, stretch->seq);
  }
  stretch->active = false;
  if (end_ns < stretch->charged_until_ns) return; // its end was not kept (the thread is gone)
  state->stretches.timed++;
  int64_t rest = end_ns - stretch->charged_until_ns + unseen_share(end_ns - stretch->start_ns, interval_ns);
  if (rest <= 0) return;
  int64_t timestamp = contprof_timeline_at(&state->timeline, end_ns);
  if (stretch->has_ref && contprof_add_to_record(state, &stretch->ref, 0, rest, timestamp)) return;
  // Its record went out with a profile already flushed: at most one interval of it.
  state->stretches.wall_unplaced_ns += (uint64_t) rest;
}

bool contprof_stretch_at_tick(per_thread_context *context, VALUE thread, bool calling_thread, int64_t recorded_until_ns,
                              int64_t tick_ns, int64_t interval_ns, bool final_round, int64_t *wall) {
  // Rounds taken by hand come at instants the program chose, which the estimate of the
  // rest does not allow: their ticks charge everything, as sampling does.
  contprof_vm_stretch latest;
  if (calling_thread || interval_ns <= 0 || !contprof_vm_thread_stretch(thread, &latest)) return false;
  if (latest.start_ns > tick_ns || (latest.end_ns != 0 && latest.end_ns <= tick_ns)) return false;
  contprof_thread_stretch *stretch = &context->stretch;
  if (!stretch->active || stretch->seq != latest.seq) {
    // (A stretch that began before the thread's previous round, or before its clocks
    // started, e.g. a thread blocked since before Contprof started, has that part
    // recorded already, or outside the profile.)
    int64_t from = latest.start_ns > recorded_until_ns ? latest.start_ns : recorded_until_ns;
    *stretch = (contprof_thread_stretch) {
        .active = true, .seq = latest.seq, .start_ns = latest.start_ns, .charged_until_ns = from};
    contprof_vm_thread_mark_stretch(thread, latest.seq);
  }
  *wall = tick_ns > stretch->charged_until_ns ? tick_ns - stretch->charged_until_ns : 0;
  if (tick_ns > stretch->charged_until_ns) stretch->charged_until_ns = tick_ns;
  if (final_round) stretch->active = false;
  return true;
}

void contprof_stretch_recorded(per_thread_context *context, const pprof_sample_ref *ref, bool recorded) {
  context->stretch.has_ref = recorded;
  if (recorded) context->stretch.ref = *ref;
}

bool contprof_stretch_extend(collector_state *state, per_thread_context *context, int64_t wall) {
  contprof_thread_stretch *stretch = &context->stretch;
  if (!stretch->has_ref || !context->memo.valid) return false;
  int64_t timestamp = state->timeline.round_timestamp_ns;
  if (timestamp > 0 && timestamp - context->memo.timed_since_ns >= CONTPROF_TIMELINE_SPAN_NS) return false;
  return contprof_add_to_record(state, &stretch->ref, 0, wall, timestamp);
}

int64_t contprof_stretch_due(per_thread_context *context, VALUE thread, int64_t now_ns) {
  contprof_thread_stretch *stretch = &context->stretch;
  contprof_vm_stretch latest;
  if (!stretch->active || !contprof_vm_thread_stretch(thread, &latest) || latest.seq != stretch->seq ||
      latest.end_ns != 0 || now_ns <= stretch->charged_until_ns) {
    return 0; // (one that ended is the next tick's to settle)
  }
  int64_t due = now_ns - stretch->charged_until_ns;
  stretch->charged_until_ns = now_ns;
  return due;
}
