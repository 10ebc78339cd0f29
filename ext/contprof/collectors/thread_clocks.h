// A thread's clocks and the baselines its records are counted from (thread_clocks.c): its
// CPU clock (or, for an M:N thread, what its hooks measured) and CLOCK_MONOTONIC, each
// with the value recorded up to. See "Where time goes" in thread_context.c.
#pragma once

#include <ruby.h>
#include <stdbool.h>
#include <stdint.h>
#include <time.h>

#include "collectors/thread_context_types.h"

typedef struct {
  bool started;
  bool has_cpu_clock;
  clockid_t cpu_clock;
  bool cpu_accounted; // an M:N thread: its CPU is what its hooks measured (vm.h)
  // False while the thread's CPU clock could not be read (a thread not started yet):
  // its first readable value is then a baseline, not a delta.
  bool cpu_baseline_valid;
  int64_t cpu_baseline_ns; // the thread's CPU clock value recorded up to
  int64_t wall_baseline_ns; // CLOCK_MONOTONIC recorded up to
  int64_t own_cpu_debt_ns; // the profiler's CPU on the thread, left out of its records
  int cpu_reads_skipped; // see MAX_SKIPPED_CPU_READS
} contprof_thread_clocks;

// A thread without a CPU timer, found waiting where it waited, has its clock read at most
// every this many wall rounds (what it used meanwhile is counted at the next read).
#define MAX_SKIPPED_CPU_READS 9

// The thread's CPU time, or -1 when it cannot be read (not started, or finished). A thread
// found sharing native threads (M:N) changes source once: its baseline starts again.
int64_t contprof_thread_cpu_time_ns(per_thread_context *context, VALUE thread);

// Makes `cpu_now` (the thread's CPU clock value, or -1 when unknown) its new baseline;
// returns the CPU time used since the previous one (0 when there is no valid previous one).
int64_t contprof_advance_cpu_baseline(contprof_thread_clocks *clocks, int64_t cpu_now);

// Makes `wall_now` its new wall baseline; returns the wall time since the previous one.
static inline int64_t contprof_advance_wall_baseline(contprof_thread_clocks *clocks, int64_t wall_now) {
  int64_t wall_delta = wall_now - clocks->wall_baseline_ns;
  if (wall_delta < 0) return 0;
  clocks->wall_baseline_ns = wall_now;
  return wall_delta;
}

// Pays the profiler's own CPU on the thread back from `*cpu` as far as it goes.
static inline void contprof_pay_own_cpu(contprof_thread_clocks *clocks, int64_t *cpu) {
  int64_t paid = clocks->own_cpu_debt_ns < *cpu ? clocks->own_cpu_debt_ns : *cpu;
  if (paid <= 0) return;
  clocks->own_cpu_debt_ns -= paid;
  *cpu -= paid;
}

// Of `*captured` CPU, the part of the stretch `*delta` (which includes it) that a capture
// off the GVL stands for: the profiler's own CPU the rest of the stretch cannot pay back
// is paid from it (a thread in C methods at every expiry, as in a loop reading a clock,
// would otherwise never pay).
static inline void contprof_pay_own_cpu_from_capture(contprof_thread_clocks *clocks, int64_t *captured, int64_t *delta) {
  int64_t unpaid = clocks->own_cpu_debt_ns - (*delta - *captured);
  if (unpaid <= 0) return;
  int64_t paid = unpaid < *captured ? unpaid : *captured;
  *captured -= paid;
  *delta -= paid;
  clocks->own_cpu_debt_ns -= paid;
}

// CPU the thread spent running a round: the profiler's.
static inline void contprof_owe_own_cpu(contprof_thread_clocks *clocks, int64_t cpu_ns) {
  clocks->own_cpu_debt_ns += cpu_ns;
}

// Its baselines start at `wall_now` (the CPU one is the caller's: a clock read).
static inline void contprof_thread_clocks_start(contprof_thread_clocks *clocks, int64_t wall_now) {
  clocks->wall_baseline_ns = wall_now;
  clocks->own_cpu_debt_ns = 0;
  clocks->started = true;
}

// Reads the thread's CPU clock (a system call) and makes it the new baseline; returns the
// CPU time used since the previous one.
int64_t contprof_advance_cpu_clock(per_thread_context *context, VALUE thread);

// Whether a thread found waiting where it waited may skip this round's reading of its CPU
// clock: at most MAX_SKIPPED_CPU_READS rounds in a row do.
static inline bool contprof_may_skip_cpu_read(contprof_thread_clocks *clocks) {
  if (clocks->cpu_reads_skipped >= MAX_SKIPPED_CPU_READS) return false;
  clocks->cpu_reads_skipped++;
  return true;
}

// The wall clock parked and ticks again from `resumed_from_ns`: the ticks that did not
// come would have moved the wall baseline there (up to `now_ns`).
static inline void contprof_resume_wall_baseline(contprof_thread_clocks *clocks, int64_t resumed_from_ns, int64_t now_ns) {
  if (resumed_from_ns > clocks->wall_baseline_ns && resumed_from_ns <= now_ns) clocks->wall_baseline_ns = resumed_from_ns;
}
