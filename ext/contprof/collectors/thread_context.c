// Contprof::Collectors::ThreadContext: what each sampling round records (see thread_context.h).
//
// ## Where time goes
//
// Per thread it keeps two baselines: the CPU time recorded so far (a value of the
// thread's own CPU clock) and the wall time recorded so far (CLOCK_MONOTONIC). Every
// record moves one of them on by what it records, so the totals are exact whatever the
// rounds' timing: sampling decides *where* time goes, never *how much*.
//
// - Wall time is recorded only by wall rounds, which the worker asks for at instants of
//   its own clock (ticks), whatever the threads do; each thread's stretch since its
//   previous wall sample goes to the stack it has then. Because those instants do not
//   depend on the threads, a stack gets wall time in proportion to how long threads stood
//   there. A round charges up to its tick's instant, not up to when it runs: it runs at
//   the next safe point of the thread holding the GVL, which native code holding the GVL
//   puts off until it returns. Until then no thread runs Ruby code, so every stack is
//   still what it was at the tick (the late thread's is the native call's), but charging
//   up to the late round would give the next stretch's start to that call: the tick after
//   a late round could not fall in the code that followed the call (measured: a method
//   taking 5 ms of Ruby between two 25 ms native calls got a quarter of its wall time).
//   Ticks skipped while the round was pending saw the same stacks: their time is the
//   round's too.
// - CPU time of a thread with a CPU timer is recorded when the timer expires: at instants
//   of the thread's own CPU clock, so a stack gets CPU in proportion to the CPU used there
//   (see sampling/cpu_timers.h). The CPU a timer counted while the thread did not hold
//   the GVL (native code, on its way into a wait) goes to the stack its signal handler
//   captured there.
// - CPU time of a thread without a timer (signals off, a refused timer) is read from its
//   clock at wall rounds and goes to its stack then, except that a thread found waiting
//   in Ruby (sleep, Queue#pop, Mutex#lock...) used that CPU before it started to wait: it
//   goes to the thread's last record taken while it was not waiting.
// - GC time: *how much* comes from the GC's own clock (GC.stat(:time), read at every
//   round), *where* from the samples whose instant fell inside a GC (a CPU timer that
//   expired during one, a wall tick that found the GVL holder in one). Such a sample is
//   recorded as "Garbage Collection" (and the phase the GC was in) on top of the stack the
//   GC left the thread at, and carries all the GC time counted since the previous such
//   sample: unbiased where (samples land in proportion to the GC time of each place), exact
//   in total. No GC event is subscribed to: on Ruby 3.1 any GC event hook slows every
//   allocation (see vm/vm.h). That time is also in the thread's clocks, so it becomes a
//   *debt* of the thread's records: the sample's own share (the CPU timer's expirations in
//   the GC, the wall stretch of a tick in the GC) pays it instead of going to the stack.
//   The debt may go below zero meanwhile; the final round settles it, either way, so the
//   totals stay exact. GC time no sample placed by the end of a run goes on the thread
//   that last sampled a GC.
// - The CPU a sampling round costs the thread that runs it is the profiler's: it is left
//   out the same way (own_cpu_debt).
//
// A thread's first sample only starts its clocks, unless the worker's thread-begin hook
// started them at the thread's birth. Reading a CPU clock is a system call: threads with
// a timer never need it but at the final round, and a thread without one found waiting
// where it waited is not asked for up to MAX_SKIPPED_CPU_READS rounds (what it used
// meanwhile is counted at the next read, never lost).
//
// The per-thread table is an st_table keyed by Thread object (marked and pinned: see
// thread_context_class.c). Entries of dead threads are removed at every wall round.
#include "collectors/thread_context.h"
#include "collectors/thread_context_state.h"
#include "collectors/blocked_stretches.h"

#include <fcntl.h>
#include <inttypes.h>
#include <signal.h>
#include <ruby/st.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "collectors/gvl_waits.h"
#include "fault_injection.h"
#include "collectors/stack.h"
#include "profiler_threads.h"
#include "pprof/pprof_util.h"
#include "recorder/stack_recorder.h"
#include "ruby_helpers.h"

// ---------------------------------------------------------------------------------------
// Clocks

// The thread's CPU time, or -1 when it cannot be read (not started, or finished). A thread
// found sharing native threads (M:N) changes source once: its baseline starts again.
static int64_t thread_cpu_time_ns(per_thread_context *context, VALUE thread) {
  int64_t accounted = contprof_vm_thread_cpu_accounted_ns(thread);
  if (accounted >= 0) {
    if (!context->cpu_accounted) {
      context->cpu_accounted = true;
      context->cpu_baseline_valid = false;
      context->silent_check_started = false;
    }
    return accounted;
  }
  if (!context->has_cpu_clock) {
    pthread_t pthread;
    if (!contprof_vm_thread_pthread(thread, &pthread)) return -1;
    if (pthread_getcpuclockid(pthread, &context->cpu_clock) != 0) return -1;
    context->has_cpu_clock = true;
  }
  struct timespec ts;
  if (clock_gettime(context->cpu_clock, &ts) != 0) return -1;
  return contprof_timespec_ns(ts);
}

per_thread_context *contprof_thread_context_for(collector_state *state, VALUE thread) {
  st_data_t value;
  if (st_lookup(state->threads, (st_data_t) thread, &value)) return (per_thread_context *) value;
  // Plain calloc: a round allocates nothing Ruby's GC counts, and raises nothing.
  per_thread_context *context = contprof_allocation_fails(CONTPROF_ALLOC_THREAD_STATE) ? NULL : calloc(1, sizeof(per_thread_context));
  if (!context) {
    state->threads_unsampled_no_memory++;
    return NULL;
  }
  context->thread_id = state->next_thread_id++;
  int len = snprintf(context->thread_id_label, sizeof(context->thread_id_label), "%ld", context->thread_id);
  context->thread_id_label_len = len > 0 ? (size_t) len : 0;
  context->name_at_previous_sample = Qnil;
  st_insert(state->threads, (st_data_t) thread, (st_data_t) context);
  return context;
}

// Makes `cpu_now` (the thread's CPU clock value, or -1 when unknown) its new baseline;
// returns the CPU time used since the previous one (0 when there is no valid previous one).
static int64_t advance_cpu_baseline(per_thread_context *context, int64_t cpu_now) {
  if (cpu_now < 0) return 0;
  int64_t delta = context->cpu_baseline_valid ? cpu_now - context->cpu_baseline_ns : 0;
  if (delta < 0) return 0; // never move backwards (a timer's expiry older than a clock read)
  context->cpu_baseline_ns = cpu_now;
  context->cpu_baseline_valid = true;
  return delta;
}

// Reads the thread's CPU clock (a system call) and makes it the new baseline.
static int64_t advance_cpu_clock(collector_state *state, per_thread_context *context, VALUE thread) {
  state->cpu_clock_reads++;
  context->cpu_reads_skipped = 0;
  return advance_cpu_baseline(context, thread_cpu_time_ns(context, thread));
}

static int64_t advance_wall_clock(per_thread_context *context, int64_t wall_now) {
  int64_t wall_delta = wall_now - context->wall_baseline_ns;
  if (wall_delta < 0) return 0;
  context->wall_baseline_ns = wall_now;
  return wall_delta;
}

static void start_clocks(collector_state *state, per_thread_context *context, VALUE thread, int64_t wall_now) {
  advance_cpu_clock(state, context, thread);
  context->wall_baseline_ns = wall_now;
  int64_t gvl_waited = contprof_vm_thread_gvl_waited_ns(thread, wall_now);
  context->gvl_waited_known = gvl_waited >= 0;
  context->gvl_waited_seen_ns = gvl_waited;
  context->gc_cpu_debt_ns = context->gc_wall_debt_ns = context->own_cpu_debt_ns = 0;
  context->clocks_started = true;
}

// Pays `*debt` back from `*amount` as far as it goes (the profiler's own CPU).
static void pay_debt(int64_t *debt, int64_t *amount) {
  int64_t paid = *debt < *amount ? *debt : *amount;
  if (paid <= 0) return;
  *debt -= paid;
  *amount -= paid;
}

// `share` of `*amount` stands for GC time (its instant fell inside a GC): it leaves the
// amount and pays the GC debt; returns what it paid. The debt may go below zero: the GC
// time a sample carries is what the GC's clock counted since the previous one, not its
// own share.
static int64_t stands_for_gc(int64_t *debt, int64_t *amount, int64_t share) {
  if (share > *amount) share = *amount;
  if (share <= 0) return 0;
  *debt -= share;
  *amount -= share;
  return share;
}

// The final record of a thread settles its GC debt either way, so the totals are exact.
static void settle_gc_debt(int64_t *debt, int64_t *amount) {
  *amount -= *debt;
  *debt = 0;
  if (*amount < 0) *amount = 0;
}

// ---------------------------------------------------------------------------------------
// Recording

// Adds CPU and wall time to a record made earlier; false when that record is no longer
// in the active profile. Wall time moves a timeline record's end to the round's instant.
static bool add_to_earlier_record(collector_state *state, const pprof_sample_ref *ref, int64_t cpu_delta,
                                  int64_t wall_delta) {
  return contprof_add_to_record(state, ref, cpu_delta, wall_delta, wall_delta > 0 ? state->round_timestamp_ns : 0);
}

// "thread id", "thread name" when it has one, and the program's labels in force on its
// fiber. Changes the memo's validity when the name or the labels changed (Thread#name=
// stores a new frozen string, so an unchanged name is the same object; every label set has
// its own serial).
void contprof_thread_context_labels(per_thread_context *context, VALUE thread, label_set *labels) {
  VALUE name = contprof_vm_thread_name(thread);
  const contprof_label_set *in_force = contprof_labels_in_force(thread);
  uint64_t serial = in_force ? in_force->serial : 0;
  contprof_trace_ids trace = {0};
  bool traced = contprof_trace_ids_of(thread, &trace);
  if (name != context->name_at_previous_sample || serial != context->labels_at_previous_sample ||
      trace.span_id != context->trace_at_previous_sample.span_id ||
      trace.local_root_span_id != context->trace_at_previous_sample.local_root_span_id) {
    context->memo.valid = false;
  }
  context->name_at_previous_sample = name;
  context->labels_at_previous_sample = serial;
  context->trace_at_previous_sample = trace;
  labels->count = 0;
  labels->list[labels->count++] =
    (pprof_label) {.key = PPROF_STR("thread id"), .str = {context->thread_id_label, context->thread_id_label_len}};
  if (RB_TYPE_P(name, T_STRING) && RSTRING_LEN(name) > 0) {
    labels->list[labels->count++] =
      (pprof_label) {.key = PPROF_STR("thread name"), .str = {RSTRING_PTR(name), (size_t) RSTRING_LEN(name)}};
  }
  if (in_force) {
    memcpy(&labels->list[labels->count], in_force->labels, in_force->count * sizeof(pprof_label));
    labels->count += in_force->count;
  }
  if (traced) { // numbers, as Datadog's backend reads them
    labels->list[labels->count++] =
      (pprof_label) {.key = PPROF_STR("local root span id"), .num = (int64_t) trace.local_root_span_id};
    labels->list[labels->count++] = (pprof_label) {.key = PPROF_STR("span id"), .num = (int64_t) trace.span_id};
    if (contprof_span_id_label) {
      snprintf(context->span_id_hex, sizeof(context->span_id_hex), "%016" PRIx64, trace.local_root_span_id);
      labels->list[labels->count++] = (pprof_label) {.key = PPROF_STR("span_id"), .str = {context->span_id_hex, 16}};
    }
  }
}

// The labels of a thread's records: its labels, then "thread state" (last, set per record
// by contprof_set_state).
static void thread_labels(per_thread_context *context, VALUE thread, label_set *labels) {
  contprof_thread_context_labels(context, thread, labels);
  labels->list[labels->count++] = (pprof_label) {.key = PPROF_STR(CONTPROF_STATE_LABEL),
                                                 .str = contprof_state_name(CONTPROF_STATE_RUNNING)};
}

// ---------------------------------------------------------------------------------------
// Garbage collection

// The GC's clock since the previous round: time for samples in a GC to carry.
static void read_gc_clock(collector_state *state) {
  if (!state->gc_clock_used) return;
  int64_t now = contprof_vm_gc_time_ns();
  int64_t delta = state->gc_clock_started ? now - state->gc_clock_seen_ns : 0;
  state->gc_clock_seen_ns = now;
  state->gc_clock_started = true;
  if (delta <= 0) return;
  state->gc_unplaced_cpu_ns += delta;
  state->gc_unplaced_wall_ns += delta;
  state->gc_time_ns += delta;
}

// The GC time a sample in a GC carries: all the GC's clock counted that no sample carried
// yet; without that clock (GC.measure_total_time off), the sample's own share.
static int64_t take_unplaced(const collector_state *state, int64_t *unplaced, int64_t sampled) {
  if (!state->gc_clock_used) return sampled;
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

// Records GC time on the stack the sampler holds (the thread's, as the GC left it), under
// "Garbage Collection" and the phase, and makes it a debt of the thread's clocks.
PPROF_MUST_CHECK
static pprof_status record_gc_sample(collector_state *state, VALUE thread, per_thread_context *context,
                                     const label_set *thread_labels, contprof_gc_moment moment, int64_t cpu,
                                     int64_t wall, pprof_error *error) {
  if (cpu <= 0 && wall <= 0) return PPROF_OK;
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
  contprof_stack_add_leaves(state->sampler, gc_frames[phase], phase == CONTPROF_GC_PHASE_UNKNOWN ? 1 : 2,
                            &state->last_gc_ref);
  contprof_stamp(state, 0, wall, NULL);
  int64_t values[PPROF_MAX_SAMPLE_TYPES];
  contprof_fill_values(state, values, cpu, wall);
  pprof_status status = contprof_stack_record(state->sampler, state->recorder, values, state->value_count, labels.list,
                                              labels.count, NULL, false, error);
  if (status != PPROF_OK) return status;
  context->gc_cpu_debt_ns += cpu;
  context->gc_wall_debt_ns += wall;
  state->gc_samples++;
  state->last_gc_thread = thread;
  state->last_gc_moment = moment;
  state->has_last_gc_ref = true;
  return PPROF_OK;
}

// At the end of a run: GC time no sample placed goes to the last sample in a GC (its
// debt to the thread that took it), else on the calling thread's stack.
PPROF_MUST_CHECK
static pprof_status place_unplaced_gc(collector_state *state, VALUE calling_thread, pprof_error *error) {
  int64_t cpu = state->gc_unplaced_cpu_ns, wall = state->gc_unplaced_wall_ns;
  state->gc_unplaced_cpu_ns = state->gc_unplaced_wall_ns = 0;
  if (cpu <= 0 && wall <= 0) return PPROF_OK;
  VALUE thread = NIL_P(state->last_gc_thread) ? calling_thread : state->last_gc_thread;
  if (NIL_P(thread) || !contprof_vm_thread_alive(thread) || contprof_profiler_thread(thread)) return PPROF_OK;
  per_thread_context *context = contprof_thread_context_for(state, thread);
  if (!context || !context->clocks_started) return PPROF_OK;
  if (state->has_last_gc_ref && add_to_earlier_record(state, &state->last_gc_ref, cpu, wall)) {
    context->gc_cpu_debt_ns += cpu;
    context->gc_wall_debt_ns += wall;
    return PPROF_OK;
  }
  label_set labels;
  thread_labels(context, thread, &labels);
  bool unused;
  pprof_status status = contprof_stack_read(state->sampler, thread, NULL, &unused, error);
  if (status != PPROF_OK) return status;
  return record_gc_sample(state, thread, context, &labels, state->last_gc_moment, cpu, wall, error);
}

// Records CPU counted off the GVL with the stack the signal handler captured there.
PPROF_MUST_CHECK
static pprof_status record_capture(collector_state *state, label_set *labels, const contprof_cpu_timer_reading *reading,
                                   int64_t cpu, pprof_error *error) {
  contprof_stack_use_frames(state->sampler, reading->captured_frames, reading->captured_total,
                            reading->captured_total);
  contprof_set_state(labels, reading->captured_holding_gvl ? CONTPROF_STATE_RUNNING : CONTPROF_STATE_NATIVE);
  contprof_stamp(state, 0, 0, NULL);
  int64_t values[PPROF_MAX_SAMPLE_TYPES];
  contprof_fill_values(state, values, cpu, 0);
  pprof_status status = contprof_stack_record(state->sampler, state->recorder, values, state->value_count,
                                              labels->list, labels->count, NULL, false, error);
  if (status == PPROF_OK) state->captured_samples++;
  return status;
}

// ---------------------------------------------------------------------------------------
// One thread in one round

typedef struct {
  collector_state *state;
  const contprof_round *round;
  VALUE current_thread;
  int64_t wall_now;
  size_t threads_seen;
  bool every_thread_idle; // (see contprof_thread_context_idle_rounds)
  pprof_status status;
  pprof_error *error;
} sampling_round;

static void note_failure(sampling_round *round, pprof_status status) {
  if (status != PPROF_OK && round->status == PPROF_OK) round->status = status;
}

// Whether the thread's signal mask blocks SIGPROF, as /proc tells (false when it cannot
// be read). Plain system calls: a round may make them.
static bool blocks_sigprof(pid_t tid) {
  if (tid <= 0) return false;
  char path[64], text[4096];
  snprintf(path, sizeof(path), "/proc/self/task/%d/status", (int) tid);
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  ssize_t length = read(fd, text, sizeof(text) - 1);
  close(fd);
  if (length <= 0) return false;
  text[length] = '\0';
  const char *line = strstr(text, "\nSigBlk:");
  unsigned long long mask = 0;
  return line && sscanf(line, "\nSigBlk: %llx", &mask) == 1 && (mask >> (SIGPROF - 1)) & 1;
}

// Whether the thread's timer goes unheard although the thread uses CPU. Every
// SILENT_TIMER_CHECK_ROUNDS wall rounds of silence its clock is read; a thread that used
// more than SILENT_TIMER_PERIODS periods of CPU (and SILENT_TIMER_SLACK_NS) from one such
// reading to the next, without one expiry, does not hear it. Silences are measured per
// timer: a timer replaced (a new period when sampling slows down to keep its overhead
// target, or speeds up again) restarts the check, since CPU counted under the old one may
// rightly have brought no expiry. The verdict says why when /proc shows it (SIGPROF in
// the thread's blocked mask, native code's pthread_sigmask), and is taken back as soon as
// an expiry arrives, or the timer is replaced (checked afresh). Meanwhile the thread's CPU
// is read from its clock; the baseline stays, so the CPU since its last expiry is not lost.
static bool timer_unheard(sampling_round *round, per_thread_context *context, VALUE thread,
                          const contprof_cpu_timer_reading *reading) {
  collector_state *state = round->state;
  bool new_timer = reading->timer_generation != context->silent_check_timer;
  if (new_timer || reading->expirations > 0) {
    context->silent_check_timer = reading->timer_generation;
    context->silent_check_started = false;
    context->silent_timer_rounds = 0;
    if (context->timer_unheard) {
      context->timer_unheard = false;
      state->threads_not_hearing_timers--;
      if (reading->expirations > 0) state->timers_heard_again++;
    }
    if (reading->expirations > 0) return false;
  }
  if (context->timer_unheard) return true;
  if (round->round->kind != CONTPROF_ROUND_WALL || ++context->silent_timer_rounds < SILENT_TIMER_CHECK_ROUNDS) {
    return false;
  }
  context->silent_timer_rounds = 0;
  int64_t clock_ns = thread_cpu_time_ns(context, thread);
  if (clock_ns < 0) return false;
  bool measured = context->silent_check_started;
  int64_t used = clock_ns - context->silent_check_cpu_ns;
  context->silent_check_started = true;
  context->silent_check_cpu_ns = clock_ns;
  if (!measured || used <= SILENT_TIMER_PERIODS * reading->period_ns + SILENT_TIMER_SLACK_NS) return false;
  context->timer_unheard = true;
  state->threads_not_hearing_timers++;
  if (blocks_sigprof(reading->tid)) {
    if (!context->counted_blocking_sigprof) state->threads_blocking_sigprof++;
    context->counted_blocking_sigprof = true;
  } else {
    if (!context->counted_silent_timer) state->threads_with_silent_timer++;
    context->counted_silent_timer = true;
  }
  return true;
}

// What of a thread's time in this round stood for GC time (its instant fell inside a GC),
// and what the GC was doing then.
typedef struct {
  int64_t cpu, wall;
  contprof_gc_moment cpu_moment, wall_moment;
} gc_share;

// The CPU its timer counted since the previous reading, split between the capture (if
// any), the GC (`gc`) and the thread's current stack; returns the latter. False when the
// thread has no timer, or one it does not hear.
static bool cpu_from_timer(sampling_round *round, VALUE thread, per_thread_context *context, label_set *labels,
                           int64_t *cpu_here, gc_share *gc) {
  const contprof_cpu_timer_source *timers = round->round->timers;
  contprof_cpu_timer_reading reading;
  if (!timers || !timers->read(timers->context, thread, &reading)) return false;
  if (timer_unheard(round, context, thread, &reading)) {
    timers->done(timers->context, thread);
    return false;
  }
  if (reading.expirations == 0 && round->round->kind == CONTPROF_ROUND_CPU) round->state->cpu_rounds_without_expiry++;
  *cpu_here = 0;
  if (reading.expirations > 0) {
    // Up to the expiry, not up to this round: the CPU a thread uses after an expiry goes
    // where the next one finds it. (Recording up to the round, the first safe point after
    // the expiry, would be exact for the rest of a long C method, but the baseline would
    // then move at the ends of methods: a method shorter than the interval that no expiry
    // hit would give its CPU to the next one that is hit, never receiving any in return.)
    int64_t delta = advance_cpu_baseline(context, reading.cpu_ns);
    int64_t period = timers->period_ns;
    if (reading.captured > 0 && reading.capture_valid && delta > 0) {
      int64_t captured = reading.captured_cpu_ns;
      if (captured > delta) captured = delta;
      // The profiler's own CPU on this thread (its rounds) is the application's nowhere:
      // what the rest of the stretch cannot pay back, the capture does. (A thread in C
      // methods at every expiry, as in a loop reading a clock, would otherwise never pay.)
      int64_t unpaid = context->own_cpu_debt_ns - (delta - captured);
      if (unpaid > 0) {
        int64_t paid = unpaid < captured ? unpaid : captured;
        captured -= paid;
        delta -= paid;
        context->own_cpu_debt_ns -= paid;
      }
      pprof_status status = captured > 0 ? record_capture(round->state, labels, &reading, captured, round->error) : PPROF_OK;
      contprof_end_extensions(context);
      if (status == PPROF_OK) delta -= captured;
      note_failure(round, status);
    }
    // Expirations during a GC stand for the GC's CPU (the final round settles instead).
    if (round->round->kind != CONTPROF_ROUND_FINAL && reading.in_gc > 0) {
      gc->cpu = stands_for_gc(&context->gc_cpu_debt_ns, &delta, (int64_t) reading.in_gc * period);
      gc->cpu_moment = reading.gc_moment;
    }
    pay_debt(&context->own_cpu_debt_ns, &delta);
    *cpu_here = delta;
    round->state->cpu_samples_from_timers++;
  }
  timers->done(timers->context, thread);
  return true;
}

// The CPU its clock shows since the previous record (threads without a timer, and every
// thread in the final round).
static int64_t cpu_from_clock(sampling_round *round, VALUE thread, per_thread_context *context, bool unchanged,
                              contprof_thread_state thread_state, gc_share *gc) {
  bool final = round->round->kind == CONTPROF_ROUND_FINAL;
  if (!final && unchanged && thread_state == CONTPROF_THREAD_WAITING &&
      context->cpu_reads_skipped < MAX_SKIPPED_CPU_READS) {
    context->cpu_reads_skipped++;
    return 0;
  }
  int64_t delta = advance_cpu_clock(round->state, context, thread);
  if (final) {
    settle_gc_debt(&context->gc_cpu_debt_ns, &delta);
  } else if (thread == round->round->gc_thread_at_tick) {
    gc->cpu = stands_for_gc(&context->gc_cpu_debt_ns, &delta, delta);
    gc->cpu_moment = round->round->gc_moment_at_tick;
  }
  pay_debt(&context->own_cpu_debt_ns, &delta);
  return delta;
}

// Records the GC time a thread's samples in a GC carry (the sampler holds its stack).
PPROF_MUST_CHECK
static pprof_status record_gc_share(collector_state *state, VALUE thread, per_thread_context *context,
                                    const label_set *labels, const gc_share *gc, pprof_error *error) {
  int64_t cpu = gc->cpu > 0 ? take_unplaced(state, &state->gc_unplaced_cpu_ns, gc->cpu) : 0;
  int64_t wall = gc->wall > 0 ? take_unplaced(state, &state->gc_unplaced_wall_ns, gc->wall) : 0;
  if (cpu <= 0 || wall <= 0 || gc->cpu_moment == gc->wall_moment) {
    return record_gc_sample(state, thread, context, labels, cpu > 0 ? gc->cpu_moment : gc->wall_moment, cpu, wall,
                            error);
  }
  pprof_status status = record_gc_sample(state, thread, context, labels, gc->cpu_moment, cpu, 0, error);
  if (status != PPROF_OK) return status;
  return record_gc_sample(state, thread, context, labels, gc->wall_moment, 0, wall, error);
}

// What the thread was doing at the round's tick. Where GVL waits are sampled (Ruby 3.1),
// a late round runs on whichever thread took the GVL since the tick, while the one that
// held it then may be waiting for it back: the tick's holder was running, and another
// thread runnable now was not (it waited for the GVL, most likely).
static contprof_thread_state state_at_tick(const sampling_round *round, VALUE thread) {
  contprof_thread_state state = contprof_vm_thread_state(thread);
  VALUE holder = round->round->holder_at_tick;
  if (round->round->kind != CONTPROF_ROUND_WALL || NIL_P(holder) ||
      contprof_vm_thread_gvl_waited_ns(thread, 0) >= 0) {
    return state;
  }
  if (state == CONTPROF_THREAD_GVL_WAIT && thread == holder) return CONTPROF_THREAD_RUNNING;
  if (state == CONTPROF_THREAD_RUNNING && thread != holder) return CONTPROF_THREAD_GVL_WAIT;
  return state;
}

// Records `cpu` and `wall` on the stack just read (the memo's when `unchanged`), labelled
// `labels` with `state_now`, its timeline record reaching `earlier_ns` further back; then
// keeps what later records add to: where the thread runs (when `runs_here`), its latest wall
// record, and the record of the stretch off the GVL a tick found it in (`in_stretch`).
static void record_on_stack(sampling_round *round, per_thread_context *context, label_set *labels, contprof_state state_now,
                            int64_t cpu, int64_t wall, int64_t earlier_ns, bool unchanged, bool in_stretch, bool runs_here) {
  collector_state *state = round->state;
  contprof_set_state(labels, state_now);
  if (state_now != context->state_at_previous_sample) context->memo.valid = false;
  context->state_at_previous_sample = state_now;
  int64_t values[PPROF_MAX_SAMPLE_TYPES];
  contprof_fill_values(state, values, cpu, wall);
  contprof_stamp(state, earlier_ns, wall, NULL);
  pprof_status status = contprof_stack_record(state->sampler, state->recorder, values, state->value_count, labels->list,
                                              labels->count, &context->memo, unchanged, round->error);
  if (status != PPROF_OK || !context->memo.valid) context->has_gvl_ref = false;
  if (in_stretch) contprof_stretch_recorded(context, &context->memo.ref, status == PPROF_OK && context->memo.valid);
  context->gvl_since_ns = 0; // (see contprof_end_extensions)
  if (status != PPROF_OK) return note_failure(round, status);
  if (!context->memo.valid) return;
  if (runs_here) {
    context->running_ref = context->memo.ref;
    context->has_running_ref = true;
  }
  if (wall > 0) {
    context->wall_ref = context->memo.ref;
    context->has_wall_ref = true;
  }
}

static void sample_thread(sampling_round *round, VALUE thread, per_thread_context *context) {
  collector_state *state = round->state;
  contprof_round_kind kind = round->round->kind;
  bool calling_thread = thread == round->current_thread;
  if (!context->clocks_started) {
    round->every_thread_idle = false;
    start_clocks(state, context, thread, round->wall_now);
    if (round->round->timers) { // expirations so far belong to before its clocks started
      contprof_cpu_timer_reading ignored;
      if (round->round->timers->read(round->round->timers->context, thread, &ignored)) {
        round->round->timers->done(round->round->timers->context, thread);
      }
    }
    return;
  }
  contprof_thread_state thread_state = state_at_tick(round, thread);
  label_set labels;
  thread_labels(context, thread, &labels);
  bool unchanged = false;
  bool stack_read = false;

  // CPU: counted by its timer, or read from its clock (also, for the rest, in the final round)
  int64_t timer_cpu = 0, clock_cpu = 0;
  gc_share gc = {0};
  bool timed = cpu_from_timer(round, thread, context, &labels, &timer_cpu, &gc);
  if ((!timed && kind == CONTPROF_ROUND_WALL) || kind == CONTPROF_ROUND_FINAL) {
    pprof_status status = contprof_stack_read(state->sampler, thread, &context->memo, &unchanged, round->error);
    if (status != PPROF_OK) return note_failure(round, status);
    stack_read = true;
    clock_cpu = cpu_from_clock(round, thread, context, unchanged, thread_state, &gc);
  }
  // A thread waiting in Ruby uses (almost) no CPU where it waits: what its clock shows
  // since its previous record was used before it started waiting. (CPU its timer counted
  // is where the timer found it: it stays.)
  if (thread_state == CONTPROF_THREAD_WAITING && clock_cpu > 0 && context->has_running_ref &&
      add_to_earlier_record(state, &context->running_ref, clock_cpu, 0)) {
    clock_cpu = 0;
  }
  int64_t cpu = timer_cpu + clock_cpu;

  // Wall time
  int64_t wall = 0, wall_from = 0;
  if (kind != CONTPROF_ROUND_CPU) {
    contprof_stretch_settle(state, context, thread, round->wall_now, round->round->tick_interval_ns);
    // (After the clock parked, the ticks that did not come would have moved it there.)
    if (state->wall_resumed_from_ns > context->wall_baseline_ns && state->wall_resumed_from_ns <= round->wall_now) {
      context->wall_baseline_ns = state->wall_resumed_from_ns;
    }
    wall_from = context->wall_baseline_ns;
    wall = advance_wall_clock(context, round->wall_now);
    if (kind == CONTPROF_ROUND_FINAL) {
      settle_gc_debt(&context->gc_wall_debt_ns, &wall);
    } else if (thread == round->round->gc_thread_at_tick) {
      gc.wall = stands_for_gc(&context->gc_wall_debt_ns, &wall, wall);
      gc.wall_moment = round->round->gc_moment_at_tick;
    }
  }
  int64_t gvl_wait = kind != CONTPROF_ROUND_CPU ? contprof_gvl_wait_share(state, context, thread, thread_state, kind == CONTPROF_ROUND_FINAL, round->wall_now, &wall) : 0;
  // A tick in a stretch off the GVL: that stretch is timed, not sampled (blocked_stretches.c).
  bool in_stretch = kind != CONTPROF_ROUND_CPU && contprof_stretch_at_tick(context, thread, calling_thread, wall_from, round->wall_now,
                                                                           round->round->tick_interval_ns, kind == CONTPROF_ROUND_FINAL, &wall);
  if (in_stretch) thread_state = CONTPROF_THREAD_NATIVE;
  bool in_gc = gc.cpu > 0 || gc.wall > 0;
  if (!in_stretch || cpu > 0 || gvl_wait > 0 || in_gc) round->every_thread_idle = false;

  // The final round's caller is inside the profiler's stop: its last stretch belongs to
  // where it was last seen.
  if (kind == CONTPROF_ROUND_FINAL && calling_thread) {
    if (cpu > 0 && context->has_running_ref && add_to_earlier_record(state, &context->running_ref, cpu, 0)) cpu = 0;
    if (wall > 0 && context->has_wall_ref && add_to_earlier_record(state, &context->wall_ref, 0, wall)) wall = 0;
  }
  // (A thread found waiting for the GVL may need a record of where it runs: see below. Its
  // wait itself may be too short to record yet: GVL_RECORD_MIN_NS.)
  bool found_waiting_for_gvl = gvl_wait > 0 || thread_state == CONTPROF_THREAD_GVL_WAIT;
  if (cpu == 0 && wall == 0 && gvl_wait == 0 && !in_gc && (!found_waiting_for_gvl || timed)) {
    return;
  }

  // Still in a stretch off the GVL that an earlier tick found: its stack and labels cannot
  // have changed, so its record takes the time without the stack being read again.
  if (in_stretch && !stack_read && cpu == 0 && gvl_wait == 0 && !in_gc && contprof_stretch_extend(state, context, wall)) {
    return;
  }
  if (!stack_read) {
    pprof_status status = contprof_stack_read(state->sampler, thread, &context->memo, &unchanged, round->error);
    if (status != PPROF_OK) return note_failure(round, status);
  }
  // What it was doing: a thread waiting for the GVL ran before it waited (its time
  // waiting is the GVL record's).
  contprof_thread_state before_wait = thread_state == CONTPROF_THREAD_GVL_WAIT ? CONTPROF_THREAD_RUNNING : thread_state;
  contprof_state state_now = contprof_state_of(&state->states, before_wait, contprof_stack_leaf(state->sampler));
  contprof_set_state(&labels, CONTPROF_STATE_RUNNING);
  if (in_gc) note_failure(round, record_gc_share(state, thread, context, &labels, &gc, round->error));
  if (in_gc) contprof_end_extensions(context);
  bool gvl_ref_fresh = false;
  if (!unchanged) context->has_gvl_ref = false;
  if (gvl_wait > 0) {
    // On the timeline, a thread waiting now ran first; one running now waited first.
    int64_t earlier = thread_state == CONTPROF_THREAD_GVL_WAIT ? 0 : wall;
    note_failure(round, contprof_gvl_wait_record(state, context, &labels, gvl_wait, earlier, unchanged, round->error));
    gvl_ref_fresh = !unchanged;
    context->memo.timed_since_ns = 0; // (see contprof_end_extensions)
  }
  // A thread that only waited for the GVL still gets a (zero) record of where it runs, when
  // that is new: the CPU its clock counts there may show up only later, once it waits in
  // Ruby. (A thread with a CPU timer has its CPU placed by the timer.)
  bool running_place_known = timed || (unchanged && context->has_running_ref);
  if (cpu == 0 && wall == 0 && (!found_waiting_for_gvl || running_place_known)) {
    if (gvl_ref_fresh) context->has_gvl_ref = false; // recorded on a stack its memo does not hold
    return;
  }
  record_on_stack(round, context, &labels, state_now, cpu, wall, thread_state == CONTPROF_THREAD_GVL_WAIT ? gvl_wait : 0,
                  unchanged, in_stretch, thread_state != CONTPROF_THREAD_WAITING && kind != CONTPROF_ROUND_FINAL);
}

static void sample_visited_thread(VALUE thread, void *data) {
  sampling_round *round = data;
  if (contprof_profiler_thread(thread)) return;
  round->threads_seen++;
  per_thread_context *context = contprof_thread_context_for(round->state, thread);
  if (context) sample_thread(round, thread, context);
}

// Forgets a thread's state (it died, or the process forked).
static void forget_thread(collector_state *state, VALUE thread, per_thread_context *context) {
  if (state->last_gc_thread == thread) state->last_gc_thread = Qnil;
  if (context->timer_unheard) state->threads_not_hearing_timers--;
  contprof_stack_memo_release(&context->memo);
  free(context);
}

static int forget_entry(st_data_t key, st_data_t value, st_data_t state) {
  forget_thread((collector_state *) state, (VALUE) key, (per_thread_context *) value);
  return ST_DELETE;
}

void contprof_thread_context_forget_all(collector_state *state) {
  st_foreach(state->threads, forget_entry, (st_data_t) state);
  state->last_gc_thread = Qnil;
  state->has_last_gc_ref = false;
}

static int remove_dead_thread(st_data_t key, st_data_t value, st_data_t state) {
  if (contprof_vm_thread_alive((VALUE) key) && !contprof_profiler_thread((VALUE) key)) return ST_CONTINUE;
  forget_thread((collector_state *) state, (VALUE) key, (per_thread_context *) value);
  return ST_DELETE;
}

pprof_status contprof_thread_context_sample(VALUE collector, const contprof_round *spec, pprof_error *error) {
  collector_state *state = RTYPEDDATA_DATA(collector);
  int64_t now = contprof_monotonic_ns();
  // A wall round charges up to its tick's instant (see "Where time goes").
  bool until_tick = spec->kind == CONTPROF_ROUND_WALL && spec->wall_until_ns > 0 && spec->wall_until_ns < now;
  sampling_round round = {.state = state,
                          .round = spec,
                          .current_thread = rb_thread_current(),
                          .wall_now = until_tick ? spec->wall_until_ns : now,
                          .every_thread_idle = spec->kind == CONTPROF_ROUND_WALL,
                          .status = PPROF_OK,
                          .error = error};
  state->round_timestamp_ns = state->timeline ? round.wall_now + state->realtime_offset_ns : 0;
  read_gc_clock(state);
  if (spec->kind == CONTPROF_ROUND_FINAL) note_failure(&round, place_unplaced_gc(state, round.current_thread, error));
  if (spec->kind == CONTPROF_ROUND_CPU) {
    per_thread_context *context =
      contprof_profiler_thread(round.current_thread) ? NULL : contprof_thread_context_for(state, round.current_thread);
    if (context) sample_thread(&round, round.current_thread, context);
  } else {
    contprof_vm_each_thread(sample_visited_thread, &round);
    // Every live thread has an entry; more entries than live threads means some died.
    if (state->threads->num_entries > round.threads_seen) st_foreach(state->threads, remove_dead_thread, (st_data_t) state);
  }
  // (A CPU round: a thread ran.)
  state->idle_rounds = round.every_thread_idle && round.threads_seen > 0 ? state->idle_rounds + 1 : 0;
  state->rounds++;
  return round.status;
}

void contprof_thread_context_wall_resumed_from(VALUE collector, int64_t instant_ns) {
  collector_state *state = RTYPEDDATA_DATA(collector);
  if (instant_ns > state->wall_resumed_from_ns) state->wall_resumed_from_ns = instant_ns;
}

unsigned contprof_thread_context_idle_rounds(VALUE collector) {
  collector_state *state = RTYPEDDATA_DATA(collector);
  return state->idle_rounds;
}

// Records `wall` of a stretch off the GVL that an earlier tick found the thread in, on
// its stack (which cannot have changed), as a wall round would.
static void record_stretch_time(sampling_round *round, VALUE thread, per_thread_context *context, int64_t wall) {
  collector_state *state = round->state;
  if (contprof_stretch_extend(state, context, wall)) return;
  label_set labels;
  thread_labels(context, thread, &labels);
  bool unchanged = false;
  pprof_status status = contprof_stack_read(state->sampler, thread, &context->memo, &unchanged, round->error);
  if (status != PPROF_OK) return note_failure(round, status);
  if (!unchanged) context->has_gvl_ref = false;
  contprof_state state_now = contprof_state_of(&state->states, CONTPROF_THREAD_NATIVE, contprof_stack_leaf(state->sampler));
  record_on_stack(round, context, &labels, state_now, 0, wall, 0, unchanged, true, true);
}

static void charge_visited_stretch(VALUE thread, void *data) {
  sampling_round *round = data;
  if (contprof_profiler_thread(thread)) return;
  st_data_t value;
  if (!st_lookup(round->state->threads, (st_data_t) thread, &value)) return;
  per_thread_context *context = (per_thread_context *) value;
  int64_t wall = contprof_stretch_due(context, thread, round->wall_now);
  if (wall > 0) record_stretch_time(round, thread, context, wall);
}

pprof_status contprof_thread_context_charge_stretches(VALUE collector, pprof_error *error) {
  collector_state *state = RTYPEDDATA_DATA(collector);
  sampling_round round = {
      .state = state, .current_thread = rb_thread_current(), .wall_now = contprof_monotonic_ns(), .status = PPROF_OK,
      .error = error};
  state->round_timestamp_ns = state->timeline ? round.wall_now + state->realtime_offset_ns : 0;
  contprof_vm_each_thread(charge_visited_stretch, &round);
  return round.status;
}

void contprof_thread_context_charge_own_cost(VALUE collector, VALUE thread, int64_t cpu_ns) {
  collector_state *state = RTYPEDDATA_DATA(collector);
  st_data_t value;
  if (cpu_ns > 0 && st_lookup(state->threads, (st_data_t) thread, &value)) {
    ((per_thread_context *) value)->own_cpu_debt_ns += cpu_ns;
  }
}

void contprof_thread_context_on_thread_begin(VALUE collector, VALUE thread) {
  collector_state *state = RTYPEDDATA_DATA(collector);
  if (contprof_profiler_thread(thread)) return;
  per_thread_context *context = contprof_thread_context_for(state, thread);
  if (!context) return;
  if (!context->clocks_started) {
    start_clocks(state, context, thread, contprof_monotonic_ns());
  } else if (!context->cpu_baseline_valid) {
    // Seen by a round before it started running: its CPU clock starts now.
    advance_cpu_clock(state, context, thread);
  }
}

pprof_status contprof_thread_context_on_thread_end(VALUE collector, VALUE thread, pprof_error *error) {
  collector_state *state = RTYPEDDATA_DATA(collector);
  if (contprof_profiler_thread(thread)) return PPROF_OK;
  st_data_t key = (st_data_t) thread, value;
  if (!st_lookup(state->threads, key, &value)) return PPROF_OK;
  // Its last stretch, as the final round would take it (the thread is not the caller of a
  // stop: it is where it ends).
  contprof_round final = {.kind = CONTPROF_ROUND_FINAL, .gc_thread_at_tick = Qnil, .holder_at_tick = Qnil};
  sampling_round round = {.state = state,
                          .round = &final,
                          .current_thread = Qnil,
                          .wall_now = contprof_monotonic_ns(),
                          .status = PPROF_OK,
                          .error = error};
  state->round_timestamp_ns = state->timeline ? round.wall_now + state->realtime_offset_ns : 0;
  sample_thread(&round, thread, (per_thread_context *) value);
  st_delete(state->threads, &key, &value);
  forget_thread(state, thread, (per_thread_context *) value);
  return round.status;
}

static void start_visited_thread_clocks(VALUE thread, void *data) {
  contprof_thread_context_on_thread_begin((VALUE) data, thread);
}

void contprof_thread_context_start_clocks(VALUE collector, bool gc_clock) {
  collector_state *state = RTYPEDDATA_DATA(collector);
  state->gc_clock_used = gc_clock;
  state->gc_clock_started = false;
  state->gc_unplaced_cpu_ns = state->gc_unplaced_wall_ns = 0;
  state->last_gc_thread = Qnil;
  state->has_last_gc_ref = false;
  state->realtime_offset_ns = contprof_realtime_ns() - contprof_monotonic_ns();
  read_gc_clock(state);
  contprof_vm_each_thread(start_visited_thread_clocks, (void *) collector);
}

