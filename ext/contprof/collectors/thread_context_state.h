// The state of the ThreadContext collector: what its files share (thread_context.c, what
// each round records, and thread_context_class.c, the Ruby class, which depends on the
// former and never the reverse), composed of each concern's own part, declared by the
// header of the file that changes it (thread_clocks.h, thread_labels.h, timer_health.h,
// gc_time.h, allocations.h, gvl_waits.h, blocked_stretches.h, timeline.h); other files
// read those parts, or call their owner's functions.
#pragma once

#include <ruby.h>
#include <ruby/st.h>
#include <string.h>
#include <time.h>

#include "collectors/allocations.h"
#include "collectors/blocked_stretches.h"
#include "collectors/gc_time.h"
#include "collectors/gvl_waits.h"
#include "collectors/labels.h"
#include "collectors/stack.h"
#include "collectors/thread_clocks.h"
#include "collectors/thread_context_types.h"
#include "collectors/thread_labels.h"
#include "collectors/thread_states.h"
#include "collectors/timeline.h"
#include "collectors/timer_health.h"
#include "collectors/trace_context.h"
#include "pprof/pprof_profile.h"
#include "recorder/stack_recorder.h"

struct per_thread_context {
  long thread_id; // 1, 2, 3... in the order threads were first seen
  // The "thread id" label: thread_id in decimal, a string as Datadog's backend reads it
  // (dd-trace-rb's has always been one). Written once, so a sample formats nothing.
  char thread_id_label[24];
  size_t thread_id_label_len;
  contprof_thread_labels_seen labels_seen; // (thread_labels.h)
  contprof_stack_memo memo;
  contprof_state state_at_previous_sample; // the "thread state" label of its last record
  pprof_sample_ref running_ref; // its last record taken while it was not waiting in Ruby
  bool has_running_ref;
  pprof_sample_ref wall_ref; // its last wall record
  bool has_wall_ref;
  contprof_thread_clocks clocks; // (thread_clocks.h)
  contprof_thread_gc_debt gc_debt; // (gc_time.h)
  contprof_thread_timer_health timer_health; // (timer_health.h)
  contprof_thread_gvl_waits gvl; // (gvl_waits.h)
  contprof_thread_stretch stretch; // its stretch off the GVL a tick found it in (blocked_stretches.h)
};

// What the records of CPU time were: clocks read, timers' counts, captures off the GVL.
typedef struct {
  uint64_t clock_reads; // CPU clocks read (system calls)
  uint64_t samples_from_timers; // records of CPU counted by CPU timers
  // CPU rounds that found no new expiry of their thread's timer: the job its timer queued
  // was run by another thread (postponed jobs are the VM's, not a thread's), or already.
  uint64_t rounds_without_expiry;
  uint64_t captured_samples; // records of CPU with a stack captured in native code
} contprof_cpu_counts;

// The collector: what every concern shares (the recorder, the sampler, the thread table,
// the rounds), then each concern's own state, changed by the file that owns it.
struct collector_state {
  VALUE recorder;
  contprof_stack_sampler *sampler;
  st_table *threads; // Thread => per_thread_context *
  long next_thread_id;
  uint64_t threads_unsampled_no_memory; // times a thread's state could not be made (out of memory): not sampled
  uint64_t rounds;
  unsigned idle_rounds; // (see contprof_thread_context_idle_rounds)
  int64_t wall_resumed_from_ns; // (see contprof_thread_context_wall_resumed_from)
  // In the recorder's values, or -1. The *-samples counts (cpu-samples, wall-samples) are
  // how many samples stand behind a value: its error bar.
  int cpu_time_index, cpu_samples_index, wall_time_index, wall_samples_index;
  size_t value_count;
  contprof_state_cache states;
  contprof_timeline timeline; // (timeline.h)
  contprof_cpu_counts cpu; // (thread_context.c)
  contprof_timer_health_counts timer_health; // (timer_health.c)
  contprof_gc_time gc; // (gc_time.c)
  contprof_allocation_state allocations; // (allocations.c)
  contprof_gvl_wait_totals gvl; // (gvl_waits.c)
  contprof_stretch_counts stretches; // (blocked_stretches.c)
};

// The counters #stats lists (under these names, in this order) and a reset sets back to
// zero: X(name, field of collector_state).
#define COLLECTOR_COUNTERS(X)                                                                                      \
  X(rounds, rounds)                                                                                                \
  X(cpu_clock_reads, cpu.clock_reads)                                                                              \
  X(cpu_samples_from_timers, cpu.samples_from_timers)                                                              \
  X(cpu_rounds_without_expiry, cpu.rounds_without_expiry)                                                          \
  X(captured_samples, cpu.captured_samples)                                                                        \
  X(gc_samples, gc.samples)                                                                                        \
  X(gc_time_ns, gc.time_ns)                                                                                        \
  X(threads_blocking_sigprof, timer_health.threads_blocking_sigprof)                                               \
  X(threads_with_silent_timer, timer_health.threads_with_silent_timer)                                             \
  X(timers_heard_again, timer_health.timers_heard_again)                                                           \
  X(threads_not_hearing_timers, timer_health.threads_not_hearing_timers)                                           \
  X(threads_unsampled_no_memory, threads_unsampled_no_memory)                                                      \
  X(allocation_records, allocations.records)                                                                       \
  X(gvl_wait_ns, gvl.wait_ns)                                                                                      \
  X(gvl_wait_records, gvl.records)                                                                                 \
  X(stretches_timed, stretches.timed)                                                                              \
  X(stretch_wall_unplaced_ns, stretches.wall_unplaced_ns)

// Forgets every thread (their states freed): for the Ruby class's free and reset.
void contprof_thread_context_forget_all(collector_state *state);

// "thread id", "thread name", the program's labels, the trace's three, "thread state", and
// up to three of a GC sample's.
#define MAX_LABELS (2 + CONTPROF_MAX_USER_LABELS + 3 + 1 + 3)

struct label_set {
  pprof_label list[MAX_LABELS];
  size_t count;
};

// The thread's state (created when first seen); NULL without memory (counted).
per_thread_context *contprof_thread_context_for(collector_state *state, VALUE thread);

// What every record of a round shares (thread_context.c, gc_time.c, gvl_waits.c, blocked_stretches.c).

// A sample's values in the recorder's order: cpu-time, cpu-samples (1 when there is CPU),
// wall-time, wall-samples (1 when there is wall time), for those of them the recorder has.
static inline void contprof_fill_values(const collector_state *state, int64_t values[PPROF_MAX_SAMPLE_TYPES],
                                        int64_t cpu_delta, int64_t wall_delta) {
  memset(values, 0, PPROF_MAX_SAMPLE_TYPES * sizeof(int64_t));
  if (state->cpu_time_index >= 0) values[state->cpu_time_index] = cpu_delta;
  if (state->cpu_samples_index >= 0) values[state->cpu_samples_index] = cpu_delta > 0 ? 1 : 0;
  if (state->wall_time_index >= 0) values[state->wall_time_index] = wall_delta;
  if (state->wall_samples_index >= 0) values[state->wall_samples_index] = wall_delta > 0 ? 1 : 0;
}

// Adds CPU and wall time to a record made earlier, its timeline end moved to
// `timestamp_ns` (0: left); false when that record is no longer in the active profile.
static inline bool contprof_add_to_record(const collector_state *state, const pprof_sample_ref *ref, int64_t cpu_delta,
                                          int64_t wall_delta, int64_t timestamp_ns) {
  int64_t values[PPROF_MAX_SAMPLE_TYPES];
  contprof_fill_values(state, values, cpu_delta, wall_delta);
  return contprof_recorder_add_again(state->recorder, ref, values, state->value_count, timestamp_ns);
}

// Adds CPU and wall time to a record made earlier; false when that record is no longer
// in the active profile. Wall time moves a timeline record's end to the round's instant.
static inline bool contprof_add_to_earlier_record(const collector_state *state, const pprof_sample_ref *ref,
                                                  int64_t cpu_delta, int64_t wall_delta) {
  return contprof_add_to_record(state, ref, cpu_delta, wall_delta, wall_delta > 0 ? state->timeline.round_timestamp_ns : 0);
}

// On the timeline a record is extended only while it is the thread's latest, so that a
// thread's records tile its time: a record of another kind (GC, a capture off the GVL, a
// GVL wait) ends the extension of its main record and of its GVL wait record.
static inline void contprof_end_extensions(per_thread_context *context) {
  context->memo.timed_since_ns = 0;
  contprof_gvl_waits_end_extension(&context->gvl);
}

// A thread's label sets end with its "thread state", set per record.
static inline void contprof_set_state(label_set *labels, contprof_state state) {
  labels->list[labels->count - 1].str = contprof_state_name(state);
}

// The next record's timestamp (the round's, moved back by `earlier_ns`), when the timeline
// is on. Only wall time stretches a record it extends (see contprof_stack_set_timestamp).
static inline void contprof_stamp(collector_state *state, int64_t earlier_ns, int64_t wall,
                                  const pprof_sample_ref *extend) {
  int64_t round_timestamp = state->timeline.round_timestamp_ns;
  if (round_timestamp > 0) contprof_stack_set_timestamp(state->sampler, round_timestamp - earlier_ns, wall > 0, extend);
}
