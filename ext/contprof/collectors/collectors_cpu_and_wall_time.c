// Contprof::Collectors::CpuAndWallTime (see collectors_cpu_and_wall_time.h).
//
// ## Where time goes
//
// Per thread it keeps two baselines: the CPU time recorded so far (a value of the
// thread's own CPU clock) and the wall time recorded so far (CLOCK_MONOTONIC). Every
// record moves one of them on by what it records, so the totals are exact whatever the
// rounds' timing: sampling decides *where* time goes, never *how much*.
//
// - Wall time is recorded only by wall rounds, which the worker takes at instants of its
//   own clock, whatever the threads do; each thread's stretch since its previous wall
//   sample goes to the stack it has then. Because those instants do not depend on the
//   threads, a stack gets wall time in proportion to how long threads stood there.
// - CPU time of a thread with a CPU timer is recorded when the timer expires: at instants
//   of the thread's own CPU clock, so a stack gets CPU in proportion to the CPU used there
//   (see sampling/cpu_timers.h). The CPU a timer counted while the thread did not hold
//   the GVL (native code, on its way into a wait) goes to the stack its signal handler
//   captured there.
// - CPU time of a thread without a timer (signals off, a refused timer) is read from its
//   clock at wall rounds and goes to its stack then, except that a thread found waiting
//   in Ruby (sleep, Queue#pop, Mutex#lock...) used that CPU before it started to wait: it
//   goes to the thread's last record taken while it was not waiting.
// - GC time is measured from the GC's events (gc_time.c) and recorded as its own samples,
//   "Garbage Collection" on top of the stack of the thread that ran it. That time is
//   also in the thread's clocks, so it becomes a *debt* of the thread's records: the
//   samples that stand for GC time are those whose instant fell inside a GC (a wall round
//   asked for while the thread ran a GC, a CPU timer that expired during one), and they
//   give their time to the debt instead of to the stack the GC left the thread at.
//   Sampling makes those samples add up to the GC's time on average (the debt may go
//   below zero meanwhile: GC time is recorded in chunks); the final round settles what is
//   left, either way, so the totals stay exact.
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
// cpu_and_wall_time_object.c). Entries of dead threads are removed at every wall round.
#include "collectors/collectors_cpu_and_wall_time.h"
#include "collectors/cpu_and_wall_time_state.h"

#include <ruby/st.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "collectors/collectors_stack.h"
#include "collectors/gc_time.h"
#include "collectors/profiler_threads.h"
#include "pprof/pprof_util.h"
#include "recorder/stack_recorder.h"
#include "ruby_helpers.h"

// ---------------------------------------------------------------------------------------
// Clocks

// The thread's CPU time, or -1 when it cannot be read (not started, or finished).
static int64_t thread_cpu_time_ns(per_thread_context *context, VALUE thread) {
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

static per_thread_context *context_for(collector_state *state, VALUE thread) {
  st_data_t value;
  if (st_lookup(state->threads, (st_data_t) thread, &value)) return (per_thread_context *) value;
  per_thread_context *context = ruby_xcalloc(1, sizeof(per_thread_context));
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
// amount and pays the GC debt. The debt may go below zero: GC time is recorded in chunks
// (see gc_time.h), so a sample may stand for GC time that is recorded only later.
static void stands_for_gc(int64_t *debt, int64_t *amount, int64_t share) {
  if (share > *amount) share = *amount;
  if (share <= 0) return;
  *debt -= share;
  *amount -= share;
}

// The final record of a thread settles its GC debt either way, so the totals are exact.
static void settle_gc_debt(int64_t *debt, int64_t *amount) {
  *amount -= *debt;
  *debt = 0;
  if (*amount < 0) *amount = 0;
}

// ---------------------------------------------------------------------------------------
// Recording

// A sample's values in the recorder's order: cpu-time, cpu-samples (1 when there is CPU),
// wall-time, for those of them the recorder has.
static void fill_values(const collector_state *state, int64_t values[PPROF_MAX_SAMPLE_TYPES], int64_t cpu_delta,
                        int64_t wall_delta) {
  memset(values, 0, PPROF_MAX_SAMPLE_TYPES * sizeof(int64_t));
  if (state->cpu_time_index >= 0) values[state->cpu_time_index] = cpu_delta;
  if (state->cpu_samples_index >= 0) values[state->cpu_samples_index] = cpu_delta > 0 ? 1 : 0;
  if (state->wall_time_index >= 0) values[state->wall_time_index] = wall_delta;
}

// Adds CPU and wall time to a record made earlier; false when that record is no longer
// in the active profile.
static bool add_to_earlier_record(collector_state *state, const pprof_sample_ref *ref, int64_t cpu_delta,
                                  int64_t wall_delta) {
  int64_t values[PPROF_MAX_SAMPLE_TYPES];
  fill_values(state, values, cpu_delta, wall_delta);
  return contprof_recorder_add_again(state->recorder, ref, values, state->value_count);
}

#define MAX_LABELS 5

typedef struct {
  pprof_label list[MAX_LABELS];
  size_t count;
} label_set;

// "thread id", and "thread name" when it has one. Changes the memo's validity when the
// name changed (Thread#name= stores a new frozen string, so an unchanged name is the same
// object).
static void thread_labels(per_thread_context *context, VALUE thread, label_set *labels) {
  VALUE name = contprof_vm_thread_name(thread);
  if (name != context->name_at_previous_sample) context->memo.valid = false;
  context->name_at_previous_sample = name;
  labels->count = 0;
  labels->list[labels->count++] =
    (pprof_label) {.key = PPROF_STR("thread id"), .str = {context->thread_id_label, context->thread_id_label_len}};
  if (RB_TYPE_P(name, T_STRING) && RSTRING_LEN(name) > 0) {
    labels->list[labels->count++] =
      (pprof_label) {.key = PPROF_STR("thread name"), .str = {RSTRING_PTR(name), (size_t) RSTRING_LEN(name)}};
  }
}

static pprof_str symbol_name(VALUE symbol) {
  if (!SYMBOL_P(symbol)) return (pprof_str) {NULL, 0};
  VALUE name = rb_sym2str(symbol);
  return (pprof_str) {RSTRING_PTR(name), (size_t) RSTRING_LEN(name)};
}

static const pprof_str gc_marking_frames[2] = {PPROF_STR("Marking"), PPROF_STR("Garbage Collection")};
static const pprof_str gc_sweeping_frames[2] = {PPROF_STR("Sweeping"), PPROF_STR("Garbage Collection")};

// Records one stretch of GC time on its thread's current stack, under "Garbage
// Collection" and the phase, and makes it a debt of the thread's clocks.
static pprof_status record_gc_stretch(collector_state *state, const contprof_gc_stretch *stretch, int64_t wall_now,
                                      pprof_error *error) {
  VALUE thread = stretch->thread;
  if (!contprof_vm_thread_alive(thread) || contprof_profiler_thread(thread)) return PPROF_OK;
  per_thread_context *context = context_for(state, thread);
  if (!context->clocks_started) {
    start_clocks(state, context, thread, wall_now); // the GC came before its clocks did: no debt
    return PPROF_OK;
  }
  label_set labels;
  thread_labels(context, thread, &labels);
  labels.list[labels.count++] =
    (pprof_label) {.key = PPROF_STR("gc type"), .str = stretch->major ? PPROF_STR("major") : PPROF_STR("minor")};
  pprof_str cause = symbol_name(stretch->cause);
  if (cause.len > 0) labels.list[labels.count++] = (pprof_label) {.key = PPROF_STR("gc cause"), .str = cause};
  pprof_str major_by = symbol_name(stretch->major_by);
  if (major_by.len > 0) labels.list[labels.count++] = (pprof_label) {.key = PPROF_STR("gc major reason"), .str = major_by};

  bool unused;
  pprof_status status = contprof_stack_read(state->sampler, thread, NULL, &unused, error);
  if (status != PPROF_OK) return status;
  contprof_stack_add_leaves(state->sampler,
                            stretch->phase == CONTPROF_GC_MARKING ? gc_marking_frames : gc_sweeping_frames, 2);
  int64_t values[PPROF_MAX_SAMPLE_TYPES];
  fill_values(state, values, stretch->wall_ns, stretch->wall_ns); // the GC runs on the CPU: its CPU is its time
  status = contprof_stack_record(state->sampler, state->recorder, values, state->value_count, labels.list,
                                 labels.count, NULL, false, error);
  if (status != PPROF_OK) return status;
  context->gc_cpu_debt_ns += stretch->wall_ns;
  context->gc_wall_debt_ns += stretch->wall_ns;
  state->gc_samples++;
  return PPROF_OK;
}

// Records pending GC time: in ordinary rounds the calling thread's only, once it reached
// the flush threshold (the round then runs where that GC was triggered); every thread's in
// the final round.
static pprof_status record_pending_gc(collector_state *state, VALUE thread, bool when_due, int64_t wall_now,
                                      pprof_error *error) {
  contprof_gc_stretch stretches[MAX_GC_STRETCHES_PER_ROUND];
  size_t count = contprof_gc_time_take(thread, when_due, stretches, MAX_GC_STRETCHES_PER_ROUND);
  pprof_status first = PPROF_OK;
  for (size_t i = 0; i < count; i++) {
    pprof_status status = record_gc_stretch(state, &stretches[i], wall_now, error);
    if (status != PPROF_OK && first == PPROF_OK) first = status;
  }
  return first;
}

// Records CPU counted off the GVL with the stack the signal handler captured there.
static pprof_status record_capture(collector_state *state, const label_set *labels,
                                   const contprof_cpu_timer_reading *reading, int64_t cpu, pprof_error *error) {
  contprof_stack_use_frames(state->sampler, reading->captured_frames, reading->captured_total,
                            reading->captured_total);
  int64_t values[PPROF_MAX_SAMPLE_TYPES];
  fill_values(state, values, cpu, 0);
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
  pprof_status status;
  pprof_error *error;
} sampling_round;

static void note_failure(sampling_round *round, pprof_status status) {
  if (status != PPROF_OK && round->status == PPROF_OK) round->status = status;
}

// Whether the thread's timer has gone unheard for a while although it used CPU: its
// signals are blocked. Reads its clock once every SILENT_TIMER_CHECK_ROUNDS wall rounds of
// silence; the baseline stays, so the CPU since the last expiry is then read from it.
static bool timer_unheard(sampling_round *round, VALUE thread, per_thread_context *context, int64_t period_ns) {
  if (context->timer_unheard) return true;
  if (round->round->kind != CONTPROF_ROUND_WALL || ++context->silent_timer_rounds < SILENT_TIMER_CHECK_ROUNDS) {
    return false;
  }
  context->silent_timer_rounds = 0;
  int64_t clock_ns = thread_cpu_time_ns(context, thread);
  if (!context->cpu_baseline_valid || clock_ns - context->cpu_baseline_ns <= SILENT_TIMER_PERIODS * period_ns) {
    return false;
  }
  context->timer_unheard = true;
  round->state->threads_not_hearing_timers++;
  return true;
}

// The CPU its timer counted since the previous reading, split between the capture (if
// any), the GC debt and the thread's current stack; returns the latter. False when the
// thread has no timer, or one it does not hear.
static bool cpu_from_timer(sampling_round *round, VALUE thread, per_thread_context *context, const label_set *labels,
                           int64_t *cpu_here) {
  const contprof_cpu_timer_source *timers = round->round->timers;
  contprof_cpu_timer_reading reading;
  if (!timers || !timers->read(timers->context, thread, &reading)) return false;
  if (reading.expirations == 0 && timer_unheard(round, thread, context, timers->period_ns)) {
    timers->done(timers->context, thread);
    return false;
  }
  if (reading.expirations > 0) context->silent_timer_rounds = 0;
  *cpu_here = 0;
  if (reading.expirations > 0) {
    int64_t delta = advance_cpu_baseline(context, reading.cpu_ns);
    int64_t period = timers->period_ns;
    if (reading.captured > 0 && reading.capture_valid && delta > 0) {
      int64_t captured = (int64_t) reading.captured * period;
      if (captured > delta) captured = delta;
      pprof_status status = record_capture(round->state, labels, &reading, captured, round->error);
      if (status == PPROF_OK) delta -= captured;
      note_failure(round, status);
    }
    // Expirations during a GC stand for the GC's CPU, already recorded from its events.
    stands_for_gc(&context->gc_cpu_debt_ns, &delta, (int64_t) reading.in_gc * period);
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
                              contprof_thread_state thread_state) {
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
    stands_for_gc(&context->gc_cpu_debt_ns, &delta, delta);
  }
  pay_debt(&context->own_cpu_debt_ns, &delta);
  return delta;
}

static void sample_thread(sampling_round *round, VALUE thread, per_thread_context *context) {
  collector_state *state = round->state;
  contprof_round_kind kind = round->round->kind;
  bool calling_thread = thread == round->current_thread;
  if (!context->clocks_started) {
    start_clocks(state, context, thread, round->wall_now);
    if (round->round->timers) { // expirations so far belong to before its clocks started
      contprof_cpu_timer_reading ignored;
      if (round->round->timers->read(round->round->timers->context, thread, &ignored)) {
        round->round->timers->done(round->round->timers->context, thread);
      }
    }
    return;
  }
  contprof_thread_state thread_state = contprof_vm_thread_state(thread);
  label_set labels;
  thread_labels(context, thread, &labels);
  bool unchanged = false;
  bool stack_read = false;

  // CPU: counted by its timer, or read from its clock (also, for the rest, in the final round)
  int64_t timer_cpu = 0, clock_cpu = 0;
  bool timed = cpu_from_timer(round, thread, context, &labels, &timer_cpu);
  if ((!timed && kind == CONTPROF_ROUND_WALL) || kind == CONTPROF_ROUND_FINAL) {
    pprof_status status = contprof_stack_read(state->sampler, thread, &context->memo, &unchanged, round->error);
    if (status != PPROF_OK) return note_failure(round, status);
    stack_read = true;
    clock_cpu = cpu_from_clock(round, thread, context, unchanged, thread_state);
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
  int64_t wall = 0;
  if (kind != CONTPROF_ROUND_CPU) {
    wall = advance_wall_clock(context, round->wall_now);
    if (kind == CONTPROF_ROUND_FINAL) {
      settle_gc_debt(&context->gc_wall_debt_ns, &wall);
    } else if (thread == round->round->gc_thread_at_tick) {
      stands_for_gc(&context->gc_wall_debt_ns, &wall, wall);
    }
  }

  // The final round's caller is inside the profiler's stop: its last stretch belongs to
  // where it was last seen.
  if (kind == CONTPROF_ROUND_FINAL && calling_thread) {
    if (cpu > 0 && context->has_running_ref && add_to_earlier_record(state, &context->running_ref, cpu, 0)) cpu = 0;
    if (wall > 0 && context->has_wall_ref && add_to_earlier_record(state, &context->wall_ref, 0, wall)) wall = 0;
  }
  if (cpu == 0 && wall == 0) return;

  if (!stack_read) {
    pprof_status status = contprof_stack_read(state->sampler, thread, &context->memo, &unchanged, round->error);
    if (status != PPROF_OK) return note_failure(round, status);
  }
  int64_t values[PPROF_MAX_SAMPLE_TYPES];
  fill_values(state, values, cpu, wall);
  pprof_status status = contprof_stack_record(state->sampler, state->recorder, values, state->value_count, labels.list,
                                              labels.count, &context->memo, unchanged, round->error);
  if (status != PPROF_OK) return note_failure(round, status);
  if (!context->memo.valid) return;
  if (thread_state != CONTPROF_THREAD_WAITING && kind != CONTPROF_ROUND_FINAL) {
    context->running_ref = context->memo.ref;
    context->has_running_ref = true;
  }
  if (wall > 0) {
    context->wall_ref = context->memo.ref;
    context->has_wall_ref = true;
  }
}

static void sample_visited_thread(VALUE thread, void *data) {
  sampling_round *round = data;
  if (contprof_profiler_thread(thread)) return;
  round->threads_seen++;
  sample_thread(round, thread, context_for(round->state, thread));
}

static int remove_dead_thread(st_data_t key, st_data_t value, st_data_t unused) {
  if (contprof_vm_thread_alive((VALUE) key) && !contprof_profiler_thread((VALUE) key)) return ST_CONTINUE;
  contprof_cpu_and_wall_time_free_context((per_thread_context *) value);
  return ST_DELETE;
}

pprof_status contprof_cpu_and_wall_time_sample(VALUE collector, const contprof_round *spec, pprof_error *error) {
  collector_state *state = RTYPEDDATA_DATA(collector);
  sampling_round round = {.state = state,
                          .round = spec,
                          .current_thread = rb_thread_current(),
                          .wall_now = contprof_monotonic_ns(),
                          .status = PPROF_OK,
                          .error = error};
  bool final = spec->kind == CONTPROF_ROUND_FINAL;
  note_failure(&round, record_pending_gc(state, final ? Qnil : round.current_thread, !final, round.wall_now, error));
  if (spec->kind == CONTPROF_ROUND_CPU) {
    if (!contprof_profiler_thread(round.current_thread)) {
      sample_thread(&round, round.current_thread, context_for(state, round.current_thread));
    }
  } else {
    contprof_vm_each_thread(sample_visited_thread, &round);
    // Every live thread has an entry; more entries than live threads means some died.
    if (state->threads->num_entries > round.threads_seen) st_foreach(state->threads, remove_dead_thread, 0);
  }
  state->sample_rounds++;
  return round.status;
}

void contprof_cpu_and_wall_time_charge_own_cost(VALUE collector, VALUE thread, int64_t cpu_ns) {
  collector_state *state = RTYPEDDATA_DATA(collector);
  st_data_t value;
  if (cpu_ns > 0 && st_lookup(state->threads, (st_data_t) thread, &value)) {
    ((per_thread_context *) value)->own_cpu_debt_ns += cpu_ns;
  }
}

void contprof_cpu_and_wall_time_on_thread_begin(VALUE collector, VALUE thread) {
  collector_state *state = RTYPEDDATA_DATA(collector);
  if (contprof_profiler_thread(thread)) return;
  per_thread_context *context = context_for(state, thread);
  if (!context->clocks_started) {
    start_clocks(state, context, thread, contprof_monotonic_ns());
  } else if (!context->cpu_baseline_valid) {
    // Seen by a round before it started running: its CPU clock starts now.
    advance_cpu_clock(state, context, thread);
  }
}

pprof_status contprof_cpu_and_wall_time_on_thread_end(VALUE collector, VALUE thread, pprof_error *error) {
  collector_state *state = RTYPEDDATA_DATA(collector);
  if (contprof_profiler_thread(thread)) return PPROF_OK;
  st_data_t key = (st_data_t) thread, value;
  if (!st_lookup(state->threads, key, &value)) return PPROF_OK;
  // Its last stretch, as the final round would take it (the thread is not the caller of a
  // stop: it is where it ends).
  contprof_round final = {.kind = CONTPROF_ROUND_FINAL, .gc_thread_at_tick = Qnil};
  sampling_round round = {.state = state,
                          .round = &final,
                          .current_thread = Qnil,
                          .wall_now = contprof_monotonic_ns(),
                          .status = PPROF_OK,
                          .error = error};
  note_failure(&round, record_pending_gc(state, thread, false, round.wall_now, error));
  sample_thread(&round, thread, (per_thread_context *) value);
  st_delete(state->threads, &key, &value);
  contprof_cpu_and_wall_time_free_context((per_thread_context *) value);
  return round.status;
}

static void start_visited_thread_clocks(VALUE thread, void *data) {
  contprof_cpu_and_wall_time_on_thread_begin((VALUE) data, thread);
}

void contprof_cpu_and_wall_time_start_clocks(VALUE collector) {
  contprof_vm_each_thread(start_visited_thread_clocks, (void *) collector);
}

