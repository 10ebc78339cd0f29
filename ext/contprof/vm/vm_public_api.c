// The backend of vm/vm.h for Ruby 3.3 and later: public C APIs for threads and the
// sampling job, and for stacks the VM's control frames where their layout is known
// (vm/vm_frame_layout.c, known for Ruby 3.3 to 4.0, proven at load time on any Ruby that
// has the public APIs), else the public API. Its files:
//
// - this one: load time; stacks, through vm/vm_frame_layout.c, or rb_profile_thread_frames
//   for another thread and rb_profile_frames for the calling one (in a signal handler),
//   with the rb_profile_frame_* functions to name frames; thread names, kept when
//   Thread#name= sets them (see "Thread names"); and what the collectors ask about a
//   thread, read from the entries the hooks keep (vm/vm_public_api_internal.h);
// - vm/vm_thread_events.c: threads and the GVL, through the internal-thread event hooks
//   (GVL waits, stretches off the GVL, M:N threads' CPU), and the sampling job.
//
// What the public API alone cannot do, and what it costs (the README's "Supported Rubies"):
// - without the frame layout, a block's frame is reported as its method's
//   (rb_profile_frames gives the method entry for both), so `block in Foo#bar` appears as
//   `Foo#bar`, at the block's line, and code eval'd in a method as the method;
// - a thread sleeping in Ruby and one in native code without the GVL look the same
//   (both SUSPENDED): both are reported as CONTPROF_THREAD_NATIVE;
// - a thread created before Contprof was loaded has no known pthread (hence no CPU clock
//   or CPU timer) until its next GVL switch;
// - M:N threads: see "M:N threads" in vm/vm_thread_events.c.
#include <pthread.h>
#include <ruby.h>
#include <ruby/debug.h>
#include <ruby/thread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "vm/vm.h"
#include "vm/vm_common.h"
#include "vm/vm_public_api_internal.h"
#include "fault_injection.h"
#include "time_helpers.h"
#ifdef CONTPROF_VM_LAYOUT
#include "vm/vm_frame_layout.h"
#endif

static ID id_name, id_known_name;
static VALUE sym_compact_count;

// Whether stacks are read through the frame layout (see contprof_vm_init), and if not why.
static bool layout_ok;
static char layout_why_not[160] = "this build reads stacks through the public API only";

bool contprof_vm_supported(void) { return true; }
const char *contprof_vm_backend_name(void) { return layout_ok ? "frame_layout" : "public_api"; }
const char *contprof_vm_backend_note(void) {
#ifdef CONTPROF_VM_LAYOUT
  if (layout_ok) return contprof_layout_note();
#endif
  return layout_why_not;
}
const char *contprof_vm_gc_hooks_unaffordable(void) { return NULL; }

static void check_frame_layout(void) {
#ifdef CONTPROF_VM_LAYOUT
  const char *wanted = getenv("CONTPROF_VM_LAYOUT");
  if (wanted && strcmp(wanted, "off") == 0) {
    snprintf(layout_why_not, sizeof(layout_why_not), "CONTPROF_VM_LAYOUT=off");
    return;
  }
  layout_ok = contprof_layout_check(layout_why_not, sizeof(layout_why_not));
#endif
}

// ---------------------------------------------------------------------------------------
// Thread names
//
// A round must never call a Ruby method: when a method called from C returns, Ruby checks
// its interrupts, and there it may switch threads (a round then waits out other threads'
// time slices, up to 100 ms each, while another thread's round runs inside it) or raise
// the application's pending Thread#raise or Timeout inside the profiler's job. Ruby's C API
// has no way to read a thread's name without calling Thread#name, so the name is kept, as
// a hidden instance variable of the Thread, when it is set: Thread#name= is wrapped by a
// prepended module (Contprof::ThreadNames), and the names threads had before are read at
// load time. A Thread#name redefined by the program is not called (it is the program's
// code): such a thread is unnamed.
static void remember_name(VALUE thread) {
  if (RB_OBJ_FROZEN(thread)) return;
  VALUE name = rb_method_basic_definition_p(CLASS_OF(thread), id_name) ? rb_funcall(thread, id_name, 0) : Qnil;
  rb_ivar_set(thread, id_known_name, name);
}

static VALUE set_name_and_remember(VALUE thread, VALUE name) {
  VALUE result = rb_call_super(1, &name);
  remember_name(thread);
  return result;
}

VALUE contprof_vm_thread_name(VALUE thread) { return rb_attr_get(thread, id_known_name); }

// ---------------------------------------------------------------------------------------
// Load time

void contprof_vm_init(void) {
  contprof_vm_common_init();
  check_frame_layout();
  id_name = rb_intern("name");
  id_known_name = rb_intern("__contprof_thread_name"); // no @: hidden from Ruby
  sym_compact_count = ID2SYM(rb_intern("compact_count"));
  rb_gc_stat(sym_compact_count);
  contprof_vm_thread_events_prepare();

  // The threads that exist already: their entries, and the names they have.
  VALUE current = rb_thread_current();
  VALUE threads = rb_funcall(rb_cThread, rb_intern("list"), 0);
  int64_t now = contprof_clock_ns(CLOCK_MONOTONIC);
  for (long i = 0; i < RARRAY_LEN(threads); i++) {
    VALUE thread = RARRAY_AREF(threads, i);
    contprof_vm_thread_events_know(thread, current, now);
    remember_name(thread);
  }
  VALUE thread_names = rb_define_module_under(rb_define_module("Contprof"), "ThreadNames");
  rb_define_method(thread_names, "name=", set_name_and_remember, 1);
  rb_prepend_module(rb_cThread, thread_names);
  contprof_vm_thread_events_start(current);
}

// ---------------------------------------------------------------------------------------
// Threads

bool contprof_vm_is_thread(VALUE object) { return rb_obj_is_kind_of(object, rb_cThread) == Qtrue; }

// A thread is alive while it has an entry: from its first GVL switch (or load time) to its
// EXITED event. One that has not run yet has no stack to sample anyway.
bool contprof_vm_thread_alive(VALUE thread) { return entry_of(thread) != NULL; }

contprof_thread_state contprof_vm_thread_state(VALUE thread) {
  thread_entry *entry = entry_of(thread);
  if (!entry) return CONTPROF_THREAD_RUNNING;
  switch (atomic_load(&entry->gvl)) {
  case GVL_RELEASED:
    return CONTPROF_THREAD_NATIVE;
  case GVL_WANTED:
    return thread == rb_thread_current() ? CONTPROF_THREAD_RUNNING : CONTPROF_THREAD_GVL_WAIT;
  default:
    return CONTPROF_THREAD_RUNNING;
  }
}

int64_t contprof_vm_thread_gvl_waited_ns(VALUE thread, int64_t now_ns) {
  thread_entry *entry = entry_of(thread);
  if (!entry) return 0;
  int64_t waited = atomic_load(&entry->gvl_waited_ns);
  int64_t ready_since = atomic_load(&entry->ready_since_ns);
  if (ready_since > 0 && now_ns > ready_since) waited += now_ns - ready_since;
  return waited;
}

bool contprof_vm_thread_stretch(VALUE thread, contprof_vm_stretch *stretch) {
  thread_entry *entry = entry_of(thread);
  if (!entry) return false;
  // (The thread gave up the GVL after writing its stretch's number and start, and cannot
  // take it back while the caller holds it: only the end may change meanwhile.)
  stretch->seq = atomic_load_explicit(&entry->stretch_seq, memory_order_acquire);
  stretch->start_ns = atomic_load_explicit(&entry->stretch_start_ns, memory_order_relaxed);
  stretch->end_ns = atomic_load_explicit(&entry->stretch_end_ns, memory_order_acquire);
  return stretch->seq > 0;
}

void contprof_vm_thread_mark_stretch(VALUE thread, uint64_t seq) {
  thread_entry *entry = entry_of(thread);
  if (!entry) return;
  atomic_store_explicit(&entry->marked_end_ns, 0, memory_order_relaxed);
  atomic_store_explicit(&entry->marked_seq, seq, memory_order_relaxed);
}

int64_t contprof_vm_thread_marked_stretch_end(VALUE thread, uint64_t seq) {
  thread_entry *entry = entry_of(thread);
  if (!entry || atomic_load_explicit(&entry->marked_seq, memory_order_relaxed) != seq) return 0;
  return atomic_load_explicit(&entry->marked_end_ns, memory_order_relaxed);
}

bool contprof_vm_thread_pthread(VALUE thread, pthread_t *pthread) {
  if (thread == rb_thread_current()) {
    *pthread = pthread_self();
    return true;
  }
  thread_entry *entry = entry_of(thread);
  if (!entry || !atomic_load(&entry->has_native)) return false;
  *pthread = (pthread_t) atomic_load(&entry->pthread);
  return true;
}

int64_t contprof_vm_thread_cpu_accounted_ns(VALUE thread) {
  thread_entry *entry = entry_of(thread);
  if (!entry || !atomic_load(&entry->shares_native)) return -1;
  // (The caller holds the GVL: any other thread's sum is settled, as is its own but for
  // what it has used since its RESUMED.)
  int64_t total = atomic_load_explicit(&entry->cpu_accounted_ns, memory_order_acquire);
  int64_t resumed_at = atomic_load_explicit(&entry->cpu_resumed_at_ns, memory_order_acquire);
  if (resumed_at > 0 && thread == rb_thread_current() && atomic_load(&entry->pthread) == (uintptr_t) pthread_self()) {
    int64_t now = own_cpu_ns();
    if (now > resumed_at) total += now - resumed_at;
  }
  return total;
}

bool contprof_vm_thread_shares_native(VALUE thread) {
  thread_entry *entry = entry_of(thread);
  return entry && atomic_load(&entry->shares_native);
}

pid_t contprof_vm_thread_tid(VALUE thread) {
  if (thread == rb_thread_current()) return my_tid();
  thread_entry *entry = entry_of(thread);
  if (!entry || !atomic_load(&entry->has_native)) return 0;
  return (pid_t) atomic_load(&entry->tid);
}

bool contprof_vm_current_thread_in_c_method(void) {
#ifdef CONTPROF_VM_LAYOUT
  // (The frame layout's reader only: it is what tells a C method's frame from the rest.)
  return layout_ok && contprof_vm_current_gvl == GVL_HELD && contprof_vm_current_entry &&
         contprof_layout_in_c_method(contprof_vm_current_entry->thread);
#else
  return false;
#endif
}

// ---------------------------------------------------------------------------------------
// Stacks

// A raw frame's words: the frame object (an iseq or a method entry); for a C frame, the
// frame object of its nearest Ruby caller, whose file and line it takes (else 0); and the
// line shifted left by one, whose lowest bit marks a C frame.
#define FRAME_OBJECT(frame) ((VALUE) (frame)->word[0])
#define FRAME_CALLER(frame) ((VALUE) (frame)->word[1])
#define FRAME_LINE(frame) ((int64_t) ((frame)->word[2] >> 1))
#define FRAME_IS_CFUNC(frame) (((frame)->word[2] & 1) != 0)

// Turns what rb_profile_frames gave (`count` frame objects and lines) into raw frames,
// keeping the first `capacity`. Async-signal-safe: rb_profile_frame_path only reads.
static void take_frames(const VALUE *objects, const int *lines, long count, contprof_raw_frame *frames, long capacity) {
  // C frames take their nearest Ruby caller's file and line, which comes later in this
  // newest-to-oldest walk: they wait in [pending_from, i) until it is found.
  long pending_from = -1;
  for (long i = 0; i < count; i++) {
    VALUE object = objects[i];
    // Ruby gives C frames line 0 (and Ruby frames a line, but for a JIT-compiled newest
    // frame): only those need the closer look (only Ruby frames have a file).
    bool cfunc = lines[i] == 0 && NIL_P(rb_profile_frame_path(object));
    uintptr_t line = (uintptr_t) (unsigned) (lines[i] > 0 ? lines[i] : 0);
    if (cfunc) {
      if (i < capacity) frames[i] = (contprof_raw_frame) {{object, 0, 1}};
      if (pending_from < 0) pending_from = i;
      continue;
    }
    for (long j = pending_from; pending_from >= 0 && j < i && j < capacity; j++) {
      frames[j].word[1] = object;
      frames[j].word[2] = line << 1 | 1;
    }
    pending_from = -1;
    if (i < capacity) frames[i] = (contprof_raw_frame) {{object, 0, line << 1}};
  }
}

// Naming may allocate (class paths), and so run a GC, which with compaction
// (GC.auto_compact) could move the objects of frames not named yet. After a compaction
// during naming, the frames read before it are not touched again: they are named
// MOVED_NAME until frames are next announced valid, and their keys not remembered (the
// frame gets its real name at its next sample).
static size_t compactions_at_read;
static bool frames_may_have_moved;
#define MOVED_NAME ((pprof_str) {"(frame moved by GC compaction)", sizeof("(frame moved by GC compaction)") - 1})

bool contprof_vm_frame_names_unreliable(void) { return frames_may_have_moved; }

// GC.stat(:compact_count), asked only when a GC ran since the last time.
static size_t compactions_so_far(void) {
  static size_t cached_gc_count = (size_t) -1, cached_compactions;
  size_t gc_count = rb_gc_count();
  if (gc_count != cached_gc_count) {
    cached_gc_count = gc_count;
    cached_compactions = (size_t) rb_gc_stat(sym_compact_count);
  }
  return cached_compactions;
}

void contprof_vm_frames_valid_now(void) {
  frames_may_have_moved = false;
  compactions_at_read = compactions_so_far();
}

// Holding the GVL: scratch for whole stacks (read whole, to know how deep they are).
static VALUE *read_objects;
static int *read_lines;
static long read_capacity;
#define READ_MAX_FRAMES (1L << 16)

// Gives the scratch room for `wanted` frames; false without memory (what it had stays).
static bool grow_read_scratch(long wanted) {
  if (contprof_allocation_fails(CONTPROF_ALLOC_STACK_SCRATCH)) return false;
  VALUE *objects = realloc(read_objects, (size_t) wanted * sizeof(VALUE));
  if (objects) read_objects = objects;
  int *lines = realloc(read_lines, (size_t) wanted * sizeof(int));
  if (lines) read_lines = lines;
  if (!objects || !lines) return false;
  read_capacity = wanted;
  return true;
}

long contprof_vm_read_stack(VALUE thread, contprof_raw_frame *frames, long capacity) {
  if (!contprof_vm_is_thread(thread)) return CONTPROF_VM_NOT_A_THREAD;
  // Without an entry, a thread has not started yet or has finished, and which one only a
  // Ruby method could say: either way there is no frame to read (the collectors skip
  // finished threads before reading; Collectors::Stack.sample asks Thread#alive? first).
  if (!contprof_vm_thread_alive(thread)) return 0;
  contprof_vm_frames_valid_now();
#ifdef CONTPROF_VM_LAYOUT
  if (layout_ok) return contprof_layout_read_stack(thread, frames, capacity);
#endif
  if (read_capacity < capacity + 1 && !grow_read_scratch(capacity + 1 > 256 ? capacity + 1 : 256)) {
    return CONTPROF_VM_NO_MEMORY;
  }
  long count;
  for (;;) {
    count = rb_profile_thread_frames(thread, 0, (int) read_capacity, read_objects, read_lines);
    // A stack that fills the scratch is read again with twice the room, to give its exact depth.
    if (count < read_capacity || read_capacity >= READ_MAX_FRAMES || !grow_read_scratch(read_capacity * 2)) break;
  }
  take_frames(read_objects, read_lines, count, frames, capacity);
  return count;
}

size_t contprof_vm_capture_scratch_size(long capacity) { return (size_t) (capacity + 1) * (sizeof(VALUE) + sizeof(int)); }

// The calling thread's frames, through `scratch` (contprof_vm_capture_scratch_size).
static long walk_current_stack(void *scratch, contprof_raw_frame *frames, long capacity, bool *all_old) {
  VALUE *objects = scratch;
  int *lines = (int *) (objects + capacity + 1);
  // One more than fits: a stack that fills it was cut (how deep it is stays unknown).
  long count = rb_profile_frames(0, (int) capacity + 1, objects, lines);
  take_frames(objects, lines, count, frames, capacity);
  for (long i = 0; i < count && i < capacity && *all_old; i++) *all_old = contprof_vm_frame_key_rememberable(&frames[i]);
  return count;
}

long contprof_vm_capture_current_stack(contprof_raw_frame *frames, long capacity, void *scratch,
                                       contprof_stack_capture_info *info) {
  // Only a thread known to be off the GVL, or inside a C method, keeps its stack still.
  bool off_gvl = contprof_vm_current_gvl == GVL_RELEASED || contprof_vm_current_gvl == GVL_WANTED;
#ifdef CONTPROF_VM_LAYOUT
  if (layout_ok) {
    if (!contprof_vm_current_entry || !(off_gvl || contprof_vm_current_thread_in_c_method())) return -1;
    return contprof_layout_capture_stack(contprof_vm_current_entry->thread, frames, capacity, info);
  }
#endif
  if (!off_gvl) return -1;
  return contprof_vm_walk_between_gcs(walk_current_stack, scratch, frames, capacity, info);
}

int64_t contprof_vm_frame_line(const contprof_raw_frame *frame) {
#ifdef CONTPROF_VM_LAYOUT
  if (layout_ok) return contprof_layout_frame_line(frame);
#endif
  return FRAME_LINE(frame);
}

static void note_possible_move(size_t gc_count_before) {
  if (rb_gc_count() != gc_count_before && compactions_so_far() != compactions_at_read) frames_may_have_moved = true;
}

pprof_str contprof_vm_frame_file(const contprof_raw_frame *frame) {
  if (frames_may_have_moved) return (pprof_str) {"", 0};
#ifdef CONTPROF_VM_LAYOUT
  if (layout_ok) return contprof_layout_frame_file(frame);
#endif
  VALUE object = FRAME_IS_CFUNC(frame) ? FRAME_CALLER(frame) : FRAME_OBJECT(frame);
  if (!object) return (pprof_str) {"", 0};
  VALUE path = rb_profile_frame_absolute_path(object);
  return contprof_vm_string(NIL_P(path) ? rb_profile_frame_path(object) : path);
}

pprof_str contprof_vm_frame_name(const contprof_raw_frame *frame, char *buffer, size_t buffer_size) {
  if (frames_may_have_moved) return MOVED_NAME;
#ifdef CONTPROF_VM_LAYOUT
  if (layout_ok) {
    size_t gc_count = rb_gc_count();
    pprof_str name = contprof_layout_frame_name(frame, buffer, buffer_size);
    note_possible_move(gc_count);
    return frames_may_have_moved ? MOVED_NAME : name;
  }
#endif
  contprof_name_writer w = {.buffer = buffer, .size = buffer_size, .len = 0};
  VALUE object = FRAME_OBJECT(frame);
  size_t gc_count = rb_gc_count();
  // Only method entries have an owner: other frames (<main>, <class:Foo>, blocks outside
  // methods, define_method bodies) are named by their label.
  VALUE owner = rb_profile_frame_classpath(object);
  note_possible_move(gc_count);
  if (frames_may_have_moved) return MOVED_NAME;
  VALUE method_name = rb_profile_frame_method_name(object);
  if (NIL_P(owner) || NIL_P(method_name)) {
    VALUE label = rb_profile_frame_label(object);
    return NIL_P(label) ? contprof_vm_string(method_name) : contprof_vm_string(label);
  }
  // "Owner#method" or "Owner.method"; just "method" when the owner has no name of its own
  // ("#<Class:0x...>" for anonymous classes, "#<Foo:0x...>" for a plain object's
  // singleton): an address in a name would make every such object a new function.
  pprof_str owner_name = contprof_vm_string(owner);
  if (owner_name.len > 0 && !(owner_name.len >= 2 && memcmp(owner_name.ptr, "#<", 2) == 0)) {
    // Kernel's global functions (sleep, loop, require...) are module functions: Ruby
    // 3.3 reports the singleton copy for a call as `sleep`, which Ruby's own backtraces
    // (and the Ruby 3.1 backend) call Kernel#sleep.
    bool kernel = owner_name.len == 6 && memcmp(owner_name.ptr, "Kernel", 6) == 0;
    bool singleton = !kernel && RTEST(rb_profile_frame_singleton_method_p(object));
    contprof_name_write(&w, owner_name.ptr, owner_name.len);
    contprof_name_write(&w, singleton ? "." : "#", 1);
  }
  pprof_str name = contprof_vm_string(method_name);
  contprof_name_write(&w, name.ptr, name.len);
  RB_GC_GUARD(owner);
  return (pprof_str) {buffer, w.len};
}

bool contprof_vm_frame_key_rememberable(const contprof_raw_frame *frame) {
#ifdef CONTPROF_VM_LAYOUT
  if (layout_ok) return contprof_layout_frame_key_rememberable(frame);
#endif
  VALUE object = FRAME_OBJECT(frame), caller = FRAME_CALLER(frame);
  if (!object || !RB_OBJ_PROMOTED_RAW(object)) return false;
  return !caller || RB_OBJ_PROMOTED_RAW(caller);
}
