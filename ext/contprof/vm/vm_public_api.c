// The backend of vm/vm.h for Ruby 3.3 and later: public C APIs for threads and the
// sampling job, and for stacks the VM's control frames where their layout is known
// (vm/vm_frame_layout.c, known for Ruby 3.3 to 4.0, proven at load time on any Ruby that
// has the public APIs), else the public API:
//
// - stacks: vm/vm_frame_layout.c, or rb_profile_thread_frames for another thread and
//   rb_profile_frames for the calling one (in a signal handler), with the
//   rb_profile_frame_* functions to name frames;
// - threads and the GVL: the internal-thread event hooks (READY, RESUMED, SUSPENDED,
//   EXITED) with a per-thread slot (rb_internal_thread_specific_*). RESUMED runs on the
//   thread itself right after it took the GVL, which is where its pthread, kernel thread id
//   and "who holds the GVL" are learned; the hooks stay installed from load time, so
//   every thread is known from its first GVL switch on. They also time GVL waits (READY
//   to RESUMED) and stretches off the GVL (SUSPENDED to READY), with plain stores by the
//   thread itself: a clock read at READY and at SUSPENDED, nothing allocated;
// - thread names: kept when Thread#name= sets them (see "Thread names");
// - the sampling job: a preregistered postponed job, triggered from a signal handler on
//   the GVL holder or from the wall clock's plain pthread (rb_postponed_job_trigger raises
//   the interrupt flag of the thread running Ruby when the caller is not a Ruby thread).
//
// What the public API alone cannot do, and what it costs (the README's "Supported Rubies"):
// - without the frame layout, a block's frame is reported as its method's
//   (rb_profile_frames gives the method entry for both), so `block in Foo#bar` appears as
//   `Foo#bar`, at the block's line, and code eval'd in a method as the method;
// - a thread sleeping in Ruby and one in native code without the GVL look the same
//   (both SUSPENDED): both are reported as CONTPROF_THREAD_NATIVE;
// - a thread created before Contprof was loaded has no known pthread (hence no CPU clock
//   or CPU timer) until its next GVL switch;
// - M:N threads: see "M:N threads" below.
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
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "vm/vm.h"
#include "vm/vm_common.h"
#include "attributes.h"
#include "fault_injection.h"
#include "time_helpers.h"
#ifdef CONTPROF_VM_LAYOUT
#include "vm/vm_frame_layout.h"
#endif

#define TLS_INITIAL_EXEC __attribute__((tls_model("initial-exec")))

// What the hooks last saw a thread do.
enum { GVL_UNKNOWN = 0, GVL_HELD = 1, GVL_WANTED = 2, GVL_RELEASED = 3 };

// Each entry has a cache line of its own (see register_thread): two threads' hooks write
// their entries at every switch between them, and entries sharing a line would bounce it
// between their cores at each event.
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
  // M:N threads (see "M:N threads"): whether it shares native threads, the CPU its hooks
  // measured, and its native thread's CPU clock at its latest RESUMED (0: off the GVL).
  atomic_bool shares_native;
  _Atomic int64_t cpu_accounted_ns, cpu_resumed_at_ns;
} thread_entry;

// Every known live thread of the main ractor, in the order they became known. Hooks add
// and remove entries without the GVL, so the list has its own lock. The Thread objects are
// marked (pinned) by registry_keeper while listed.
static pthread_mutex_t registry_lock = PTHREAD_MUTEX_INITIALIZER;
static thread_entry **registry;
static long registry_count, registry_capacity;
static VALUE registry_keeper = Qnil;

static rb_internal_thread_specific_key_t entry_key;
static atomic_uintptr_t gvl_holder; // the Thread holding the GVL (a VALUE), or 0
static atomic_int sharing_holder_tid; // its kernel thread id if it shares native threads, else 0
static rb_postponed_job_handle_t job_handle = POSTPONED_JOB_HANDLE_INVALID;
static ID id_name, id_known_name;
static atomic_bool job_wanted_on_resume; // see contprof_vm_request_job
// A call the next thread to take the GVL makes (contprof_vm_call_on_next_resume): the
// function and its data are written before the flag is raised, holding the GVL, and read
// by the thread that takes the GVL next, after it.
static atomic_bool call_wanted_on_resume;
static void (*call_on_resume)(void *);
static void *call_on_resume_data;
static VALUE sym_compact_count;

// The calling thread's view of itself (read by signal handlers: initial-exec TLS needs no
// allocation on first use).
static __thread int current_gvl TLS_INITIAL_EXEC = GVL_UNKNOWN;
static __thread pid_t current_tid TLS_INITIAL_EXEC;
static __thread thread_entry *current_entry TLS_INITIAL_EXEC;
// The sharing thread that gave up the GVL on this native thread latest (compared, never
// read: it may be gone), and the native thread's CPU clock then (see "M:N threads").
static __thread const thread_entry *suspended_entry TLS_INITIAL_EXEC;
static __thread int64_t suspended_cpu_ns TLS_INITIAL_EXEC;
static bool mn_threads_requested;
static atomic_uint_fast64_t threads_sharing_native;

// Set (non-NULL) in the main ractor only: tells a hook whether its thread is one of ours.
static rb_ractor_local_key_t main_ractor_key;
static bool in_main_ractor(void) { return rb_ractor_local_storage_ptr(main_ractor_key) != NULL; }

static pid_t my_tid(void) {
  if (current_tid == 0) current_tid = (pid_t) syscall(SYS_gettid);
  return current_tid;
}

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
  rb_internal_thread_specific_set(thread, entry_key, entry);
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

static thread_entry *entry_of(VALUE thread) {
  return (thread_entry *) rb_internal_thread_specific_get(thread, entry_key);
}

static void learn_native_thread(thread_entry *entry) {
  atomic_store(&entry->pthread, (uintptr_t) pthread_self());
  atomic_store(&entry->tid, my_tid());
  atomic_store(&entry->has_native, true);
}

static int64_t own_cpu_ns(void) { return contprof_clock_ns(CLOCK_THREAD_CPUTIME_ID); }

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
    current_gvl = GVL_HELD;
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
    current_entry = entry;
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
    current_gvl = GVL_WANTED;
    if (entry) {
      int64_t now = contprof_clock_ns(CLOCK_MONOTONIC);
      atomic_store_explicit(&entry->ready_since_ns, now, memory_order_release);
      atomic_store_explicit(&entry->stretch_end_ns, now, memory_order_release);
      atomic_store_explicit(&entry->gvl, GVL_WANTED, memory_order_release);
    }
    return;
  case RUBY_INTERNAL_THREAD_EVENT_SUSPENDED: {
    contprof_vm_check_no_round("a thread gave up the GVL");
    current_gvl = GVL_RELEASED;
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
    current_gvl = GVL_UNKNOWN;
    current_entry = NULL;
    uintptr_t expected = (uintptr_t) thread;
    if (atomic_compare_exchange_strong(&gvl_holder, &expected, 0)) atomic_store(&sharing_holder_tid, 0);
    if (!entry) return;
    rb_internal_thread_specific_set(thread, entry_key, NULL);
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
  current_tid = 0;
  atomic_store(&call_wanted_on_resume, false); // (the parent's clock, not this process's)
  long kept = 0;
  for (long i = 0; i < registry_count; i++) {
    thread_entry *entry = registry[i];
    if (entry == current_entry) {
      learn_native_thread(entry);
      atomic_store(&gvl_holder, (uintptr_t) entry->thread);
      atomic_store(&sharing_holder_tid, 0); // (re-learnt at the child's next RESUMED)
      registry[kept++] = entry;
    } else {
      // That Thread is dead in this process (it gets no EXITED event): without an entry,
      // it is not alive.
      rb_internal_thread_specific_set(entry->thread, entry_key, NULL);
      free(entry);
    }
  }
  registry_count = kept;
  pthread_mutex_unlock(&registry_lock);
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

void contprof_vm_init(void) {
  contprof_vm_common_init();
  check_frame_layout();
  const char *mn_threads = getenv("RUBY_MN_THREADS"); // (read by Ruby at boot, likewise)
  mn_threads_requested = mn_threads && atoi(mn_threads) > 0;
  id_name = rb_intern("name");
  id_known_name = rb_intern("__contprof_thread_name"); // no @: hidden from Ruby
  sym_compact_count = ID2SYM(rb_intern("compact_count"));
  rb_gc_stat(sym_compact_count);
  entry_key = rb_internal_thread_specific_key_create();
  main_ractor_key = rb_ractor_local_storage_ptr_newkey(NULL);
  rb_ractor_local_storage_ptr_set(main_ractor_key, &main_ractor_key);

  registry_keeper = TypedData_Wrap_Struct(rb_cObject, &registry_keeper_type, NULL);
  rb_gc_register_mark_object(registry_keeper);

  // The threads that exist already; the calling one holds the GVL, so the others are off
  // it, in a stretch that began before any hook could see it: counted from now (what came
  // before is in no profile), and ended by their RESUMED should its READY come first.
  VALUE current = rb_thread_current();
  VALUE threads = rb_funcall(rb_cThread, rb_intern("list"), 0);
  int64_t now = contprof_clock_ns(CLOCK_MONOTONIC);
  for (long i = 0; i < RARRAY_LEN(threads); i++) {
    VALUE thread = RARRAY_AREF(threads, i);
    thread_entry *entry = entry_of(thread);
    if (!entry && (entry = register_thread(thread)) && thread != current) {
      atomic_store(&entry->stretch_start_ns, now);
      atomic_store(&entry->stretch_seq, 1);
    }
    remember_name(thread);
  }
  VALUE thread_names = rb_define_module_under(rb_define_module("Contprof"), "ThreadNames");
  rb_define_method(thread_names, "name=", set_name_and_remember, 1);
  rb_prepend_module(rb_cThread, thread_names);
  thread_entry *entry = entry_of(current);
  if (entry) {
    learn_native_thread(entry);
    atomic_store(&entry->gvl, GVL_HELD);
  }
  current_entry = entry;
  current_gvl = GVL_HELD;
  atomic_store(&gvl_holder, (uintptr_t) current);

  rb_internal_thread_add_event_hook(on_thread_event,
                                    RUBY_INTERNAL_THREAD_EVENT_READY | RUBY_INTERNAL_THREAD_EVENT_RESUMED |
                                        RUBY_INTERNAL_THREAD_EVENT_SUSPENDED | RUBY_INTERNAL_THREAD_EVENT_EXITED,
                                    NULL);
  pthread_atfork(before_fork, after_fork_in_parent, after_fork_in_child);
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

bool contprof_vm_mn_threads_requested(void) { return mn_threads_requested; }
uint64_t contprof_vm_threads_sharing_native(void) { return atomic_load(&threads_sharing_native); }

pid_t contprof_vm_thread_tid(VALUE thread) {
  if (thread == rb_thread_current()) return my_tid();
  thread_entry *entry = entry_of(thread);
  if (!entry || !atomic_load(&entry->has_native)) return 0;
  return (pid_t) atomic_load(&entry->tid);
}

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

bool contprof_vm_current_thread_holds_gvl(void) { return current_gvl == GVL_HELD || current_gvl == GVL_UNKNOWN; }

bool contprof_vm_current_thread_in_c_method(void) {
#ifdef CONTPROF_VM_LAYOUT
  // (The frame layout's reader only: it is what tells a C method's frame from the rest.)
  return layout_ok && current_gvl == GVL_HELD && current_entry && contprof_layout_in_c_method(current_entry->thread);
#else
  return false;
#endif
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
  bool off_gvl = current_gvl == GVL_RELEASED || current_gvl == GVL_WANTED;
#ifdef CONTPROF_VM_LAYOUT
  if (layout_ok) {
    if (!current_entry || !(off_gvl || contprof_vm_current_thread_in_c_method())) return -1;
    return contprof_layout_capture_stack(current_entry->thread, frames, capacity, info);
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

bool contprof_vm_request_job_from_ruby_threads(void) { return false; }
