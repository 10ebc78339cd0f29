// Per-thread CPU-time timers: the trigger for CPU samples.
//
// Every Ruby thread gets a timer on its own CPU clock (timer_create, delivered to that
// thread only: SIGEV_THREAD_ID). Each time the thread has used one period of CPU, the
// kernel sends it SIGPROF right where it burns that CPU, so CPU samples land in proportion
// to the CPU each place uses, whatever the thread does between: this is what makes
// cpu-time unbiased. The signal handler (contprof_cpu_timers_on_signal) then
//
// - counts the expiration (with the ones the kernel merged into it, si_overrun, for a
//   POSIX timer): a timer armed at CPU time A with period P that expired n times had used
//   exactly A + nP, so the CPU a sample gets needs no clock read; a perf event's counter is
//   read instead (one read on its descriptor per round that has new expirations), as its
//   signals say nothing of the overflows merged into them;
// - when the thread holds the GVL, lets the caller queue the sampling job, which then
//   samples this thread's stack on it (and notes whether the expiry came during a GC, and
//   what the GC was doing: that CPU is the GC's);
// - when the thread runs native code with the GVL released (zlib, a database driver), its
//   Ruby stack cannot change until it takes the GVL back: the handler copies it (a
//   *capture*), and the next round records the CPU with that stack. Without the capture,
//   that CPU would go to wherever the thread is at the next round (often an I/O wait).
//   The same holds whenever the thread does not hold the GVL (going to sleep, waiting to
//   take the GVL back): its Ruby stack cannot change until it has it again.
//
// Timer state lives in static slots: the signal handler must never touch memory another
// thread may free, and arming a timer must not allocate (a forked child arms its timers
// right after the fork). Capture buffers are allocated by sampling rounds, on demand (the
// first expiry in native code asks for one), kept for the slot's next owners, and freed
// when the worker stops.
#pragma once

#include <ruby.h>
#include <ruby/st.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>

#include "collectors/thread_context.h"

// Whether this build has per-thread CPU timers (timer_create with SIGEV_THREAD_ID).
bool contprof_cpu_timers_built(void);

// Which kind of timer new timers are (see "The two kinds of timer" in cpu_timers_arming.c):
// AUTO takes a perf event where the kernel allows it, else a POSIX timer.
typedef enum { CONTPROF_CPU_TIMER_AUTO = 0, CONTPROF_CPU_TIMER_POSIX = 1 } contprof_cpu_timer_kind;
void contprof_cpu_timers_set_kind(contprof_cpu_timer_kind kind);

// The timers of one worker (one at a time per process: there is one SIGPROF handler).
// Only used holding the GVL, except where marked.
typedef struct {
  st_table *threads; // Thread => slot index; keys are marked (pinned)
  int64_t period_ns; // the period the timers are armed with
  long capture_frames; // the deepest stack a capture keeps
  uint64_t armed; // timers created
  uint64_t perf_events_armed; // of which perf events (the others are POSIX timers)
  uint64_t failed; // timer_create or timer_settime refused (the thread's CPU then comes from clock reads)
  // Threads the latest round found without a timer (not known when armed: on Ruby 3.3+, a
  // thread is known from its first GVL switch since the profiler was loaded). The worker
  // arms them again from time to time (contprof_sigprof_maintain_timers).
  uint64_t unarmed_seen;
} contprof_cpu_timers;

void contprof_cpu_timers_init(contprof_cpu_timers *timers, int64_t period_ns, long capture_frames);
void contprof_cpu_timers_mark(const contprof_cpu_timers *timers);
void contprof_cpu_timers_free(contprof_cpu_timers *timers);

// Gives `thread` a timer (no-op when it has one); false when refused (counted in `failed`).
bool contprof_cpu_timers_arm(contprof_cpu_timers *timers, VALUE thread);
void contprof_cpu_timers_arm_all(contprof_cpu_timers *timers, VALUE except_thread);
void contprof_cpu_timers_delete(contprof_cpu_timers *timers, VALUE thread);
void contprof_cpu_timers_delete_all(contprof_cpu_timers *timers);
// Deletes the timers of threads that ended without their end event (in Ruby 3.1 a thread
// killed or ended by an exception skips it): a dead thread's timer never fires, but holds
// a kernel timer.
void contprof_cpu_timers_delete_dead(contprof_cpu_timers *timers);
// Re-arms every timer with a new period (a new cadence: the timers are replaced).
void contprof_cpu_timers_set_period(contprof_cpu_timers *timers, int64_t period_ns);
// In a forked child: the parent's timers did not come along (POSIX), only their ids.
void contprof_cpu_timers_forget_after_fork(contprof_cpu_timers *timers);
size_t contprof_cpu_timers_live(const contprof_cpu_timers *timers);

// What the signal handler did with one SIGPROF of a CPU timer.
typedef enum {
  CONTPROF_TIMER_NOT_OURS = 0, // not a live timer's signal (late, or another sender)
  CONTPROF_TIMER_ON_GVL_HOLDER = 1, // the thread holds the GVL: queue the sampling job
  CONTPROF_TIMER_ELSEWHERE = 2, // counted (captured when it could be); nothing to queue
} contprof_timer_signal;

// From the SIGPROF handler, for a signal whose si_code is SI_TIMER: async-signal-safe.
contprof_timer_signal contprof_cpu_timers_on_signal(const siginfo_t *info);

// The collector's view of the timers (see contprof_cpu_timer_source): reads a thread's new
// expirations and capture. Holding the GVL.
contprof_cpu_timer_source contprof_cpu_timers_source(contprof_cpu_timers *timers);

// Testing (and bench/sample_cost.rb): counts one expiry of `thread`'s timer, as its
// signal would, without the kernel's part; false when it has no timer.
bool contprof_cpu_timers_count_expiry(contprof_cpu_timers *timers, VALUE thread);

// The timers' statistics, under the names #stats lists them with, in its order (the
// worker's reset after a fork sets them back to zero):
// - captures: expirations in native code whose stack was captured;
// - captures_missed: in native code but not captured (no buffer yet, another capture
//   pending, a GC);
// - captures_stale: captured, but a GC ran before a round could record them;
// - expirations_in_gc;
// - perf events: signals whose lateness was measured (the CPU the thread used between the
//   counter's expiry and the handler), their total and largest lateness, and those more
//   than a millisecond late.
#define CONTPROF_CPU_TIMERS_STATS(X)                                                                          \
  X(captures) X(captures_missed) X(captures_stale) X(expirations_in_gc)                                       \
  X(cpu_signals_timed) X(cpu_signal_lag_ns_total) X(cpu_signal_lag_ns_max) X(cpu_signals_late)
#define CONTPROF_CPU_TIMERS_STAT_FIELD(name) uint64_t name;
typedef struct {
  CONTPROF_CPU_TIMERS_STATS(CONTPROF_CPU_TIMERS_STAT_FIELD)
} contprof_cpu_timers_stats;
#undef CONTPROF_CPU_TIMERS_STAT_FIELD
contprof_cpu_timers_stats contprof_cpu_timers_get_stats(void);
// Why this process cannot have perf-event CPU timers (it gets POSIX timers instead),
// written into `why`; NULL when it can (a probe: one perf event opened and closed).
const char *contprof_cpu_timers_perf_events_refused(char *why, size_t size);
// Memory held by capture buffers (given back when the timers are all deleted).
size_t contprof_cpu_timers_capture_bytes(void);
void contprof_cpu_timers_reset_stats(void);
