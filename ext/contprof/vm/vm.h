// The one door to the Ruby VM: what the collectors and the sampler need from it, and
// nothing else. Each Ruby gets one backend file that implements it:
//
// - vm/vm_ruby31.c: Ruby 3.1, through the VM's private structures (its "MJIT header");
// - vm/vm_public_api.c: Ruby 3.3 and later, through public C APIs (the internal-thread
//   event hooks, postponed-job handles), and for stacks the VM's control frames where
//   vm/vm_frame_layout.c knows and has checked their layout, else rb_profile_thread_frames;
// - vm/vm_unsupported.c: any other Ruby; builds, samples nothing, and says why.
//
// extconf.rb picks one (by the functions the Ruby has, not its version number). What all
// backends share, because it only uses Ruby's public API, is in vm/vm_common.c.
//
// Every function here must be called holding the GVL, and none of them allocates a Ruby
// object unless it says so. The few that other threads or signal handlers may call say so.
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

// Whether this build can sample (false with vm/vm_unsupported.c).
bool contprof_vm_supported(void);
// Which backend this process uses: "ruby31"; on Ruby 3.3+ "frame_layout" (stacks read
// from the VM's control frames) or "public_api" (the same backend when the frame layout
// is not known or did not pass its check); "unsupported".
const char *contprof_vm_backend_name(void);
// Why the backend reads less than it could (the public API's limits), or "".
const char *contprof_vm_backend_note(void);

// Called once at load time, holding the GVL (may allocate).
void contprof_vm_init(void);

// ---------------------------------------------------------------------------------------
// Threads

bool contprof_vm_is_thread(VALUE object);
bool contprof_vm_thread_alive(VALUE thread);
// What a thread is doing, as far as where its time goes is concerned.
typedef enum {
  // Runs Ruby code: holds the GVL (or the backend cannot tell it from waiting for it).
  CONTPROF_THREAD_RUNNING = 0,
  // In native code with the GVL released (a C extension's computation, an I/O wait,
  // IO.select): its Ruby stack stays as it is until it takes the GVL back.
  CONTPROF_THREAD_NATIVE = 1,
  // Waiting in Ruby: sleep, Queue#pop, Mutex#lock, ConditionVariable#wait, Thread#join.
  // (Backends that cannot tell this from NATIVE report NATIVE.)
  CONTPROF_THREAD_WAITING = 2,
  // Ready to run Ruby code, waiting for the GVL another thread holds.
  CONTPROF_THREAD_GVL_WAIT = 3,
} contprof_thread_state;
contprof_thread_state contprof_vm_thread_state(VALUE thread);
// The time `thread` has spent waiting for the GVL (ready to run, another thread holding
// it) since the profiler was loaded, counting a wait in progress up to `now_ns`
// (CLOCK_MONOTONIC); -1 when the backend does not measure it (Ruby 3.1 has no GVL
// events: there, waits are seen only as samples of CONTPROF_THREAD_GVL_WAIT). The total
// may briefly lag while a wait ends; it never counts a wait twice.
int64_t contprof_vm_thread_gvl_waited_ns(VALUE thread, int64_t now_ns);

// A thread's latest stretch off the GVL: from giving it up (a blocking call, a sleep,
// native code that releases it) to wanting it back. Numbered per thread (`seq`, from 1),
// CLOCK_MONOTONIC instants; `end_ns` 0 while it lasts.
typedef struct {
  uint64_t seq;
  int64_t start_ns, end_ns;
} contprof_vm_stretch;
// Fills `stretch` with `thread`'s latest stretch off the GVL (its start and seq are stable
// while the caller holds the GVL); false when the backend does not time them (Ruby 3.1:
// no GVL events) or `thread` has had none. The calling thread's own is never current.
bool contprof_vm_thread_stretch(VALUE thread, contprof_vm_stretch *stretch);
// Asks the backend to keep the end of `thread`'s stretch `seq` (called holding the GVL
// while it lasts): read back by contprof_vm_thread_marked_stretch_end once a later
// stretch has begun; 0 until it ended (or where stretches are not timed).
void contprof_vm_thread_mark_stretch(VALUE thread, uint64_t seq);
int64_t contprof_vm_thread_marked_stretch_end(VALUE thread, uint64_t seq);
// Has the next thread to take the GVL call `call(data)`, once, before it runs anything
// (the wall clock parks while every thread is off the GVL, and must hear when one comes
// back). Called holding the GVL; `call` runs on that thread with no Ruby call and must not
// block for long. False where the backend cannot see threads take the GVL (Ruby 3.1).
bool contprof_vm_call_on_next_resume(void (*call)(void *data), void *data);
// Cancels a call asked for above that has not been made yet.
void contprof_vm_cancel_call_on_next_resume(void);
// The thread's name (a String) or nil. Like everything a round calls, it runs no Ruby
// method (see vm_public_api.c, "Thread names").
VALUE contprof_vm_thread_name(VALUE thread);
// The thread's pthread; false when it is not known (not started, finished, or not seen
// running since the profiler was loaded).
bool contprof_vm_thread_pthread(VALUE thread, pthread_t *pthread);
// The thread's kernel thread id, or 0 when not known.
pid_t contprof_vm_thread_tid(VALUE thread);
// M:N threads (Ruby 3.3+, RUBY_MN_THREADS=1): a Ruby thread that shares native threads with
// others has no CPU clock or CPU timer of its own. Its CPU time as its own event hooks
// measured it (see vm_thread_events.c, "M:N threads"), or -1 for a thread on a native thread
// of its own (read its pthread's CPU clock).
int64_t contprof_vm_thread_cpu_accounted_ns(VALUE thread);
bool contprof_vm_thread_shares_native(VALUE thread);
// Whether M:N threads were asked for (RUBY_MN_THREADS), and how many threads were seen
// sharing a native thread so far.
bool contprof_vm_mn_threads_requested(void);
uint64_t contprof_vm_threads_sharing_native(void);

// Threads the backend could not follow for lack of memory (never sampled), so far.
uint64_t contprof_vm_threads_unknown_no_memory(void);

// Calls `visit` for each live thread of the main ractor, in creation order. `visit` must
// not create or kill threads.
typedef void (*contprof_vm_thread_visitor)(VALUE thread, void *context);
void contprof_vm_each_thread(contprof_vm_thread_visitor visit, void *context);

// Async-signal-safe: whether the calling thread is a Ruby thread holding the GVL. A thread
// whose state is not known (not seen since the profiler was loaded) counts as holding it.
bool contprof_vm_current_thread_holds_gvl(void);
// Async-signal-safe: whether the calling thread holds the GVL inside a method written in C
// (its newest frame is the C method's). Its Ruby stack then stays as it is until the method
// returns or calls Ruby, so a signal handler may copy it: the CPU it uses goes to the C
// method even when the next safe point comes after it returned, or inside a block it
// calls. Only where the VM makes a frame current after writing it (Ruby 3.3+: a fence in
// vm_push_frame) and the backend reads frames itself (the frame layout); false elsewhere
// (Ruby 3.1: there the next safe point usually still has the C frame on top).
bool contprof_vm_current_thread_in_c_method(void);

// ---------------------------------------------------------------------------------------
// The sampling job: one function, run by a thread holding the GVL at its next safe point
// (where Ruby checks interrupts).

// Registers `job` as the sampling job (once, holding the GVL). False when Ruby refused.
bool contprof_vm_job_register(void (*job)(void *));

// Async-signal-safe: asks the calling thread, which holds the GVL (a signal handler on it,
// or a GC event), to run the job. Returns 1 when asked, 2 when it already was, 0 when the
// request was lost (Ruby's queue was full).
int contprof_vm_job_trigger_here(void);

// Asks the thread holding the GVL to run the job, without a signal: its interrupt flag is
// raised, as Ruby's own timer thread does. Called without the GVL, from a thread that is
// not a Ruby thread, or from any thread where contprof_vm_request_job_from_ruby_threads. Stores into
// `*holder` the thread holding the GVL (Qnil: none), into `*gc_thread` the holder when it is
// running a GC, else Qnil, and into `*gc_moment` what that GC is doing (see
// contprof_vm_gc_moment).
// Returns 1 when a holder was asked, 0 when no thread holds the GVL (nothing asked), or
// -1 when memory ran out.
int contprof_vm_request_job(atomic_uintptr_t *holder, atomic_uintptr_t *gc_thread, atomic_uint *gc_moment);
// Whether a thread holds the GVL now (from any thread; the answer may be outdated at once).
bool contprof_vm_gvl_held(void);
// The kernel thread id of the thread holding the GVL when it shares native threads (M:N
// threads), else 0. Under M:N, Ruby's job request from a thread that is not a Ruby thread
// may raise another thread's interrupt flag: the caller signals this one instead (see
// sampling/rounds.c, "M:N threads"). From any thread; the answer may be outdated at once.
pid_t contprof_vm_sharing_holder_tid(void);
// Whether contprof_vm_request_job may also be called from a Ruby thread without the GVL
// (then the worker thread itself runs the wall clock).
bool contprof_vm_request_job_from_ruby_threads(void);

// A sampling round runs on the calling thread, holding the GVL, between these two calls.
// Nothing in a round may let the thread give up the GVL (a thread switch: another thread
// could then run Ruby, or a round of its own, in the middle of this one). Builds with
// CONTPROF_ROUND_CHECKS defined (rake test:round_checks) abort with a message when the
// backend sees a thread suspended or resumed while a round runs (on Ruby 3.3+, whose
// thread event hooks see every switch), or a round begin inside another. Returns false,
// in any build, when a round is already running: the caller must then not run its own.
bool contprof_vm_round_begin(const char *what);
void contprof_vm_round_end(void);

// ---------------------------------------------------------------------------------------
// Stacks

// One frame as read from the VM, named lazily by the functions below. Its words belong to
// the backend (VM object addresses, a position, a line); backends zero the words they do
// not use, so that two reads of the same frame compare equal with memcmp.
typedef struct {
  uintptr_t word[3];
} contprof_raw_frame;

#define CONTPROF_VM_NOT_A_THREAD (-1)
#define CONTPROF_VM_THREAD_DEAD (-2)

// Reads `thread`'s frames, newest first, into `frames` (at most `capacity` of them), the
// same frames Thread#backtrace_locations reports. Returns how many frames the thread
// has in all (possibly more than `capacity`; 0 for a thread without any Ruby-level
// frame), or CONTPROF_VM_NOT_A_THREAD / CONTPROF_VM_THREAD_DEAD (a backend that cannot
// tell a finished thread from one not started yet returns 0 for both).
long contprof_vm_read_stack(VALUE thread, contprof_raw_frame *frames, long capacity);
#define CONTPROF_VM_NO_MEMORY (-3) // (from contprof_vm_read_stack: its scratch could not grow)

// The frames about to be named (contprof_vm_frame_name, _file) are valid now: just read,
// or read earlier and known still valid (a capture, an allocation's frames, no GC since).
// A backend that notices naming may have moved objects (a compaction in the middle) names
// the rest of them "" until the next call: every set of frames must be announced here.
void contprof_vm_frames_valid_now(void);
// Whether names given since then may be of moved objects: those frames are named
// "(frame moved by GC compaction)" and must not be remembered by key.
bool contprof_vm_frame_names_unreliable(void);

// The frame's line (for a C frame, its caller's line; 0 when unknown).
int64_t contprof_vm_frame_line(const contprof_raw_frame *frame);
// The frame's absolute file path (for a C frame, its caller's), or "" when unknown.
// Points into a Ruby string that stays valid until the VM runs Ruby code again.
pprof_str contprof_vm_frame_file(const contprof_raw_frame *frame);
// The frame's name as Ruby backtraces print it, with methods qualified by their owner:
// "Integer#times", "Foo.bar", "block in Foo#bar", "<main>". Written into `buffer`
// (truncated to fit) unless it can point at a Ruby string directly. May allocate (the
// public-API backend): call it only for frames not seen before.
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
  uint64_t major_gc_count; // the major GCs a round counted before the capture (see cpu_timers.c)
  bool all_old; // every VM object the frames point to was old
} contprof_stack_capture_info;

// The scratch memory contprof_vm_capture_current_stack needs for `capacity` frames (the
// caller allocates it beforehand: a signal handler cannot).
size_t contprof_vm_capture_scratch_size(long capacity);

// Reads the calling thread's frames into `frames` as contprof_vm_read_stack would, when it
// is a Ruby thread that does not hold the GVL (or holds it inside a C method, see
// contprof_vm_current_thread_in_c_method) and no GC is running. Returns the frame
// count (more than `capacity` when the stack was cut), or -1 when the stack cannot be
// read safely now.
long contprof_vm_capture_current_stack(contprof_raw_frame *frames, long capacity, void *scratch,
                                       contprof_stack_capture_info *info);

// ---------------------------------------------------------------------------------------
// Garbage collection, without GC events
//
// On Ruby 3.1 any GC event hook (even an empty one on GC_ENTER/GC_EXIT) sends every
// allocation down the allocator's slow path, which costs allocation-heavy code 11-14%
// (bench/allocation_overhead.rb). So the profiler subscribes to no GC event: it reads what
// the GC is doing at the instants it samples (a CPU timer's signal, the wall clock's
// tick), and the GC's own clock between rounds. The first three functions below read the
// GC's flags only: they never allocate, lock or write, so signal handlers and threads
// without the GVL may call them (the answers are racy, and harmless). The counters at
// the end go through rb_gc_stat, which Ruby 4.0 makes flush per-ractor counts: holding
// the GVL only.

// Whether a GC is running right now (on the thread holding the GVL).
bool contprof_vm_during_gc(void);

// Why GC event hooks must not be used on this Ruby (they slow every allocation), or NULL
// where a hook on a GC's own events (end of marking, end of a step) costs nothing
// outside GCs (Ruby 3.3+, whose allocator tests for NEWOBJ hooks only).
const char *contprof_vm_gc_hooks_unaffordable(void);

// What the GC is doing at one instant, packed in one word so that a signal handler or the
// wall clock can hand it to a sampling round atomically: 0 when no GC runs, else
// CONTPROF_GC_RUNNING with the phase, the cause and, for a major GC, its reason.
typedef uint32_t contprof_gc_moment;
#define CONTPROF_GC_RUNNING 1u
typedef enum { CONTPROF_GC_PHASE_UNKNOWN = 0, CONTPROF_GC_MARKING = 1, CONTPROF_GC_SWEEPING = 2 } contprof_gc_phase;
contprof_gc_moment contprof_vm_gc_moment(void);
static inline contprof_gc_phase contprof_gc_moment_phase(contprof_gc_moment moment) {
  return (contprof_gc_phase) ((moment >> 1) & 3);
}
// The GC's trigger and, for a major GC, its reason, as GC.latest_gc_info(:gc_by) and
// (:major_by) name them ("newobj", "malloc", "method"...; "nofree", "oldgen"...); "" when
// not known, and for the reason of a minor GC.
const char *contprof_vm_gc_cause(contprof_gc_moment moment);
const char *contprof_vm_gc_major_reason(contprof_gc_moment moment);

// The time the GC has spent so far, by its own clock (GC.stat(:time): milliseconds, which
// a running total can afford), in nanoseconds; 0 when GC.measure_total_time is off.
int64_t contprof_vm_gc_time_ns(void);
// How many major GCs have started so far.
uint64_t contprof_vm_major_gc_count(void);
// How many objects have been allocated so far (GC.stat(:total_allocated_objects)).
uint64_t contprof_vm_allocated_objects(void);
// The bytes an object holds: its slot and what it keeps outside it
// (ObjectSpace.memsize_of). Holding the GVL, the object alive.
size_t contprof_vm_object_size(VALUE object);

// Frame keys (see pprof_frame_key): a frame can be identified by the addresses of its VM
// objects as long as those objects can be neither freed nor moved. Old-generation
// objects stay put until the next major GC, so the key of a frame whose objects are old
// stays valid for the current *epoch* (the number of major GCs so far).
//
// The key itself is the raw frame, word for word (backends order their words so that
// this holds, and zero the words they do not use); whether it may be *remembered* is
// decided when it is first seen (contprof_vm_frame_key_rememberable). A key found among
// remembered ones needs no check: its old objects still occupy those addresses, so no
// other object can be there.
static inline pprof_frame_key contprof_vm_frame_key(const contprof_raw_frame *frame) {
  return (pprof_frame_key) {.a = frame->word[0], .b = frame->word[1], .c = frame->word[2]};
}
bool contprof_vm_frame_key_rememberable(const contprof_raw_frame *frame);
// The epoch keys are valid for, and whether keys may be used at all right now
// (not during a major GC).
bool contprof_vm_key_epoch(uint64_t *epoch);
