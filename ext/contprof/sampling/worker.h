// The state of Contprof::Collectors::CpuAndWallTimeWorker, shared by its two halves:
// cpu_and_wall_time_worker.c (the Ruby class, lifecycle, signal handler and sampling job)
// and wall_clock.c (the worker thread's loop, which asks for wall rounds).
#pragma once

#include <pthread.h>
#include <ruby.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "sampling/cpu_timers.h"

typedef struct {
  VALUE collector;
  VALUE failure; // exception raised while sampling, or nil
  VALUE worker_thread; // the Ruby thread running the wall clock, or nil
  int64_t interval_ns;
  double overhead_target;
  bool cpu_timers_wanted; // asked for, and built
  bool use_cpu_timers; // in this run: wanted, and not given up (see give_up_cpu_timers)
  const char *cpu_timers_given_up; // why this run stopped using them, or NULL
  contprof_cpu_timer_kind timer_kind;
  contprof_cpu_timers timers; // only used holding the GVL

  atomic_bool should_run;
  // Incremented at every start: a loop or worker thread left from an earlier run (stop
  // does not wait for them) recognizes it is stale.
  atomic_uint_fast64_t run_generation;
  // Held by the wall clock while it asks for a round; taken by stop to know that no
  // request is in flight any more.
  pthread_mutex_t nudge_mutex;
  // A wall round was asked for and has not run yet: no new request until it has, so that
  // jobs never pile up.
  atomic_bool wall_round_requested;
  atomic_int_fast64_t requested_at_ns; // when the pending wall round was asked for
  // The thread that was running a GC when the pending wall round was asked for (a VALUE),
  // or Qnil.
  atomic_uintptr_t gc_thread_at_tick;
  atomic_uint gc_moment_at_tick; // and what that GC was doing (a contprof_gc_moment)
  atomic_int_fast64_t effective_interval_ns; // the interval, stretched by the adaptive rate

  pthread_mutex_t wakeup_mutex;
  pthread_cond_t wakeup_cond;
  bool wakeup_requested; // guarded by wakeup_mutex
  bool loop_started; // guarded by wakeup_mutex

  bool signal_handler_installed;

  // Statistics: updated from the signal handler, the worker thread and the sampling job.
  atomic_uint_fast64_t sample_rounds;
  atomic_uint_fast64_t wall_rounds;
  atomic_uint_fast64_t cpu_rounds;
  atomic_uint_fast64_t interrupts_raised; // wall rounds asked of the thread holding the GVL
  atomic_uint_fast64_t jobs_not_queued; // postponed job buffer full
  atomic_uint_fast64_t jobs_already_queued;
  atomic_uint_fast64_t nudges_skipped; // the previous wall round was still pending
  atomic_uint_fast64_t nudges_lost; // pending for too long: given up on
  atomic_uint_fast64_t samples_with_gvl_taken; // the worker thread took the GVL itself
  atomic_uint_fast64_t gvl_taken_delay_ns_total; // from the tick to such a round
  atomic_uint_fast64_t gvl_taken_delay_ns_max;
  atomic_uint_fast64_t ticks_in_gc; // wall rounds asked for while a GC ran
  atomic_uint_fast64_t sampling_ns_total;
  atomic_uint_fast64_t sampling_ns_max;
  atomic_uint_fast64_t sampling_errors;
  atomic_uint_fast64_t trigger_thread_cpu_ns; // CPU used by the worker thread's loop
  atomic_uint_fast64_t trigger_wakeups;
  atomic_uint_fast64_t timer_signals; // SIGPROFs from CPU timers

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
#define WORKER_COUNTERS(X)                                                                                  \
  X(sample_rounds) X(wall_rounds) X(cpu_rounds) X(interrupts_raised) X(jobs_not_queued)                     \
  X(jobs_already_queued) X(nudges_skipped) X(nudges_lost)                                                   \
  X(samples_with_gvl_taken) X(gvl_taken_delay_ns_total) X(gvl_taken_delay_ns_max) X(ticks_in_gc) X(sampling_ns_total) X(sampling_ns_max) X(sampling_errors)      \
  X(trigger_thread_cpu_ns) X(trigger_wakeups) X(timer_signals)

struct slice_attributes { // struct sched_attr, which glibc does not declare
  uint32_t size, policy;
  uint64_t flags;
  int32_t nice;
  uint32_t priority;
  uint64_t runtime, deadline, period;
  uint32_t util_min, util_max;
};

// The wall clock (wall_clock.c): asks for a wall round every interval until the run
// `generation` ends or it is stopped. It runs on the worker thread itself where the VM
// backend allows it (on_worker_thread), else on a plain pthread that the worker thread (a
// Ruby thread) starts, takes the GVL for, and stops.
typedef struct {
  worker_state *state;
  uint64_t generation;
  pthread_t clock;
  bool clock_running;
  bool on_worker_thread; // the clock runs on the worker thread itself (no pthread)
  atomic_bool stop;
  pthread_mutex_t lock; // guards the three flags below
  pthread_cond_t cond; // the worker thread waits on it
  bool gvl_round_wanted; // nobody held the GVL at a tick: the worker thread samples
  bool clock_ended;
  bool interrupted; // Ruby wants the worker thread back (Thread#kill, VM shutdown)
  int worker_previous_slack; // the worker thread's scheduling, restored at its end
  struct slice_attributes worker_previous_slice;
} contprof_wall_clock_call;
// Runs the clock on the calling thread, the worker thread, without the GVL (where the VM
// backend allows it): returns when woken, for Ruby to handle interrupts.
void *contprof_wall_clock_run_here(void *call);
// Starts the clock thread; false when it could not be created.
bool contprof_wall_clock_start(contprof_wall_clock_call *call);
// Stops the clock thread and waits for it to end (with or without the GVL: it never
// needs it).
void contprof_wall_clock_stop(contprof_wall_clock_call *call);
// Run by the worker thread without the GVL: returns when the clock hands over a round,
// ends, or contprof_wall_clock_interrupt is called.
void *contprof_wall_clock_wait_for_gvl_round(void *call);
// Whether a round was handed over (and takes it).
bool contprof_wall_clock_take_gvl_round(contprof_wall_clock_call *call);
bool contprof_wall_clock_ended(contprof_wall_clock_call *call);
void contprof_wall_clock_interrupt(contprof_wall_clock_call *call);
// Run by the worker thread around its part: gives it the clock's scheduling (a short
// slice, no timer slack), then restores what it had.
void contprof_wall_clock_worker_begin(contprof_wall_clock_call *call);
void contprof_wall_clock_worker_end(contprof_wall_clock_call *call);
// Returns once the clock of the current run has started (at most 5 s).
void *contprof_wall_clock_wait_for_start(void *state);
// Wakes the clock (stop, a failure).
void contprof_wall_clock_wake(worker_state *state);
bool contprof_wall_clock_current_run(worker_state *state, uint64_t generation);

// The sampling job (see cpu_and_wall_time_worker.c), and its registration on the calling
// thread (async-signal-safe, for the signal handler and GC events).
void contprof_worker_job(void *unused);
void contprof_worker_register_job(void);
// A wall round taken by the worker thread itself, holding the GVL (no thread held it).
void *contprof_worker_wall_round_with_gvl(void *state);
