// Time spent in garbage collection, measured from the VM's GC events (not sampled), so
// that the CpuAndWallTime collector can record it as its own "Garbage Collection" frame
// on top of the stack that triggered it, instead of leaving it to whatever frame the
// next sample finds.
//
// Ruby runs a GC in slices (GC_ENTER .. GC_EXIT): a whole GC at once, or incremental
// marking steps and lazy sweeping steps spread over later allocations. Each slice is
// timed with CLOCK_MONOTONIC and split into marking and sweeping at the GC_END_MARK and
// GC_END_SWEEP events. Slices add up per (thread, phase, kind of GC) into a few pending
// *stretches* until the collector takes them. The GC holds the GVL and runs on the CPU,
// so a slice's CPU time is its wall time: no system call per slice (Ruby already makes
// two for GC.total_time).
#pragma once

#include <ruby.h>
#include <stdbool.h>
#include <stdint.h>

typedef enum { CONTPROF_GC_MARKING = 0, CONTPROF_GC_SWEEPING = 1 } contprof_gc_phase;

// GC time not yet recorded, of one thread, phase and kind of GC.
typedef struct {
  VALUE thread; // the thread the GC ran on
  contprof_gc_phase phase;
  bool major;
  VALUE cause; // the GC's trigger as GC.latest_gc_info(:gc_by) names it (a static Symbol), or nil
  VALUE major_by; // for a major GC, GC.latest_gc_info(:major_by), or nil
  int64_t wall_ns;
} contprof_gc_stretch;

// Starts timing GCs (holding the GVL). `flush_wanted` is called from a GC event, holding
// the GVL and without allocating, when a thread's pending GC time reaches `flush_after_ns`:
// it should arrange for contprof_gc_time_take to be called soon on a safe point (the
// worker queues its sampling job), so that the time is recorded while the thread still
// stands where it triggered the GC.
void contprof_gc_time_start(int64_t flush_after_ns, void (*flush_wanted)(void));
void contprof_gc_time_stop(void);

// Moves up to `capacity` pending stretches into `out`; returns how many. Holding the GVL,
// outside any GC event. With `thread` other than Qnil, only that thread's, and with
// `when_due` only once they add up to the flush threshold: a thread then stands where the
// GC that reached it was triggered (the job queued by `flush_wanted` runs at the thread's
// next safe point).
size_t contprof_gc_time_take(VALUE thread, bool when_due, contprof_gc_stretch *out, size_t capacity);

// Major GCs started since the process began (while timing); async-signal-safe.
uint64_t contprof_gc_time_major_count(void);

typedef struct {
  uint64_t slices; // GC_ENTER..GC_EXIT slices timed
  uint64_t gc_ns; // their total time
  uint64_t merged; // slices that found no free stretch and were added to another one
} contprof_gc_time_stats;
contprof_gc_time_stats contprof_gc_time_get_stats(void);
void contprof_gc_time_reset_stats(void);

void contprof_gc_time_init(void);
