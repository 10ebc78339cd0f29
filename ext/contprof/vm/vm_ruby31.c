// Access to Ruby VM internals (see vm/vm.h). This is the only file that includes the
// VM's private header; it must be its only Ruby include, hence the guard macro below.
//
// Written for Ruby 3.1 (Debian's 3.1.2), whose MJIT header carries the layouts of the VM
// structures. Without that header this file compiles to stubs and the profiler reports
// itself unsupported.

#ifdef CONTPROF_MJIT_HEADER

// The VM header declares static functions it does not define; that is not our code.
#pragma GCC diagnostic ignored "-Wunused-function"
#include CONTPROF_MJIT_HEADER
#define CONTPROF_VM_ACCESS_SKIP_RUBY_INCLUDES
#include "vm/vm.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

// The type of Thread objects' data. ruby_threadptr_data_type is not exported, so it is
// learned from the current thread at load time.
static const rb_data_type_t *thread_data_type;

static VALUE sym_major_gc_count, sym_state, sym_none, sym_major_by;

bool contprof_vm_supported(void) { return true; }

void contprof_vm_init(void) {
  thread_data_type = RTYPEDDATA_TYPE(rb_thread_current());
  sym_major_gc_count = ID2SYM(rb_intern("major_gc_count"));
  sym_state = ID2SYM(rb_intern("state"));
  sym_none = ID2SYM(rb_intern("none"));
  sym_major_by = ID2SYM(rb_intern("major_by"));
  // The GC's statistics functions create their own symbols on first use: do it now,
  // while allocating is allowed, rather than on the first sample.
  rb_gc_stat(sym_major_gc_count);
  rb_gc_latest_gc_info(sym_state);
}

// ---------------------------------------------------------------------------------------
// Threads

static rb_thread_t *thread_struct(VALUE object) {
  if (!RB_TYPE_P(object, T_DATA) || !RTYPEDDATA_P(object) || RTYPEDDATA_TYPE(object) != thread_data_type) return NULL;
  return (rb_thread_t *) RTYPEDDATA_DATA(object);
}

bool contprof_vm_is_thread(VALUE object) { return thread_struct(object) != NULL; }

bool contprof_vm_thread_alive(VALUE thread) {
  rb_thread_t *th = thread_struct(thread);
  return th && th->status != THREAD_KILLED;
}

// Ruby 3.1 marks a thread THREAD_STOPPED both while it sleeps in Ruby (sleep, Queue#pop,
// Mutex#lock... all go through native_sleep) and while it runs native code with the GVL
// released (rb_thread_call_without_gvl, which zlib, I/O waits and database drivers use).
// Only the latter sets blocking_region_buffer, from before it releases the GVL until
// after it has taken it back.
contprof_thread_state contprof_vm_thread_state(VALUE thread) {
  const rb_thread_t *th = thread_struct(thread);
  if (!th || (th->status != THREAD_STOPPED && th->status != THREAD_STOPPED_FOREVER)) return CONTPROF_THREAD_RUNNING;
  return th->blocking_region_buffer ? CONTPROF_THREAD_NATIVE : CONTPROF_THREAD_WAITING;
}

VALUE contprof_vm_thread_name(VALUE thread) {
  rb_thread_t *th = thread_struct(thread);
  return th ? th->name : Qnil;
}

bool contprof_vm_thread_pthread(VALUE thread, pthread_t *pthread) {
  rb_thread_t *th = thread_struct(thread);
  // A thread that has not started yet, or has finished, has no native thread to ask.
  if (!th || th->status == THREAD_KILLED || !th->ec || !th->ec->vm_stack) return false;
  *pthread = th->thread_id;
  return true;
}

pid_t contprof_vm_thread_tid(VALUE thread) {
  rb_thread_t *th = thread_struct(thread);
  if (!th) return 0;
  // Ruby 3.1 does not update the forking thread's tid in a forked child: ask the kernel.
  if (th == GET_THREAD()) return (pid_t) syscall(SYS_gettid);
  return th->tid;
}

void contprof_vm_each_thread(contprof_vm_thread_visitor visit, void *context) {
  rb_ractor_t *ractor = GET_RACTOR();
  rb_thread_t *th = NULL;
  // The VM itself walks this list without further locking while holding the GVL.
  list_for_each(&ractor->threads.set, th, lt_node) {
    if (th->status != THREAD_KILLED) visit(th->self, context);
  }
}

static void push_thread(VALUE thread, void *list) { rb_ary_push((VALUE) list, thread); }

VALUE contprof_vm_thread_list(void) {
  VALUE list = rb_ary_new();
  contprof_vm_each_thread(push_thread, (void *) list);
  return list;
}

VALUE contprof_vm_gvl_owner(void) {
  const rb_thread_t *owner = GET_RACTOR()->threads.gvl.owner;
  return owner ? owner->self : Qnil;
}

// The VM's job queue for other threads (vm->workqueue, what MJIT uses): a list of these,
// as vm_trace.c defines them, malloc'd by the sender and freed by the flush.
struct workqueue_job {
  struct list_node node;
  void (*func)(void *);
  void *data;
};

int contprof_vm_request_job(void (*job)(void *), void *data, atomic_uintptr_t *gc_thread) {
  rb_vm_t *vm = GET_VM();
  rb_global_vm_lock_t *gvl = &GET_RACTOR()->threads.gvl;
  struct workqueue_job *queued = malloc(sizeof(*queued));
  if (!queued) return -1;
  queued->func = job;
  queued->data = data;
  rb_native_mutex_lock(&gvl->lock);
  const rb_thread_t *owner = gvl->owner;
  // A GC runs on the thread holding the GVL, from gc_enter to gc_exit.
  atomic_store(gc_thread, (uintptr_t) (owner && rb_during_gc() ? owner->self : Qnil));
  if (owner) {
    rb_native_mutex_lock(&vm->workqueue_lock);
    list_add_tail(&vm->workqueue, &queued->node);
    rb_native_mutex_unlock(&vm->workqueue_lock);
    RUBY_VM_SET_POSTPONED_JOB_INTERRUPT(owner->ec);
  }
  rb_native_mutex_unlock(&gvl->lock);
  if (!owner) free(queued);
  return owner ? 1 : 0;
}

bool contprof_vm_current_thread_holds_gvl(void) {
  const rb_execution_context_t *ec = ruby_current_ec;
  if (!ec || !ec->thread_ptr) return false; // not a Ruby thread
  const rb_thread_t *th = ec->thread_ptr;
  return th->ractor && th->ractor->threads.gvl.owner == th;
}

// ---------------------------------------------------------------------------------------
// Stacks

// The method entry of a C frame, when it is one Thread#backtrace_locations would show.
static const rb_callable_method_entry_t *cfunc_method(const rb_control_frame_t *cfp) {
  if (cfp->iseq || VM_FRAME_TYPE(cfp) != VM_FRAME_MAGIC_CFUNC) return NULL;
  return rb_vm_frame_method_entry(cfp);
}

// The walk itself: only reads, so it also serves the signal handler (see
// contprof_vm_capture_current_stack).
static long read_stack_of(const rb_thread_t *th, contprof_raw_frame *frames, long capacity) {
  const rb_execution_context_t *ec = th->ec;
  // Not started yet, or already finished: no stack.
  if (!ec || !ec->vm_stack || !ec->cfp) return 0;

  // The oldest frame is the VM's dummy frame (on the main thread it even looks like a
  // "<main>" Ruby frame at line 0): Ruby's backtraces skip it, and so do we.
  const rb_control_frame_t *end = RUBY_VM_NEXT_CONTROL_FRAME(RUBY_VM_END_CONTROL_FRAME(ec));
  long count = 0;
  // C frames take the file and line of their nearest Ruby caller, which comes later in
  // this newest-to-oldest walk: they wait in [pending_from, count) until it is found.
  long pending_from = -1;
  for (const rb_control_frame_t *cfp = ec->cfp; RUBY_VM_VALID_CONTROL_FRAME_P(cfp, end);
       cfp = RUBY_VM_PREVIOUS_CONTROL_FRAME(cfp)) {
    if (cfp->iseq) {
      if (!cfp->pc) continue; // not a Ruby frame backtraces show (e.g. a C block)
      if (pending_from >= 0) {
        for (long i = pending_from; i < count && i < capacity; i++) {
          frames[i].iseq = cfp->iseq;
          frames[i].pc = cfp->pc;
        }
        pending_from = -1;
      }
      if (count < capacity) {
        frames[count] = (contprof_raw_frame) {
          .iseq = cfp->iseq, .pc = cfp->pc, .method = rb_vm_frame_method_entry(cfp), .kind = CONTPROF_FRAME_RUBY};
      } else {
        // Past capacity, and no C frame waits for its caller any more: count the rest.
        const rb_control_frame_t *rest = RUBY_VM_PREVIOUS_CONTROL_FRAME(cfp);
        count++;
        for (; RUBY_VM_VALID_CONTROL_FRAME_P(rest, end); rest = RUBY_VM_PREVIOUS_CONTROL_FRAME(rest)) {
          if (rest->iseq ? rest->pc != NULL : cfunc_method(rest) != NULL) count++;
        }
        return count;
      }
      count++;
    } else {
      const rb_callable_method_entry_t *method = cfunc_method(cfp);
      if (!method) continue;
      if (count < capacity) {
        frames[count] = (contprof_raw_frame) {.iseq = NULL, .pc = NULL, .method = method, .kind = CONTPROF_FRAME_CFUNC};
      }
      if (pending_from < 0) pending_from = count;
      count++;
    }
  }
  return count;
}

long contprof_vm_read_stack(VALUE thread, contprof_raw_frame *frames, long capacity) {
  rb_thread_t *th = thread_struct(thread);
  if (!th) return CONTPROF_VM_NOT_A_THREAD;
  if (th->status == THREAD_KILLED) return CONTPROF_VM_THREAD_DEAD;
  return read_stack_of(th, frames, capacity);
}

bool contprof_vm_during_gc(void) { return rb_during_gc() != 0; }

long contprof_vm_capture_current_stack(contprof_raw_frame *frames, long capacity, contprof_stack_capture_info *info) {
  const rb_execution_context_t *ec = ruby_current_ec;
  if (!ec || !ec->thread_ptr) return -1; // not a Ruby thread
  const rb_thread_t *th = ec->thread_ptr;
  if (!th->ractor || th->ractor->threads.gvl.owner == th) return -1; // it could be changing its stack
  // A GC running on the GVL holder may move what the frames point to: read the GC
  // counter around the walk, and give up if a GC ran or started meanwhile.
  size_t gc_count = rb_gc_count();
  atomic_thread_fence(memory_order_seq_cst);
  if (rb_during_gc()) return -1;
  long count = read_stack_of(th, frames, capacity);
  bool all_old = true;
  for (long i = 0; i < count && i < capacity && all_old; i++) all_old = contprof_vm_frame_key_rememberable(&frames[i]);
  atomic_thread_fence(memory_order_seq_cst);
  if (rb_during_gc() || rb_gc_count() != gc_count) return -1;
  info->gc_count = gc_count;
  info->all_old = all_old;
  return count;
}

int64_t contprof_vm_frame_line(const contprof_raw_frame *frame) {
  const rb_iseq_t *iseq = frame->iseq;
  if (!iseq || !frame->pc) return 0;
  size_t position = (size_t) ((const VALUE *) frame->pc - iseq->body->iseq_encoded);
  // The pc points at the next instruction; step back into the current one.
  if (position > 0) position--;
  return rb_iseq_line_no(iseq, position);
}

static pprof_str string_of(VALUE string) {
  if (!RB_TYPE_P(string, T_STRING)) return (pprof_str) {"", 0};
  return (pprof_str) {RSTRING_PTR(string), (size_t) RSTRING_LEN(string)};
}

pprof_str contprof_vm_frame_file(const contprof_raw_frame *frame) {
  const rb_iseq_t *iseq = frame->iseq;
  if (!iseq) return (pprof_str) {"", 0};
  // pathobj is the path, or [path, realpath] when the real path is known.
  VALUE pathobj = iseq->body->location.pathobj;
  if (RB_TYPE_P(pathobj, T_ARRAY)) {
    VALUE realpath = RARRAY_AREF(pathobj, 1);
    return string_of(NIL_P(realpath) ? RARRAY_AREF(pathobj, 0) : realpath);
  }
  return string_of(pathobj);
}

typedef struct {
  char *buffer;
  size_t size;
  size_t len;
} name_writer;

static void write_bytes(name_writer *w, const char *bytes, size_t len) {
  size_t room = w->size - w->len;
  if (len > room) len = room;
  memcpy(w->buffer + w->len, bytes, len);
  w->len += len;
}

static void write_string(name_writer *w, VALUE string) {
  pprof_str s = string_of(string);
  write_bytes(w, s.ptr, s.len);
}

// "Owner#method" or "Owner.method" (singleton methods of classes and modules), or just
// "method" when the owner has no name (anonymous classes, singletons of plain objects).
static void write_qualified_method(name_writer *w, const rb_callable_method_entry_t *method) {
  VALUE owner = method->owner;
  const char *separator = "#";
  if (RB_TYPE_P(owner, T_ICLASS)) owner = RBASIC(owner)->klass;
  if (RB_TYPE_P(owner, T_CLASS) && RB_FL_TEST_RAW(owner, RUBY_FL_SINGLETON)) {
    VALUE attached = rb_attr_get(owner, id__attached__);
    owner = (RB_TYPE_P(attached, T_CLASS) || RB_TYPE_P(attached, T_MODULE)) ? attached : Qnil;
    separator = ".";
  }
  VALUE path = NIL_P(owner) ? Qnil : rb_class_path_cached(owner);
  if (RB_TYPE_P(path, T_STRING)) {
    write_string(w, path);
    write_bytes(w, separator, 1);
  }
  VALUE name = rb_id2str(method->def->original_id);
  if (name) {
    write_string(w, name);
  } else {
    write_bytes(w, "?", 1);
  }
}

// Whether `method` is the method whose body `iseq` belongs to (the iseq itself, or a
// block, rescue or ensure clause inside it).
static bool method_owns_iseq(const rb_callable_method_entry_t *method, const rb_iseq_t *iseq) {
  if (!method || method->def->type != VM_METHOD_TYPE_ISEQ) return false;
  const rb_iseq_t *method_iseq = method->def->body.iseq.iseqptr;
  return method_iseq && method_iseq->body == iseq->body->local_iseq->body;
}

pprof_str contprof_vm_frame_name(const contprof_raw_frame *frame, char *buffer, size_t buffer_size) {
  name_writer w = {.buffer = buffer, .size = buffer_size, .len = 0};
  const rb_callable_method_entry_t *method = frame->method;
  if (frame->kind == CONTPROF_FRAME_CFUNC) {
    write_qualified_method(&w, method);
    return (pprof_str) {buffer, w.len};
  }
  const rb_iseq_t *iseq = frame->iseq;
  VALUE label = iseq->body->location.label;
  if (!method_owns_iseq(method, iseq)) return string_of(label); // <main>, <class:Foo>, define_method bodies...
  if (iseq->body->type == ISEQ_TYPE_METHOD) {
    write_qualified_method(&w, method);
    return (pprof_str) {buffer, w.len};
  }
  // A block, rescue or ensure inside a method: its label ends with the method's name
  // ("block (2 levels) in bar"), which becomes the qualified name.
  pprof_str full = string_of(label), base = string_of(iseq->body->location.base_label);
  if (base.len > full.len || memcmp(full.ptr + full.len - base.len, base.ptr, base.len) != 0) return full;
  write_bytes(&w, full.ptr, full.len - base.len);
  write_qualified_method(&w, method);
  return (pprof_str) {buffer, w.len};
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

pprof_frame_key contprof_vm_frame_key(const contprof_raw_frame *frame) {
  // A Ruby frame and a C frame it calls share iseq and pc but never the method entry.
  return (pprof_frame_key) {.a = (uintptr_t) frame->iseq, .b = (uintptr_t) frame->method, .c = (uintptr_t) frame->pc};
}

bool contprof_vm_frame_key_rememberable(const contprof_raw_frame *frame) {
  if (!frame->iseq && !frame->method) return false;
  if (frame->iseq && !RB_OBJ_PROMOTED((VALUE) frame->iseq)) return false;
  return !frame->method || RB_OBJ_PROMOTED((VALUE) frame->method);
}

#else // No VM header: everything reports "unsupported".

#include "vm/vm.h"

bool contprof_vm_supported(void) { return false; }
void contprof_vm_init(void) {}
bool contprof_vm_is_thread(VALUE object) { return rb_obj_is_kind_of(object, rb_cThread) == Qtrue; }
bool contprof_vm_thread_alive(VALUE thread) { return false; }
contprof_thread_state contprof_vm_thread_state(VALUE thread) { return CONTPROF_THREAD_RUNNING; }
long contprof_vm_capture_current_stack(contprof_raw_frame *frames, long capacity, contprof_stack_capture_info *info) {
  return -1;
}
bool contprof_vm_during_gc(void) { return false; }
VALUE contprof_vm_thread_name(VALUE thread) { return Qnil; }
bool contprof_vm_thread_pthread(VALUE thread, pthread_t *pthread) { return false; }
pid_t contprof_vm_thread_tid(VALUE thread) { return 0; }
void contprof_vm_each_thread(contprof_vm_thread_visitor visit, void *context) {}
VALUE contprof_vm_thread_list(void) { return rb_ary_new(); }
VALUE contprof_vm_gvl_owner(void) { return Qnil; }
int contprof_vm_request_job(void (*job)(void *), void *data, atomic_uintptr_t *gc_thread) {
  atomic_store(gc_thread, (uintptr_t) Qnil);
  return 0;
}
bool contprof_vm_current_thread_holds_gvl(void) { return false; }
long contprof_vm_read_stack(VALUE thread, contprof_raw_frame *frames, long capacity) { return CONTPROF_VM_NOT_A_THREAD; }
int64_t contprof_vm_frame_line(const contprof_raw_frame *frame) { return 0; }
pprof_str contprof_vm_frame_file(const contprof_raw_frame *frame) { return (pprof_str) {"", 0}; }
pprof_str contprof_vm_frame_name(const contprof_raw_frame *frame, char *buffer, size_t buffer_size) {
  return (pprof_str) {"", 0};
}
bool contprof_vm_key_generation(uint64_t *generation) {
  *generation = 0;
  return false;
}
pprof_frame_key contprof_vm_frame_key(const contprof_raw_frame *frame) { return (pprof_frame_key) {0, 0, 0}; }
bool contprof_vm_frame_key_rememberable(const contprof_raw_frame *frame) { return false; }

#endif
