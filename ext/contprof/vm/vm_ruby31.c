// The Ruby 3.1 backend of vm/vm.h, through the VM's private structures. This is the only
// file that includes the VM's private header; it must be its only Ruby include, hence the
// guard macro below.
//
// Written for Ruby 3.1 (Debian's 3.1.2), whose MJIT header carries the layouts of the VM
// structures. extconf.rb builds this file where such a header exists and this file
// compiles against it.

#ifndef CONTPROF_MJIT_HEADER
#error "vm_ruby31.c needs Ruby 3.1's MJIT header (see extconf.rb)"
#endif

// The VM header declares static functions it does not define; that is not our code.
#pragma GCC diagnostic ignored "-Wunused-function"
#include CONTPROF_MJIT_HEADER
#define CONTPROF_VM_ACCESS_SKIP_RUBY_INCLUDES
#include "vm/vm.h"
#include "vm/vm_common.h"
#include "attributes.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

// The type of Thread objects' data. ruby_threadptr_data_type is not exported, so it is
// learned from the current thread at load time.
static const rb_data_type_t *thread_data_type;

bool contprof_vm_supported(void) { return true; }
const char *contprof_vm_backend_name(void) { return "ruby31"; }
const char *contprof_vm_backend_note(void) { return ""; }
uint64_t contprof_vm_threads_unknown_no_memory(void) { return 0; } // (threads are Ruby's own structures)
int64_t contprof_vm_thread_cpu_accounted_ns(VALUE CONTPROF_UNUSED thread) { return -1; } // (Ruby 3.1 has no M:N threads)
bool contprof_vm_thread_shares_native(VALUE CONTPROF_UNUSED thread) { return false; }
pid_t contprof_vm_sharing_holder_tid(void) { return 0; }
bool contprof_vm_mn_threads_requested(void) { return false; }
uint64_t contprof_vm_threads_sharing_native(void) { return 0; }
void contprof_vm_frames_valid_now(void) {}
bool contprof_vm_frame_names_unreliable(void) { return false; } // (naming never moves objects here)
const char *contprof_vm_gc_hooks_unaffordable(void) {
  return "on Ruby 3.1 any GC event hook sends every allocation down the allocator's slow path (11-14% slower "
         "allocation-heavy code), and live-heap tracking needs one";
}

void contprof_vm_init(void) {
  thread_data_type = RTYPEDDATA_TYPE(rb_thread_current());
  contprof_vm_common_init();
}

// A raw frame's words: the iseq (for a C frame, its nearest Ruby caller's, or NULL), the
// callable method entry or NULL, whose lowest bit (entries are aligned) marks a C frame,
// and the pc in the iseq (giving the line). A Ruby frame and a C frame it calls share
// iseq and pc but never the method entry, so the words are a frame's key.
#define FRAME_ISEQ(frame) ((const rb_iseq_t *) (frame)->word[0])
#define FRAME_METHOD(frame) ((const rb_callable_method_entry_t *) ((frame)->word[1] & ~(uintptr_t) 1))
#define FRAME_IS_CFUNC(frame) (((frame)->word[1] & 1) != 0)
#define FRAME_PC(frame) ((const VALUE *) (frame)->word[2])

static contprof_raw_frame ruby_frame(const rb_control_frame_t *cfp) {
  return (contprof_raw_frame) {{(uintptr_t) cfp->iseq, (uintptr_t) rb_vm_frame_method_entry(cfp), (uintptr_t) cfp->pc}};
}

static contprof_raw_frame cfunc_frame(const rb_callable_method_entry_t *method) {
  return (contprof_raw_frame) {{0, (uintptr_t) method | 1, 0}};
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
// A runnable thread other than the caller (which holds the GVL: every caller does) is
// waiting for the GVL.
contprof_thread_state contprof_vm_thread_state(VALUE thread) {
  const rb_thread_t *th = thread_struct(thread);
  if (!th) return CONTPROF_THREAD_RUNNING;
  if (th->status == THREAD_RUNNABLE) return th == GET_THREAD() ? CONTPROF_THREAD_RUNNING : CONTPROF_THREAD_GVL_WAIT;
  if (th->status != THREAD_STOPPED && th->status != THREAD_STOPPED_FOREVER) return CONTPROF_THREAD_RUNNING;
  return th->blocking_region_buffer ? CONTPROF_THREAD_NATIVE : CONTPROF_THREAD_WAITING;
}

int64_t contprof_vm_thread_gvl_waited_ns(VALUE CONTPROF_UNUSED thread, int64_t CONTPROF_UNUSED now_ns) { return -1; }
bool contprof_vm_thread_stretch(VALUE CONTPROF_UNUSED thread, CONTPROF_UNUSED contprof_vm_stretch *stretch) { return false; }
void contprof_vm_thread_mark_stretch(VALUE CONTPROF_UNUSED thread, uint64_t CONTPROF_UNUSED seq) {}
int64_t contprof_vm_thread_marked_stretch_end(VALUE CONTPROF_UNUSED thread, uint64_t CONTPROF_UNUSED seq) { return 0; }
bool contprof_vm_call_on_next_resume(void (*call)(void *), void *data) {
  (void) call;
  (void) data;
  return false;
}
void contprof_vm_cancel_call_on_next_resume(void) {}

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

// The VM's job queue for other threads (vm->workqueue, what MJIT uses): a list of these,
// as vm_trace.c defines them, malloc'd by the sender and freed by the flush.
struct workqueue_job {
  struct list_node node;
  void (*func)(void *);
  void *data;
};

// Handed to Ruby with the job. Ruby 3.1 can, rarely, run a job with the data of another
// registration made in the middle of a flush (bug #19991): whatever job gets this pointer
// finds zeroed memory rather than NULL.
static char harmless_job_data[256];
static void (*sampling_job)(void *);
// From ruby/debug.h, which cannot be included next to the VM header.
int rb_postponed_job_register_one(unsigned int flags, void (*func)(void *), void *data);

bool contprof_vm_job_register(void (*job)(void *)) {
  sampling_job = job;
  return true;
}

int contprof_vm_job_trigger_here(void) {
  return rb_postponed_job_register_one(0, sampling_job, harmless_job_data);
}

int contprof_vm_request_job(atomic_uintptr_t *holder, atomic_uintptr_t *gc_thread, atomic_uint *gc_moment) {
  rb_vm_t *vm = GET_VM();
  rb_global_vm_lock_t *gvl = &GET_RACTOR()->threads.gvl;
  struct workqueue_job *queued = malloc(sizeof(*queued));
  if (!queued) return -1;
  queued->func = sampling_job;
  queued->data = harmless_job_data;
  rb_native_mutex_lock(&gvl->lock);
  const rb_thread_t *owner = gvl->owner;
  atomic_store(holder, (uintptr_t) (owner ? owner->self : Qnil));
  // A GC runs on the thread holding the GVL, from gc_enter to gc_exit.
  contprof_gc_moment moment = owner ? contprof_vm_gc_moment() : 0;
  atomic_store(gc_moment, moment);
  atomic_store(gc_thread, (uintptr_t) (moment ? owner->self : Qnil));
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

bool contprof_vm_gvl_held(void) {
  rb_global_vm_lock_t *gvl = &GET_RACTOR()->threads.gvl;
  rb_native_mutex_lock(&gvl->lock);
  bool held = gvl->owner != NULL;
  rb_native_mutex_unlock(&gvl->lock);
  return held;
}

bool contprof_vm_current_thread_in_c_method(void) { return false; }

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
          frames[i].word[0] = (uintptr_t) cfp->iseq;
          frames[i].word[2] = (uintptr_t) cfp->pc;
        }
        pending_from = -1;
      }
      if (count < capacity) {
        frames[count] = ruby_frame(cfp);
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
        frames[count] = cfunc_frame(method);
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

size_t contprof_vm_capture_scratch_size(long CONTPROF_UNUSED capacity) { return 0; }

static long walk_stack_of(void *thread, contprof_raw_frame *frames, long capacity, bool *all_old) {
  long count = read_stack_of(thread, frames, capacity);
  for (long i = 0; i < count && i < capacity && *all_old; i++) *all_old = contprof_vm_frame_key_rememberable(&frames[i]);
  return count;
}

long contprof_vm_capture_current_stack(contprof_raw_frame *frames, long capacity, CONTPROF_UNUSED void *scratch,
                                       contprof_stack_capture_info *info) {
  const rb_execution_context_t *ec = ruby_current_ec;
  if (!ec || !ec->thread_ptr) return -1; // not a Ruby thread
  const rb_thread_t *th = ec->thread_ptr;
  if (!th->ractor || th->ractor->threads.gvl.owner == th) return -1; // it could be changing its stack
  return contprof_vm_walk_between_gcs(walk_stack_of, (void *) th, frames, capacity, info);
}

int64_t contprof_vm_frame_line(const contprof_raw_frame *frame) {
  const rb_iseq_t *iseq = FRAME_ISEQ(frame);
  if (!iseq || !FRAME_PC(frame)) return 0;
  size_t position = (size_t) (FRAME_PC(frame) - iseq->body->iseq_encoded);
  // The pc points at the next instruction; step back into the current one.
  if (position > 0) position--;
  return rb_iseq_line_no(iseq, position);
}

pprof_str contprof_vm_frame_file(const contprof_raw_frame *frame) {
  const rb_iseq_t *iseq = FRAME_ISEQ(frame);
  if (!iseq) return (pprof_str) {"", 0};
  // pathobj is the path, or [path, realpath] when the real path is known.
  VALUE pathobj = iseq->body->location.pathobj;
  if (RB_TYPE_P(pathobj, T_ARRAY)) {
    VALUE realpath = RARRAY_AREF(pathobj, 1);
    return contprof_vm_string(NIL_P(realpath) ? RARRAY_AREF(pathobj, 0) : realpath);
  }
  return contprof_vm_string(pathobj);
}

static void write_string(contprof_name_writer *w, VALUE string) {
  pprof_str s = contprof_vm_string(string);
  contprof_name_write(w, s.ptr, s.len);
}

// "Owner#method" or "Owner.method" (singleton methods of classes and modules), or just
// "method" when the owner has no name (anonymous classes, singletons of plain objects).
static void write_qualified_method(contprof_name_writer *w, const rb_callable_method_entry_t *method) {
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
    contprof_name_write(w, separator, 1);
  }
  VALUE name = rb_id2str(method->def->original_id);
  if (name) {
    write_string(w, name);
  } else {
    contprof_name_write(w, "?", 1);
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
  contprof_name_writer w = {.buffer = buffer, .size = buffer_size, .len = 0};
  const rb_callable_method_entry_t *method = FRAME_METHOD(frame);
  if (FRAME_IS_CFUNC(frame)) {
    write_qualified_method(&w, method);
    return (pprof_str) {buffer, w.len};
  }
  const rb_iseq_t *iseq = FRAME_ISEQ(frame);
  VALUE label = iseq->body->location.label;
  if (!method_owns_iseq(method, iseq)) return contprof_vm_string(label); // <main>, <class:Foo>, define_method bodies...
  if (iseq->body->type == ISEQ_TYPE_METHOD) {
    write_qualified_method(&w, method);
    return (pprof_str) {buffer, w.len};
  }
  // A block, rescue or ensure inside a method: its label ends with the method's name
  // ("block (2 levels) in bar"), which becomes the qualified name.
  pprof_str full = contprof_vm_string(label), base = contprof_vm_string(iseq->body->location.base_label);
  if (base.len > full.len || memcmp(full.ptr + full.len - base.len, base.ptr, base.len) != 0) return full;
  contprof_name_write(&w, full.ptr, full.len - base.len);
  write_qualified_method(&w, method);
  return (pprof_str) {buffer, w.len};
}

bool contprof_vm_frame_key_rememberable(const contprof_raw_frame *frame) {
  const rb_iseq_t *iseq = FRAME_ISEQ(frame);
  const rb_callable_method_entry_t *method = FRAME_METHOD(frame);
  if (!iseq && !method) return false;
  if (iseq && !RB_OBJ_PROMOTED((VALUE) iseq)) return false;
  return !method || RB_OBJ_PROMOTED((VALUE) method);
}

bool contprof_vm_request_job_from_ruby_threads(void) { return true; }
