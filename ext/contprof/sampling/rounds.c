// The worker's sampling job and the wall clock's ticks (see worker.h).
//
// Every round runs as the same postponed job (contprof_worker_job) on a thread holding the
// GVL, the only safe place to read threads' stacks: a wall round when the clock's tick
// asked for one, else a CPU round of the thread it runs on (its CPU timer's signal queued
// it). Where each kind of time comes from is in collectors/thread_context.c; why the
// clock ticks as it does, in wall_clock.c.
//
// ## Nothing but C in a round
//
// A round runs inside the application's thread, at a point where Ruby checks interrupts.
// It calls no Ruby method (Ruby checks interrupts again on the way out of one: a pending
// Thread#raise or Timeout would be delivered inside the round, or the thread switched away
// mid-round), allocates no Ruby object and raises nothing: a failure (out of memory, an
// internal limit) is kept as text and ends sampling, and the worker thread, outside any
// round, turns it into the exception it raises (contprof_worker_failure). The rb_protect
// around a round remains only as a last guard. contprof_vm_round_begin refuses a round
// inside another (which only a thread switch could cause), and test builds abort on one
// (rake test:round_checks).
//
// ## Fork
//
// A child gets the parent's memory as the fork found it, with only the forking thread. The
// parent's clock thread may have held the clock's lock then, or been waiting on its
// condition variable (a glibc broadcast waits for such a waiter to leave, which in the
// child it never does), and a round may be pending: the clock's alarm or tick queued the
// job on the forking thread, which runs it at its first interrupt check in the child,
// before the Ruby fork hook resets the worker. Such a round, once it set the allocation
// alarm, hung the child. So a C fork handler, which runs before any Ruby code of the child,
// gives the clock and the tick fresh locks and holds rounds back until the Ruby side's
// reset (_native_reset_after_fork) has replaced the parent's threads, timers and clock. A
// child forked outside Ruby (fork(2) from a C extension: no Ruby hook) stays that way, not
// sampled.
//
// ## M:N threads
//
// The clock asks the GVL holder for a wall round through Ruby (rb_postponed_job_trigger
// from its own pthread), which raises the interrupt flag of the thread Ruby thinks is
// running. Under M:N threads that is often another one (the stat wall_round_signals counts
// the rounds that needed the signal below; test/collectors/mn_threads_test.rb runs that shape), and the round then runs at a later thread switch, with every stack moved
// on. When the holder shares native threads, the clock also sends SIGPROF to the holder's
// native thread (a queued signal with a value of our own), whose handler asks the thread
// it interrupts, if that still holds the GVL, exactly as a CPU timer's does. Only while
// Contprof's handler is installed (CPU timers on), never after it is given back (the flag
// is cleared under tick_mutex, which the sender holds), and only to a thread that shares
// native threads: a 1:1 holder gets no signal from the clock.
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "collectors/allocations.h"
#include "ruby_helpers.h"
#include "sampling/statistics.h"
#include "sampling/worker.h"
#include "vm/vm.h"

// How long a wall round may stay pending before its request counts as lost (its thread
// may have exited before running the job).
#define PENDING_GIVE_UP_NS (1000LL * 1000 * 1000)
// Wall rounds in a row that must find nothing to sample before the clock parks (see
// wall_clock.c, "Parking": each park costs one wakeup more when it ends).
#define IDLE_TICKS_BEFORE_PARKING 4

// Atomic: the signal handler reads it.
static _Atomic(worker_state *) active_worker;
static bool fail_next_round;
static bool switch_in_next_round;
static bool final_round_saw_sampling;

worker_state *contprof_active_worker(void) { return atomic_load(&active_worker); }
void contprof_set_active_worker(worker_state *state) { atomic_store(&active_worker, state); }
void contprof_worker_fail_next_round(void) { fail_next_round = true; }
void contprof_worker_switch_in_next_round(void) { switch_in_next_round = true; }
bool contprof_worker_final_round_saw_sampling(void) { return final_round_saw_sampling; }

void contprof_worker_new_locks_after_fork(worker_state *state) {
  pthread_mutex_init(&state->tick_mutex, NULL);
  contprof_wall_clock_reset_after_fork(&state->clock);
}

static void after_fork_in_child(void) {
  worker_state *state = atomic_load(&active_worker);
  if (!state) return;
  atomic_store(&state->awaiting_fork_reset, true);
  contprof_worker_new_locks_after_fork(state);
}

void contprof_worker_install_fork_handler(void) { pthread_atfork(NULL, NULL, after_fork_in_child); }

bool contprof_pthread_ok(worker_state *state, int result, const char *call) {
  if (result == 0) return true;
  int none = 0;
  if (atomic_compare_exchange_strong(&state->pthread_error, &none, result)) atomic_store(&state->pthread_error_call, call);
  atomic_store(&state->should_run, false);
  // The clock's loop must end too (on Ruby 3.3+ it is a thread of its own, which the
  // worker thread waits for).
  contprof_wall_clock_end_run(&state->clock);
  return false;
}

void contprof_worker_fail(worker_state *state, VALUE exception) {
  if (NIL_P(state->failure)) state->failure = exception;
  atomic_store(&state->should_run, false);
  contprof_wall_clock_stop(&state->clock);
}

// From a round: what went wrong, as text (no exception object is made in a round).
static void fail_in_round(worker_state *state, VALUE exception_class, const char *context, const char *message) {
  if (!atomic_load(&state->round_failed)) {
    state->round_failure_class = exception_class;
    snprintf(state->round_failure_message, sizeof(state->round_failure_message), "%s%s%s", context,
             message[0] ? ": " : "", message);
    atomic_store(&state->round_failed, true);
  }
  atomic_store(&state->should_run, false);
  contprof_wall_clock_stop(&state->clock);
}

VALUE contprof_worker_failure(worker_state *state) {
  if (NIL_P(state->failure) && atomic_load(&state->round_failed)) {
    state->failure = rb_exc_new_cstr(state->round_failure_class, state->round_failure_message);
  }
  return state->failure;
}

// ---------------------------------------------------------------------------------------
// Rounds (holding the GVL)

// Calls `function(data)`. Nothing in a round raises (see "Nothing but C in a round"); should
// something still, the exception ends sampling (kept for the worker thread) instead of
// reaching the application. Returns whether it returned normally.
static bool call_protected(worker_state *state, VALUE (*function)(VALUE), VALUE data) {
  int exception_state = 0;
  rb_protect(function, data, &exception_state);
  if (!exception_state) return true;
  VALUE exception = rb_errinfo();
  rb_set_errinfo(Qnil);
  contprof_worker_fail(state, exception);
  return false;
}

// Has the allocation sampler arm its hook if the next sample is near, or tell when to
// look again (see sampling/allocation_sampler.c, "Cost").
static void check_allocations(worker_state *state) {
  int64_t next = contprof_allocation_sampler_check(&state->allocations, contprof_monotonic_ns());
  if (next > 0) contprof_wall_clock_set_alarm(&state->clock, next);
}

typedef struct {
  worker_state *state;
  contprof_round round;
} round_call;

// A status of a round's records: out of memory or an internal limit ends sampling (the
// worker thread raises it); a dead thread or a dropped sample is not worth stopping for.
static void note_status(worker_state *state, pprof_status status, const pprof_error *error, const char *context) {
  if (status == PPROF_OK) return;
  atomic_fetch_add(&state->sampling_errors, 1);
  if (status == PPROF_ERR_NO_MEMORY || status == PPROF_ERR_LIMIT) {
    fail_in_round(state, contprof_error_class, context, error->message);
  }
}

static VALUE take_round(VALUE data) {
  round_call *call = (round_call *) data;
  worker_state *state = call->state;
  if (fail_next_round) {
    fail_next_round = false;
    fail_in_round(state, rb_eRuntimeError, "injected sampling failure (testing)", "");
    return Qnil;
  }
  if (switch_in_next_round) { // what a round must never do (testing the round checks)
    switch_in_next_round = false;
    rb_thread_schedule();
  }
  contprof_cpu_timer_source timers = contprof_cpu_timers_source(&state->timers);
  call->round.timers = state->use_cpu_timers ? &timers : NULL;
  pprof_error error;
  state->allocations.busy = true; // what a round allocates is the profiler's
  pprof_status status = contprof_thread_context_sample(state->collector, &call->round, &error);
  state->allocations.busy = false;
  check_allocations(state);
  note_status(state, status, &error, "CpuAndWallTimeWorker sampling failed");
  return Qnil;
}

// (The VM's call, on the first thread to take the GVL after a park, holding it.)
static void unpark_clock(void *data) {
  worker_state *state = data;
  int64_t resumed_from = contprof_wall_clock_unpark(&state->clock);
  if (resumed_from > 0 && atomic_load(&state->should_run)) {
    contprof_thread_context_wall_resumed_from(state->collector, resumed_from);
  }
}

// Parks the clock when rounds have found nothing to sample for a while (wall_clock.c,
// "Parking"): the next thread to take the GVL unparks it. (Holding the GVL, so no thread
// can take it between the two calls.) Only from the worker thread's rounds, which give the
// GVL back at once: another of the profiler's threads may keep it (an export), and a
// thread waiting for it meanwhile would have its wait before the unpark counted nowhere.
// The count of idle rounds goes on across unparks: a process that wakes a thread for a
// moment parks again at the next tick that finds it waiting, which costs one wakeup,
// where four ticks would cost eight.
static void park_clock_if_idle(worker_state *state) {
  if (rb_thread_current() != state->worker_thread) return;
  if (contprof_thread_context_idle_rounds(state->collector) < IDLE_TICKS_BEFORE_PARKING) return;
  if (!atomic_load(&state->should_run)) return;
  if (contprof_vm_call_on_next_resume(unpark_clock, state)) contprof_wall_clock_park(&state->clock);
}

// One round of `kind`; never raises.
static void run_round(worker_state *state, contprof_round_kind kind, VALUE gc_thread, contprof_gc_moment gc_moment,
                      int64_t wall_until, VALUE holder) {
  if (atomic_load(&state->awaiting_fork_reset)) return;
  // The final round runs after stop has ended sampling (and must not start it again: the
  // wall clock and the thread hooks would take it up).
  if (kind == CONTPROF_ROUND_FINAL) {
    final_round_saw_sampling = atomic_load(&state->should_run);
  } else if (!atomic_load(&state->should_run)) {
    return;
  }
  if (!contprof_vm_round_begin(kind == CONTPROF_ROUND_CPU ? "a CPU round" : "a wall round")) {
    atomic_fetch_add(&state->rounds_refused, 1);
    return;
  }
  int64_t started = contprof_monotonic_ns();
  int64_t cpu_started = contprof_clock_ns(CLOCK_THREAD_CPUTIME_ID);
  round_call call = {.state = state,
                     .round = {.kind = kind, .gc_thread_at_tick = gc_thread, .gc_moment_at_tick = gc_moment,
                               .wall_until_ns = wall_until, .holder_at_tick = holder,
                               .tick_interval_ns = atomic_load(&state->clock.effective_interval_ns)}};
  bool returned = call_protected(state, take_round, (VALUE) &call);
  contprof_vm_round_end();
  if (!returned) return;
  int64_t elapsed = contprof_monotonic_ns() - started;
  int64_t cpu_elapsed = contprof_clock_ns(CLOCK_THREAD_CPUTIME_ID) - cpu_started;
  atomic_fetch_add(&state->rounds, 1);
  atomic_fetch_add(kind == CONTPROF_ROUND_CPU ? &state->cpu_rounds : &state->wall_rounds, 1);
  atomic_fetch_add(&state->sampling_ns_total, (uint64_t) elapsed);
  contprof_update_max(&state->sampling_ns_max, (uint64_t) elapsed);
  // The CPU the round used on this thread is the profiler's, not the application's: its
  // own clock says how much (its wall time, charged before, overcharged a round preempted
  // on a busy machine: a puma worker's threads showed 3.5% less CPU than they used).
  if (cpu_started >= 0 && cpu_elapsed > 0) {
    contprof_thread_context_charge_own_cost(state->collector, rb_thread_current(), cpu_elapsed);
  }
  if (kind == CONTPROF_ROUND_WALL) {
    contprof_sigprof_maintain_timers(state);
    park_clock_if_idle(state);
  }
}

void contprof_worker_round(worker_state *state, contprof_round_kind kind) { run_round(state, kind, Qnil, 0, 0, Qnil); }

typedef struct {
  worker_state *state;
  const contprof_allocation_sample *sample;
  const contprof_raw_frame *frames;
} allocation_call;

static VALUE record_allocation(VALUE data) {
  allocation_call *call = (allocation_call *) data;
  pprof_error error;
  pprof_status status = contprof_thread_context_record_allocation(call->state->collector, call->sample, call->frames, &error);
  note_status(call->state, status, &error, "recording an allocation");
  return Qnil;
}

// The allocation the NEWOBJ hook sampled, if any (see sampling/allocation_sampler.c).
// Returns whether it recorded one.
static bool record_pending_allocation(worker_state *state) {
  allocation_call call = {.state = state};
  call.sample = contprof_allocation_sampler_pending(&state->allocations, &call.frames);
  if (!call.sample) return false;
  if (!contprof_vm_round_begin("an allocation record")) {
    atomic_fetch_add(&state->rounds_refused, 1);
    return false; // (still pending: the next job records it)
  }
  state->allocations.busy = true;
  if (atomic_load(&state->should_run)) call_protected(state, record_allocation, (VALUE) &call);
  state->allocations.busy = false;
  contprof_vm_round_end();
  contprof_allocation_sampler_done(&state->allocations);
  return true;
}

void contprof_worker_job(void *unused) {
  (void) unused;
  // The worker may have stopped (or been replaced) since the job was queued.
  worker_state *state = atomic_load(&active_worker);
  if (!state || atomic_load(&state->awaiting_fork_reset)) return;
  // (After a sample the next target may be nearer than the next round: checked now.)
  bool recorded = record_pending_allocation(state);
  bool asked = atomic_exchange(&state->allocation_check_requested, false);
  if ((recorded || asked || contprof_allocation_sampler_check_wanted(&state->allocations)) &&
      atomic_load(&state->should_run)) {
    if (asked) state->allocations.checks_asked++;
    check_allocations(state);
  }
  if (atomic_load(&state->wall_round_requested)) {
    int64_t delay = contprof_monotonic_ns() - atomic_load(&state->requested_at_ns);
    if (delay < 0) delay = 0;
    atomic_fetch_add(&state->wall_round_delay_ns_total, (uint64_t) delay);
    contprof_update_max(&state->wall_round_delay_ns_max, (uint64_t) delay);
    bool of_holder = atomic_load(&state->requested_of_holder);
    if (delay > 1000 * 1000) {
      atomic_fetch_add(&state->wall_rounds_late, 1);
      if (of_holder) atomic_fetch_add(&state->holder_rounds_late, 1);
    }
    if (of_holder && rb_thread_current() == state->worker_thread) atomic_fetch_add(&state->holder_rounds_by_worker, 1);
    if (of_holder && rb_thread_current() != (VALUE) atomic_load(&state->holder_at_tick)) {
      atomic_fetch_add(&state->holder_rounds_elsewhere, 1);
    }
    if (rb_thread_current() == state->worker_thread) { // nobody held the GVL: the worker took it
      atomic_fetch_add(&state->rounds_with_gvl_taken, 1);
      atomic_fetch_add(&state->gvl_taken_delay_ns_total, (uint64_t) delay);
      contprof_update_max(&state->gvl_taken_delay_ns_max, (uint64_t) delay);
    }
    VALUE gc_thread = (VALUE) atomic_exchange(&state->gc_thread_at_tick, (uintptr_t) Qnil);
    run_round(state, CONTPROF_ROUND_WALL, gc_thread, atomic_exchange(&state->gc_moment_at_tick, 0),
              atomic_load(&state->latest_tick_ns), (VALUE) atomic_exchange(&state->holder_at_tick, (uintptr_t) Qnil));
    atomic_store(&state->wall_round_requested, false);
  } else if (atomic_exchange(&state->cpu_round_wanted, false)) {
    run_round(state, CONTPROF_ROUND_CPU, Qnil, 0, 0, Qnil);
  }
}

void *contprof_worker_round_with_gvl(void *data) {
  worker_state *state = data;
  // (The round may have been run meanwhile by a thread that took the GVL first.)
  if (atomic_load(&state->wall_round_requested)) contprof_worker_job(NULL);
  return NULL;
}

// (From the signal handler of a CPU timer; the wall clock, on a thread of its own, uses
// contprof_vm_request_job instead.)
void contprof_worker_queue_cpu_round(void) {
  worker_state *state = atomic_load(&active_worker);
  if (state) atomic_store(&state->cpu_round_wanted, true);
  int result = contprof_vm_job_trigger_here();
  if (!state) return;
  if (result == 0) atomic_fetch_add(&state->jobs_not_queued, 1);
  if (result == 2) atomic_fetch_add(&state->jobs_already_queued, 1);
}

// The value a wall round's SIGPROF carries (see "M:N threads"); a CPU timer's signal has
// SI_TIMER or a POLL_ code, never SI_QUEUE.
#define WALL_ROUND_SIGNAL 0x43505257

static void signal_sharing_holder(worker_state *state) {
  if (!atomic_load(&state->wall_signals_allowed)) return;
  pid_t tid = contprof_vm_sharing_holder_tid();
  if (tid <= 0) return;
  siginfo_t info;
  memset(&info, 0, sizeof(info));
  info.si_signo = SIGPROF;
  info.si_code = SI_QUEUE;
  info.si_pid = getpid();
  info.si_uid = getuid();
  info.si_value.sival_int = WALL_ROUND_SIGNAL;
  if (syscall(SYS_rt_tgsigqueueinfo, getpid(), tid, SIGPROF, &info) == 0) atomic_fetch_add(&state->wall_round_signals, 1);
}

void contprof_worker_on_timer_signal(const siginfo_t *info) {
  worker_state *state = atomic_load(&active_worker);
  if (!state) return;
  if (info->si_code == SI_QUEUE && info->si_value.sival_int == WALL_ROUND_SIGNAL && info->si_pid == getpid()) {
    if (contprof_vm_current_thread_holds_gvl()) contprof_vm_job_trigger_here();
    return;
  }
  contprof_timer_signal what = contprof_cpu_timers_on_signal(info);
  if (what != CONTPROF_TIMER_NOT_OURS) atomic_fetch_add(&state->timer_signals, 1);
  if (what == CONTPROF_TIMER_ON_GVL_HOLDER) contprof_worker_queue_cpu_round();
}

// ---------------------------------------------------------------------------------------
// The wall clock's client (without the GVL)

// Asks for one wall round (holding tick_mutex, sampling on).
static contprof_tick ask_for_wall_round(worker_state *state) {
  int64_t now = contprof_monotonic_ns();
  atomic_store(&state->latest_tick_ns, now);
  if (atomic_exchange(&state->wall_round_requested, true)) {
    // A round asked of the thread holding the GVL waits for its next interrupt check; if it
    // gave the GVL up first (a blocking call right after the tick), that check comes only
    // once it is back, maybe a whole blocking call later, and every tick until then would
    // be skipped (stretches no tick saw go uncounted): nobody holding the GVL now, the
    // round is asked again, of whoever takes it or of the worker.
    bool taken_over = atomic_load(&state->requested_of_holder) && !contprof_vm_gvl_held();
    if (now - atomic_load(&state->requested_at_ns) <= PENDING_GIVE_UP_NS && !taken_over) {
      atomic_fetch_add(&state->ticks_skipped, 1);
      return CONTPROF_TICK_PENDING;
    }
    atomic_fetch_add(taken_over ? &state->holder_rounds_taken_over : &state->ticks_lost, 1);
  }
  atomic_store(&state->requested_at_ns, now);
  // (The GC thread is stored before the request: the job reads it.)
  int requested = contprof_vm_request_job(&state->holder_at_tick, &state->gc_thread_at_tick, &state->gc_moment_at_tick);
  if (!NIL_P((VALUE) atomic_load(&state->gc_thread_at_tick))) atomic_fetch_add(&state->ticks_in_gc, 1);
  atomic_store(&state->requested_of_holder, requested > 0);
  if (requested > 0) {
    signal_sharing_holder(state);
    atomic_fetch_add(&state->rounds_requested, 1);
    return CONTPROF_TICK_ASKED;
  }
  if (requested == 0) return CONTPROF_TICK_NOBODY;
  atomic_store(&state->wall_round_requested, false);
  return CONTPROF_TICK_FAILED;
}

static contprof_tick tick(void *data) {
  worker_state *state = data;
  if (!CONTPROF_PTHREAD_OK(state, pthread_mutex_lock(&state->tick_mutex))) return CONTPROF_TICK_STOPPED;
  contprof_tick answer = atomic_load(&state->should_run) ? ask_for_wall_round(state) : CONTPROF_TICK_STOPPED;
  CONTPROF_PTHREAD_OK(state, pthread_mutex_unlock(&state->tick_mutex));
  return answer;
}

// The allocation sampler's next check is due: the thread holding the GVL runs it (when no
// thread holds it, nothing allocates; the rounds check again).
static void allocation_check_due(void *data) {
  worker_state *state = data;
  if (!CONTPROF_PTHREAD_OK(state, pthread_mutex_lock(&state->tick_mutex))) return;
  if (atomic_load(&state->should_run)) {
    atomic_store(&state->allocation_check_requested, true);
    atomic_uintptr_t holder = (uintptr_t) Qnil, gc_thread = (uintptr_t) Qnil;
    atomic_uint gc_moment = 0;
    contprof_vm_request_job(&holder, &gc_thread, &gc_moment);
  }
  CONTPROF_PTHREAD_OK(state, pthread_mutex_unlock(&state->tick_mutex));
}

static int64_t rounds_cost_ns(void *data) { return (int64_t) atomic_load(&((worker_state *) data)->sampling_ns_total); }

static void round_with_gvl(void *data) { rb_thread_call_with_gvl(contprof_worker_round_with_gvl, data); }

static void clock_failed(void *data, int error, const char *call) { contprof_pthread_ok(data, error, call); }

contprof_wall_clock_client contprof_worker_clock_client(worker_state *state) {
  return (contprof_wall_clock_client) {
    .data = state, .tick = tick, .rounds_cost_ns = rounds_cost_ns, .round_with_gvl = round_with_gvl,
    .alarm = allocation_check_due, .failed = clock_failed};
}
