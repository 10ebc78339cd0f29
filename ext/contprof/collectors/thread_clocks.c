// A thread's clocks and baselines (see thread_clocks.h): reading its CPU clock, and moving
// a baseline on by what a record counts, never backwards.
#include "collectors/thread_clocks.h"

#include <pthread.h>

#include "collectors/thread_context_state.h"
#include "time_helpers.h"

int64_t contprof_thread_cpu_time_ns(per_thread_context *context, VALUE thread) {
  contprof_thread_clocks *clocks = &context->clocks;
  int64_t accounted = contprof_vm_thread_cpu_accounted_ns(thread);
  if (accounted >= 0) {
    if (!clocks->cpu_accounted) {
      clocks->cpu_accounted = true;
      clocks->cpu_baseline_valid = false;
      contprof_timer_health_clock_changed(&context->timer_health);
    }
    return accounted;
  }
  if (!clocks->has_cpu_clock) {
    pthread_t pthread;
    if (!contprof_vm_thread_pthread(thread, &pthread)) return -1;
    if (pthread_getcpuclockid(pthread, &clocks->cpu_clock) != 0) return -1;
    clocks->has_cpu_clock = true;
  }
  struct timespec ts;
  if (clock_gettime(clocks->cpu_clock, &ts) != 0) return -1;
  return contprof_timespec_ns(ts);
}

int64_t contprof_advance_cpu_baseline(contprof_thread_clocks *clocks, int64_t cpu_now) {
  if (cpu_now < 0) return 0;
  int64_t delta = clocks->cpu_baseline_valid ? cpu_now - clocks->cpu_baseline_ns : 0;
  if (delta < 0) return 0; // never move backwards (a timer's expiry older than a clock read)
  clocks->cpu_baseline_ns = cpu_now;
  clocks->cpu_baseline_valid = true;
  return delta;
}

int64_t contprof_advance_cpu_clock(per_thread_context *context, VALUE thread) {
  context->clocks.cpu_reads_skipped = 0;
  return contprof_advance_cpu_baseline(&context->clocks, contprof_thread_cpu_time_ns(context, thread));
}
