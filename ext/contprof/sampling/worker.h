// The state of Contprof::Collectors::CpuAndWallTimeWorker, shared by its three files:
// cpu_and_wall_time_worker.c (the Ruby class and its lifecycle), rounds.c (the sampling
// job, the clock's ticks and their statistics) and sigprof.c (SIGPROF's disposition). The
// wall clock (wall_clock.c) sees none of it: it talks to rounds.c through its client
// callbacks.
#pragma once

#include <pthread.h>
#include <ruby.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "collectors/thread_context.h"
#include "sampling/allocation_sampler.h"
#include "sampling/cpu_timers.h"
#include "sampling/wall_clock.h"

typedef struct {
  VALUE collector; // a ThreadContext
  VALUE failure; // exception raised while sampling, or nil (see contprof_worker_failure)
  // A round's failure, as text until the worker thread makes it an exception (rounds.c,
  // "Nothing but C in a round"): its class and message.
  atomic_bool round_failed;
  VALUE round_failure_class;
  char round_failure_message[256];
  VALUE worker_thread; // the Ruby thread the wall clock runs on or answers to, or nil
  int64_t interval_ns;
  double overhead_target;
  bool cpu_timers_wanted; // asked for, and built
  bool use_cpu_timers; // in this run: wanted, and not given up (see contprof_sigprof_give_up)
  const char *cpu_timers_given_up; // why this run stopped using them, or NULL
  contprof_cpu_timer_kind timer_kind;
  contprof_cpu_timers timers; // only used holding the GVL
  // Wall rounds since threads without a timer were last armed, and how many such threads
  // the latest wall rounds met (see contprof_sigprof_maintain_timers).
  int rounds_since_arming;
  uint64_t unarmed_at_last_try, threads_without_timer;
  contprof_wall_clock clock;
  contprof_allocation_sampler allocations; // only used holding the GVL
  // A CPU timer's signal asked the thread holding the GVL for a CPU round.
  atomic_bool cpu_round_wanted;
  atomic_bool allocation_check_requested; // by the wall clock's alarm (see rounds.c)
  bool signal_handler_installed;
  // SIGPROF may be sent to ask an M:N holder for a wall round (see rounds.c, "M:N threads"):
  // set once the handler is installed, cleared under tick_mutex before it is given back.
  atomic_bool wall_signals_allowed;

  atomic_bool should_run;
  // In a forked child, from the fork until the Ruby side's reset (_native_reset_after_fork):
  // no round runs on the parent's state (see rounds.c, "Fork").
  atomic_bool awaiting_fork_reset;
  // The run (start to stop) being served: a worker thread left from an earlier run (stop
  // does not wait for it) recognizes it is stale. The wall clock's run number.
  atomic_uint_fast64_t run;
  // Held by a tick while it asks for a round; taken by stop to know that none is in
  // flight any more.
  pthread_mutex_t tick_mutex;
  // A wall round was asked for and has not run yet: no new request until it has, so that
  // jobs never pile up.
  atomic_bool wall_round_requested;
  atomic_int_fast64_t requested_at_ns; // when the pending wall round was asked for
  // The instant of the clock's latest tick, skipped or not (0: none yet): a wall round
  // charges wall time up to there (collectors/thread_context.c, "Where time goes").
  atomic_int_fast64_t latest_tick_ns;
  atomic_bool requested_of_holder; // and whether a thread holding the GVL was asked
  // The thread that was running a GC when the pending wall round was asked for (a VALUE),
  // or Qnil, and what that GC was doing (a contprof_gc_moment).
  atomic_uintptr_t gc_thread_at_tick;
  atomic_uintptr_t holder_at_tick; // the thread holding the GVL then (a VALUE), or Qnil
  atomic_uint gc_moment_at_tick;

  // Statistics: updated from the signal handler, the clock and the sampling job.
  atomic_uint_fast64_t rounds;
  atomic_uint_fast64_t wall_rounds;
  atomic_uint_fast64_t cpu_rounds;
  atomic_uint_fast64_t rounds_requested; // wall rounds asked of the thread holding the GVL
  atomic_uint_fast64_t jobs_not_queued; // postponed job buffer full
  atomic_uint_fast64_t jobs_already_queued;
  atomic_uint_fast64_t ticks_skipped; // the previous wall round was still pending
  atomic_uint_fast64_t ticks_lost; // pending for too long: given up on
  atomic_uint_fast64_t rounds_with_gvl_taken; // the worker thread took the GVL itself
  atomic_uint_fast64_t gvl_taken_delay_ns_total; // from the tick to such a round
  atomic_uint_fast64_t gvl_taken_delay_ns_max;
  atomic_uint_fast64_t wall_round_delay_ns_total; // from the tick to its round, whoever ran it
  atomic_uint_fast64_t wall_round_delay_ns_max;
  atomic_uint_fast64_t wall_rounds_late; // more than a millisecond after their tick
  atomic_uint_fast64_t holder_rounds_late; // of those, asked of a thread holding the GVL
  atomic_uint_fast64_t holder_rounds_by_worker; // asked of a holder, run by the worker thread
  atomic_uint_fast64_t holder_rounds_elsewhere; // asked of a holder, run by another thread
  atomic_uint_fast64_t wall_round_signals; // sent to a holder sharing native threads (M:N)
  atomic_uint_fast64_t holder_rounds_taken_over; // asked again: the holder gave the GVL up first
  atomic_uint_fast64_t ticks_in_gc; // wall rounds asked for while a GC ran
  atomic_uint_fast64_t sampling_ns_total;
  atomic_uint_fast64_t sampling_ns_max;
  atomic_uint_fast64_t sampling_errors;
  atomic_uint_fast64_t timer_signals; // SIGPROFs from CPU timers
  atomic_uint_fast64_t rounds_refused; // a round began inside another (contprof_vm_round_begin)

  atomic_int pthread_error; // the first failed pthread call's result, or 0
  const char *_Atomic pthread_error_call; // and the call
} worker_state;

// pthread calls on the worker's own, initialized objects fail only on a bug or corrupt
// memory. A failure is never ignored: the first one is kept and ends sampling, and the
// worker thread raises it (a SystemCallError naming the call). The application goes on.
// Evaluates to whether `call` returned 0.
#define CONTPROF_PTHREAD_OK(state, call) contprof_pthread_ok((state), (call), #call)
bool contprof_pthread_ok(worker_state *state, int result, const char *call);

// The statistics counters that start from zero in every process (a forked child resets
// them), in the order #stats lists them.
#define WORKER_COUNTERS(X)                                                                                      \
  X(rounds) X(wall_rounds) X(cpu_rounds) X(rounds_requested) X(jobs_not_queued) X(jobs_already_queued)          \
  X(ticks_skipped) X(ticks_lost) X(rounds_with_gvl_taken) X(gvl_taken_delay_ns_total) X(gvl_taken_delay_ns_max) \
  X(wall_round_delay_ns_total) X(wall_round_delay_ns_max) X(wall_rounds_late) \
  X(holder_rounds_late) X(holder_rounds_by_worker) X(holder_rounds_elsewhere) X(wall_round_signals) X(holder_rounds_taken_over) X(ticks_in_gc) X(sampling_ns_total) X(sampling_ns_max) X(sampling_errors) X(timer_signals) X(rounds_refused)

// ---------------------------------------------------------------------------------------
// rounds.c: the sampling job, and the wall clock's client

// The worker that is running (one per process: there is one SIGPROF handler); the signal
// handler and the job read it. Set and cleared by the class.
worker_state *contprof_active_worker(void);
void contprof_set_active_worker(worker_state *state);

// The sampling job, run on a thread holding the GVL at its next safe point: a wall round
// when one was asked for, else a CPU round of the thread it runs on. Never raises: a
// failure is stored (#failure) and ends sampling.
void contprof_worker_job(void *unused);
// Asks the calling thread, which holds the GVL, for a CPU round of its own (async-signal-safe).
void contprof_worker_queue_cpu_round(void);
// A CPU timer's SIGPROF, from the signal handler (async-signal-safe): counted, and the job
// queued when the thread holds the GVL.
void contprof_worker_on_timer_signal(const siginfo_t *info);
// A round, now, on the calling thread (holding the GVL). The final round runs after the
// request to stop (and does not start sampling again).
void contprof_worker_round(worker_state *state, contprof_round_kind kind);
// The wall clock's callbacks (see wall_clock.h), `data` being the worker's state.
contprof_wall_clock_client contprof_worker_clock_client(worker_state *state);
// A CONTPROF_TICK_NOBODY round, run by the worker thread holding the GVL.
void *contprof_worker_round_with_gvl(void *state);
// Sampling ends with this exception (the first one is kept). Not from a round.
void contprof_worker_fail(worker_state *state, VALUE exception);
// The exception sampling ended with, or nil; made here from a round's failure text. Not
// from a round.
VALUE contprof_worker_failure(worker_state *state);
// Makes a forked child safe before any of its Ruby code runs (see rounds.c, "Fork"). Once.
void contprof_worker_install_fork_handler(void);
// In a forked child: the tick's and the clock's locks, new (the parent's threads may have
// held them).
void contprof_worker_new_locks_after_fork(worker_state *state);
// Testing: the next round fails.
void contprof_worker_fail_next_round(void);
// Testing: the next round lets the thread switch (rb_thread_schedule), which a round must
// never do: builds with round checks abort.
void contprof_worker_switch_in_next_round(void);
// Testing: whether sampling was on when the latest final round ran.
bool contprof_worker_final_round_saw_sampling(void);

// ---------------------------------------------------------------------------------------
// sigprof.c: SIGPROF's disposition

// Installs Contprof's handler, which hands CPU timers' signals to `receiver`
// (async-signal-safe); raises when another handler is there (another profiler, or the
// application's own).
void contprof_sigprof_install(worker_state *state, void (*receiver)(const siginfo_t *info));
// Discards any SIGPROF still pending and brings back the disposition from before the
// start, unless the handler is no longer Contprof's (then it stays). Only once no timer
// can signal any more.
void contprof_sigprof_restore(worker_state *state);
// The rest of this run does without CPU timers (the application wants SIGPROF): `reason`.
void contprof_sigprof_give_up(worker_state *state, const char *reason);
// After a wall round: gives the timers up when SIGPROF's handler was replaced (by code
// outside Ruby); else lets dead threads' timers go and moves the period with the
// effective (adaptive) interval.
void contprof_sigprof_maintain_timers(worker_state *state);
