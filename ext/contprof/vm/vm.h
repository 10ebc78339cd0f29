// The only door to Ruby VM internals. vm/vm_ruby31.c is the one file that includes the
// VM's private header (Ruby 3.1's MJIT header); everything else in Contprof uses these
// plain functions and Ruby's public C API. Supporting another Ruby version means
// changing vm/vm_ruby31.c only.
//
// Every function here must be called holding the GVL, and none of them allocates a Ruby
// object (so they are safe to use while sampling), except contprof_vm_thread_list.
#pragma once

#include <pthread.h>
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
// Whether the thread is waiting in Ruby (sleep, Queue#pop, Mutex, ConditionVariable...).
bool contprof_vm_thread_waiting(VALUE thread);
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

// Nudges the thread holding the GVL so that it runs postponed jobs soon. Callable WITHOUT
// the GVL (from the sampling trigger thread). While it runs, the GVL's internal lock is
// held, so the owner can neither change nor exit (no signal to a dead thread, no write
// to a freed context). With `signal` > 0 it sends that signal to the owner
// (pthread_kill); with `signal` == 0 it calls `before_interrupt` (which registers the
// job) and then raises the owner's postponed-job interrupt flag, as Ruby's own timer
// thread raises its timer flag: no signal at all.
// Returns 1 when an owner was nudged, 0 when no thread holds the GVL, or -errno.
int contprof_vm_nudge_gvl_owner(int signal, void (*before_interrupt)(void));

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
