// Contprof::Collectors::ThreadContext: decides what each sample records, from the
// threads' clocks, CPU timers and the GC's time. The worker
// (sampling/cpu_and_wall_time_worker.c) decides when.
#pragma once

#include <ruby.h>
#include <stdbool.h>

#include "pprof/pprof_profile.h"
#include "vm/vm.h"

VALUE contprof_enforce_thread_context(VALUE collector);

// A thread's CPU as its CPU timer saw it since the previous reading (see
// sampling/cpu_timers.h).
typedef struct {
  uint64_t expirations; // new expirations since the previous reading (0: nothing new)
  int64_t cpu_ns; // the thread's CPU clock at its latest expiry (when expirations > 0)
  uint64_t in_gc; // of the new expirations, those while the thread was running a GC
  contprof_gc_moment gc_moment; // what the GC was doing at the latest of them (when in_gc > 0)
  // Of the new expirations, those while it ran native code without the GVL (or a C method
  // holding it), whose stack the signal handler captured (0: none), and that stack.
  uint64_t captured;
  bool captured_holding_gvl; // captured in a C method holding the GVL
  int64_t captured_cpu_ns; // the CPU those expirations stand for
  const contprof_raw_frame *captured_frames;
  long captured_total; // the stack's depth (may exceed the frames kept)
  bool capture_valid; // false when a GC since the capture may have invalidated its frames
  // The timer this reading is of: a timer replaced (a new period) starts counting afresh,
  // so silences are measured per timer (see timer_health.c).
  uint64_t timer_generation;
  int64_t period_ns; // that timer's nominal period
  pid_t tid; // the thread's kernel thread id (0: not known)
} contprof_cpu_timer_reading;

typedef struct {
  // Fills `reading` for `thread`; false when the thread has no CPU timer. After a true
  // answer, `done` must be called once the reading has been recorded (or given up).
  bool (*read)(void *context, VALUE thread, contprof_cpu_timer_reading *reading);
  void (*done)(void *context, VALUE thread);
  void *context;
  int64_t period_ns;
} contprof_cpu_timer_source;

typedef enum {
  // Every thread's wall time since its previous wall sample, at an instant that does not
  // depend on what the threads do (the worker's clock). Threads without a CPU timer get
  // their CPU from their clocks here too.
  CONTPROF_ROUND_WALL,
  // The calling thread's CPU timer expired: its CPU goes to its current stack.
  CONTPROF_ROUND_CPU,
  // The run's last round: every clock is read and every thread's remaining time recorded.
  // The calling thread is inside the profiler's stop: its last stretch goes to its
  // previous samples (CPU to the last one taken while it ran, wall time to the last wall
  // sample), not to the profiler's frames.
  CONTPROF_ROUND_FINAL,
} contprof_round_kind;

typedef struct {
  contprof_round_kind kind;
  // For a wall round: the thread that was running a GC when the round was asked for, or
  // Qnil, and what that GC was doing. That thread's wall sample stands for GC time.
  VALUE gc_thread_at_tick;
  contprof_gc_moment gc_moment_at_tick;
  const contprof_cpu_timer_source *timers; // NULL: every thread's CPU comes from its clock
  // For a wall round: the instant up to which wall time is charged, that of the clock's
  // latest tick (0, or later than now: now).
  int64_t wall_until_ns;
  // For a wall round: the thread that held the GVL at the tick, or Qnil.
  VALUE holder_at_tick;
  // For a wall round: the clock's mean interval between ticks (drawn within jitter.h's
  // CONTPROF_JITTER of it); 0 for rounds taken by hand.
  int64_t tick_interval_ns;
} contprof_round;

// Takes one round; must hold the GVL. Raises nothing: returns the first failure (a thread
// whose state cannot be allocated is skipped and counted).
PPROF_MUST_CHECK
pprof_status contprof_thread_context_sample(VALUE collector, const contprof_round *round, pprof_error *error);
// How many wall rounds in a row, up to the latest, found every thread off the GVL in a
// stretch that a tick had found, using no CPU: nothing a tick would add to (the clock may
// park, sampling/wall_clock.c).
unsigned contprof_thread_context_idle_rounds(VALUE collector);
// The clock parked and ticks again: the interval of its next tick began at `instant_ns`
// (sampling/wall_clock.c, "Parking"), and every thread's wall time counts from there at
// the latest (all of theirs before it is in stretches timed without ticks). Holding the
// GVL.
void contprof_thread_context_wall_resumed_from(VALUE collector, int64_t instant_ns);
// Records the time of every stretch off the GVL that a tick found and that still goes on,
// up to now, without a tick (before a flush while the clock is parked: that time would
// otherwise reach the profile only once the stretch ends). Holding the GVL; raises nothing:
// returns the first failure.
PPROF_MUST_CHECK
pprof_status contprof_thread_context_charge_stretches(VALUE collector, pprof_error *error);

// CPU the calling thread spent running a round: the profiler's, left out of its samples.
void contprof_thread_context_charge_own_cost(VALUE collector, VALUE thread, int64_t cpu_ns);

// Leaves `thread` out of every sample (the profiler's own threads).
void contprof_thread_context_ignore_thread(VALUE collector, VALUE thread);

// Thread lifecycle, from the worker's event hooks (on the thread concerned, holding the
// GVL): a new thread's clocks start at its birth, and a finishing thread's last slice of
// CPU and wall time is recorded rather than lost.
void contprof_thread_context_on_thread_begin(VALUE collector, VALUE thread);
PPROF_MUST_CHECK
pprof_status contprof_thread_context_on_thread_end(VALUE collector, VALUE thread, pprof_error *error);

// Starts the clocks of every live thread that has none yet (when sampling starts), and
// the GC's: `gc_clock` when GC.measure_total_time is on (the GC's clock then says how much
// GC time there was; else samples in a GC estimate it).
void contprof_thread_context_start_clocks(VALUE collector, bool gc_clock);

// Forgets every thread (after a fork, in the child).
void contprof_thread_context_reset(VALUE collector);

void contprof_thread_context_class_init(VALUE contprof_module);
