// GC time (see gc_time.h, and "Where time goes" in thread_context.c): the GC's clock read
// every round, and the records of the samples that fell inside a GC, each carrying all
// the GC time counted since the previous one, under "Garbage Collection" and the phase
// the GC was in, on top of the stack the GC left the thread at.
#include "collectors/gc_time.h"

#include <string.h>

#include "collectors/stack.h"
#include "collectors/thread_context_state.h"
#include "recorder/stack_recorder.h"

void contprof_gc_time_start(contprof_gc_time *gc, bool clock_used) {
  gc->clock_used = clock_used;
  gc->clock_started = false;
  gc->unplaced_cpu_ns = gc->unplaced_wall_ns = 0;
  contprof_gc_forget_all(gc);
}

void contprof_gc_time_reset(contprof_gc_time *gc) {
  gc->unplaced_cpu_ns = gc->unplaced_wall_ns = 0;
  gc->clock_started = false;
}

void contprof_gc_read_clock(contprof_gc_time *gc) {
  if (!gc->clock_used) return;
  int64_t now = contprof_vm_gc_time_ns();
  int64_t delta = gc->clock_started ? now - gc->clock_seen_ns : 0;
  gc->clock_seen_ns = now;
  gc->clock_started = true;
  if (delta <= 0) return;
  gc->unplaced_cpu_ns += delta;
  gc->unplaced_wall_ns += delta;
  gc->time_ns += delta;
}

// The GC time a sample in a GC carries: all the GC's clock counted that no sample carried
// yet; without that clock (GC.measure_total_time off), the sample's own share.
static int64_t take_unplaced(const contprof_gc_time *gc, int64_t *unplaced, int64_t sampled) {
  if (!gc->clock_used) return sampled;
  int64_t taken = *unplaced;
  *unplaced = 0;
  return taken;
}

static const pprof_str gc_frames[][2] = {
  [CONTPROF_GC_PHASE_UNKNOWN] = {PPROF_STR("Garbage Collection")},
  [CONTPROF_GC_MARKING] = {PPROF_STR("Marking"), PPROF_STR("Garbage Collection")},
  [CONTPROF_GC_SWEEPING] = {PPROF_STR("Sweeping"), PPROF_STR("Garbage Collection")},
};

static pprof_str static_string(const char *string) { return (pprof_str) {string, strlen(string)}; }

// The debt GC time recorded apart leaves on the thread's clocks.
static void owe(per_thread_context *context, int64_t cpu, int64_t wall) {
  context->gc_debt.cpu_ns += cpu;
  context->gc_debt.wall_ns += wall;
}

pprof_status contprof_gc_record_sample(collector_state *state, VALUE thread, per_thread_context *context,
                                       const label_set *thread_labels, contprof_gc_moment moment, int64_t cpu,
                                       int64_t wall, pprof_error *error) {
  if (cpu <= 0 && wall <= 0) return PPROF_OK;
  contprof_gc_time *gc = &state->gc;
  label_set labels = *thread_labels;
  const char *major_reason = contprof_vm_gc_major_reason(moment), *cause = contprof_vm_gc_cause(moment);
  if (moment) {
    labels.list[labels.count++] =
      (pprof_label) {.key = PPROF_STR("gc type"), .str = major_reason[0] ? PPROF_STR("major") : PPROF_STR("minor")};
  }
  if (cause[0]) labels.list[labels.count++] = (pprof_label) {.key = PPROF_STR("gc cause"), .str = static_string(cause)};
  if (major_reason[0]) {
    labels.list[labels.count++] = (pprof_label) {.key = PPROF_STR("gc major reason"), .str = static_string(major_reason)};
  }
  contprof_gc_phase phase = contprof_gc_moment_phase(moment);
  contprof_stack_add_leaves(state->sampler, gc_frames[phase], phase == CONTPROF_GC_PHASE_UNKNOWN ? 1 : 2, &gc->last_ref);
  contprof_stamp(state, 0, wall, NULL);
  int64_t values[PPROF_MAX_SAMPLE_TYPES];
  contprof_fill_values(state, values, cpu, wall);
  pprof_status status = contprof_stack_record(state->sampler, state->recorder, values, state->value_count, labels.list,
                                              labels.count, NULL, false, error);
  if (status != PPROF_OK) return status;
  owe(context, cpu, wall);
  gc->samples++;
  gc->last_thread = thread;
  gc->last_moment = moment;
  gc->has_last_ref = true;
  return PPROF_OK;
}

pprof_status contprof_gc_record_share(collector_state *state, VALUE thread, per_thread_context *context,
                                     const label_set *labels, const contprof_gc_share *share, pprof_error *error) {
  contprof_gc_time *gc = &state->gc;
  int64_t cpu = share->cpu > 0 ? take_unplaced(gc, &gc->unplaced_cpu_ns, share->cpu) : 0;
  int64_t wall = share->wall > 0 ? take_unplaced(gc, &gc->unplaced_wall_ns, share->wall) : 0;
  if (cpu <= 0 || wall <= 0 || share->cpu_moment == share->wall_moment) {
    return contprof_gc_record_sample(state, thread, context, labels, cpu > 0 ? share->cpu_moment : share->wall_moment,
                                     cpu, wall, error);
  }
  pprof_status status = contprof_gc_record_sample(state, thread, context, labels, share->cpu_moment, cpu, 0, error);
  if (status != PPROF_OK) return status;
  return contprof_gc_record_sample(state, thread, context, labels, share->wall_moment, 0, wall, error);
}

contprof_gc_share contprof_gc_take_unplaced(contprof_gc_time *gc) {
  contprof_gc_share unplaced = {.cpu = gc->unplaced_cpu_ns, .wall = gc->unplaced_wall_ns};
  gc->unplaced_cpu_ns = gc->unplaced_wall_ns = 0;
  return unplaced;
}

bool contprof_gc_add_to_last_sample(collector_state *state, per_thread_context *context, const contprof_gc_share *unplaced) {
  if (!state->gc.has_last_ref || !contprof_add_to_earlier_record(state, &state->gc.last_ref, unplaced->cpu, unplaced->wall)) {
    return false;
  }
  owe(context, unplaced->cpu, unplaced->wall);
  return true;
}
