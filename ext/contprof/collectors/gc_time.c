// GC time from the VM's GC events (see gc_time.h).
//
// Everything here runs holding the GVL: the event hook runs inside the GC (so it must not
// allocate, raise or call back into Ruby), and contprof_gc_time_take runs in a sampling
// round. No locking is needed beyond the GVL; the major-GC counter is atomic because
// signal handlers read it.
#include "collectors/gc_time.h"

#include <ruby/debug.h>
#include <stdatomic.h>

#include "ruby_helpers.h"

// Enough for the handful of (thread, phase, kind) combinations between two rounds; a
// slice that finds no room is added to a stretch of the same thread (or the last one).
#define MAX_PENDING_STRETCHES 16

static contprof_gc_stretch pending[MAX_PENDING_STRETCHES];
static size_t pending_count;

static VALUE tracepoint = Qnil;
static VALUE sym_gc_by, sym_major_by;
static int64_t flush_after_ns;
static void (*flush_wanted)(void);

// The GC cycle in progress, as its events tell it.
static bool cycle_major;
static VALUE cycle_cause = Qnil, cycle_major_by = Qnil;
static bool in_cycle; // between GC_START and GC_END_SWEEP
static contprof_gc_phase cycle_phase;
static int64_t slice_started_ns; // when the current slice (or its part since a phase change) began
static atomic_uint_fast64_t major_count;

static contprof_gc_time_stats stats;

// Adds `wall_ns` of the current phase to the calling thread's pending stretch; returns
// that thread's pending GC time in all.
static int64_t add_to_stretch(int64_t wall_ns) {
  VALUE thread = rb_thread_current();
  contprof_gc_stretch *match = NULL, *same_thread = NULL;
  int64_t thread_total = wall_ns;
  for (size_t i = 0; i < pending_count; i++) {
    contprof_gc_stretch *stretch = &pending[i];
    if (stretch->thread != thread) continue;
    thread_total += stretch->wall_ns;
    same_thread = stretch;
    if (stretch->phase == cycle_phase && stretch->major == cycle_major && stretch->cause == cycle_cause &&
        stretch->major_by == cycle_major_by) {
      match = stretch;
    }
  }
  if (!match && pending_count < MAX_PENDING_STRETCHES) {
    match = &pending[pending_count++];
    *match = (contprof_gc_stretch) {.thread = thread, .phase = cycle_phase, .major = cycle_major,
                                    .cause = cycle_cause, .major_by = cycle_major_by};
  }
  if (!match) {
    match = same_thread ? same_thread : &pending[MAX_PENDING_STRETCHES - 1];
    stats.merged++;
  }
  match->wall_ns += wall_ns;
  return thread_total;
}

// Closes the part of the current slice spent in the current phase.
static int64_t close_slice_part(int64_t now) {
  int64_t elapsed = now - slice_started_ns;
  slice_started_ns = now;
  if (elapsed <= 0 || !in_cycle) return 0;
  stats.gc_ns += (uint64_t) elapsed;
  return add_to_stretch(elapsed);
}

static void on_gc_event(VALUE tracepoint_data, void *unused) {
  rb_event_flag_t event = rb_tracearg_event_flag(rb_tracearg_from_tracepoint(tracepoint_data));
  int64_t now = contprof_monotonic_ns();
  switch (event) {
    case RUBY_INTERNAL_EVENT_GC_ENTER:
      slice_started_ns = now;
      break;
    case RUBY_INTERNAL_EVENT_GC_START: // inside the slice that GC_ENTER began
      // The VM sets the GC's reasons before this event (gc_start in gc.c).
      cycle_major_by = rb_gc_latest_gc_info(sym_major_by);
      cycle_major = !NIL_P(cycle_major_by);
      cycle_cause = rb_gc_latest_gc_info(sym_gc_by);
      cycle_phase = CONTPROF_GC_MARKING;
      in_cycle = true;
      if (cycle_major) atomic_fetch_add(&major_count, 1);
      break;
    case RUBY_INTERNAL_EVENT_GC_END_MARK:
      close_slice_part(now);
      cycle_phase = CONTPROF_GC_SWEEPING;
      break;
    case RUBY_INTERNAL_EVENT_GC_END_SWEEP:
      close_slice_part(now);
      in_cycle = false;
      break;
    case RUBY_INTERNAL_EVENT_GC_EXIT: {
      stats.slices++;
      // Slices outside a cycle (running finalizers) are not GC work: GC.total_time leaves
      // them out too.
      int64_t thread_pending = close_slice_part(now);
      if (thread_pending >= flush_after_ns && flush_wanted) flush_wanted();
      break;
    }
    default:
      break;
  }
}

void contprof_gc_time_start(int64_t flush_after, void (*on_flush_wanted)(void)) {
  flush_after_ns = flush_after;
  flush_wanted = on_flush_wanted;
  pending_count = 0;
  // A GC cycle already under way (lazy sweeping) carries on with unknown reasons.
  in_cycle = false;
  if (NIL_P(tracepoint)) {
    tracepoint = rb_tracepoint_new(0,
                                   RUBY_INTERNAL_EVENT_GC_ENTER | RUBY_INTERNAL_EVENT_GC_EXIT |
                                     RUBY_INTERNAL_EVENT_GC_START | RUBY_INTERNAL_EVENT_GC_END_MARK |
                                     RUBY_INTERNAL_EVENT_GC_END_SWEEP,
                                   on_gc_event, NULL);
  }
  rb_tracepoint_enable(tracepoint);
}

void contprof_gc_time_stop(void) {
  if (!NIL_P(tracepoint)) rb_tracepoint_disable(tracepoint);
  flush_wanted = NULL;
  in_cycle = false;
}

size_t contprof_gc_time_take(VALUE thread, bool when_due, contprof_gc_stretch *out, size_t capacity) {
  if (!NIL_P(thread) && when_due) {
    int64_t total = 0;
    for (size_t i = 0; i < pending_count; i++) {
      if (pending[i].thread == thread) total += pending[i].wall_ns;
    }
    if (total < flush_after_ns || total == 0) return 0;
  }
  size_t taken = 0, kept = 0;
  for (size_t i = 0; i < pending_count; i++) {
    bool take = (NIL_P(thread) || pending[i].thread == thread) && taken < capacity;
    if (take) {
      out[taken++] = pending[i];
    } else {
      pending[kept++] = pending[i];
    }
  }
  for (size_t i = kept; i < pending_count; i++) pending[i].thread = Qnil;
  pending_count = kept;
  return taken;
}

uint64_t contprof_gc_time_major_count(void) { return atomic_load(&major_count); }

contprof_gc_time_stats contprof_gc_time_get_stats(void) { return stats; }

void contprof_gc_time_reset_stats(void) {
  stats = (contprof_gc_time_stats) {0};
  pending_count = 0;
}

void contprof_gc_time_init(void) {
  sym_gc_by = ID2SYM(rb_intern("gc_by"));
  sym_major_by = ID2SYM(rb_intern("major_by"));
  // The GC creates the symbols it answers with on first use: not inside a GC event.
  rb_gc_latest_gc_info(sym_gc_by);
  rb_global_variable(&tracepoint);
  // A pending stretch keeps its thread alive (and in place) until the collector takes it.
  for (size_t i = 0; i < MAX_PENDING_STRETCHES; i++) {
    pending[i].thread = Qnil;
    rb_global_variable(&pending[i].thread);
  }
  rb_global_variable(&cycle_cause);
  rb_global_variable(&cycle_major_by);
}
