// Per-thread CPU-time timers (see cpu_timers.h) where this build has none (no
// timer_create): every thread's CPU comes from clock reads at wall rounds. Stubs, which
// ignore their arguments; builds with timers use cpu_timers.c and the files it names.
#include "sampling/cpu_timers.h"

#ifndef CONTPROF_HAVE_CPU_TIMERS

#include <stdio.h>
#include <string.h>

#pragma GCC diagnostic ignored "-Wunused-parameter"

bool contprof_cpu_timers_built(void) { return false; }
void contprof_cpu_timers_init(contprof_cpu_timers *timers, int64_t period_ns, long capture_frames) {
  memset(timers, 0, sizeof(*timers));
  timers->period_ns = period_ns;
}
void contprof_cpu_timers_mark(const contprof_cpu_timers *timers) {}
void contprof_cpu_timers_free(contprof_cpu_timers *timers) {}
bool contprof_cpu_timers_arm(contprof_cpu_timers *timers, VALUE thread) { return false; }
void contprof_cpu_timers_arm_all(contprof_cpu_timers *timers, VALUE except_thread) {}
void contprof_cpu_timers_delete(contprof_cpu_timers *timers, VALUE thread) {}
void contprof_cpu_timers_delete_all(contprof_cpu_timers *timers) {}
void contprof_cpu_timers_delete_dead(contprof_cpu_timers *timers) {}
void contprof_cpu_timers_set_period(contprof_cpu_timers *timers, int64_t period_ns) {}
void contprof_cpu_timers_forget_after_fork(contprof_cpu_timers *timers) {}
size_t contprof_cpu_timers_live(const contprof_cpu_timers *timers) { return 0; }
contprof_timer_signal contprof_cpu_timers_on_signal(const siginfo_t *info) { return CONTPROF_TIMER_NOT_OURS; }
static bool no_timer(void *context, VALUE thread, contprof_cpu_timer_reading *reading) { return false; }
static void no_done(void *context, VALUE thread) {}
contprof_cpu_timer_source contprof_cpu_timers_source(contprof_cpu_timers *timers) {
  return (contprof_cpu_timer_source) {.read = no_timer, .done = no_done, .context = timers};
}
contprof_cpu_timers_stats contprof_cpu_timers_get_stats(void) { return (contprof_cpu_timers_stats) {0}; }
size_t contprof_cpu_timers_capture_bytes(void) { return 0; }
const char *contprof_cpu_timers_perf_events_refused(char *why, size_t size) {
  snprintf(why, size, "built without CPU timers (no timer_create)");
  return why;
}
bool contprof_cpu_timers_count_expiry(contprof_cpu_timers *timers, VALUE thread) { return false; }
void contprof_cpu_timers_reset_stats(void) {}
void contprof_cpu_timers_set_kind(contprof_cpu_timer_kind kind) {}

#endif
