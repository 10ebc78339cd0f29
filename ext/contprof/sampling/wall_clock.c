// The wall clock: the loop that asks for wall rounds.
//
// Wall time must be sampled at instants that do not depend on what the threads do, or it
// lands where threads happen to be when something else wakes the profiler (CPU timers
// fire only while a thread runs, so they would give every sleep to the code that runs
// next). So this loop wakes every interval on a fixed cadence, whatever the threads do,
// and asks for a wall round:
//
// - when a thread holds the GVL, by asking it to run the sampling job at its next safe
//   point: its interrupt flag is raised, as Ruby's own timer thread raises its flag
//   (contprof_vm_request_job). No signal: a signal to
//   a busy thread is delivered when the kernel gets around to it, which on virtual
//   machines is often its next system call (a C program spending 8% of its time in a
//   system call received 94% of such signals there), so signal-driven rounds would land
//   after system calls rather than at the tick; a raised flag is seen within microseconds,
//   at the thread's next method return or loop iteration;
// - when no thread holds the GVL (every thread blocked, asleep or in native code), by
//   having the worker thread take the GVL and sample itself.
//
// Which thread runs the clock depends on the VM backend (contprof_vm_request_job):
// - where a Ruby thread may ask (Ruby 3.1), the worker thread itself, with the GVL
//   released, and it takes the GVL itself when nobody holds it;
// - else (Ruby 3.3+: rb_postponed_job_trigger raises the *caller's* flag when the caller
//   is a Ruby thread) a plain pthread, owned by the worker thread, which starts it,
//   answers its requests to take the GVL, and stops and joins it on the way out, whatever
//   ends the worker thread. That hand-over costs a thread wakeup, late by milliseconds
//   now and then on this VM, so the backend also has the first thread to take the GVL run
//   the round (vm/vm_public_api.c): the worker only serves ticks nobody else does.
//
// Deadlines follow a fixed cadence, so a slow nudge does not slow the rate down.
//
// ## Adaptive rate
//
// Every few wakeups the loop compares what the profiler cost (the sampling rounds' time
// on the application's threads plus this loop's own CPU) with the time elapsed, and
// stretches the interval so that the cost stays within `overhead_target` of one core.
// Values stay exact (they are time deltas); only the resolution drops.
#include <errno.h>
#include <pthread.h>
#include <ruby.h>
#include <ruby/thread.h>
#include <signal.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "ruby_helpers.h"
#include "sampling/worker.h"
#include "vm/vm.h"

// How long a wall round may stay pending before its request counts as lost (its thread
// may have exited before running the job, or blocked SIGPROF).
#define PENDING_GIVE_UP_NS (1000LL * 1000 * 1000)
// Wakeups between two updates of the adaptive rate.
#define RATE_WINDOW_WAKEUPS 32
// The stretched interval never exceeds this many intervals.
#define MAX_STRETCH 100

// The worker thread's scheduling slice. A thread woken on a CPU where another runs does
// not run at once: the scheduler lets the running one finish its slice (3 ms by default
// under EEVDF) or reach its next preemption point, which is typically its next system
// call. So with the default slice, ticks would observe busy threads at their system calls
// (measured: a C program whose thread spent 0.2% of its time reading its CPU clock was
// found there at 5-14% of a sleeping thread's wakeups; 0.2-1% with a 100 us slice, 0.1%
// with the two threads on separate CPUs). Since Linux 6.12 a thread may ask for a shorter
// slice (sched_attr.sched_runtime, no privilege needed); older kernels ignore it.
#define WAKEUP_SLICE_NS 100000


// Gives the calling thread a short slice (where the kernel knows of slices); its previous
// attributes go to `previous` (size 0 when they could not be read: nothing to restore).
static void take_short_slice(struct slice_attributes *previous) {
  memset(previous, 0, sizeof(*previous));
#ifdef SYS_sched_setattr
  if (syscall(SYS_sched_getattr, 0, previous, sizeof(*previous), 0) != 0) {
    previous->size = 0;
    return;
  }
  struct slice_attributes attributes = *previous;
  attributes.runtime = WAKEUP_SLICE_NS;
  syscall(SYS_sched_setattr, 0, &attributes, 0);
#endif
}

static void restore_slice(struct slice_attributes *previous) {
#ifdef SYS_sched_setattr
  if (previous->size > 0) syscall(SYS_sched_setattr, 0, previous, 0);
#endif
}

// The worker thread runs the rounds nobody else can: it must run as soon as the clock
// hands one over, for the same reason as the clock itself. It is a Ruby thread, and Ruby
// may reuse its native thread for another Ruby thread afterwards: the end restores.
void contprof_wall_clock_worker_begin(contprof_wall_clock_call *call) {
  call->worker_previous_slack = prctl(PR_GET_TIMERSLACK, 0, 0, 0, 0);
  prctl(PR_SET_TIMERSLACK, 1, 0, 0, 0);
  take_short_slice(&call->worker_previous_slice);
}

void contprof_wall_clock_worker_end(contprof_wall_clock_call *call) {
  if (call->worker_previous_slack > 0) prctl(PR_SET_TIMERSLACK, call->worker_previous_slack, 0, 0, 0);
  restore_slice(&call->worker_previous_slice);
}

bool contprof_wall_clock_current_run(worker_state *state, uint64_t generation) {
  return atomic_load(&state->should_run) && atomic_load(&state->run_generation) == generation;
}

// Waits until `deadline_ns` (CLOCK_MONOTONIC) or until woken; false when the loop should end.
static bool wait_until(worker_state *state, int64_t deadline_ns) {
  struct timespec deadline = contprof_ns_timespec(deadline_ns);
  if (!CONTPROF_PTHREAD_OK(state, pthread_mutex_lock(&state->wakeup_mutex))) return false;
  while (!state->wakeup_requested && atomic_load(&state->should_run)) {
    int waited = pthread_cond_timedwait(&state->wakeup_cond, &state->wakeup_mutex, &deadline);
    if (waited == ETIMEDOUT || !CONTPROF_PTHREAD_OK(state, waited)) break;
  }
  bool woken = state->wakeup_requested;
  state->wakeup_requested = false;
  CONTPROF_PTHREAD_OK(state, pthread_mutex_unlock(&state->wakeup_mutex));
  return !woken && atomic_load(&state->should_run);
}

void contprof_wall_clock_wake(worker_state *state) {
  if (!CONTPROF_PTHREAD_OK(state, pthread_mutex_lock(&state->wakeup_mutex))) return;
  state->wakeup_requested = true;
  CONTPROF_PTHREAD_OK(state, pthread_cond_broadcast(&state->wakeup_cond));
  CONTPROF_PTHREAD_OK(state, pthread_mutex_unlock(&state->wakeup_mutex));
}

static int64_t thread_cpu_ns(void) {
  struct timespec cpu;
  if (clock_gettime(CLOCK_THREAD_CPUTIME_ID, &cpu) != 0) return 0;
  return contprof_timespec_ns(cpu);
}

// The profiler's cost so far: rounds plus this loop's CPU since `loop_cpu_at_start`.
static int64_t cost_so_far(worker_state *state, int64_t loop_cpu_at_start) {
  return (int64_t) atomic_load(&state->sampling_ns_total) + (thread_cpu_ns() - loop_cpu_at_start);
}

static void update_rate(worker_state *state, int64_t cost, int64_t elapsed) {
  if (state->overhead_target <= 0 || elapsed <= 0) return;
  double fraction = (double) cost / (double) elapsed;
  int64_t current = atomic_load(&state->effective_interval_ns);
  int64_t wanted = (int64_t) ((double) current * fraction / state->overhead_target);
  if (wanted < state->interval_ns) wanted = state->interval_ns;
  if (wanted > state->interval_ns * MAX_STRETCH) wanted = state->interval_ns * MAX_STRETCH;
  atomic_store(&state->effective_interval_ns, wanted);
}

typedef enum {
  ROUND_ASKED, // the thread holding the GVL will run the job
  ROUND_STILL_PENDING, // the previous request has not been served yet
  ROUND_TAKE_GVL, // nobody holds the GVL: the worker thread must take it and sample
  ROUND_NOT_ASKED, // out of memory
} round_request;

static bool clock_should_run(contprof_wall_clock_call *call) {
  return !atomic_load(&call->stop) && contprof_wall_clock_current_run(call->state, call->generation);
}

// Hands a wall round to the worker thread (nobody holds the GVL).
static void want_gvl_round(contprof_wall_clock_call *call) {
  if (!CONTPROF_PTHREAD_OK(call->state, pthread_mutex_lock(&call->lock))) return;
  call->gvl_round_wanted = true;
  CONTPROF_PTHREAD_OK(call->state, pthread_cond_signal(&call->cond));
  CONTPROF_PTHREAD_OK(call->state, pthread_mutex_unlock(&call->lock));
}

// Asks for one wall round (holding nudge_mutex, for the current run).
static round_request ask_for_wall_round(worker_state *state) {
  int64_t now = contprof_monotonic_ns();
  if (atomic_exchange(&state->wall_round_requested, true)) {
    if (now - atomic_load(&state->requested_at_ns) <= PENDING_GIVE_UP_NS) {
      atomic_fetch_add(&state->nudges_skipped, 1);
      return ROUND_STILL_PENDING;
    }
    atomic_fetch_add(&state->nudges_lost, 1);
  }
  atomic_store(&state->requested_at_ns, now);
  // (The GC thread is stored before the request: the job reads it.)
  int requested = contprof_vm_request_job(&state->gc_thread_at_tick, &state->gc_moment_at_tick);
  if (!NIL_P((VALUE) atomic_load(&state->gc_thread_at_tick))) atomic_fetch_add(&state->ticks_in_gc, 1);
  if (requested > 0) {
    atomic_fetch_add(&state->interrupts_raised, 1);
    return ROUND_ASKED;
  }
  if (requested == 0) return ROUND_TAKE_GVL;
  atomic_store(&state->wall_round_requested, false);
  return ROUND_NOT_ASKED;
}

static void *clock_loop(void *data) {
  contprof_wall_clock_call *call = data;
  worker_state *state = call->state;
  // The tick must come at its deadline: with the default timer slack (50 us) the kernel
  // may hold it back to fire together with another timer, typically the end of a thread's
  // timed wait (sleep, IO.select with a timeout). And it must run at once (see above).
  // (On the worker thread, contprof_wall_clock_worker_begin did this.)
  if (!call->on_worker_thread) {
    prctl(PR_SET_TIMERSLACK, 1, 0, 0, 0);
    struct slice_attributes unused;
    take_short_slice(&unused); // (this thread is ours: nothing to restore)
  }
  // This thread never handles SIGPROF (it has no CPU timer). On the worker thread the mask
  // is restored on the way out: Ruby reuses native threads.
  sigset_t sigprof, previous_mask;
  sigemptyset(&sigprof);
  sigaddset(&sigprof, SIGPROF);
  pthread_sigmask(SIG_BLOCK, &sigprof, &previous_mask);

  if (CONTPROF_PTHREAD_OK(state, pthread_mutex_lock(&state->wakeup_mutex))) {
    state->loop_started = true;
    CONTPROF_PTHREAD_OK(state, pthread_cond_broadcast(&state->wakeup_cond));
    CONTPROF_PTHREAD_OK(state, pthread_mutex_unlock(&state->wakeup_mutex));
  }

  int64_t deadline = contprof_monotonic_ns();
  int64_t loop_cpu_at_start = thread_cpu_ns(), loop_cpu_counted = loop_cpu_at_start;
  int64_t window_started = deadline, window_cost = cost_so_far(state, loop_cpu_at_start);
  unsigned wakeups_in_window = 0;
  for (;;) {
    int64_t wait = atomic_load(&state->effective_interval_ns);
    int64_t now = contprof_monotonic_ns();
    deadline += wait;
    if (deadline < now - wait) deadline = now + wait; // after a long stall, restart from now
    if (!wait_until(state, deadline)) {
      // On the worker thread any wakeup goes back to Ruby (an interrupt to handle); the
      // worker calls the loop again if the run goes on.
      if (!clock_should_run(call) || call->on_worker_thread) break;
      deadline -= wait; // woken for another reason (a stop of an earlier run): same deadline
      continue;
    }
    if (!clock_should_run(call)) break;
    atomic_fetch_add(&state->trigger_wakeups, 1);

    if (++wakeups_in_window == RATE_WINDOW_WAKEUPS) {
      // (The clock's CPU reaches the statistics here, not only when the loop ends: stop
      // does not wait for this thread, so #stats right after it would miss the last run.)
      int64_t loop_cpu = thread_cpu_ns();
      atomic_fetch_add(&state->trigger_thread_cpu_ns, (uint_fast64_t) (loop_cpu - loop_cpu_counted));
      loop_cpu_counted = loop_cpu;
      int64_t cost = cost_so_far(state, loop_cpu_at_start);
      now = contprof_monotonic_ns();
      update_rate(state, cost - window_cost, now - window_started);
      window_cost = cost;
      window_started = now;
      wakeups_in_window = 0;
    }

    if (!CONTPROF_PTHREAD_OK(state, pthread_mutex_lock(&state->nudge_mutex))) break;
    if (!clock_should_run(call)) {
      CONTPROF_PTHREAD_OK(state, pthread_mutex_unlock(&state->nudge_mutex));
      break;
    }
    round_request request = ask_for_wall_round(state);
    CONTPROF_PTHREAD_OK(state, pthread_mutex_unlock(&state->nudge_mutex));
    if (request == ROUND_TAKE_GVL) {
      if (call->on_worker_thread) {
        rb_thread_call_with_gvl(contprof_worker_wall_round_with_gvl, state);
      } else {
        want_gvl_round(call);
      }
    }
  }
  // Added, not stored: on the worker thread this loop runs many times.
  atomic_fetch_add(&state->trigger_thread_cpu_ns, (uint_fast64_t) (thread_cpu_ns() - loop_cpu_counted));
  pthread_sigmask(SIG_SETMASK, &previous_mask, NULL);
  if (!call->on_worker_thread && CONTPROF_PTHREAD_OK(state, pthread_mutex_lock(&call->lock))) {
    call->clock_ended = true;
    CONTPROF_PTHREAD_OK(state, pthread_cond_signal(&call->cond));
    CONTPROF_PTHREAD_OK(state, pthread_mutex_unlock(&call->lock));
  }
  return NULL;
}

void *contprof_wall_clock_run_here(void *call) { return clock_loop(call); }

bool contprof_wall_clock_start(contprof_wall_clock_call *call) {
  pthread_mutex_init(&call->lock, NULL);
  pthread_cond_init(&call->cond, NULL);
  call->gvl_round_wanted = call->clock_ended = call->interrupted = false;
  atomic_store(&call->stop, false);
  // No signal for this thread (it has no CPU timer, and the application's signals belong
  // to its Ruby threads): it inherits a full mask.
  sigset_t all, previous;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &previous);
  int error = pthread_create(&call->clock, NULL, clock_loop, call);
  pthread_sigmask(SIG_SETMASK, &previous, NULL);
  call->clock_running = error == 0;
  return call->clock_running;
}

void contprof_wall_clock_stop(contprof_wall_clock_call *call) {
  if (!call->clock_running) return;
  atomic_store(&call->stop, true);
  contprof_wall_clock_wake(call->state);
  // The clock never needs the GVL, so it ends within one of its iterations (microseconds)
  // whether or not the caller holds the GVL.
  CONTPROF_PTHREAD_OK(call->state, pthread_join(call->clock, NULL));
  call->clock_running = false;
  pthread_cond_destroy(&call->cond);
  pthread_mutex_destroy(&call->lock);
}

void *contprof_wall_clock_wait_for_gvl_round(void *data) {
  contprof_wall_clock_call *call = data;
  if (!CONTPROF_PTHREAD_OK(call->state, pthread_mutex_lock(&call->lock))) return NULL;
  while (!call->gvl_round_wanted && !call->clock_ended && !call->interrupted) {
    if (!CONTPROF_PTHREAD_OK(call->state, pthread_cond_wait(&call->cond, &call->lock))) call->clock_ended = true;
  }
  call->interrupted = false;
  CONTPROF_PTHREAD_OK(call->state, pthread_mutex_unlock(&call->lock));
  return NULL;
}

bool contprof_wall_clock_take_gvl_round(contprof_wall_clock_call *call) {
  if (!CONTPROF_PTHREAD_OK(call->state, pthread_mutex_lock(&call->lock))) return false;
  bool wanted = call->gvl_round_wanted;
  call->gvl_round_wanted = false;
  CONTPROF_PTHREAD_OK(call->state, pthread_mutex_unlock(&call->lock));
  return wanted;
}

bool contprof_wall_clock_ended(contprof_wall_clock_call *call) {
  if (!CONTPROF_PTHREAD_OK(call->state, pthread_mutex_lock(&call->lock))) return true;
  bool ended = call->clock_ended;
  CONTPROF_PTHREAD_OK(call->state, pthread_mutex_unlock(&call->lock));
  return ended;
}

void contprof_wall_clock_interrupt(contprof_wall_clock_call *call) {
  if (!CONTPROF_PTHREAD_OK(call->state, pthread_mutex_lock(&call->lock))) return;
  call->interrupted = true;
  CONTPROF_PTHREAD_OK(call->state, pthread_cond_signal(&call->cond));
  CONTPROF_PTHREAD_OK(call->state, pthread_mutex_unlock(&call->lock));
}

void *contprof_wall_clock_wait_for_start(void *data) {
  worker_state *state = data;
  struct timespec deadline;
  clock_gettime(CLOCK_MONOTONIC, &deadline);
  deadline.tv_sec += 5;
  if (!CONTPROF_PTHREAD_OK(state, pthread_mutex_lock(&state->wakeup_mutex))) return NULL;
  while (!state->loop_started && !state->wakeup_requested) {
    int waited = pthread_cond_timedwait(&state->wakeup_cond, &state->wakeup_mutex, &deadline);
    if (waited == ETIMEDOUT || !CONTPROF_PTHREAD_OK(state, waited)) break;
  }
  CONTPROF_PTHREAD_OK(state, pthread_mutex_unlock(&state->wakeup_mutex));
  return NULL;
}
