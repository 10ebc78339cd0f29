// The CPU timers' private state, shared by their files (the interface is cpu_timers.h):
// cpu_timers_signal.c, the SIGPROF handler's part; cpu_timers_arming.c, which creates and
// deletes timers; cpu_timers.c, what the collector reads. Builds without timer_create have
// none of it (cpu_timers_unavailable.c).
//
// ## Slots
//
// Each timer owns a slot of a process-wide static array. The signal value of its timer
// names the slot and the slot's lease; a slot given back gets a new lease, so a
// late signal of a deleted timer can neither count for nor capture into the slot's next
// owner. A slot's word holds lease << SLOT_COUNT_BITS | expirations, updated with a
// compare-and-swap that checks the lease.
//
// ## Captures
//
// A capture is written by the signal handler on the slot's thread and read by a sampling
// round on another thread (holding the GVL). The slot's capture_lock arbitrates: the
// handler takes it with 0 -> 1 and gives up when it is taken (that expiry then goes
// uncaptured); a round takes it with 0 -> 2, between `read` and `done`. Everything under
// the lock is plain memory ordered by the lock's atomics. The buffer holds two stacks:
// the capture, and a scratch area where the handler reads the stack to compare it with a
// capture already pending (equal: the expiry joins it; different: uncaptured).
#pragma once

#ifdef CONTPROF_HAVE_CPU_TIMERS

#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>
#include <time.h>

#include "sampling/cpu_timers.h"
#include "vm/vm.h"

#define CPU_TIMER_SLOTS 4096 // threads beyond that get their CPU from clock reads
#define SLOT_INDEX_BITS 12
#define SLOT_COUNT_BITS 44
#define SLOT_COUNT_MASK ((UINT64_C(1) << SLOT_COUNT_BITS) - 1)
#define SLOT_LEASE_MASK ((UINT64_C(1) << (31 - SLOT_INDEX_BITS)) - 1) // fits a positive int with the index

enum { CAPTURE_FREE = 0, CAPTURE_WRITING = 1, CAPTURE_READING = 2 };

// What the signal handler touches: never freed.
typedef struct {
  atomic_uint_fast64_t word; // lease << SLOT_COUNT_BITS | expirations
  atomic_uint_fast64_t in_gc; // expirations while the thread ran a GC
  atomic_uint gc_moment; // what that GC was doing at the latest of them (contprof_gc_moment)
  atomic_int capture_lock;
  atomic_int_fast64_t period_ns; // the timer's nominal period
  // A perf event's (see "Random periods" in cpu_timers_signal.c): its id, the counter's
  // value at the latest expiry the handler saw (0: none yet), and the handler's random draws.
  atomic_uint_fast64_t perf_id;
  atomic_uint_fast64_t perf_counted;
  atomic_uint_fast64_t perf_period; // the period set at the latest expiry (0: not yet)
  uint64_t jitter_state;
  atomic_bool capture_wanted; // an expiry in native code found no buffer
  // Under capture_lock:
  contprof_raw_frame *frames; // 2 * capacity: the capture, then scratch
  void *vm_scratch; // what the VM backend needs to capture (contprof_vm_capture_scratch_size)
  long capacity;
  uint64_t capture_lease; // the lease the capture belongs to
  uint64_t captured; // expirations the captured stack stands for (0: none)
  int64_t captured_cpu_ns; // and the CPU they counted
  bool captured_holding_gvl; // in a C method holding the GVL
  long captured_total;
  contprof_stack_capture_info capture_info;
} timer_slot;

// The rest of a timer's state: only used holding the GVL.
typedef struct {
  int perf_fd; // the perf event, or -1 for a POSIX timer
  uint64_t perf_id; // PERF_EVENT_IOC_ID: tells our event from another file at the same fd
  timer_t id;
  pid_t tid;
  clockid_t clock;
  uint64_t lease; // the slot's, when this timer was created
  int64_t armed_at_cpu_ns; // expiries at armed_at_cpu_ns + k * period_ns
  int64_t period_ns;
  uint64_t expirations_read; // by the collector so far
  uint64_t in_gc_read;
} cpu_timer;

// Shared between the files, and hidden like every symbol of the extension
// (-fvisibility=hidden) but said so at the declaration: the compiler then addresses it
// directly, as it would a static, not through the global offset table.
#define TIMERS_SHARED extern __attribute__((visibility("hidden")))

// Defined in cpu_timers_signal.c: all the memory the handler touches.
TIMERS_SHARED timer_slot contprof_timer_slots[CPU_TIMER_SLOTS];
#ifdef CONTPROF_HAVE_PERF_EVENTS
// Perf events' signals carry their descriptor, not a value (see "The two kinds of timer"
// in cpu_timers_arming.c).
#define PERF_FD_TABLE 65536 // descriptors beyond it get a POSIX timer
TIMERS_SHARED atomic_int contprof_timer_perf_fds[PERF_FD_TABLE]; // fd => lease << SLOT_INDEX_BITS | slot, or -1
#endif
// The major GCs counted by the latest round (the handler cannot ask the GC itself: see
// capture_valid in cpu_timers.c).
TIMERS_SHARED atomic_uint_fast64_t contprof_timer_major_gcs_seen;
#define TIMER_STAT_COUNTER(name) atomic_uint_fast64_t name;
typedef struct {
  CONTPROF_CPU_TIMERS_STATS(TIMER_STAT_COUNTER)
} cpu_timer_counters;
#undef TIMER_STAT_COUNTER
TIMERS_SHARED cpu_timer_counters contprof_timer_stats; // (contprof_cpu_timers_get_stats)

// Defined in cpu_timers_arming.c: the slots' timers, indexed as the slots.
TIMERS_SHARED cpu_timer contprof_timer_entries[CPU_TIMER_SLOTS];

#endif
