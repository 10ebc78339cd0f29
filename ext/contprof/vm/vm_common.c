// The parts of vm/vm.h that every backend implements the same way, with Ruby's public API
// only: GC state, the epoch frame keys are valid for, and the pieces frame naming
// is built from.
#include <ruby.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "vm/vm.h"
#include "vm/vm_common.h"

static VALUE sym_major_gc_count, sym_state, sym_none, sym_major_by, sym_gc_by, sym_time, sym_marking, sym_sweeping,
  sym_total_allocated_objects;

// The names GC.latest_gc_info answers with; a moment stores their index (0: not known).
static const char *const gc_causes[] = {"", "newobj", "malloc", "method", "capi", "stress"};
static const char *const gc_major_reasons[] = {"", "nofree", "oldgen", "shady", "force", "oldmalloc"};
#define GC_CAUSES (sizeof(gc_causes) / sizeof(gc_causes[0]))
#define GC_MAJOR_REASONS (sizeof(gc_major_reasons) / sizeof(gc_major_reasons[0]))
static VALUE gc_cause_symbols[GC_CAUSES], gc_major_reason_symbols[GC_MAJOR_REASONS];

static void intern_all(const char *const *names, VALUE *symbols, size_t count) {
  for (size_t i = 1; i < count; i++) symbols[i] = ID2SYM(rb_intern(names[i]));
}

void contprof_vm_common_init(void) {
  sym_major_gc_count = ID2SYM(rb_intern("major_gc_count"));
  sym_state = ID2SYM(rb_intern("state"));
  sym_none = ID2SYM(rb_intern("none"));
  sym_marking = ID2SYM(rb_intern("marking"));
  sym_sweeping = ID2SYM(rb_intern("sweeping"));
  sym_major_by = ID2SYM(rb_intern("major_by"));
  sym_gc_by = ID2SYM(rb_intern("gc_by"));
  sym_time = ID2SYM(rb_intern("time"));
  sym_total_allocated_objects = ID2SYM(rb_intern("total_allocated_objects"));
  intern_all(gc_causes, gc_cause_symbols, GC_CAUSES);
  intern_all(gc_major_reasons, gc_major_reason_symbols, GC_MAJOR_REASONS);
  // The GC's statistics functions create their own symbols on first use: do it now,
  // while allocating is allowed, rather than in a signal handler or a GC.
  rb_gc_stat(sym_major_gc_count);
  rb_gc_latest_gc_info(sym_state);
}

bool contprof_vm_during_gc(void) { return rb_during_gc() != 0; }

static unsigned symbol_index(VALUE symbol, const VALUE *symbols, size_t count) {
  for (size_t i = 1; i < count; i++) {
    if (symbols[i] == symbol) return (unsigned) i;
  }
  return 0;
}

// rb_gc_latest_gc_info with a Symbol and rb_gc_stat with a Symbol only read the GC's
// flags and counters once their own symbols exist (contprof_vm_common_init made them):
// Ruby 3.1's and 3.3's gc.c, 3.4's gc/default.c.
contprof_gc_moment contprof_vm_gc_moment(void) {
  if (!rb_during_gc()) return 0;
  VALUE state = rb_gc_latest_gc_info(sym_state);
  contprof_gc_phase phase = state == sym_marking    ? CONTPROF_GC_MARKING
                            : state == sym_sweeping ? CONTPROF_GC_SWEEPING
                                                    : CONTPROF_GC_PHASE_UNKNOWN;
  unsigned cause = symbol_index(rb_gc_latest_gc_info(sym_gc_by), gc_cause_symbols, GC_CAUSES);
  unsigned major = symbol_index(rb_gc_latest_gc_info(sym_major_by), gc_major_reason_symbols, GC_MAJOR_REASONS);
  return CONTPROF_GC_RUNNING | (contprof_gc_moment) phase << 1 | cause << 3 | major << 7;
}

const char *contprof_vm_gc_cause(contprof_gc_moment moment) {
  unsigned index = (moment >> 3) & 15;
  return index < GC_CAUSES ? gc_causes[index] : "";
}

const char *contprof_vm_gc_major_reason(contprof_gc_moment moment) {
  unsigned index = (moment >> 7) & 15;
  return index < GC_MAJOR_REASONS ? gc_major_reasons[index] : "";
}

int64_t contprof_vm_gc_time_ns(void) { return (int64_t) rb_gc_stat(sym_time) * 1000 * 1000; }

uint64_t contprof_vm_major_gc_count(void) { return (uint64_t) rb_gc_stat(sym_major_gc_count); }

uint64_t contprof_vm_allocated_objects(void) { return (uint64_t) rb_gc_stat(sym_total_allocated_objects); }

size_t rb_obj_memsize_of(VALUE object); // exported by every Ruby supported, but not declared publicly

size_t contprof_vm_object_size(VALUE object) { return rb_obj_memsize_of(object); }

long contprof_vm_walk_between_gcs(contprof_vm_stack_walk walk, void *context, contprof_raw_frame *frames,
                                  long capacity, contprof_stack_capture_info *info) {
  size_t gc_count = rb_gc_count();
  atomic_thread_fence(memory_order_seq_cst);
  if (rb_during_gc()) return -1;
  bool all_old = true;
  long count = walk(context, frames, capacity, &all_old);
  atomic_thread_fence(memory_order_seq_cst);
  if (rb_during_gc() || rb_gc_count() != gc_count) return -1;
  info->gc_count = gc_count;
  info->all_old = all_old;
  return count;
}

bool contprof_vm_key_epoch(uint64_t *epoch) {
  // Asking the GC for its statistics is not free; its GC counter is. The answer can only
  // change when a GC starts (the counter moves) or when a major GC in progress ends.
  static size_t cached_gc_count = (size_t) -1;
  static uint64_t cached_epoch;
  static bool cached_allowed;
  size_t gc_count = rb_gc_count();
  if (gc_count != cached_gc_count || !cached_allowed) {
    cached_gc_count = gc_count;
    cached_epoch = contprof_vm_major_gc_count();
    // During a major GC old objects may be moved (compaction, right after marking) or
    // freed (sweeping), so no key can be trusted until it is over. Minor GCs never touch
    // old objects.
    cached_allowed = rb_gc_latest_gc_info(sym_state) == sym_none || NIL_P(rb_gc_latest_gc_info(sym_major_by));
  }
  *epoch = cached_epoch;
  return cached_allowed;
}

pprof_str contprof_vm_string(VALUE string) {
  if (!RB_TYPE_P(string, T_STRING)) return (pprof_str) {"", 0};
  return (pprof_str) {RSTRING_PTR(string), (size_t) RSTRING_LEN(string)};
}

void contprof_name_write(contprof_name_writer *w, const char *bytes, size_t len) {
  size_t room = w->size - w->len;
  if (len > room) len = room;
  memcpy(w->buffer + w->len, bytes, len);
  w->len += len;
}

// ---------------------------------------------------------------------------------------
// Rounds (see contprof_vm_round_begin)

// The round running now (what it is), or NULL. Written holding the GVL; read by thread
// event hooks, which run without it.
static const char *_Atomic round_running;

// write(2) only: callable from a hook or a signal handler.
static void say(const char *text) {
  ssize_t ignored = write(STDERR_FILENO, text, strlen(text));
  (void) ignored;
}

#ifdef CONTPROF_ROUND_CHECKS
static void round_check_failed(const char *event, const char *round) {
  say("contprof: round check failed: ");
  say(event);
  say(" while a round (");
  say(round);
  say(") was running: a round let the thread switch or ran inside another\n");
  abort();
}
#endif

bool contprof_vm_round_begin(const char *what) {
  const char *running = atomic_load(&round_running);
  if (running) {
#ifdef CONTPROF_ROUND_CHECKS
    round_check_failed(what, running);
#endif
    return false;
  }
  atomic_store(&round_running, what);
  return true;
}

void contprof_vm_round_end(void) { atomic_store(&round_running, NULL); }

void contprof_vm_check_no_round(const char *event) {
#ifdef CONTPROF_ROUND_CHECKS
  const char *running = atomic_load(&round_running);
  if (running) round_check_failed(event, running);
#else
  (void) event;
  (void) say;
#endif
}
