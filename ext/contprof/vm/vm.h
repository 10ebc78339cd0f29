// The only door to Ruby VM internals. vm/vm_ruby31.c is the one file that includes the
// VM's private header (Ruby 3.1's MJIT header); everything else in Contprof uses these
// plain functions and Ruby's public C API. Supporting another Ruby version means
// changing vm/vm_ruby31.c only.
//
// Every function here must be called holding the GVL, and none of them allocates a Ruby
// object (so they are safe to use while sampling), except contprof_vm_thread_list. The
// few that other threads or signal handlers may call say so.
#pragma once

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

// vm/vm_ruby31.c includes the VM's private header instead of ruby.h; the two conflict.
#ifndef CONTPROF_VM_ACCESS_SKIP_RUBY_INCLUDES
#include <ruby.h>
#endif

#include "pprof/pprof_profile.h"

// Whether this build can read VM internals (false without the VM header).
bool contprof_vm_supported(void);

// Called once at load time.
void contprof_vm_init(void);

// ---------------------------------------------------------------------------------------
// Threads

bool contprof_vm_is_thread(VALUE object);
bool contprof_vm_thread_alive(VALUE thread);
// What a thread is doing, as far as where its time goes is concerned.
typedef enum {
  // Runs Ruby code: holds the GVL, or is ready to and waits for it.
  CONTPROF_THREAD_RUNNING = 0,
  // In native code with the GVL released (a C extension's computation, an I/O wait,
  // IO.select): its Ruby stack stays as it is until it takes the GVL back.
  CONTPROF_THREAD_NATIVE = 1,
  // Waiting in Ruby: sleep, Queue#pop, Mutex#lock, ConditionVariable#wait, Thread#join.
  CONTPROF_THREAD_WAITING = 2,
} contprof_thread_state;
contprof_thread_state contprof_vm_thread_state(VALUE thread);
// The thread's name (a String) or nil.
VALUE contprof_vm_thread_name(VALUE thread);
// The thread's pthread; false when it has none (not started or finished).
bool contprof_vm_thread_pthread(VALUE thread, pthread_t *pthread);
// The thread's kernel thread id, or 0.
pid_t contprof_vm_thread_tid(VALUE thread);

// Calls `visit` for each live thread of the current ractor, in creation order. `visit`
// must not create or kill threads.
typedef void (*contprof_vm_thread_visitor)(VALUE thread, void *context);
void contprof_vm_each_thread(contprof_vm_thread_visitor visit, void *context);

// An Array of the live threads (allocates; not for use while sampling).
VALUE contprof_vm_thread_list(void);

// The thread holding the GVL right now, or Qnil.
VALUE contprof_vm_gvl_owner(void);

// Asks the thread holding the GVL to run `job(data)` at its next safe point (where Ruby
// checks interrupts), without a signal: the job goes to the VM's thread-safe job queue
// and the holder's interrupt flag is raised, as Ruby's own timer thread raises its
// flag. Callable WITHOUT the GVL (from the worker thread). While it runs, the GVL's
// internal lock is held, so the holder can neither change nor exit meanwhile. Stores into
// `*gc_thread` the holder when it is running a GC, else Qnil.
// Returns 1 when the job was queued for a holder, 0 when no thread holds the GVL (nothing
// queued), or -1 when memory ran out.
int contprof_vm_request_job(void (*job)(void *), void *data, atomic_uintptr_t *gc_thread);

// Async-signal-safe: whether the calling thread holds the GVL.
bool contprof_vm_current_thread_holds_gvl(void);

// ---------------------------------------------------------------------------------------
// Stacks

typedef enum {
  CONTPROF_FRAME_RUBY = 1, // a method, block, class body or script written in Ruby
  CONTPROF_FRAME_CFUNC = 2, // a method written in C (e.g. Kernel#sleep)
} contprof_frame_kind;

// One frame as read from the VM, named lazily by the functions below.
typedef struct {
  const void *iseq; // the frame's instruction sequence; for a C frame its nearest Ruby caller's (or NULL)
  const void *pc; // position in `iseq`, giving the line
  const void *method; // the callable method entry, or NULL (top level, class bodies)
  contprof_frame_kind kind;
} contprof_raw_frame;

#define CONTPROF_VM_NOT_A_THREAD (-1)
#define CONTPROF_VM_THREAD_DEAD (-2)

// Reads `thread`'s frames, newest first, into `frames` (at most `capacity` of them), the
// same frames Thread#backtrace_locations reports. Returns how many frames the thread
// has in all (possibly more than `capacity`; 0 for a thread without any Ruby-level
// frame), or CONTPROF_VM_NOT_A_THREAD / CONTPROF_VM_THREAD_DEAD.
long contprof_vm_read_stack(VALUE thread, contprof_raw_frame *frames, long capacity);

// The frame's line (for a C frame, its caller's line; 0 when unknown).
int64_t contprof_vm_frame_line(const contprof_raw_frame *frame);
// The frame's absolute file path (for a C frame, its caller's), or "" when unknown.
// Points into a Ruby string that stays valid until the VM runs Ruby code again.
pprof_str contprof_vm_frame_file(const contprof_raw_frame *frame);
// The frame's name as Ruby backtraces print it, with methods qualified by their owner:
// "Integer#times", "Foo.bar", "block in Foo#bar", "<main>". Written into `buffer`
// (truncated to fit) unless it can point at a Ruby string directly.
pprof_str contprof_vm_frame_name(const contprof_raw_frame *frame, char *buffer, size_t buffer_size);

// Reading the calling thread's own stack from a signal handler (async-signal-safe).
//
// A thread that does not hold the GVL (native code with the GVL released, a wait in
// Ruby, waiting to take the GVL back) cannot change its Ruby stack until it takes the GVL
// again, and no other thread changes it either, except a GC that moves or frees what the
// frames point to. So a signal handler running on such a thread can copy its raw frames,
// provided no GC ran meanwhile: the GC counter is read before and after, and a GC in
// progress refuses. The frames stay usable until the next GC, and if they point only to
// old objects, until the next major GC (see capture_valid in sampling/cpu_timers.c).
typedef struct {
  size_t gc_count; // rb_gc_count() when captured
  uint64_t major_gc_count; // the caller's count of major GCs when captured (see gc_time.h)
  bool all_old; // every VM object the frames point to was old
} contprof_stack_capture_info;

// Reads the calling thread's frames into `frames` as contprof_vm_read_stack would, when it
// is a Ruby thread that does not hold the GVL and no GC is running. Returns the frame
// count (possibly more than `capacity`), or -1 when the stack cannot be read safely now.
// `info->major_gc_count` is left for the caller to fill.
long contprof_vm_capture_current_stack(contprof_raw_frame *frames, long capacity, contprof_stack_capture_info *info);

// Whether a GC is running right now (any thread; a racy but harmless read).
bool contprof_vm_during_gc(void);

// Frame keys (see pprof_frame_key): a frame can be identified by the addresses of its VM
// objects as long as those objects can be neither freed nor moved. Old-generation
// objects stay put until the next major GC, so the key of a frame whose objects are old
// stays valid for the current `generation` (the number of major GCs so far).
//
// The key itself is just the addresses; whether it may be *remembered* is decided when
// it is first seen (contprof_vm_frame_key_rememberable). A key found among remembered
// ones needs no check: its old objects still occupy those addresses, so no other object
// can be there.
pprof_frame_key contprof_vm_frame_key(const contprof_raw_frame *frame);
bool contprof_vm_frame_key_rememberable(const contprof_raw_frame *frame);
// The generation keys are valid for, and whether keys may be used at all right now
// (not during a major GC).
bool contprof_vm_key_generation(uint64_t *generation);
