// What a thread was doing when sampled, as the "thread state" label says it: from what
// the VM backend knows (holds the GVL, waits for it, released it, sleeps in Ruby) and,
// for a thread that is not running Ruby, from the method it waits in (its leaf frame).
#pragma once

#include <stdbool.h>
#include <stdint.h>

#include "collectors/thread_context.h"
#include "pprof/pprof_profile.h"
#include "vm/vm.h"

// The label's values: one set of names in every export.
typedef enum {
  CONTPROF_STATE_RUNNING = 0, // "running": runs Ruby code, holding the GVL
  CONTPROF_STATE_NATIVE, // "native": in native code with the GVL released (zlib, a C extension)
  CONTPROF_STATE_GVL, // "waiting for gvl": ready to run Ruby code, another thread holds the GVL
  CONTPROF_STATE_SLEEPING, // "sleeping": Kernel#sleep, Thread.stop
  CONTPROF_STATE_WAITING, // "waiting": a Queue, Mutex, ConditionVariable, Monitor, Thread#join, a child process
  CONTPROF_STATE_IO, // "io": blocked reading, writing, accepting, connecting, resolving or in IO.select
  CONTPROF_STATE_COUNT
} contprof_state;

#define CONTPROF_STATE_LABEL "thread state"

pprof_str contprof_state_name(contprof_state state);

// Remembers the answer for leaf frames seen before (by frame key, for the key's epoch), so
// that naming a frame (which may allocate) happens once per waiting place.
#define CONTPROF_STATE_CACHE_SIZE 256
typedef struct {
  pprof_frame_key keys[CONTPROF_STATE_CACHE_SIZE];
  uint64_t epochs[CONTPROF_STATE_CACHE_SIZE];
  uint8_t states[CONTPROF_STATE_CACHE_SIZE];
  uint64_t names_read; // leaf frames named to classify them
} contprof_state_cache;

// The state of a thread the VM reports in `vm_state`, whose leaf frame is `leaf` (NULL:
// none, or not a frame of Ruby's). Holding the GVL.
contprof_state contprof_state_of(contprof_state_cache *cache, contprof_thread_state vm_state,
                                 const contprof_raw_frame *leaf);

// The state a frame name stands for when a thread waits there (CONTPROF_STATE_COUNT: not a
// known waiting place). Plain C, for tests too.
contprof_state contprof_state_of_waiting_place(const char *name, size_t len);

// What `thread` was doing at `round`'s tick. Where GVL waits are sampled (Ruby 3.1),
// a late round runs on whichever thread took the GVL since the tick, while the one that
// held it then may be waiting for it back: the tick's holder was running, and another
// thread runnable now was not (it waited for the GVL, most likely).
contprof_thread_state contprof_thread_state_at_tick(const contprof_round *round, VALUE thread);
