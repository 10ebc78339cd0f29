// The state of the ThreadContext collector, shared by its two files: thread_context.c (what
// each round records) and thread_context_class.c (the Ruby class, which depends on the
// former and never the reverse).
#pragma once

#include <ruby.h>
#include <ruby/st.h>
#include <string.h>
#include <time.h>

#include "collectors/heap_tracker.h"
#include "collectors/labels.h"
#include "collectors/trace_context.h"
#include "collectors/stack.h"
#include "collectors/thread_states.h"
#include "pprof/pprof_profile.h"
#include "recorder/stack_recorder.h"

// The stretch off the GVL (vm.h's contprof_vm_thread_stretch) that a wall tick found a
// thread in, timed rather than sampled (collectors/blocked_stretches.c).
typedef struct {
  bool active; // a tick fell in it, and its end has not been recorded yet
  uint64_t seq;
  int64_t start_ns;
  int64_t charged_until_ns; // its wall time recorded so far runs from start_ns to here
  pprof_sample_ref ref; // its record (when has_ref)
  bool has_ref;
} contprof_thread_stretch;

typedef struct {
  long thread_id; // 1, 2, 3... in the order threads were first seen
  // The "thread id" label: thread_id in decimal, a string as Datadog's backend reads it
  // (dd-trace-rb's has always been one). Written once, so a sample formats nothing.
  char thread_id_label[24];
  size_t thread_id_label_len;
  bool has_cpu_clock;
  clockid_t cpu_clock;
  bool cpu_accounted; // an M:N thread: its CPU is what its hooks measured (vm.h)
  bool clocks_started;
  // False while the thread's CPU clock could not be read (a thread not started yet):
  // its first readable value is then a baseline, not a delta.
  bool cpu_baseline_valid;
  int64_t cpu_baseline_ns; // the thread's CPU clock value recorded up to
  int64_t wall_baseline_ns; // CLOCK_MONOTONIC recorded up to
  int64_t gc_cpu_debt_ns, gc_wall_debt_ns; // see "Where time goes"
  int64_t own_cpu_debt_ns;
  VALUE name_at_previous_sample; // its name object (labels change when it does)
  uint64_t labels_at_previous_sample; // the serial of its label set then (0: none)
  contprof_trace_ids trace_at_previous_sample; // its trace's span ids then (zeros: none)
  char span_id_hex[17]; // the "span_id" label's text
  contprof_stack_memo memo;
  int cpu_reads_skipped; // see MAX_SKIPPED_CPU_READS
  pprof_sample_ref running_ref; // its last record taken while it was not waiting in Ruby
  bool has_running_ref;
  pprof_sample_ref wall_ref; // its last wall record
  bool has_wall_ref;
  int silent_timer_rounds; // wall rounds since its timer last counted CPU (or was checked)
  bool timer_unheard; // its timer's signals do not reach it: CPU is read from its clock
  bool silent_check_started; // its clock was read after a silence (see timer_unheard)
  // Already counted among the threads that blocked SIGPROF, or whose timer was silent
  // (a thread is counted once, however often its timer is replaced and judged again).
  bool counted_blocking_sigprof, counted_silent_timer;
  int64_t silent_check_cpu_ns; // that reading
  uint64_t silent_check_timer; // the timer (generation) those readings are of
  contprof_state state_at_previous_sample; // the "thread state" label of its last record
  // Its GVL waits, where the backend measures them: the backend's total when last read.
  bool gvl_waited_known;
  int64_t gvl_waited_seen_ns;
  int64_t gvl_wait_pending_ns; // not recorded yet (see GVL_RECORD_MIN_NS)
  int64_t gvl_wait_ns; // recorded as "Waiting for GVL" while profiled
  pprof_sample_ref gvl_ref; // its last "Waiting for GVL" record, on the stack of its memo
  bool has_gvl_ref;
  int64_t gvl_since_ns; // that record's first timestamp (timeline)
  contprof_thread_stretch stretch; // its stretch off the GVL a tick fell in (blocked_stretches.h)
} per_thread_context;

#define MAX_SKIPPED_CPU_READS 9
// After this many wall rounds without a word from a thread's timer, its clock is read: a
// thread that blocks SIGPROF (native code's pthread_sigmask) never hears its timer, and
// its CPU would be lost. More than SILENT_TIMER_PERIODS periods of CPU, plus
// SILENT_TIMER_SLACK_NS, between two such readings of the same timer, unheard, means so
// (see timer_unheard in thread_context.c).
#define SILENT_TIMER_CHECK_ROUNDS 32
#define SILENT_TIMER_PERIODS 4
#define SILENT_TIMER_SLACK_NS (20 * 1000 * 1000) // a POSIX timer is noticed at the scheduler's tick (4-10 ms)

typedef struct {
  VALUE recorder;
  contprof_stack_sampler *sampler;
  st_table *threads; // Thread => per_thread_context *
  long next_thread_id;
  uint64_t rounds;
  unsigned idle_rounds; // (see contprof_thread_context_idle_rounds)
  int64_t wall_resumed_from_ns; // (see contprof_thread_context_wall_resumed_from)
  uint64_t cpu_clock_reads; // CPU clocks read (system calls)
  uint64_t cpu_samples_from_timers; // records of CPU counted by CPU timers
  // CPU rounds that found no new expiry of their thread's timer: the job its timer queued
  // was run by another thread (postponed jobs are the VM's, not a thread's), or already.
  uint64_t cpu_rounds_without_expiry;
  uint64_t captured_samples; // records of CPU with a stack captured in native code
  uint64_t gc_samples; // records of GC time
  // GC time (see "Where time goes"): the GC's clock when last read, and the time it
  // counted that no sample in a GC has carried yet.
  bool gc_clock_used, gc_clock_started;
  int64_t gc_clock_seen_ns;
  int64_t gc_unplaced_cpu_ns, gc_unplaced_wall_ns;
  uint64_t gc_time_ns; // counted by the GC's clock while sampling
  VALUE last_gc_thread; // the thread whose sample was last in a GC (marked), or Qnil
  pprof_sample_ref last_gc_ref; // that sample's record (when has_last_gc_ref)
  contprof_gc_moment last_gc_moment; // and what the GC was doing then
  bool has_last_gc_ref;
  // Threads found not hearing their CPU timer (timer_unheard): those whose signal mask
  // blocked SIGPROF, the others (a timer silent for another reason), and those that heard
  // it again later; and how many do not hear it now.
  uint64_t threads_blocking_sigprof, threads_with_silent_timer, timers_heard_again, threads_not_hearing_timers;
  uint64_t threads_unsampled_no_memory; // times a thread's state could not be made (out of memory): not sampled
  // In the recorder's values, or -1. The *-samples counts (cpu-samples, wall-samples) and
  // the *-unscaled ones are how many samples stand behind a value: its error bar.
  int cpu_time_index, cpu_samples_index, wall_time_index, wall_samples_index;
  int alloc_samples_index, alloc_size_index, alloc_unscaled_index;
  int heap_samples_index, heap_size_index, heap_unscaled_index;
  contprof_heap_tracker *heap; // when the recorder has heap-live types, else NULL
  uint64_t allocation_records; // records of sampled allocations
  uint64_t allocation_sizes_read, allocation_bytes_read; // objects whose size was read, and their bytes
  size_t value_count;
  // The timeline: whether records carry timestamps, CLOCK_REALTIME minus CLOCK_MONOTONIC
  // (timestamps are the rounds' monotonic instants, moved to the epoch), and the current
  // round's timestamp (0 when off).
  bool timeline;
  int64_t realtime_offset_ns;
  int64_t round_timestamp_ns;
  contprof_state_cache states;
  uint64_t gvl_wait_ns; // recorded as "Waiting for GVL", all threads
  uint64_t gvl_wait_records;
  uint64_t stretches_timed; // stretches off the GVL whose wall time was measured (blocked_stretches.c)
  uint64_t stretch_wall_unplaced_ns; // the ends of such stretches whose record had been flushed
} collector_state;

// The counters #stats lists (under these names) and a reset sets back to zero.
#define COLLECTOR_COUNTERS(X)                                                                                   \
  X(rounds) X(cpu_clock_reads) X(cpu_samples_from_timers) X(cpu_rounds_without_expiry) X(captured_samples)     \
  X(gc_samples) X(gc_time_ns) X(threads_blocking_sigprof) X(threads_with_silent_timer) X(timers_heard_again) \
  X(threads_not_hearing_timers) X(threads_unsampled_no_memory) X(allocation_records) \
  X(gvl_wait_ns) X(gvl_wait_records) X(stretches_timed) X(stretch_wall_unplaced_ns)

// Forgets every thread (their states freed): for the Ruby class's free and reset.
void contprof_thread_context_forget_all(collector_state *state);

// "thread id", "thread name", the program's labels, the trace's three, "thread state", and
// up to three of a GC sample's.
#define MAX_LABELS (2 + CONTPROF_MAX_USER_LABELS + 3 + 1 + 3)

typedef struct {
  pprof_label list[MAX_LABELS];
  size_t count;
} label_set;

// The thread's state (created when first seen); NULL without memory (counted).
per_thread_context *contprof_thread_context_for(collector_state *state, VALUE thread);
// The labels every sample of the thread carries ("thread id", "thread name", and those of
// Contprof.with_labels in force on its current fiber); room is left for three more.
void contprof_thread_context_labels(per_thread_context *context, VALUE thread, label_set *labels);

// What every record of a round shares (thread_context.c, gvl_waits.c).

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

// On the timeline a record is extended only while it is the thread's latest, so that a
// thread's records tile its time: a record of another kind (GC, a capture off the GVL, a
// GVL wait) ends the extension of its main record and of its GVL wait record.
static inline void contprof_end_extensions(per_thread_context *context) {
  context->memo.timed_since_ns = 0;
  context->gvl_since_ns = 0;
}

// A thread's label sets end with its "thread state", set per record.
static inline void contprof_set_state(label_set *labels, contprof_state state) {
  labels->list[labels->count - 1].str = contprof_state_name(state);
}

// The next record's timestamp (the round's, moved back by `earlier_ns`), when the timeline
// is on. Only wall time stretches a record it extends (see contprof_stack_set_timestamp).
static inline void contprof_stamp(collector_state *state, int64_t earlier_ns, int64_t wall,
                                  const pprof_sample_ref *extend) {
  if (state->round_timestamp_ns > 0) {
    contprof_stack_set_timestamp(state->sampler, state->round_timestamp_ns - earlier_ns, wall > 0, extend);
  }
}
