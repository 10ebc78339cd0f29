// What the files of the Ruby 3.3+ backend of vm/vm.h share (the interface is vm/vm.h):
// vm/vm_thread_events.c keeps a thread_entry for each thread from its event hooks, and
// vm/vm_public_api.c reads the entries (the per-thread questions of vm/vm.h) and, in signal
// handlers, the calling thread's view of itself. Private to those two files.
#pragma once

#include <pthread.h>
#include <ruby.h>
#include <ruby/thread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <unistd.h>

#include "time_helpers.h"

#define TLS_INITIAL_EXEC __attribute__((tls_model("initial-exec")))

// Shared between the files, and hidden like every symbol of the extension
// (-fvisibility=hidden) but said so at the declaration: the compiler then addresses it
// directly, as it would a static.
#define VM_SHARED extern __attribute__((visibility("hidden")))

// What the hooks last saw a thread do.
enum { GVL_UNKNOWN = 0, GVL_HELD = 1, GVL_WANTED = 2, GVL_RELEASED = 3 };

// Each entry has a cache line of its own (see register_thread in vm/vm_thread_events.c):
// two threads' hooks write their entries at every switch between them, and entries sharing
// a line would bounce it between their cores at each event.
typedef struct {
  _Alignas(64) VALUE thread;
  atomic_uintptr_t pthread; // a pthread_t, valid once has_native
  atomic_int tid;
  atomic_bool has_native;
  atomic_int gvl; // GVL_*
  // GVL waits (see contprof_vm_thread_gvl_waited_ns): when the wait in progress began
  // (CLOCK_MONOTONIC; 0: none), and the total of those that ended.
  _Atomic int64_t ready_since_ns;
  _Atomic int64_t gvl_waited_ns;
  // Stretches off the GVL (see contprof_vm_thread_stretch), written by the thread's own
  // hooks: the latest one's number, start and end (0 while it lasts).
  atomic_uint_fast64_t stretch_seq;
  _Atomic int64_t stretch_start_ns, stretch_end_ns;
  // The stretch a round asked to keep the end of (written holding the GVL), and that end
  // (written by RESUMED, which takes the GVL after the round's write).
  atomic_uint_fast64_t marked_seq;
  _Atomic int64_t marked_end_ns;
  // M:N threads (see "M:N threads" in vm/vm_thread_events.c): whether it shares native
  // threads, the CPU its hooks measured, and its native thread's CPU clock at its latest
  // RESUMED (0: off the GVL).
  atomic_bool shares_native;
  _Atomic int64_t cpu_accounted_ns, cpu_resumed_at_ns;
} thread_entry;

// Defined in vm/vm_thread_events.c. The key of each thread's entry (a thread without one
// has not run since load time, or has exited).
VM_SHARED rb_internal_thread_specific_key_t contprof_vm_entry_key;
// The calling thread's view of itself (read by signal handlers: initial-exec TLS needs no
// allocation on first use).
VM_SHARED __thread int contprof_vm_current_gvl TLS_INITIAL_EXEC; // GVL_*
VM_SHARED __thread pid_t contprof_vm_current_tid TLS_INITIAL_EXEC; // 0: not asked yet
VM_SHARED __thread thread_entry *contprof_vm_current_entry TLS_INITIAL_EXEC;

static inline thread_entry *entry_of(VALUE thread) {
  return (thread_entry *) rb_internal_thread_specific_get(thread, contprof_vm_entry_key);
}

static inline pid_t my_tid(void) {
  if (contprof_vm_current_tid == 0) contprof_vm_current_tid = (pid_t) syscall(SYS_gettid);
  return contprof_vm_current_tid;
}

static inline int64_t own_cpu_ns(void) { return contprof_clock_ns(CLOCK_THREAD_CPUTIME_ID); }

// Load time, in this order (holding the GVL), by contprof_vm_init: the hooks' keys and the
// registry; each thread that exists already; then the hooks, which follow every thread
// from its next GVL switch on (`current` is the calling thread).
void contprof_vm_thread_events_prepare(void);
void contprof_vm_thread_events_know(VALUE thread, VALUE current, int64_t now_ns);
void contprof_vm_thread_events_start(VALUE current);
