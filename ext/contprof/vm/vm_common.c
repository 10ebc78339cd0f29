// The parts of vm/vm.h that every backend implements the same way, with Ruby's public API
// only: GC state, the generation frame keys are valid for, and the pieces frame naming
// is built from.
#include <ruby.h>
#include <stdatomic.h>
#include <string.h>

#include "vm/vm.h"
#include "vm/vm_common.h"

static VALUE sym_major_gc_count, sym_state, sym_none, sym_major_by;

void contprof_vm_common_init(void) {
  sym_major_gc_count = ID2SYM(rb_intern("major_gc_count"));
  sym_state = ID2SYM(rb_intern("state"));
  sym_none = ID2SYM(rb_intern("none"));
  sym_major_by = ID2SYM(rb_intern("major_by"));
  // The GC's statistics functions create their own symbols on first use: do it now,
  // while allocating is allowed, rather than on the first sample.
  rb_gc_stat(sym_major_gc_count);
  rb_gc_latest_gc_info(sym_state);
}

bool contprof_vm_during_gc(void) { return rb_during_gc() != 0; }

long contprof_vm_walk_between_gcs(contprof_vm_stack_walk walk, void *context, contprof_raw_frame *frames,
                                  long capacity, contprof_stack_capture_info *info) {
  size_t gc_count = rb_gc_count();
  atomic_thread_fence(memory_order_seq_cst);
  if (rb_during_gc()) return -1;
  long count = walk(context, frames, capacity);
  bool all_old = true;
  for (long i = 0; i < count && i < capacity && all_old; i++) all_old = contprof_vm_frame_key_rememberable(&frames[i]);
  atomic_thread_fence(memory_order_seq_cst);
  if (rb_during_gc() || rb_gc_count() != gc_count) return -1;
  info->gc_count = gc_count;
  info->all_old = all_old;
  return count;
}

bool contprof_vm_key_generation(uint64_t *generation) {
  // Asking the GC for its statistics is not free; its GC counter is. The answer can only
  // change when a GC starts (the counter moves) or when a major GC in progress ends.
  static size_t cached_gc_count = (size_t) -1;
  static uint64_t cached_generation;
  static bool cached_allowed;
  size_t gc_count = rb_gc_count();
  if (gc_count != cached_gc_count || !cached_allowed) {
    cached_gc_count = gc_count;
    cached_generation = (uint64_t) rb_gc_stat(sym_major_gc_count);
    // During a major GC old objects may be moved (compaction, right after marking) or
    // freed (sweeping), so no key can be trusted until it is over. Minor GCs never touch
    // old objects.
    cached_allowed = rb_gc_latest_gc_info(sym_state) == sym_none || NIL_P(rb_gc_latest_gc_info(sym_major_by));
  }
  *generation = cached_generation;
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
