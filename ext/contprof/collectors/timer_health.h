// Whether a thread hears its CPU timer (timer_health.c): a thread that blocks SIGPROF
// (native code's pthread_sigmask) never hears it, and its CPU would be lost; such a
// thread's CPU is read from its clock instead, until an expiry reaches it again.
#pragma once

#include <ruby.h>
#include <stdbool.h>
#include <stdint.h>

#include "collectors/thread_context.h"
#include "collectors/thread_context_types.h"

// After this many wall rounds without a word from a thread's timer, its clock is read.
// More than SILENT_TIMER_PERIODS periods of CPU, plus SILENT_TIMER_SLACK_NS, between two
// such readings of the same timer, unheard, means the thread does not hear it.
#define SILENT_TIMER_CHECK_ROUNDS 32
#define SILENT_TIMER_PERIODS 4
#define SILENT_TIMER_SLACK_NS (20 * 1000 * 1000) // a POSIX timer is noticed at the scheduler's tick (4-10 ms)

// A thread's side of the check.
typedef struct {
  int silent_rounds; // wall rounds since its timer last counted CPU (or was checked)
  bool unheard; // its timer's signals do not reach it: CPU is read from its clock
  bool check_started; // its clock was read after a silence
  int64_t check_cpu_ns; // that reading
  uint64_t check_timer; // the timer (generation) those readings are of
  // Already counted among the threads that blocked SIGPROF, or whose timer was silent
  // (a thread is counted once, however often its timer is replaced and judged again).
  bool counted_blocking_sigprof, counted_silent_timer;
} contprof_thread_timer_health;

// Threads found not hearing their CPU timer: those whose signal mask blocked SIGPROF, the
// others (a timer silent for another reason), and those that heard it again later; and
// how many do not hear it now.
typedef struct {
  uint64_t threads_blocking_sigprof, threads_with_silent_timer, timers_heard_again, threads_not_hearing_timers;
} contprof_timer_health_counts;

// Whether the thread's timer goes unheard although the thread uses CPU, from its timer's
// `reading` in a round of `kind` (judged in wall rounds).
bool contprof_timer_unheard(contprof_timer_health_counts *counts, per_thread_context *context, VALUE thread,
                            const contprof_cpu_timer_reading *reading, contprof_round_kind kind);

// The thread's CPU clock changed source (vm.h's M:N accounting): a check under way
// starts again.
static inline void contprof_timer_health_clock_changed(contprof_thread_timer_health *health) {
  health->check_started = false;
}

// A thread forgotten (it died, or the process forked) no longer counts as not hearing.
static inline void contprof_timer_health_forget(contprof_timer_health_counts *counts,
                                                const contprof_thread_timer_health *health) {
  if (health->unheard) counts->threads_not_hearing_timers--;
}
