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
//
// ## A thread in a round
//
// sample_thread takes a thread's slice of time since its previous record in steps: its
// CPU (from its timer, or its clock), then its wall time (less what was a GVL wait, or a
// stretch off the GVL a tick found it in, timed), each with the part of it that stood for
// GC time; and records the slice: the GC's share, the GVL wait, and the rest on its stack.
#include "collectors/thread_context.h"
#include "collectors/thread_context_state.h"
#include "collectors/thread_labels.h"

#include <ruby/st.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fault_injection.h"
#include "profiler_threads.h"
#include "pprof/pprof_util.h"
#include "recorder/stack_recorder.h"
#include "ruby_helpers.h"

// ---------------------------------------------------------------------------------------
// Threads and their clocks

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
  context->labels_seen.name = Qnil;
  st_insert(state->threads, (st_data_t) thread, (st_data_t) context);
  return context;
}

// Reads the thread's CPU clock (a system call, counted) and makes it the new baseline.
static int64_t advance_cpu_clock(collector_state *state, per_thread_context *context, VALUE thread) {
  state->cpu.clock_reads++;
  return contprof_advance_cpu_clock(context, thread);
}

static void start_clocks(collector_state *state, per_thread_context *context, VALUE thread, int64_t wall_now) {
  advance_cpu_clock(state, context, thread);
  contprof_thread_clocks_start(&context->clocks, wall_now);
  contprof_gvl_waits_start(&context->gvl, thread, wall_now);
  contprof_thread_gc_debt_start(&context->gc_debt);
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

// A thread's slice of time in a round, as sample_thread's steps measure it.
typedef struct {
  contprof_thread_state thread_state; // what it was doing at the round's tick
  label_set labels;
  bool stack_read; // its stack was read this round (the sampler holds it)
  bool unchanged; // and was the one its memo holds
  bool timed; // its CPU came from its timer
  int64_t cpu, wall;
  int64_t gvl_wait; // wall time it waited for the GVL, taken out of `wall`
  int64_t wall_from; // its wall baseline before this round
  bool in_stretch; // the tick fell in a stretch off the GVL: `wall` is that stretch's
  contprof_gc_share gc; // what of its time stood for GC time, out of `cpu` and `wall`
} thread_slice;

static void note_failure(sampling_round *round, pprof_status status) {
  if (status != PPROF_OK && round->status == PPROF_OK) round->status = status;
}

static bool in_gc(const thread_slice *slice) { return slice->gc.cpu > 0 || slice->gc.wall > 0; }

// Reads the thread's stack into the sampler (its memo's when unchanged); false on failure.
static bool read_stack(sampling_round *round, VALUE thread, per_thread_context *context, thread_slice *slice) {
  pprof_status status = contprof_stack_read(round->state->sampler, thread, &context->memo, &slice->unchanged, round->error);
  note_failure(round, status);
  slice->stack_read = status == PPROF_OK;
  return slice->stack_read;
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
  if (status == PPROF_OK) state->cpu.captured_samples++;
  return status;
}

// The CPU its timer counted since the previous reading, split between the capture (if
// any), the GC (`slice->gc`) and the thread's current stack; returns the latter in
// `*cpu_here`. False when the thread has no timer, or one it does not hear.
static bool cpu_from_timer(sampling_round *round, VALUE thread, per_thread_context *context, thread_slice *slice,
                           int64_t *cpu_here) {
  const contprof_cpu_timer_source *timers = round->round->timers;
  contprof_cpu_timer_reading reading;
  if (!timers || !timers->read(timers->context, thread, &reading)) return false;
  if (contprof_timer_unheard(&round->state->timer_health, context, thread, &reading, round->round->kind)) {
    timers->done(timers->context, thread);
    return false;
  }
  if (reading.expirations == 0 && round->round->kind == CONTPROF_ROUND_CPU) round->state->cpu.rounds_without_expiry++;
  *cpu_here = 0;
  if (reading.expirations > 0) {
    // Up to the expiry, not up to this round: the CPU a thread uses after an expiry goes
    // where the next one finds it. (Recording up to the round, the first safe point after
    // the expiry, would be exact for the rest of a long C method, but the baseline would
    // then move at the ends of methods: a method shorter than the interval that no expiry
    // hit would give its CPU to the next one that is hit, never receiving any in return.)
    int64_t delta = contprof_advance_cpu_baseline(&context->clocks, reading.cpu_ns);
    int64_t period = timers->period_ns;
    if (reading.captured > 0 && reading.capture_valid && delta > 0) {
      int64_t captured = reading.captured_cpu_ns;
      if (captured > delta) captured = delta;
      contprof_pay_own_cpu_from_capture(&context->clocks, &captured, &delta);
      pprof_status status =
        captured > 0 ? record_capture(round->state, &slice->labels, &reading, captured, round->error) : PPROF_OK;
      contprof_end_extensions(context);
      if (status == PPROF_OK) delta -= captured;
      note_failure(round, status);
    }
    // Expirations during a GC stand for the GC's CPU (the final round settles instead).
    if (round->round->kind != CONTPROF_ROUND_FINAL && reading.in_gc > 0) {
      slice->gc.cpu = contprof_gc_stands_for(&context->gc_debt.cpu_ns, &delta, (int64_t) reading.in_gc * period);
      slice->gc.cpu_moment = reading.gc_moment;
    }
    contprof_pay_own_cpu(&context->clocks, &delta);
    *cpu_here = delta;
    round->state->cpu.samples_from_timers++;
  }
  timers->done(timers->context, thread);
  return true;
}

// The CPU its clock shows since the previous record (threads without a timer, and every
// thread in the final round).
static int64_t cpu_from_clock(sampling_round *round, VALUE thread, per_thread_context *context, thread_slice *slice) {
  bool final = round->round->kind == CONTPROF_ROUND_FINAL;
  if (!final && slice->unchanged && slice->thread_state == CONTPROF_THREAD_WAITING &&
      contprof_may_skip_cpu_read(&context->clocks)) {
    return 0;
  }
  int64_t delta = advance_cpu_clock(round->state, context, thread);
  if (final) {
    contprof_gc_settle(&context->gc_debt.cpu_ns, &delta);
  } else if (thread == round->round->gc_thread_at_tick) {
    slice->gc.cpu = contprof_gc_stands_for(&context->gc_debt.cpu_ns, &delta, delta);
    slice->gc.cpu_moment = round->round->gc_moment_at_tick;
  }
  contprof_pay_own_cpu(&context->clocks, &delta);
  return delta;
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
  if (status != PPROF_OK || !context->memo.valid) contprof_gvl_waits_forget_record(&context->gvl);
  if (in_stretch) contprof_stretch_recorded(context, &context->memo.ref, status == PPROF_OK && context->memo.valid);
  contprof_gvl_waits_end_extension(&context->gvl); // (see contprof_end_extensions)
  if (status != PPROF_OK) {
    note_failure(round, status);
    return;
  }
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

// A thread's first sample only starts its clocks (unless its thread-begin hook did).
static void start_thread_clocks(sampling_round *round, VALUE thread, per_thread_context *context) {
  round->every_thread_idle = false;
  start_clocks(round->state, context, thread, round->wall_now);
  const contprof_cpu_timer_source *timers = round->round->timers;
  if (timers) { // expirations so far belong to before its clocks started
    contprof_cpu_timer_reading ignored;
    if (timers->read(timers->context, thread, &ignored)) timers->done(timers->context, thread);
  }
}

// Its CPU: counted by its timer, or read from its clock (also, for the rest, in the final
// round, which reads its stack for that). False when the stack could not be read.
static bool measure_cpu(sampling_round *round, VALUE thread, per_thread_context *context, thread_slice *slice) {
  contprof_round_kind kind = round->round->kind;
  int64_t timer_cpu = 0, clock_cpu = 0;
  slice->timed = cpu_from_timer(round, thread, context, slice, &timer_cpu);
  if ((!slice->timed && kind == CONTPROF_ROUND_WALL) || kind == CONTPROF_ROUND_FINAL) {
    if (!read_stack(round, thread, context, slice)) return false;
    clock_cpu = cpu_from_clock(round, thread, context, slice);
  }
  // A thread waiting in Ruby uses (almost) no CPU where it waits: what its clock shows
  // since its previous record was used before it started waiting. (CPU its timer counted
  // is where the timer found it: it stays.)
  if (slice->thread_state == CONTPROF_THREAD_WAITING && clock_cpu > 0 && context->has_running_ref &&
      contprof_add_to_earlier_record(round->state, &context->running_ref, clock_cpu, 0)) {
    clock_cpu = 0;
  }
  slice->cpu = timer_cpu + clock_cpu;
  return true;
}

// Its wall time (wall and final rounds): the stretch since its previous wall record, up to
// the round's instant, less what stood for GC time and what was a wait for the GVL; or,
// when the tick fell in a stretch off the GVL, that stretch's time (blocked_stretches.c).
static void measure_wall(sampling_round *round, VALUE thread, per_thread_context *context, thread_slice *slice) {
  collector_state *state = round->state;
  const contprof_round *spec = round->round;
  bool final = spec->kind == CONTPROF_ROUND_FINAL;
  contprof_stretch_settle(state, context, thread, round->wall_now, spec->tick_interval_ns);
  contprof_resume_wall_baseline(&context->clocks, state->wall_resumed_from_ns, round->wall_now);
  slice->wall_from = context->clocks.wall_baseline_ns;
  slice->wall = contprof_advance_wall_baseline(&context->clocks, round->wall_now);
  if (final) {
    contprof_gc_settle(&context->gc_debt.wall_ns, &slice->wall);
  } else if (thread == spec->gc_thread_at_tick) {
    slice->gc.wall = contprof_gc_stands_for(&context->gc_debt.wall_ns, &slice->wall, slice->wall);
    slice->gc.wall_moment = spec->gc_moment_at_tick;
  }
  slice->gvl_wait =
    contprof_gvl_wait_share(state, context, thread, slice->thread_state, final, round->wall_now, &slice->wall);
  slice->in_stretch = contprof_stretch_at_tick(context, thread, thread == round->current_thread, slice->wall_from,
                                               round->wall_now, spec->tick_interval_ns, final, &slice->wall);
  if (slice->in_stretch) slice->thread_state = CONTPROF_THREAD_NATIVE;
}

// The final round's caller is inside the profiler's stop: its last stretch belongs to
// where it was last seen.
static void give_to_last_records(collector_state *state, per_thread_context *context, thread_slice *slice) {
  if (slice->cpu > 0 && context->has_running_ref &&
      contprof_add_to_earlier_record(state, &context->running_ref, slice->cpu, 0)) {
    slice->cpu = 0;
  }
  if (slice->wall > 0 && context->has_wall_ref && contprof_add_to_earlier_record(state, &context->wall_ref, 0, slice->wall)) {
    slice->wall = 0;
  }
}

// (A thread found waiting for the GVL may need a record of where it runs: see
// needs_running_record. Its wait itself may be too short to record yet: GVL_RECORD_MIN_NS.)
static bool found_waiting_for_gvl(const thread_slice *slice) {
  return slice->gvl_wait > 0 || slice->thread_state == CONTPROF_THREAD_GVL_WAIT;
}

static bool worth_recording(const thread_slice *slice) {
  return slice->cpu != 0 || slice->wall != 0 || slice->gvl_wait != 0 || in_gc(slice) ||
         (found_waiting_for_gvl(slice) && !slice->timed);
}

// The tick found it in a stretch off the GVL, using no CPU: nothing to record but that
// stretch's time (see contprof_thread_context_idle_rounds).
static bool idle_in_stretch(const thread_slice *slice) {
  return slice->in_stretch && slice->cpu == 0 && slice->gvl_wait == 0 && !in_gc(slice);
}

// Still in a stretch off the GVL that an earlier tick found: its stack and labels cannot
// have changed, so its record takes the time without the stack being read again.
static bool extends_stretch(collector_state *state, per_thread_context *context, const thread_slice *slice) {
  return idle_in_stretch(slice) && !slice->stack_read && contprof_stretch_extend(state, context, slice->wall);
}

// Records its GVL wait on the stack just read; true when that made a record its memo does
// not hold.
static bool record_gvl_wait(sampling_round *round, per_thread_context *context, thread_slice *slice) {
  if (!slice->unchanged) contprof_gvl_waits_forget_record(&context->gvl);
  if (slice->gvl_wait <= 0) return false;
  // On the timeline, a thread waiting now ran first; one running now waited first.
  int64_t earlier = slice->thread_state == CONTPROF_THREAD_GVL_WAIT ? 0 : slice->wall;
  note_failure(round, contprof_gvl_wait_record(round->state, context, &slice->labels, slice->gvl_wait, earlier,
                                               slice->unchanged, round->error));
  context->memo.timed_since_ns = 0; // (see contprof_end_extensions)
  return !slice->unchanged;
}

// A thread that only waited for the GVL still gets a (zero) record of where it runs, when
// that is new: the CPU its clock counts there may show up only later, once it waits in
// Ruby. (A thread with a CPU timer has its CPU placed by the timer.)
static bool needs_running_record(const per_thread_context *context, const thread_slice *slice) {
  if (slice->cpu != 0 || slice->wall != 0) return true;
  bool running_place_known = slice->timed || (slice->unchanged && context->has_running_ref);
  return found_waiting_for_gvl(slice) && !running_place_known;
}

// Records the slice on the stack the sampler holds: the GC's share, the GVL wait, then
// the rest.
static void record_slice(sampling_round *round, VALUE thread, per_thread_context *context, thread_slice *slice) {
  collector_state *state = round->state;
  // What it was doing: a thread waiting for the GVL ran before it waited (its time
  // waiting is the GVL record's).
  bool gvl_waiting = slice->thread_state == CONTPROF_THREAD_GVL_WAIT;
  contprof_state state_now = contprof_state_of(&state->states, gvl_waiting ? CONTPROF_THREAD_RUNNING : slice->thread_state,
                                               contprof_stack_leaf(state->sampler));
  contprof_set_state(&slice->labels, CONTPROF_STATE_RUNNING);
  if (in_gc(slice)) {
    note_failure(round, contprof_gc_record_share(state, thread, context, &slice->labels, &slice->gc, round->error));
    contprof_end_extensions(context);
  }
  bool gvl_record_fresh = record_gvl_wait(round, context, slice);
  if (!needs_running_record(context, slice)) {
    if (gvl_record_fresh) contprof_gvl_waits_forget_record(&context->gvl); // on a stack its memo does not hold
    return;
  }
  record_on_stack(round, context, &slice->labels, state_now, slice->cpu, slice->wall, gvl_waiting ? slice->gvl_wait : 0,
                  slice->unchanged, slice->in_stretch,
                  slice->thread_state != CONTPROF_THREAD_WAITING && round->round->kind != CONTPROF_ROUND_FINAL);
}

// A thread's slice of time since its previous record, in a round: measured (CPU, then wall
// time), then recorded, unless a stretch's record takes it or there is nothing to record.
static void sample_thread(sampling_round *round, VALUE thread, per_thread_context *context) {
  contprof_round_kind kind = round->round->kind;
  if (!context->clocks.started) {
    start_thread_clocks(round, thread, context);
    return;
  }
  thread_slice slice = {.thread_state = contprof_thread_state_at_tick(round->round, thread)};
  contprof_thread_labels(context, thread, &slice.labels);
  if (!measure_cpu(round, thread, context, &slice)) return;
  if (kind != CONTPROF_ROUND_CPU) measure_wall(round, thread, context, &slice);
  if (!idle_in_stretch(&slice)) round->every_thread_idle = false;
  if (kind == CONTPROF_ROUND_FINAL && thread == round->current_thread) give_to_last_records(round->state, context, &slice);
  if (!worth_recording(&slice) || extends_stretch(round->state, context, &slice)) return;
  if (!slice.stack_read && !read_stack(round, thread, context, &slice)) return;
  record_slice(round, thread, context, &slice);
}

// At the end of a run: GC time no sample placed goes to the last sample in a GC (its
// debt to the thread that took it), else on the calling thread's stack.
static void place_unplaced_gc(sampling_round *round) {
  collector_state *state = round->state;
  contprof_gc_share unplaced = contprof_gc_take_unplaced(&state->gc);
  if (unplaced.cpu <= 0 && unplaced.wall <= 0) return;
  VALUE thread = NIL_P(state->gc.last_thread) ? round->current_thread : state->gc.last_thread;
  if (NIL_P(thread) || !contprof_vm_thread_alive(thread) || contprof_profiler_thread(thread)) return;
  per_thread_context *context = contprof_thread_context_for(state, thread);
  if (!context || !context->clocks.started || contprof_gc_add_to_last_sample(state, context, &unplaced)) return;
  label_set labels;
  contprof_thread_labels(context, thread, &labels);
  bool unused;
  pprof_status status = contprof_stack_read(state->sampler, thread, NULL, &unused, round->error);
  if (status == PPROF_OK) {
    status = contprof_gc_record_sample(state, thread, context, &labels, state->gc.last_moment, unplaced.cpu, unplaced.wall,
                                       round->error);
  }
  note_failure(round, status);
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
  contprof_gc_forget_thread(&state->gc, thread);
  contprof_timer_health_forget(&state->timer_health, &context->timer_health);
  contprof_stack_memo_release(&context->memo);
  free(context);
}

static int forget_entry(st_data_t key, st_data_t value, st_data_t state) {
  forget_thread((collector_state *) state, (VALUE) key, (per_thread_context *) value);
  return ST_DELETE;
}

void contprof_thread_context_forget_all(collector_state *state) {
  st_foreach(state->threads, forget_entry, (st_data_t) state);
  contprof_gc_forget_all(&state->gc);
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
  contprof_timeline_begin_round(&state->timeline, round.wall_now);
  contprof_gc_read_clock(&state->gc);
  if (spec->kind == CONTPROF_ROUND_FINAL) place_unplaced_gc(&round);
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
  contprof_thread_labels(context, thread, &labels);
  bool unchanged = false;
  pprof_status status = contprof_stack_read(state->sampler, thread, &context->memo, &unchanged, round->error);
  if (status != PPROF_OK) {
    note_failure(round, status);
    return;
  }
  if (!unchanged) contprof_gvl_waits_forget_record(&context->gvl);
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
  contprof_timeline_begin_round(&state->timeline, round.wall_now);
  contprof_vm_each_thread(charge_visited_stretch, &round);
  return round.status;
}

void contprof_thread_context_charge_own_cost(VALUE collector, VALUE thread, int64_t cpu_ns) {
  collector_state *state = RTYPEDDATA_DATA(collector);
  st_data_t value;
  if (cpu_ns > 0 && st_lookup(state->threads, (st_data_t) thread, &value)) {
    contprof_owe_own_cpu(&((per_thread_context *) value)->clocks, cpu_ns);
  }
}

void contprof_thread_context_on_thread_begin(VALUE collector, VALUE thread) {
  collector_state *state = RTYPEDDATA_DATA(collector);
  if (contprof_profiler_thread(thread)) return;
  per_thread_context *context = contprof_thread_context_for(state, thread);
  if (!context) return;
  if (!context->clocks.started) {
    start_clocks(state, context, thread, contprof_monotonic_ns());
  } else if (!context->clocks.cpu_baseline_valid) {
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
  contprof_timeline_begin_round(&state->timeline, round.wall_now);
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
  contprof_gc_time_start(&state->gc, gc_clock);
  contprof_timeline_start(&state->timeline);
  contprof_gc_read_clock(&state->gc);
  contprof_vm_each_thread(start_visited_thread_clocks, (void *) collector);
}

