// The wall clock: a loop that ticks every interval on a fixed cadence, whatever the
// threads do, and at each tick has its client (the worker) ask for a wall round; between
// ticks it wakes at the one moment its client sets (an alarm: the allocation sampler's
// next check); it also stretches the interval to keep the profiler's cost within a
// target. Plain C (pthreads): the client does everything that touches Ruby, through the
// callbacks below. Why it works this way: the notes at the top of wall_clock.c.
#pragma once

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

// What asking for a wall round at a tick came to.
typedef enum {
  CONTPROF_TICK_ASKED, // the thread holding the GVL will run the round
  CONTPROF_TICK_PENDING, // the previous round has not run yet: nothing asked
  CONTPROF_TICK_NOBODY, // no thread holds the GVL: the round is to be run by taking it
  CONTPROF_TICK_FAILED, // could not ask (out of memory): skipped
  CONTPROF_TICK_STOPPED, // sampling has ended: the clock stops
} contprof_tick;

// What the clock needs from its client. Each callback is called without the GVL, from the
// thread the clock runs on, but for round_with_gvl (see contprof_wall_clock_run_here).
typedef struct {
  void *data;
  contprof_tick (*tick)(void *data);
  // The CPU the client's rounds have cost so far (for the adaptive rate).
  int64_t (*rounds_cost_ns)(void *data);
  // Runs a CONTPROF_TICK_NOBODY round, taking the GVL: only when the clock runs on a Ruby
  // thread (contprof_wall_clock_run_here).
  void (*round_with_gvl)(void *data);
  // The time asked for with contprof_wall_clock_set_alarm has come.
  void (*alarm)(void *data);
  // A pthread call on the clock's own objects failed (a bug or corrupt memory): sampling
  // must end. `call` names it.
  void (*failed)(void *data, int error, const char *call);
} contprof_wall_clock_client;

// struct sched_attr, which glibc does not declare.
typedef struct {
  uint32_t size, policy;
  uint64_t flags;
  int32_t nice;
  uint32_t priority;
  uint64_t runtime, deadline, period;
  uint32_t util_min, util_max;
} contprof_sched_attributes;

// A thread's scheduling before it was made prompt, to give back.
typedef struct {
  int timer_slack;
  contprof_sched_attributes slice;
} contprof_prompt_thread;

// The clock's statistics, added to by every run and listed by #stats as clock_<name>:
// wakeups (ticks), thread_wakeups (every return from a wait: ticks, alarms, changes of
// plan), cpu_ns (the clock thread's CPU), parks and parked_ns, and how late the loop woke
// after its deadlines (the kernel's wakeup latency): in total, at worst, and how many
// wakeups were over a millisecond late.
#define CONTPROF_WALL_CLOCK_COUNTERS(X) \
  X(wakeups) X(thread_wakeups) X(cpu_ns) X(parks) X(parked_ns) X(wakeup_late_ns_total) X(wakeup_late_ns_max) X(wakeups_late)

typedef struct {
  contprof_wall_clock_client client;
  int64_t interval_ns;
  double overhead_target; // of one core; 0 or less: no stretching
  atomic_int_fast64_t effective_interval_ns; // the interval, stretched by the adaptive rate
  // Which run the clock serves: a loop started for an earlier one ends (see
  // contprof_wall_clock_start_run).
  atomic_uint_fast64_t run;
  atomic_bool running;
  pthread_mutex_t mutex; // guards the flags below
  pthread_cond_t cond; // (CLOCK_MONOTONIC)
  bool wakeup_requested;
  bool alarm_changed; // the loop must reconsider how long to wait
  bool started; // a loop of the current run has begun
  // What the loop waits for now (0: it is not waiting; it looks at the alarm before it
  // waits again): contprof_wall_clock_set_alarm wakes it only for an earlier alarm.
  int64_t waiting_until_ns;
  atomic_int_fast64_t alarm_ns; // when to call client.alarm (CLOCK_MONOTONIC; 0: never)
  // Parked (contprof_wall_clock_park): no ticks until a thread takes the GVL again.
  // Written under the mutex.
  atomic_bool parked;
  atomic_int_fast64_t parked_since_ns;
  // Under the mutex: the loop's latest tick and the one it waits for (the schedule a park
  // interrupts, which the unpark moves on); whether it unparked since the loop last
  // looked; the draws of contprof_wall_clock_unpark.
  int64_t previous_tick_ns, next_tick_ns;
  bool unparked;
  uint64_t unpark_random_state;
#define CONTPROF_DECLARE_CLOCK_COUNTER(name) atomic_uint_fast64_t name;
  CONTPROF_WALL_CLOCK_COUNTERS(CONTPROF_DECLARE_CLOCK_COUNTER)
#undef CONTPROF_DECLARE_CLOCK_COUNTER
} contprof_wall_clock;

void contprof_wall_clock_init(contprof_wall_clock *clock, contprof_wall_clock_client client);
void contprof_wall_clock_destroy(contprof_wall_clock *clock);
// In a forked child: the mutex may have been held by a thread that did not come along.
void contprof_wall_clock_reset_after_fork(contprof_wall_clock *clock);
// Stops the ticks until contprof_wall_clock_unpark (which the client has the first thread
// to take the GVL call): its client found every thread off the GVL in a stretch that is
// timed without ticks. Called holding the GVL.
void contprof_wall_clock_park(contprof_wall_clock *clock);
// Ticks again, as if the clock had never stopped: returns the instant the interval of its
// next tick began (from which threads' wall time counts, see wall_clock.c), or 0 when it
// was not parked. Does not block beyond the clock's mutex.
int64_t contprof_wall_clock_unpark(contprof_wall_clock *clock);

// A new run (returns its number), with this interval and target; ends the previous one.
uint64_t contprof_wall_clock_start_run(contprof_wall_clock *clock, int64_t interval_ns, double overhead_target);
// Has the loop call client.alarm at `at_ns` (CLOCK_MONOTONIC), between its ticks, unless
// an earlier alarm is pending. Any thread; takes the clock's mutex briefly.
void contprof_wall_clock_set_alarm(contprof_wall_clock *clock, int64_t at_ns);
// Ends the run: every loop returns at its next wakeup, which this causes.
void contprof_wall_clock_stop(contprof_wall_clock *clock);
// Ends the run without waking the loop: every loop returns at its next wakeup at the
// latest (one interval). For a failed pthread call, which may be one on the clock's own
// mutex, and for signal handlers: takes no lock.
void contprof_wall_clock_end_run(contprof_wall_clock *clock);
// Wakes the loop (it checks whether its run goes on).
void contprof_wall_clock_wake(contprof_wall_clock *clock);
bool contprof_wall_clock_serving(contprof_wall_clock *clock, uint64_t run);
// Returns once a loop of the current run has begun, or after 5 s.
void contprof_wall_clock_wait_for_start(contprof_wall_clock *clock);

// The loop, on the calling thread, for one run: a Ruby thread without the GVL (the
// client's round_with_gvl takes it when no thread holds it). Returns when woken, for the
// caller to handle Ruby's interrupts, or when the run ends. Takes a
// contprof_wall_clock_here *.
typedef struct {
  contprof_wall_clock *clock;
  uint64_t run;
} contprof_wall_clock_here;
void *contprof_wall_clock_run_here(void *here);

// The loop on a thread of its own, for a client whose rounds must be asked for from a
// thread that is not a Ruby thread (the Ruby 3.3+ backend): a tick that finds no thread
// holding the GVL is handed to the caller's Ruby thread (the worker), which waits for such
// hand-overs and runs them. Lives on the worker thread's stack.
typedef struct {
  contprof_wall_clock *clock;
  uint64_t run;
  pthread_t thread;
  bool thread_running;
  atomic_bool stop; // the worker thread is leaving (killed, or the run ended)
  pthread_mutex_t lock; // guards the three flags below
  pthread_cond_t cond;
  bool round_wanted; // a tick found nobody holding the GVL: the worker takes it
  bool ended;
  bool interrupted; // Ruby wants the worker thread back (Thread#kill, VM shutdown)
} contprof_wall_clock_thread;

bool contprof_wall_clock_thread_start(contprof_wall_clock_thread *thread, contprof_wall_clock *clock, uint64_t run);
// Stops the clock's thread and joins it (with or without the GVL: it never needs it).
void contprof_wall_clock_thread_stop(contprof_wall_clock_thread *thread);
// Run by the worker thread without the GVL: returns when the clock hands over a round,
// ends, or contprof_wall_clock_thread_interrupt is called. Takes a thread.
void *contprof_wall_clock_thread_wait(void *thread);
// Whether a round was handed over (and takes it).
bool contprof_wall_clock_thread_take_round(contprof_wall_clock_thread *thread);
bool contprof_wall_clock_thread_ended(contprof_wall_clock_thread *thread);
void contprof_wall_clock_thread_interrupt(contprof_wall_clock_thread *thread);

// For a thread that must run as soon as it is woken (the clock's, and the worker thread
// that runs the rounds nobody else can): a short scheduling slice and no timer slack.
void contprof_wall_clock_make_prompt(contprof_prompt_thread *previous);
void contprof_wall_clock_restore(const contprof_prompt_thread *previous);
