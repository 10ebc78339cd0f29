// The thread event hooks of the Ruby 3.3+ backend of vm/vm.h (vm/vm_public_api.c is the
// rest of it), and the per-thread state they keep (vm/vm_public_api_internal.h). The
// internal-thread event hooks (READY, RESUMED, SUSPENDED, EXITED) keep an entry for each
// thread in a per-thread slot (rb_internal_thread_specific_*). RESUMED runs on the thread
// itself right after it took the GVL, which is where its pthread, kernel thread id and "who
// holds the GVL" are learned; the hooks stay installed from load time, so every thread is
// known from its first GVL switch on. They also time GVL waits (READY to RESUMED) and
// stretches off the GVL (SUSPENDED to READY), with plain stores by the thread itself: a
// clock read at READY and at SUSPENDED, nothing allocated. The hooks run at every GVL
// switch: what they call is in this file.
//
// Also here, because the hooks run it: the sampling job, a preregistered postponed job,
// triggered from a signal handler on the GVL holder, from the wall clock's plain pthread
// (rb_postponed_job_trigger raises the interrupt flag of the thread running Ruby when the
// caller is not a Ruby thread), or by the next thread to take the GVL.
//
// ## M:N threads
//
// With RUBY_MN_THREADS=1 (Ruby 3.3+) Ruby runs threads on fewer native threads, moving them
// between those; a native thread's CPU clock and CPU timer then count every Ruby thread it
// ran (four threads on one native thread were each charged all of its CPU). A Ruby thread
// is known to share when its first RESUMED finds another live thread's entry on the same
// native thread, or a RESUMED finds it on another native thread than before (a thread on a
// native thread of its own never moves), whatever the environment says (later Rubies run
// even the main thread this way). From then on its hooks measure its CPU time with the
// native thread's clock: from RESUMED to SUSPENDED (the thread runs Ruby), and from
// SUSPENDED to its next RESUMED when that comes on the same native thread with no other
// thread run there meanwhile (it ran native code without the GVL, or idled, which costs no
// CPU). CPU a native thread spends between two different threads is the scheduler's, in
// no thread's profile. Two clock reads per switch (system calls), only for such threads.
// The collector reads that sum instead of a clock (contprof_vm_thread_cpu_accounted_ns);
// such threads get no CPU timer. What cannot be right: the CPU a thread uses without the
// GVL shows when it takes the GVL back, not while it runs.
#include <pthread.h>
#include <ruby.h>
#include <ruby/debug.h>
#include <ruby/ractor.h>
#include <ruby/thread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "vm/vm.h"
#include "vm/vm_common.h"
#include "vm/vm_public_api_internal.h"
#include "attributes.h"
#include "fault_injection.h"
#include "time_helpers.h"

// Every known live thread of the main ractor, in the order they became known. Hooks add
// and remove entries without the GVL, so the list has its own lock. The Thread objects are
// marked (pinned) by registry_keeper while listed.
static pthread_mutex_t registry_lock = PTHREAD_MUTEX_INITIALIZER;
static thread_entry **registry;
static long registry_count, registry_capacity;
static VALUE registry_keeper = Qnil;

rb_internal_thread_specific_key_t contprof_vm_entry_key;
static atomic_uintptr_t gvl_holder; // the Thread holding the GVL (a VALUE), or 0
static atomic_int sharing_holder_tid; // its kernel thread id if it shares native threads, else 0
static rb_postponed_job_handle_t job_handle = POSTPONED_JOB_HANDLE_INVALID;
static atomic_bool job_wanted_on_resume; // see contprof_vm_request_job
// A call the next thread to take the GVL makes (contprof_vm_call_on_next_resume): the
// function and its data are written before the flag is raised, holding the GVL, and read
// by the thread that takes the GVL next, after it.
static atomic_bool call_wanted_on_resume;
static void (*call_on_resume)(void *);
static void *call_on_resume_data;

// The calling thread's view of itself (see vm/vm_public_api_internal.h).
__thread int contprof_vm_current_gvl TLS_INITIAL_EXEC = GVL_UNKNOWN;
__thread pid_t contprof_vm_current_tid TLS_INITIAL_EXEC;
__thread thread_entry *contprof_vm_current_entry TLS_INITIAL_EXEC;
// The sharing thread that gave up the GVL on this native thread latest (compared, never
// read: it may be gone), and the native thread's CPU clock then (see "M:N threads").
static __thread const thread_entry *suspended_entry TLS_INITIAL_EXEC;
static __thread int64_t suspended_cpu_ns TLS_INITIAL_EXEC;
static bool mn_threads_requested;
static atomic_uint_fast64_t threads_sharing_native;

// Set (non-NULL) in the main ractor only: tells a hook whether its thread is one of ours.
static rb_ractor_local_key_t main_ractor_key;
static bool in_main_ractor(void) { return rb_ractor_local_storage_ptr(main_ractor_key) != NULL; }

// ---------------------------------------------------------------------------------------
// The registry

static void registry_mark(CONTPROF_UNUSED void *unused) {
  pthread_mutex_lock(&registry_lock);
  for (long i = 0; i < registry_count; i++) rb_gc_mark(registry[i]->thread);
  pthread_mutex_unlock(&registry_lock);
}

static const rb_data_type_t registry_keeper_type = {
  .wrap_struct_name = "Contprof::VM::ThreadRegistry",
  .function = {.dmark = registry_mark},
};

// Threads that could not be registered for lack of memory (never sampled: see below).
static atomic_uint_fast64_t threads_unregistered;

// Adds `thread` (without the GVL: plain malloc). NULL without memory: the thread then
// stays unknown, which costs its samples (counted; tried again at its next GVL switch).
static thread_entry *register_thread(VALUE thread) {
  void *memory = NULL;
  if (contprof_allocation_fails(CONTPROF_ALLOC_THREAD_ENTRY) || posix_memalign(&memory, _Alignof(thread_entry), sizeof(thread_entry)) != 0) {
    atomic_fetch_add(&threads_unregistered, 1);
    return NULL;
  }
  thread_entry *entry = memset(memory, 0, sizeof(thread_entry));
  entry->thread = thread;
  pthread_mutex_lock(&registry_lock);
  if (registry_count == registry_capacity) {
    long capacity = registry_capacity ? registry_capacity * 2 : 64;
    thread_entry **grown = realloc(registry, (size_t) capacity * sizeof(*grown));
    if (!grown) {
      pthread_mutex_unlock(&registry_lock);
      free(entry);
      atomic_fetch_add(&threads_unregistered, 1);
      return NULL;
    }
    registry = grown;
    registry_capacity = capacity;
  }
  registry[registry_count++] = entry;
  pthread_mutex_unlock(&registry_lock);
  rb_internal_thread_specific_set(thread, contprof_vm_entry_key, entry);
  return entry;
}

uint64_t contprof_vm_threads_unknown_no_memory(void) { return atomic_load(&threads_unregistered); }

static void unregister(thread_entry *entry) {
  pthread_mutex_lock(&registry_lock);
  for (long i = registry_count - 1; i >= 0; i--) {
    if (registry[i] != entry) continue;
    memmove(&registry[i], &registry[i + 1], (size_t) (registry_count - i - 1) * sizeof(*registry));
    registry_count--;
    break;
  }
  pthread_mutex_unlock(&registry_lock);
  free(entry);
}

static void learn_native_thread(thread_entry *entry) {
  atomic_store(&entry->pthread, (uintptr_t) pthread_self());
  atomic_store(&entry->tid, my_tid());
  atomic_store(&entry->has_native, true);
}

static void mark_sharing(thread_entry *entry) {
  if (atomic_load(&entry->shares_native)) return;
  atomic_store(&entry->shares_native, true);
  atomic_fetch_add(&threads_sharing_native, 1);
}

// (In RESUMED, which just learnt the calling native thread; see "M:N threads".) `moved`:
// the thread ran on another native thread before.
static void note_sharing(thread_entry *entry, bool moved) {
  if (atomic_load_explicit(&entry->shares_native, memory_order_relaxed)) return;
  if (moved) {
    mark_sharing(entry);
    return;
  }
  uintptr_t self = (uintptr_t) pthread_self();
  pthread_mutex_lock(&registry_lock);
  for (long i = 0; i < registry_count; i++) {
    thread_entry *other = registry[i];
    if (other != entry && atomic_load(&other->has_native) && atomic_load(&other->pthread) == self) {
      mark_sharing(other);
      mark_sharing(entry);
    }
  }
  pthread_mutex_unlock(&registry_lock);
}

// (In RESUMED and SUSPENDED of a sharing thread; see "M:N threads".)
static void account_resumed(thread_entry *entry) {
  int64_t now = own_cpu_ns();
  if (suspended_entry == entry && suspended_cpu_ns > 0 && now > suspended_cpu_ns) {
    int64_t total = atomic_load_explicit(&entry->cpu_accounted_ns, memory_order_relaxed);
    atomic_store_explicit(&entry->cpu_accounted_ns, total + now - suspended_cpu_ns, memory_order_release);
  }
  suspended_entry = NULL;
  atomic_store_explicit(&entry->cpu_resumed_at_ns, now, memory_order_release);
}

static void account_suspended(thread_entry *entry) {
  // (Ruby's header does not promise that a thread's events run on its native thread: one
  // that does not would read another clock. That stretch is left out.)
  if (atomic_load_explicit(&entry->pthread, memory_order_relaxed) != (uintptr_t) pthread_self()) {
    atomic_store_explicit(&entry->cpu_resumed_at_ns, 0, memory_order_release);
    return;
  }
  int64_t now = own_cpu_ns();
  int64_t resumed_at = atomic_load_explicit(&entry->cpu_resumed_at_ns, memory_order_relaxed);
  if (resumed_at > 0 && now > resumed_at) {
    int64_t total = atomic_load_explicit(&entry->cpu_accounted_ns, memory_order_relaxed);
    atomic_store_explicit(&entry->cpu_accounted_ns, total + now - resumed_at, memory_order_release);
  }
  atomic_store_explicit(&entry->cpu_resumed_at_ns, 0, memory_order_release);
  suspended_entry = entry;
  suspended_cpu_ns = now;
}

// ---------------------------------------------------------------------------------------
// The hooks: run without the GVL, on the thread the event concerns.

static void on_thread_event(rb_event_flag_t event, const rb_internal_thread_event_data_t *data,
                            CONTPROF_UNUSED void *unused) {
  VALUE thread = data->thread;
  thread_entry *entry = entry_of(thread);
  switch (event) {
  case RUBY_INTERNAL_THREAD_EVENT_RESUMED:
    contprof_vm_check_no_round("a thread took the GVL");
    contprof_vm_current_gvl = GVL_HELD;
    // Threads of other ractors run under their own ractor's lock: never ours to sample.
    if (!entry && !in_main_ractor()) return;
    atomic_store_explicit(&gvl_holder, (uintptr_t) thread, memory_order_release);
    if (atomic_load_explicit(&job_wanted_on_resume, memory_order_relaxed) && atomic_exchange(&job_wanted_on_resume, false)) {
      rb_postponed_job_trigger(job_handle);
    }
    if (atomic_load_explicit(&call_wanted_on_resume, memory_order_relaxed) && atomic_exchange(&call_wanted_on_resume, false)) {
      call_on_resume(call_on_resume_data);
    }
    if (!entry) entry = register_thread(thread);
    if (!entry) return;
    contprof_vm_current_entry = entry;
    bool known = atomic_load(&entry->has_native);
    if (!known || atomic_load(&entry->pthread) != (uintptr_t) pthread_self()) {
      learn_native_thread(entry);
      note_sharing(entry, known);
    }
    if (atomic_load_explicit(&entry->shares_native, memory_order_relaxed)) {
      account_resumed(entry);
      atomic_store_explicit(&sharing_holder_tid, my_tid(), memory_order_release);
    } else {
      suspended_entry = NULL;
      if (atomic_load_explicit(&sharing_holder_tid, memory_order_relaxed)) atomic_store(&sharing_holder_tid, 0);
    }
    // (Release stores, not sequentially consistent ones: each of those is a locked
    // instruction, at every GVL switch; readers need only see each value whole, and a
    // count after the clearing that precedes it.)
    atomic_store_explicit(&entry->gvl, GVL_HELD, memory_order_release);
    // The wait ends: cleared first, then counted, so that a reader between the two misses
    // it for a moment rather than counting it twice. (Only this thread writes the count.)
    int64_t ready_since = atomic_load_explicit(&entry->ready_since_ns, memory_order_relaxed);
    // (A stretch whose READY no hook saw: one begun before the hooks were added.)
    if (atomic_load_explicit(&entry->stretch_end_ns, memory_order_relaxed) == 0 &&
        atomic_load_explicit(&entry->stretch_seq, memory_order_relaxed) > 0) {
      atomic_store_explicit(&entry->stretch_end_ns, contprof_clock_ns(CLOCK_MONOTONIC), memory_order_release);
    }
    if (atomic_load_explicit(&entry->marked_seq, memory_order_relaxed) ==
        atomic_load_explicit(&entry->stretch_seq, memory_order_relaxed)) {
      atomic_store_explicit(&entry->marked_end_ns, atomic_load_explicit(&entry->stretch_end_ns, memory_order_relaxed),
                            memory_order_relaxed);
    }
    if (ready_since > 0) {
      atomic_store_explicit(&entry->ready_since_ns, 0, memory_order_release);
      int64_t waited = atomic_load_explicit(&entry->gvl_waited_ns, memory_order_relaxed);
      atomic_store_explicit(&entry->gvl_waited_ns, waited + contprof_clock_ns(CLOCK_MONOTONIC) - ready_since,
                            memory_order_release);
    }
    return;
  case RUBY_INTERNAL_THREAD_EVENT_READY:
    contprof_vm_current_gvl = GVL_WANTED;
    if (entry) {
      int64_t now = contprof_clock_ns(CLOCK_MONOTONIC);
      atomic_store_explicit(&entry->ready_since_ns, now, memory_order_release);
      atomic_store_explicit(&entry->stretch_end_ns, now, memory_order_release);
      atomic_store_explicit(&entry->gvl, GVL_WANTED, memory_order_release);
    }
    return;
  case RUBY_INTERNAL_THREAD_EVENT_SUSPENDED: {
    contprof_vm_check_no_round("a thread gave up the GVL");
    contprof_vm_current_gvl = GVL_RELEASED;
    uintptr_t expected = (uintptr_t) thread;
    if (atomic_load_explicit(&gvl_holder, memory_order_relaxed) == expected &&
        atomic_compare_exchange_strong(&gvl_holder, &expected, 0)) {
      atomic_store_explicit(&sharing_holder_tid, 0, memory_order_release);
    }
    if (entry) {
      if (atomic_load_explicit(&entry->shares_native, memory_order_relaxed)) account_suspended(entry);
      // A new stretch: its start and end before its number, which rounds read first.
      atomic_store_explicit(&entry->stretch_start_ns, contprof_clock_ns(CLOCK_MONOTONIC), memory_order_relaxed);
      atomic_store_explicit(&entry->stretch_end_ns, 0, memory_order_relaxed);
      atomic_store_explicit(&entry->stretch_seq, atomic_load_explicit(&entry->stretch_seq, memory_order_relaxed) + 1,
                            memory_order_release);
      atomic_store_explicit(&entry->gvl, GVL_RELEASED, memory_order_release);
    }
    return;
  }
  case RUBY_INTERNAL_THREAD_EVENT_EXITED: {
    contprof_vm_current_gvl = GVL_UNKNOWN;
    contprof_vm_current_entry = NULL;
    uintptr_t expected = (uintptr_t) thread;
    if (atomic_compare_exchange_strong(&gvl_holder, &expected, 0)) atomic_store(&sharing_holder_tid, 0);
    if (!entry) return;
    rb_internal_thread_specific_set(thread, contprof_vm_entry_key, NULL);
    // The exiting thread still holds the GVL here (Ruby releases it after this event), so
    // no sampling round can be looking at the entry: it goes at once, and the Thread is no
    // longer kept alive by the registry.
    unregister(entry);
    return;
  }
  default:
    return;
  }
}

// In a forked child only the forking thread survives (it holds the GVL); the others get
// no EXITED event.
static void before_fork(void) { pthread_mutex_lock(&registry_lock); }
static void after_fork_in_parent(void) { pthread_mutex_unlock(&registry_lock); }
static void after_fork_in_child(void) {
  contprof_vm_current_tid = 0;
  atomic_store(&call_wanted_on_resume, false); // (the parent's clock, not this process's)
  long kept = 0;
  for (long i = 0; i < registry_count; i++) {
    thread_entry *entry = registry[i];
    if (entry == contprof_vm_current_entry) {
      learn_native_thread(entry);
      atomic_store(&gvl_holder, (uintptr_t) entry->thread);
      atomic_store(&sharing_holder_tid, 0); // (re-learnt at the child's next RESUMED)
      registry[kept++] = entry;
    } else {
      // That Thread is dead in this process (it gets no EXITED event): without an entry,
      // it is not alive.
      rb_internal_thread_specific_set(entry->thread, contprof_vm_entry_key, NULL);
      free(entry);
    }
  }
  registry_count = kept;
  pthread_mutex_unlock(&registry_lock);
}

// ---------------------------------------------------------------------------------------
// Load time

void contprof_vm_thread_events_prepare(void) {
  const char *mn_threads = getenv("RUBY_MN_THREADS"); // (read by Ruby at boot, likewise)
  mn_threads_requested = mn_threads && atoi(mn_threads) > 0;
  contprof_vm_entry_key = rb_internal_thread_specific_key_create();
  main_ractor_key = rb_ractor_local_storage_ptr_newkey(NULL);
  rb_ractor_local_storage_ptr_set(main_ractor_key, &main_ractor_key);

  registry_keeper = TypedData_Wrap_Struct(rb_cObject, &registry_keeper_type, NULL);
  rb_gc_register_mark_object(registry_keeper);
}

// A thread that exists already; the calling one holds the GVL, so the others are off it,
// in a stretch that began before any hook could see it: counted from `now_ns` (what came
// before is in no profile), and ended by their RESUMED should its READY come first.
void contprof_vm_thread_events_know(VALUE thread, VALUE current, int64_t now_ns) {
  thread_entry *entry = entry_of(thread);
  if (!entry && (entry = register_thread(thread)) && thread != current) {
    atomic_store(&entry->stretch_start_ns, now_ns);
    atomic_store(&entry->stretch_seq, 1);
  }
}

void contprof_vm_thread_events_start(VALUE current) {
  thread_entry *entry = entry_of(current);
  if (entry) {
    learn_native_thread(entry);
    atomic_store(&entry->gvl, GVL_HELD);
  }
  contprof_vm_current_entry = entry;
  contprof_vm_current_gvl = GVL_HELD;
  atomic_store(&gvl_holder, (uintptr_t) current);

  rb_internal_thread_add_event_hook(on_thread_event,
                                    RUBY_INTERNAL_THREAD_EVENT_READY | RUBY_INTERNAL_THREAD_EVENT_RESUMED |
                                        RUBY_INTERNAL_THREAD_EVENT_SUSPENDED | RUBY_INTERNAL_THREAD_EVENT_EXITED,
                                    NULL);
  pthread_atfork(before_fork, after_fork_in_parent, after_fork_in_child);
}

// ---------------------------------------------------------------------------------------
// Threads, all of them (vm/vm_public_api.c answers about one)

bool contprof_vm_mn_threads_requested(void) { return mn_threads_requested; }
uint64_t contprof_vm_threads_sharing_native(void) { return atomic_load(&threads_sharing_native); }

// The threads being visited (holding the GVL).
static VALUE *visit_list;
static long visit_capacity;

void contprof_vm_each_thread(contprof_vm_thread_visitor visit, void *context) {
  pthread_mutex_lock(&registry_lock);
  if (visit_capacity < registry_count) {
    VALUE *grown = realloc(visit_list, (size_t) registry_count * sizeof(VALUE));
    if (grown) {
      visit_list = grown;
      visit_capacity = registry_count;
    }
  }
  long count = registry_count < visit_capacity ? registry_count : visit_capacity;
  for (long i = 0; i < count; i++) visit_list[i] = registry[i]->thread;
  pthread_mutex_unlock(&registry_lock);
  // (Visited without the lock: visitors read stacks, which may allocate names. No thread
  // can exit meanwhile: that needs the GVL.)
  for (long i = 0; i < count; i++) visit(visit_list[i], context);
}

bool contprof_vm_current_thread_holds_gvl(void) {
  return contprof_vm_current_gvl == GVL_HELD || contprof_vm_current_gvl == GVL_UNKNOWN;
}

// ---------------------------------------------------------------------------------------
// The sampling job

bool contprof_vm_job_register(void (*job)(void *)) {
  job_handle = rb_postponed_job_preregister(0, job, NULL);
  return job_handle != POSTPONED_JOB_HANDLE_INVALID;
}

int contprof_vm_job_trigger_here(void) {
  if (job_handle == POSTPONED_JOB_HANDLE_INVALID) return 0;
  rb_postponed_job_trigger(job_handle);
  return 1;
}

bool contprof_vm_gvl_held(void) { return atomic_load(&gvl_holder) != 0; }

pid_t contprof_vm_sharing_holder_tid(void) { return atomic_load_explicit(&sharing_holder_tid, memory_order_acquire); }

int contprof_vm_request_job(atomic_uintptr_t *holder_out, atomic_uintptr_t *gc_thread, atomic_uint *gc_moment) {
  VALUE holder = (VALUE) atomic_load(&gvl_holder);
  atomic_store(holder_out, (uintptr_t) (holder ? holder : Qnil));
  // A GC runs on the thread holding the GVL.
  contprof_gc_moment moment = holder ? contprof_vm_gc_moment() : 0;
  atomic_store(gc_moment, moment);
  atomic_store(gc_thread, (uintptr_t) (moment ? holder : Qnil));
  if (job_handle == POSTPONED_JOB_HANDLE_INVALID) return 0;
  if (holder) {
    rb_postponed_job_trigger(job_handle);
    return 1;
  }
  // Nobody holds the GVL: the caller has the worker thread take it, and meanwhile the
  // first thread to take it (RESUMED) runs the job. That thread often comes first (the
  // worker's wakeup can be late by milliseconds here) and runs the job at once, still
  // inside the method it is coming back from, with every other thread where it was at the
  // tick: what the round should see.
  atomic_store(&job_wanted_on_resume, true);
  return 0;
}

bool contprof_vm_call_on_next_resume(void (*call)(void *), void *data) {
  call_on_resume = call;
  call_on_resume_data = data;
  atomic_store(&call_wanted_on_resume, true);
  return true;
}

void contprof_vm_cancel_call_on_next_resume(void) { atomic_store(&call_wanted_on_resume, false); }

bool contprof_vm_request_job_from_ruby_threads(void) { return false; }
