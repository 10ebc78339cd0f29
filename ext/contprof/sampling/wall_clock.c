// The wall clock (see wall_clock.h).
//
// Wall time must be sampled at instants that do not depend on what the threads do, or it
// lands where threads happen to be when something else wakes the profiler (CPU timers
// fire only while a thread runs, so they would give every sleep to the code that runs
// next). So this loop wakes every interval on a fixed cadence, whatever the threads do,
// and its client asks for a wall round:
//
// - when a thread holds the GVL, by asking it to run the sampling job at its next safe
//   point (its interrupt flag is raised, as Ruby's own timer thread raises it). No signal:
//   a signal to a busy thread is delivered when the kernel gets around to it, which on
//   virtual machines is often its next system call (a C program spending 8% of its time
//   in a system call received 94% of such signals there), so rounds would land after
//   system calls rather than at the tick; a raised flag is seen within microseconds;
// - when no thread holds the GVL (every thread blocked, asleep or in native code), by
//   taking the GVL and sampling itself.
//
// Where the loop runs depends on the VM backend (contprof_vm_request_job_from_ruby_threads):
// - where a Ruby thread may ask (Ruby 3.1), on the worker thread itself, without the GVL,
//   which takes the GVL itself when nobody holds it (contprof_wall_clock_run_here);
// - else (Ruby 3.3+: rb_postponed_job_trigger raises the *caller's* flag when the caller
//   is a Ruby thread) on a plain pthread owned by the worker thread, which starts it,
//   answers its hand-overs by taking the GVL, and stops and joins it on the way out,
//   whatever ends the worker thread (contprof_wall_clock_thread). That hand-over costs a
//   thread wakeup, late by milliseconds now and then on a virtual machine, so the Ruby
//   3.3+ backend also has the first thread to take the GVL run the round: the worker only
//   serves ticks nobody else does.
//
// Deadlines follow a cadence of their own, so a slow request does not slow the rate down;
// its intervals are random around the interval (jitter.h: a steady loop in the
// program would otherwise be sampled at the same few points).
//
// ## Parking
//
// On Ruby 3.3+ a stretch a thread spends off the GVL is timed by the thread hooks once a
// tick has found it (collectors/blocked_stretches.c): later ticks in it only add to its
// record. So when the client's rounds find every thread in such a stretch, using no CPU,
// for a few ticks in a row, the clock parks: no tick until a thread takes the GVL again,
// whose hook wakes it (contprof_wall_clock_unpark). An idle process (a server between
// requests, a job worker waiting for work) then costs no wakeup at all, instead of two per
// tick (this loop's, and the worker thread's that takes the GVL to run the round). No
// stretch can begin unseen meanwhile: beginning one takes the GVL first.
//
// The ticks after a park must fall as if the clock had never stopped, or those near the
// moments threads come back would not be placed apart from what the threads do (the chance
// that a tick falls in a stretch, which weighs every seen stretch, and the interval a
// tick in running code charges both assume they are). So the unpark goes on with the
// schedule the park interrupted: it draws the ticks that did not come up to the moment it
// is called, and the loop waits for the next one, whose round counts threads' wall time
// from the one before (returned to the client, which holds every thread's wall time to it:
// all of it in stretches timed without ticks). After a long park that is many draws; from
// PARK_MIXED_INTERVALS on, the moment is taken among intervals drawn as usual instead
// (jitter.h, contprof_moment_among_intervals: after that many intervals the schedule has
// forgotten where it began). Parking needs a few idle ticks in a row
// (IDLE_TICKS_BEFORE_PARKING, the client's to count), since each park costs one wakeup more
// when it ends: a process that idles for less than an interval at a time would pay more
// than it saves.
//
// ## Adaptive rate
//
// Every RATE_WINDOW_WAKEUPS wakeups the loop compares what the profiler cost (its client's
// rounds plus this loop's own CPU) with the time elapsed, and stretches the interval so
// that the cost stays within `overhead_target` of one core. Values stay exact (they are
// time deltas); only the resolution drops.
#include "sampling/wall_clock.h"

#include <errno.h>
#include <signal.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "jitter.h"
#include "sampling/statistics.h"
#include "time_helpers.h"

// Wakeups between two updates of the adaptive rate.
#define RATE_WINDOW_WAKEUPS 32
// The stretched interval never exceeds this many intervals.
#define MAX_STRETCH 100
// How much one window may stretch the interval: a single slow round (a round that met a
// long GC, say) must not throw away the resolution of the next 32 wakeups, which at the
// stretched interval would take a long time to pass. Steady costs still reach their
// interval within a few windows.
#define MAX_GROWTH 4

// The prompt threads' scheduling slice. A thread woken on a CPU where another runs does
// not run at once: the scheduler lets the running one finish its slice (3 ms by default
// under EEVDF) or reach its next preemption point, which is typically its next system
// call. So with the default slice, ticks would observe busy threads at their system calls
// (measured: a C program whose thread spent 0.2% of its time reading its CPU clock was
// found there at 5-14% of a sleeping thread's wakeups; 0.2-1% with a 100 us slice, 0.1%
// with the two threads on separate CPUs). Since Linux 6.12 a thread may ask for a shorter
// slice (sched_attr.sched_runtime, no privilege needed); older kernels ignore it.
#define PROMPT_SLICE_NS 100000

// A pthread call on the clock's own objects; a failure is the client's to report (it
// ends sampling). Evaluates to whether `call` returned 0.
#define CLOCK_PTHREAD_OK(clock, call) clock_pthread_ok((clock), (call), #call)

static bool clock_pthread_ok(contprof_wall_clock *clock, int result, const char *call) {
  if (result == 0) return true;
  atomic_store(&clock->running, false);
  clock->client.failed(clock->client.data, result, call);
  return false;
}

static void init_locks(contprof_wall_clock *clock) {
  pthread_mutex_init(&clock->mutex, NULL);
  pthread_condattr_t attributes;
  pthread_condattr_init(&attributes);
  pthread_condattr_setclock(&attributes, CLOCK_MONOTONIC);
  pthread_cond_init(&clock->cond, &attributes);
  pthread_condattr_destroy(&attributes);
}

void contprof_wall_clock_init(contprof_wall_clock *clock, contprof_wall_clock_client client) {
  memset(clock, 0, sizeof(*clock));
  clock->client = client;
  clock->unpark_random_state = contprof_jitter_seed((uint64_t) contprof_clock_ns(CLOCK_MONOTONIC), (uint64_t) (uintptr_t) clock);
  init_locks(clock);
}

void contprof_wall_clock_destroy(contprof_wall_clock *clock) {
  pthread_mutex_destroy(&clock->mutex);
  pthread_cond_destroy(&clock->cond);
}

// Past this many intervals of a park, the first tick after it is placed by
// contprof_moment_among_intervals rather than by drawing the ticks that did not come.
#define PARK_MIXED_INTERVALS 16

static void clear_park(contprof_wall_clock *clock) {
  atomic_store(&clock->parked, false);
  clock->unparked = false;
  clock->previous_tick_ns = clock->next_tick_ns = 0;
}

void contprof_wall_clock_reset_after_fork(contprof_wall_clock *clock) {
  init_locks(clock);
  clock->wakeup_requested = clock->alarm_changed = clock->started = false;
  clock->waiting_until_ns = 0;
  clear_park(clock);
  atomic_store(&clock->alarm_ns, 0);
#define RESET_COUNTER(name) atomic_store(&clock->name, 0);
  CONTPROF_WALL_CLOCK_COUNTERS(RESET_COUNTER)
#undef RESET_COUNTER
}

uint64_t contprof_wall_clock_start_run(contprof_wall_clock *clock, int64_t interval_ns, double overhead_target) {
  clock->interval_ns = interval_ns;
  clock->overhead_target = overhead_target;
  atomic_store(&clock->effective_interval_ns, interval_ns);
  clock->wakeup_requested = clock->alarm_changed = false;
  clock->started = false;
  clear_park(clock);
  atomic_store(&clock->alarm_ns, 0);
  uint64_t run = atomic_fetch_add(&clock->run, 1) + 1;
  atomic_store(&clock->running, true);
  return run;
}

void contprof_wall_clock_wake(contprof_wall_clock *clock) {
  if (!CLOCK_PTHREAD_OK(clock, pthread_mutex_lock(&clock->mutex))) return;
  clock->wakeup_requested = true;
  CLOCK_PTHREAD_OK(clock, pthread_cond_broadcast(&clock->cond));
  CLOCK_PTHREAD_OK(clock, pthread_mutex_unlock(&clock->mutex));
}

void contprof_wall_clock_set_alarm(contprof_wall_clock *clock, int64_t at_ns) {
  int_fast64_t pending = atomic_load(&clock->alarm_ns);
  if (pending > 0 && pending <= at_ns) return;
  atomic_store(&clock->alarm_ns, at_ns);
  if (!CLOCK_PTHREAD_OK(clock, pthread_mutex_lock(&clock->mutex))) return;
  // A loop that will wake before the alarm anyway, or is not waiting (it looks at the alarm
  // before it waits: see wait_until), is left alone: each wakeup of a sleeping thread costs
  // tens of microseconds on a virtual machine, and the allocation sampler sets an alarm
  // after every check.
  if (clock->waiting_until_ns > at_ns) {
    clock->alarm_changed = true;
    CLOCK_PTHREAD_OK(clock, pthread_cond_broadcast(&clock->cond));
  }
  CLOCK_PTHREAD_OK(clock, pthread_mutex_unlock(&clock->mutex));
}

void contprof_wall_clock_end_run(contprof_wall_clock *clock) { atomic_store(&clock->running, false); }

void contprof_wall_clock_park(contprof_wall_clock *clock) {
  if (!CLOCK_PTHREAD_OK(clock, pthread_mutex_lock(&clock->mutex))) return;
  if (atomic_load(&clock->running) && !atomic_load(&clock->parked)) {
    atomic_store(&clock->parked_since_ns, contprof_clock_ns(CLOCK_MONOTONIC));
    atomic_store(&clock->parked, true);
    atomic_fetch_add(&clock->parks, 1);
    clock->alarm_changed = true; // (the loop reconsiders its wait)
    CLOCK_PTHREAD_OK(clock, pthread_cond_broadcast(&clock->cond));
  }
  CLOCK_PTHREAD_OK(clock, pthread_mutex_unlock(&clock->mutex));
}

int64_t contprof_wall_clock_unpark(contprof_wall_clock *clock) {
  if (!CLOCK_PTHREAD_OK(clock, pthread_mutex_lock(&clock->mutex))) return 0;
  int64_t resumed_from = 0;
  if (atomic_load(&clock->parked)) {
    int64_t now = contprof_clock_ns(CLOCK_MONOTONIC);
    int64_t interval = atomic_load(&clock->effective_interval_ns);
    int64_t previous = clock->previous_tick_ns, next = clock->next_tick_ns;
    if (next <= 0 || now - next > PARK_MIXED_INTERVALS * interval) {
      int64_t since_previous, until_next;
      contprof_moment_among_intervals(&clock->unpark_random_state, interval, &since_previous, &until_next);
      previous = now - since_previous;
      next = now + until_next;
    } else {
      while (next <= now) {
        previous = next;
        next += contprof_jittered_interval(&clock->unpark_random_state, interval);
      }
    }
    resumed_from = previous;
    clock->previous_tick_ns = previous;
    clock->next_tick_ns = next;
    clock->unparked = true;
    atomic_store(&clock->parked, false);
    int64_t parked_for = now - atomic_load(&clock->parked_since_ns);
    if (parked_for > 0) atomic_fetch_add(&clock->parked_ns, (uint_fast64_t) parked_for);
    CLOCK_PTHREAD_OK(clock, pthread_cond_broadcast(&clock->cond));
  }
  CLOCK_PTHREAD_OK(clock, pthread_mutex_unlock(&clock->mutex));
  return resumed_from;
}

void contprof_wall_clock_stop(contprof_wall_clock *clock) {
  contprof_wall_clock_end_run(clock);
  contprof_wall_clock_wake(clock);
}

bool contprof_wall_clock_serving(contprof_wall_clock *clock, uint64_t run) {
  return atomic_load(&clock->running) && atomic_load(&clock->run) == run;
}

void contprof_wall_clock_wait_for_start(contprof_wall_clock *clock) {
  struct timespec deadline = contprof_ns_timespec(contprof_clock_ns(CLOCK_MONOTONIC) + 5000000000LL);
  if (!CLOCK_PTHREAD_OK(clock, pthread_mutex_lock(&clock->mutex))) return;
  while (!clock->started && !clock->wakeup_requested) {
    int waited = pthread_cond_timedwait(&clock->cond, &clock->mutex, &deadline);
    if (waited == ETIMEDOUT || !CLOCK_PTHREAD_OK(clock, waited)) break;
  }
  CLOCK_PTHREAD_OK(clock, pthread_mutex_unlock(&clock->mutex));
}

// ---------------------------------------------------------------------------------------
// Prompt threads

void contprof_wall_clock_make_prompt(contprof_prompt_thread *previous) {
  // The tick must come at its deadline: with the default timer slack (50 us) the kernel
  // may hold it back to fire together with another timer, typically the end of a thread's
  // timed wait (sleep, IO.select with a timeout). And it must run at once (see above).
  previous->timer_slack = prctl(PR_GET_TIMERSLACK, 0, 0, 0, 0);
  prctl(PR_SET_TIMERSLACK, 1, 0, 0, 0);
  memset(&previous->slice, 0, sizeof(previous->slice));
#ifdef SYS_sched_setattr
  if (syscall(SYS_sched_getattr, 0, &previous->slice, sizeof(previous->slice), 0) != 0) {
    previous->slice.size = 0; // nothing to restore
    return;
  }
  contprof_sched_attributes attributes = previous->slice;
  attributes.runtime = PROMPT_SLICE_NS;
  syscall(SYS_sched_setattr, 0, &attributes, 0);
#endif
}

// (A Ruby thread may run another Ruby thread afterwards: Ruby reuses native threads.)
void contprof_wall_clock_restore(const contprof_prompt_thread *previous) {
  if (previous->timer_slack > 0) prctl(PR_SET_TIMERSLACK, previous->timer_slack, 0, 0, 0);
#ifdef SYS_sched_setattr
  if (previous->slice.size > 0) syscall(SYS_sched_setattr, 0, &previous->slice, 0);
#endif
}

// ---------------------------------------------------------------------------------------
// The loop

typedef enum { WAITED, WAIT_RECONSIDER, WAIT_UNPARKED, WAIT_ENDED } wait_outcome;

// A parked loop still looks at the clock this often: a run ended without a wakeup (a
// failed pthread call ends it so) is noticed then.
#define PARKED_CHECK_NS (1000LL * 1000 * 1000)

// Waits until `deadline_ns` (CLOCK_MONOTONIC; while parked, at most PARKED_CHECK_NS), until
// the alarm changes or the clock parks (WAIT_RECONSIDER), until it unparks (WAIT_UNPARKED:
// `*tick_ns` becomes the tick to wait for), or until woken or stopped (WAIT_ENDED: the
// caller decides what next). `*previous_tick_ns` and `*tick_ns`: the loop's schedule, which an
// unpark moves on.
static wait_outcome wait_until(contprof_wall_clock *clock, int64_t deadline_ns, int64_t *previous_tick_ns, int64_t *tick_ns) {
  if (!CLOCK_PTHREAD_OK(clock, pthread_mutex_lock(&clock->mutex))) return WAIT_ENDED;
  if (!clock->unparked) { // (else the unpark's schedule is the one to take)
    clock->previous_tick_ns = *previous_tick_ns;
    clock->next_tick_ns = *tick_ns;
  }
  // An alarm set after the caller read it, for before its deadline: set_alarm did not wake a
  // loop that was not waiting.
  int_fast64_t alarm = atomic_load(&clock->alarm_ns);
  if (alarm > 0 && (deadline_ns <= 0 || alarm < deadline_ns)) clock->alarm_changed = true;
  while (!clock->wakeup_requested && !clock->alarm_changed && !clock->unparked && atomic_load(&clock->running)) {
    int64_t until = deadline_ns;
    if (atomic_load(&clock->parked)) {
      int64_t check = contprof_clock_ns(CLOCK_MONOTONIC) + PARKED_CHECK_NS;
      if (until <= 0 || until > check) until = check;
    }
    struct timespec deadline = contprof_ns_timespec(until);
    clock->waiting_until_ns = until;
    int waited = pthread_cond_timedwait(&clock->cond, &clock->mutex, &deadline);
    clock->waiting_until_ns = 0;
    atomic_fetch_add(&clock->thread_wakeups, 1);
    if (waited == ETIMEDOUT || !CLOCK_PTHREAD_OK(clock, waited)) break;
  }
  bool woken = clock->wakeup_requested, reconsider = clock->alarm_changed, unparked = clock->unparked;
  clock->wakeup_requested = clock->alarm_changed = clock->unparked = false;
  if (unparked) {
    *previous_tick_ns = clock->previous_tick_ns;
    *tick_ns = clock->next_tick_ns;
  }
  CLOCK_PTHREAD_OK(clock, pthread_mutex_unlock(&clock->mutex));
  if (woken || !atomic_load(&clock->running)) return WAIT_ENDED;
  if (unparked) return WAIT_UNPARKED;
  return reconsider ? WAIT_RECONSIDER : WAITED;
}

// Waits for the next tick at `*deadline_ns` (the one after `previous_tick_ns`), calling the
// client's alarm on the way when one is due before it; while parked, only the alarm. An
// unpark moves `*deadline_ns` (see "Parking"). False when the loop should end.
static bool wait_for_tick(contprof_wall_clock *clock, int64_t previous_tick_ns, int64_t *deadline_ns) {
  int64_t previous = previous_tick_ns;
  for (;;) {
    int_fast64_t alarm = atomic_load(&clock->alarm_ns);
    bool parked = atomic_load(&clock->parked);
    int64_t until = parked ? alarm : (alarm > 0 && alarm < *deadline_ns ? alarm : *deadline_ns);
    wait_outcome outcome = wait_until(clock, until, &previous, deadline_ns);
    if (outcome == WAIT_ENDED) return false;
    if (outcome == WAIT_RECONSIDER || outcome == WAIT_UNPARKED) continue;
    int64_t now = contprof_clock_ns(CLOCK_MONOTONIC);
    alarm = atomic_load(&clock->alarm_ns);
    if (alarm > 0 && alarm <= now && atomic_compare_exchange_strong(&clock->alarm_ns, &alarm, 0)) {
      clock->client.alarm(clock->client.data);
    }
    // (A wakeup that began parked never ticks, even if the clock unparked meanwhile: its
    // deadline is from before the park, and the unpark's is taken at the next wait.)
    if (!parked && !atomic_load(&clock->parked) && now >= *deadline_ns) return true;
  }
}

static void update_rate(contprof_wall_clock *clock, int64_t cost, int64_t elapsed) {
  if (clock->overhead_target <= 0 || elapsed <= 0) return;
  double fraction = (double) cost / (double) elapsed;
  int64_t current = atomic_load(&clock->effective_interval_ns);
  int64_t wanted = (int64_t) ((double) current * fraction / clock->overhead_target);
  if (wanted > current * MAX_GROWTH) wanted = current * MAX_GROWTH;
  if (wanted < clock->interval_ns) wanted = clock->interval_ns;
  if (wanted > clock->interval_ns * MAX_STRETCH) wanted = clock->interval_ns * MAX_STRETCH;
  atomic_store(&clock->effective_interval_ns, wanted);
}

static void note_lateness(contprof_wall_clock *clock, int64_t late_ns) {
  if (late_ns <= 0) return;
  atomic_fetch_add(&clock->wakeup_late_ns_total, (uint_fast64_t) late_ns);
  contprof_update_max(&clock->wakeup_late_ns_max, (uint64_t) late_ns);
  if (late_ns > 1000 * 1000) atomic_fetch_add(&clock->wakeups_late, 1);
}

// What the loop does with a tick that found no thread holding the GVL.
typedef void (*nobody_handler)(void *context);

static void loop(contprof_wall_clock *clock, uint64_t run, nobody_handler on_nobody, void *context) {
  // This thread never handles SIGPROF (it has no CPU timer); on the worker thread the
  // mask is restored on the way out.
  sigset_t sigprof, previous_mask;
  sigemptyset(&sigprof);
  sigaddset(&sigprof, SIGPROF);
  pthread_sigmask(SIG_BLOCK, &sigprof, &previous_mask);

  if (CLOCK_PTHREAD_OK(clock, pthread_mutex_lock(&clock->mutex))) {
    clock->started = true;
    CLOCK_PTHREAD_OK(clock, pthread_cond_broadcast(&clock->cond));
    CLOCK_PTHREAD_OK(clock, pthread_mutex_unlock(&clock->mutex));
  }

  int64_t deadline = contprof_clock_ns(CLOCK_MONOTONIC);
  uint64_t random_state = contprof_jitter_seed((uint64_t) deadline, (uint64_t) (uintptr_t) clock);
  int64_t cpu_at_start = contprof_clock_ns(CLOCK_THREAD_CPUTIME_ID), cpu_counted = cpu_at_start;
  int64_t window_started = deadline, window_cost = clock->client.rounds_cost_ns(clock->client.data);
  unsigned wakeups_in_window = 0;
  while (contprof_wall_clock_serving(clock, run)) {
    int64_t wait = contprof_jittered_interval(&random_state, atomic_load(&clock->effective_interval_ns));
    int64_t now = contprof_clock_ns(CLOCK_MONOTONIC);
    int64_t previous = deadline;
    deadline += wait;
    if (deadline < now - wait) deadline = now + wait; // after a long stall, restart from now
    if (!wait_for_tick(clock, previous, &deadline)) break; // woken (or stopped): the caller decides what next
    if (!contprof_wall_clock_serving(clock, run)) break;
    atomic_fetch_add(&clock->wakeups, 1);
    note_lateness(clock, contprof_clock_ns(CLOCK_MONOTONIC) - deadline);

    if (++wakeups_in_window == RATE_WINDOW_WAKEUPS) {
      // (The loop's CPU reaches the statistics here, not only when the loop ends: the
      // worker's stop does not wait for this thread.)
      int64_t cpu = contprof_clock_ns(CLOCK_THREAD_CPUTIME_ID);
      atomic_fetch_add(&clock->cpu_ns, (uint_fast64_t) (cpu - cpu_counted));
      cpu_counted = cpu;
      int64_t cost = clock->client.rounds_cost_ns(clock->client.data) + (cpu - cpu_at_start);
      now = contprof_clock_ns(CLOCK_MONOTONIC);
      update_rate(clock, cost - window_cost, now - window_started);
      window_cost = cost;
      window_started = now;
      wakeups_in_window = 0;
    }

    contprof_tick tick = clock->client.tick(clock->client.data);
    if (tick == CONTPROF_TICK_STOPPED) break;
    if (tick == CONTPROF_TICK_NOBODY) on_nobody(context);
  }
  atomic_fetch_add(&clock->cpu_ns, (uint_fast64_t) (contprof_clock_ns(CLOCK_THREAD_CPUTIME_ID) - cpu_counted));
  pthread_sigmask(SIG_SETMASK, &previous_mask, NULL);
}

static void round_with_gvl(void *clock) {
  contprof_wall_clock *self = clock;
  self->client.round_with_gvl(self->client.data);
}

void *contprof_wall_clock_run_here(void *data) {
  contprof_wall_clock_here *here = data;
  loop(here->clock, here->run, round_with_gvl, here->clock);
  return NULL;
}

// ---------------------------------------------------------------------------------------
// The clock on a thread of its own

#define THREAD_PTHREAD_OK(thread, call) clock_pthread_ok((thread)->clock, (call), #call)

// Hands a round to the worker thread (nobody holds the GVL).
static void hand_over_round(void *data) {
  contprof_wall_clock_thread *thread = data;
  if (!THREAD_PTHREAD_OK(thread, pthread_mutex_lock(&thread->lock))) return;
  thread->round_wanted = true;
  THREAD_PTHREAD_OK(thread, pthread_cond_signal(&thread->cond));
  THREAD_PTHREAD_OK(thread, pthread_mutex_unlock(&thread->lock));
}

static void *clock_thread_main(void *data) {
  contprof_wall_clock_thread *thread = data;
  contprof_prompt_thread unused;
  contprof_wall_clock_make_prompt(&unused); // (this thread is ours: nothing to restore)
  // Woken early (a stop of an earlier run, a failure), the loop returns: it goes on while
  // the run does.
  while (!atomic_load(&thread->stop) && contprof_wall_clock_serving(thread->clock, thread->run)) {
    loop(thread->clock, thread->run, hand_over_round, thread);
  }
  if (THREAD_PTHREAD_OK(thread, pthread_mutex_lock(&thread->lock))) {
    thread->ended = true;
    THREAD_PTHREAD_OK(thread, pthread_cond_signal(&thread->cond));
    THREAD_PTHREAD_OK(thread, pthread_mutex_unlock(&thread->lock));
  }
  return NULL;
}

bool contprof_wall_clock_thread_start(contprof_wall_clock_thread *thread, contprof_wall_clock *clock, uint64_t run) {
  thread->clock = clock;
  thread->run = run;
  pthread_mutex_init(&thread->lock, NULL);
  pthread_cond_init(&thread->cond, NULL);
  thread->round_wanted = thread->ended = thread->interrupted = false;
  atomic_store(&thread->stop, false);
  // No signal for this thread (it has no CPU timer, and the application's signals belong
  // to its Ruby threads): it inherits a full mask.
  sigset_t all, previous;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &previous);
  int error = pthread_create(&thread->thread, NULL, clock_thread_main, thread);
  pthread_sigmask(SIG_SETMASK, &previous, NULL);
  thread->thread_running = error == 0;
  return thread->thread_running;
}

void contprof_wall_clock_thread_stop(contprof_wall_clock_thread *thread) {
  if (!thread->thread_running) return;
  // The run may go on (the worker thread is being killed): this clock thread ends anyway.
  atomic_store(&thread->stop, true);
  contprof_wall_clock_wake(thread->clock);
  // The clock never needs the GVL, so it ends within one of its iterations (microseconds)
  // whether or not the caller holds the GVL.
  THREAD_PTHREAD_OK(thread, pthread_join(thread->thread, NULL));
  thread->thread_running = false;
  pthread_cond_destroy(&thread->cond);
  pthread_mutex_destroy(&thread->lock);
}

void *contprof_wall_clock_thread_wait(void *data) {
  contprof_wall_clock_thread *thread = data;
  if (!THREAD_PTHREAD_OK(thread, pthread_mutex_lock(&thread->lock))) return NULL;
  while (!thread->round_wanted && !thread->ended && !thread->interrupted) {
    if (!THREAD_PTHREAD_OK(thread, pthread_cond_wait(&thread->cond, &thread->lock))) thread->ended = true;
  }
  thread->interrupted = false;
  THREAD_PTHREAD_OK(thread, pthread_mutex_unlock(&thread->lock));
  return NULL;
}

bool contprof_wall_clock_thread_take_round(contprof_wall_clock_thread *thread) {
  if (!THREAD_PTHREAD_OK(thread, pthread_mutex_lock(&thread->lock))) return false;
  bool wanted = thread->round_wanted;
  thread->round_wanted = false;
  THREAD_PTHREAD_OK(thread, pthread_mutex_unlock(&thread->lock));
  return wanted;
}

bool contprof_wall_clock_thread_ended(contprof_wall_clock_thread *thread) {
  if (!THREAD_PTHREAD_OK(thread, pthread_mutex_lock(&thread->lock))) return true;
  bool ended = thread->ended;
  THREAD_PTHREAD_OK(thread, pthread_mutex_unlock(&thread->lock));
  return ended;
}

void contprof_wall_clock_thread_interrupt(contprof_wall_clock_thread *thread) {
  if (!THREAD_PTHREAD_OK(thread, pthread_mutex_lock(&thread->lock))) return;
  thread->interrupted = true;
  THREAD_PTHREAD_OK(thread, pthread_cond_signal(&thread->cond));
  THREAD_PTHREAD_OK(thread, pthread_mutex_unlock(&thread->lock));
}
