// Per-thread CPU-time timers (see cpu_timers.h).
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
#include "sampling/cpu_timers.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#ifdef CONTPROF_HAVE_PERF_EVENTS
#include <linux/perf_event.h>
#include <sys/ioctl.h>
#include <sys/syscall.h>
#endif

#include "ruby_helpers.h"
#include "jitter.h"
#include "sampling/statistics.h"
#include "vm/vm.h"

#ifdef CONTPROF_HAVE_CPU_TIMERS

#ifndef sigev_notify_thread_id
#define sigev_notify_thread_id _sigev_un._tid // glibc before 2.31 names it only this way
#endif

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
  // A perf event's (see "Random periods"): its id, the counter's value at the latest
  // expiry the handler saw (0: none yet), and the handler's random draws.
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

static timer_slot slots[CPU_TIMER_SLOTS];
static cpu_timer timer_entries[CPU_TIMER_SLOTS];
static int free_slots[CPU_TIMER_SLOTS]; // a stack of free slot indexes
static int free_slot_count = -1; // -1: not set up yet

// Perf events' signals carry their descriptor, not a value (see "The two kinds of timer").
#ifdef CONTPROF_HAVE_PERF_EVENTS
#define PERF_FD_TABLE 65536 // descriptors beyond it get a POSIX timer
static atomic_int perf_fd_values[PERF_FD_TABLE]; // fd => lease << SLOT_INDEX_BITS | slot, or -1
static atomic_int perf_usable = 1; // cleared for good when the kernel refuses perf events
#endif
static atomic_int timer_kind_wanted = CONTPROF_CPU_TIMER_AUTO;
// The major GCs counted by the latest round (the handler cannot ask the GC itself: see
// capture_valid).
static atomic_uint_fast64_t major_gcs_seen;

static struct {
  atomic_uint_fast64_t captures, captures_missed, captures_stale, expirations_in_gc;
  atomic_uint_fast64_t signals_timed, signal_lag_ns_total, signal_lag_ns_max, signals_late;
} stats;

bool contprof_cpu_timers_built(void) { return true; }

// A new lease for `slot`, with no expirations counted and no capture.
static uint64_t renew_slot(int index) {
  timer_slot *slot = &slots[index];
  uint64_t lease = ((atomic_load(&slot->word) >> SLOT_COUNT_BITS) + 1) & SLOT_LEASE_MASK;
  atomic_store(&slot->word, lease << SLOT_COUNT_BITS);
  atomic_store(&slot->in_gc, 0);
  atomic_store(&slot->gc_moment, 0);
  atomic_store(&slot->capture_wanted, false);
  atomic_store(&slot->perf_id, 0);
  atomic_store(&slot->perf_counted, 0);
  atomic_store(&slot->perf_period, 0);
  return lease;
}

// (Once, before the first timer.)
static void reset_slots(void) {
  for (int i = 0; i < CPU_TIMER_SLOTS; i++) {
    renew_slot(i);
    atomic_store(&slots[i].capture_lock, CAPTURE_FREE);
    slots[i].captured = 0;
    free_slots[i] = CPU_TIMER_SLOTS - 1 - i;
  }
  free_slot_count = CPU_TIMER_SLOTS;
}

static int take_slot(void) {
  if (free_slot_count < 0) {
#ifdef CONTPROF_HAVE_PERF_EVENTS
    for (int i = 0; i < PERF_FD_TABLE; i++) atomic_store(&perf_fd_values[i], -1);
#endif
    reset_slots();
  }
  return free_slot_count > 0 ? free_slots[--free_slot_count] : -1;
}

static void give_back_slot(int index) {
  renew_slot(index);
  free_slots[free_slot_count++] = index;
}

// ---------------------------------------------------------------------------------------
// The two kinds of timer
//
// A POSIX CPU-time timer (timer_create on the thread's CPU clock) is checked by the kernel
// at its scheduler tick (250 Hz here): an expiry is noticed at the first tick after it
// while the thread runs. CPU the thread used after its last tick before blocking is then
// signalled at its first tick after it wakes, in whatever code runs then: with phases
// shorter than a tick, that moves CPU from the code that runs before waits to the code
// that runs after them (measured with a C program alternating 1.5 ms and 0.5 ms of CPU
// with 2 ms sleeps: 60% vs 75% of the samples where the truth is 75%).
//
// A perf event counting the thread's task-clock with a sampling period fires from a
// high-resolution timer that runs only while the thread is on a CPU, and keeps what is
// left of the period when it is switched out: it signals exactly each time the thread
// has used one period (the same program: 74.1% vs 74.9%). It needs perf_event_open
// (kernel.perf_event_paranoid <= 2, no seccomp filter refusing it) and a file descriptor
// per thread, so it is used where it works and POSIX timers elsewhere. Its signal comes
// through fcntl(F_SETSIG) with the event's descriptor in si_fd; a static table maps the
// descriptor to the slot and lease, as a POSIX timer's signal value does.

//
// ## Random periods
//
// A perf event's period is drawn anew at each expiry (jitter.h: a fixed period
// samples a steady loop at the same few points). The handler sets the next one
// (PERF_EVENT_IOC_PERIOD, which restarts the count from there) and reads the counter, so
// the CPU at each expiry is known without assuming a period. POSIX timers keep their
// fixed period: the scheduler tick that checks them (see above) already spreads their
// expiries over the loop, only less evenly.

// The slot value (lease << SLOT_INDEX_BITS | slot) a signal carries, or -1.
static int signal_value(const siginfo_t *info) {
  if (info->si_code == SI_TIMER) return info->si_value.sival_int;
#ifdef CONTPROF_HAVE_PERF_EVENTS
  // fcntl(F_SETSIG) signals carry a POLL_* code and the descriptor.
  if (info->si_code >= POLL_IN && info->si_code <= POLL_HUP && info->si_fd >= 0 && info->si_fd < PERF_FD_TABLE) {
    return atomic_load(&perf_fd_values[info->si_fd]);
  }
#endif
  return -1;
}

// ---------------------------------------------------------------------------------------
// The signal handler's part: async-signal-safe (lock-free atomics, no allocation)

static void try_capture(timer_slot *slot, uint64_t lease, uint64_t expirations, int64_t cpu_ns, bool holding_gvl) {
  int expected = CAPTURE_FREE;
  if (!atomic_compare_exchange_strong(&slot->capture_lock, &expected, CAPTURE_WRITING)) {
    atomic_fetch_add(&stats.captures_missed, 1);
    return;
  }
  // The slot may have been given back since the expiry was counted.
  bool ours = (atomic_load(&slot->word) >> SLOT_COUNT_BITS) == lease;
  bool stored = false;
  if (ours && !slot->frames) {
    atomic_store(&slot->capture_wanted, true);
  } else if (ours) {
    if (slot->capture_lease != lease) slot->captured = 0;
    bool pending = slot->captured > 0;
    contprof_raw_frame *target = pending ? slot->frames + slot->capacity : slot->frames;
    contprof_stack_capture_info info;
    long total = contprof_vm_capture_current_stack(target, slot->capacity, slot->vm_scratch, &info);
    if (total >= 0) {
      info.major_gc_count = atomic_load(&major_gcs_seen);
      long kept = total < slot->capacity ? total : slot->capacity;
      if (!pending) {
        slot->captured = expirations;
        slot->captured_cpu_ns = cpu_ns;
        slot->captured_holding_gvl = holding_gvl;
        slot->captured_total = total;
        slot->capture_info = info;
        slot->capture_lease = lease;
        stored = true;
      } else if (total == slot->captured_total && info.gc_count == slot->capture_info.gc_count &&
                 holding_gvl == slot->captured_holding_gvl &&
                 memcmp(target, slot->frames, (size_t) kept * sizeof(contprof_raw_frame)) == 0) {
        slot->captured += expirations; // the same stack again
        slot->captured_cpu_ns += cpu_ns;
        stored = true;
      }
    }
  }
  atomic_store(&slot->capture_lock, CAPTURE_FREE);
  atomic_fetch_add(stored ? &stats.captures : &stats.captures_missed, 1);
}

#ifdef CONTPROF_HAVE_PERF_EVENTS
// At a perf event's expiry, on its thread: notes the counter and draws the next period.
// Returns the CPU counted since the previous expiry (0 when unknown).
static int64_t perf_event_expired(timer_slot *slot, int fd) {
  uint64_t id = 0, counted = 0;
  // The application may have closed the descriptor and reused its number: only our event
  // is read (a read could take another file's data).
  if (ioctl(fd, PERF_EVENT_IOC_ID, &id) != 0 || id != atomic_load(&slot->perf_id)) return 0;
  int64_t elapsed = 0;
  if (read(fd, &counted, sizeof(counted)) == (ssize_t) sizeof(counted) && counted > 0) {
    uint64_t previous = atomic_exchange(&slot->perf_counted, counted);
    if (counted > previous) elapsed = (int64_t) (counted - previous);
    // The CPU the thread used between the expiry and this handler: how late the signal came.
    uint64_t period_before = atomic_load(&slot->perf_period);
    if (period_before && previous && elapsed > 0) {
      uint64_t lag = (uint64_t) elapsed > period_before ? (uint64_t) elapsed - period_before : 0;
      atomic_fetch_add(&stats.signals_timed, 1);
      atomic_fetch_add(&stats.signal_lag_ns_total, lag);
      contprof_update_max(&stats.signal_lag_ns_max, lag);
      if (lag > 1000 * 1000) atomic_fetch_add(&stats.signals_late, 1);
    }
  }
  uint64_t period = (uint64_t) contprof_jittered_interval(&slot->jitter_state, atomic_load(&slot->period_ns));
  ioctl(fd, PERF_EVENT_IOC_PERIOD, &period);
  atomic_store(&slot->perf_period, period);
  return elapsed;
}
#endif

contprof_timer_signal contprof_cpu_timers_on_signal(const siginfo_t *info) {
  int value = signal_value(info);
  if (value < 0) return CONTPROF_TIMER_NOT_OURS;
  timer_slot *slot = &slots[value & (CPU_TIMER_SLOTS - 1)];
  uint64_t lease = (uint64_t) value >> SLOT_INDEX_BITS;
  // (si_overrun is a POSIX timer's; a perf event's signal has a POLL_ code, whose si_band
  // lies there: its merged overflows are found from its counter instead.)
  uint64_t overruns = info->si_code == SI_TIMER && info->si_overrun > 0 ? (uint64_t) info->si_overrun : 0;
  uint64_t expirations = 1 + overruns;
  uint_fast64_t word = atomic_load(&slot->word);
  for (;;) {
    if ((word >> SLOT_COUNT_BITS) != lease) return CONTPROF_TIMER_NOT_OURS;
    if (atomic_compare_exchange_weak(&slot->word, &word, word + expirations)) break;
  }
  int64_t cpu_ns = (int64_t) expirations * atomic_load(&slot->period_ns);
#ifdef CONTPROF_HAVE_PERF_EVENTS
  if (info->si_code != SI_TIMER) {
    int64_t counted = perf_event_expired(slot, info->si_fd);
    if (counted > 0) cpu_ns = counted;
  }
#endif
  if (contprof_vm_current_thread_holds_gvl()) {
    contprof_gc_moment moment = contprof_vm_gc_moment(); // a GC runs on the GVL holder
    if (moment) {
      atomic_store(&slot->gc_moment, moment);
      atomic_fetch_add(&slot->in_gc, expirations);
      atomic_fetch_add(&stats.expirations_in_gc, expirations);
    } else if (contprof_vm_current_thread_in_c_method()) {
      // Its next safe point may come only once the method returned, or in a block it
      // calls: the CPU goes to the stack it has now.
      try_capture(slot, lease, expirations, cpu_ns, true);
    }
    return CONTPROF_TIMER_ON_GVL_HOLDER;
  }
  // Not holding the GVL (native code, a wait, going to sleep or coming back): its stack
  // stays put until it takes the GVL back, so it can be captured. Uncaptured, the CPU
  // goes to the thread's stack at its next record.
  try_capture(slot, lease, expirations, cpu_ns, false);
  return CONTPROF_TIMER_ELSEWHERE;
}

// ---------------------------------------------------------------------------------------
// Creating and deleting timers (holding the GVL)

#ifdef CONTPROF_HAVE_PERF_EVENTS
// Closes our perf event at `fd`, unless the descriptor no longer is it (the application
// closed it and reused the number: then it is not ours to close). `disable`: stop the
// event first, so that no signal comes between here and the close. Only the process that
// opened the event may: a forked child's descriptor shares the parent's open event, and
// disabling it there switches off the parent's timer.
static void close_perf_event(cpu_timer *timer, bool disable) {
  int fd = timer->perf_fd;
  timer->perf_fd = -1;
  if (fd < 0) return;
  if (fd < PERF_FD_TABLE) atomic_store(&perf_fd_values[fd], -1);
  uint64_t id = 0;
  if (ioctl(fd, PERF_EVENT_IOC_ID, &id) != 0 || id != timer->perf_id) return;
  if (disable) ioctl(fd, PERF_EVENT_IOC_DISABLE, 0);
  close(fd);
}

// A task-clock perf event on the slot's thread that signals it every `period_ns` of CPU.
static bool start_perf_event(int index, int64_t period_ns) {
  if (!atomic_load(&perf_usable) || atomic_load(&timer_kind_wanted) == CONTPROF_CPU_TIMER_POSIX) return false;
  cpu_timer *timer = &timer_entries[index];
  struct perf_event_attr attributes;
  memset(&attributes, 0, sizeof(attributes));
  attributes.size = sizeof(attributes);
  attributes.type = PERF_TYPE_SOFTWARE;
  attributes.config = PERF_COUNT_SW_TASK_CLOCK;
  attributes.sample_period = (uint64_t) period_ns;
  attributes.wakeup_events = 1; // a signal at every overflow
  attributes.disabled = 1;
  int fd = (int) syscall(SYS_perf_event_open, &attributes, timer->tid, -1, -1, PERF_FLAG_FD_CLOEXEC);
  if (fd < 0) {
    // Not allowed here (perf_event_paranoid, seccomp, no kernel support): never again in
    // this process. Running out of descriptors is only this thread's problem.
    if (errno != EMFILE && errno != ENFILE && errno != ENOMEM) atomic_store(&perf_usable, 0);
    return false;
  }
  struct f_owner_ex owner = {.type = F_OWNER_TID, .pid = timer->tid};
  bool ready = fd < PERF_FD_TABLE && ioctl(fd, PERF_EVENT_IOC_ID, &timer->perf_id) == 0 &&
               fcntl(fd, F_SETSIG, SIGPROF) == 0 && fcntl(fd, F_SETOWN_EX, &owner) == 0;
  if (ready) {
    timer->perf_fd = fd;
    timer_slot *slot = &slots[index];
    atomic_store(&slot->perf_id, timer->perf_id);
    slot->jitter_state = contprof_jitter_seed((uint64_t) contprof_clock_ns(CLOCK_MONOTONIC), (uint64_t) timer->tid);
    atomic_store(&perf_fd_values[fd], (int) (timer->lease << SLOT_INDEX_BITS | (uint64_t) index));
    ready = fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_ASYNC) == 0 && ioctl(fd, PERF_EVENT_IOC_ENABLE, 0) == 0;
    if (!ready) close_perf_event(timer, true);
  } else {
    close(fd);
  }
  if (ready) {
    // Expiries then come every period from here: the clock now is their origin.
    struct timespec now;
    clock_gettime(timer->clock, &now);
    timer->armed_at_cpu_ns = contprof_timespec_ns(now);
    timer->period_ns = period_ns;
  }
  return ready;
}
const char *contprof_cpu_timers_perf_events_refused(char *why, size_t size) {
  struct perf_event_attr attributes;
  memset(&attributes, 0, sizeof(attributes));
  attributes.size = sizeof(attributes);
  attributes.type = PERF_TYPE_SOFTWARE;
  attributes.config = PERF_COUNT_SW_TASK_CLOCK;
  attributes.disabled = 1;
  int fd = (int) syscall(SYS_perf_event_open, &attributes, 0, -1, -1, PERF_FLAG_FD_CLOEXEC);
  if (fd >= 0) {
    close(fd);
    return NULL;
  }
  snprintf(why, size, "perf_event_open refused: %s", strerror(errno));
  return why;
}
#else
const char *contprof_cpu_timers_perf_events_refused(char *why, size_t size) {
  snprintf(why, size, "built without perf events (no linux/perf_event.h)");
  return why;
}
static void close_perf_event(cpu_timer *timer, bool disable) {
  (void) disable;
  timer->perf_fd = -1;
}
static bool start_perf_event(int index, int64_t period_ns) { return false; }
#endif

// Creates and arms the timer of slot `index` (its tid and clock set) with `period_ns`,
// under a new lease of the slot: a perf event where possible, else a POSIX timer.
static bool start_timer(int index, int64_t period_ns) {
  cpu_timer *timer = &timer_entries[index];
  timer->lease = renew_slot(index);
  timer->expirations_read = timer->in_gc_read = 0;
  timer->perf_fd = -1;
  atomic_store(&slots[index].period_ns, period_ns);
  if (start_perf_event(index, period_ns)) return true;
  struct sigevent event;
  memset(&event, 0, sizeof(event));
  event.sigev_notify = SIGEV_THREAD_ID;
  event.sigev_signo = SIGPROF;
  event.sigev_notify_thread_id = timer->tid;
  event.sigev_value.sival_int = (int) (timer->lease << SLOT_INDEX_BITS | (uint64_t) index);
  if (timer_create(timer->clock, &event, &timer->id) != 0) return false;
  struct timespec now;
  bool armed = clock_gettime(timer->clock, &now) == 0;
  if (armed) {
    timer->armed_at_cpu_ns = contprof_timespec_ns(now);
    timer->period_ns = period_ns;
    struct itimerspec at = {.it_interval = contprof_ns_timespec(period_ns),
                            .it_value = contprof_ns_timespec(timer->armed_at_cpu_ns + period_ns)};
    armed = timer_settime(timer->id, TIMER_ABSTIME, &at, NULL) == 0;
  }
  if (!armed) timer_delete(timer->id);
  return armed;
}

static void stop_timer(int index) {
  cpu_timer *timer = &timer_entries[index];
  if (timer->perf_fd >= 0) {
    close_perf_event(timer, true);
  } else {
    timer_delete(timer->id);
  }
}

static int mark_thread(st_data_t thread, st_data_t CONTPROF_UNUSED slot, st_data_t CONTPROF_UNUSED unused) {
  rb_gc_mark((VALUE) thread); // pins: the table hashes by address
  return ST_CONTINUE;
}

void contprof_cpu_timers_init(contprof_cpu_timers *timers, int64_t period_ns, long capture_frames) {
  timers->threads = st_init_numtable();
  timers->period_ns = period_ns;
  timers->capture_frames = capture_frames;
  timers->armed = timers->failed = timers->perf_events_armed = 0;
  timers->unarmed_seen = 0;
}

void contprof_cpu_timers_mark(const contprof_cpu_timers *timers) {
  if (timers->threads) st_foreach(timers->threads, mark_thread, 0);
}

void contprof_cpu_timers_free(contprof_cpu_timers *timers) {
  contprof_cpu_timers_delete_all(timers);
  st_free_table(timers->threads);
  timers->threads = NULL;
}

bool contprof_cpu_timers_arm(contprof_cpu_timers *timers, VALUE thread) {
  if (st_lookup(timers->threads, (st_data_t) thread, NULL)) return true;
  // A thread sharing native threads (M:N) has no timer of its own: a native thread's timer
  // would count the CPU of every thread it runs (see vm/vm_public_api.c, "M:N threads").
  if (contprof_vm_thread_shares_native(thread)) return false;
  pthread_t pthread;
  clockid_t clock;
  pid_t tid = contprof_vm_thread_tid(thread);
  if (tid <= 0 || !contprof_vm_thread_pthread(thread, &pthread) || pthread_getcpuclockid(pthread, &clock) != 0) {
    return false; // not started yet: its begin event arms it
  }
  int index = take_slot();
  if (index >= 0) {
    timer_entries[index].tid = tid;
    timer_entries[index].clock = clock;
    if (!start_timer(index, timers->period_ns)) {
      give_back_slot(index);
      index = -1;
    }
  }
  if (index < 0) {
    timers->failed++;
    return false;
  }
  st_insert(timers->threads, (st_data_t) thread, (st_data_t) index);
  timers->armed++;
  if (timer_entries[index].perf_fd >= 0) timers->perf_events_armed++;
  return true;
}

typedef struct {
  contprof_cpu_timers *timers;
  VALUE except;
} arm_call;

static void arm_visited_thread(VALUE thread, void *data) {
  arm_call *call = data;
  if (thread != call->except) contprof_cpu_timers_arm(call->timers, thread);
}

void contprof_cpu_timers_arm_all(contprof_cpu_timers *timers, VALUE except_thread) {
  arm_call call = {.timers = timers, .except = except_thread};
  contprof_vm_each_thread(arm_visited_thread, &call);
}

static void delete_slot_timer(int index) {
  stop_timer(index);
  give_back_slot(index);
}

void contprof_cpu_timers_delete(contprof_cpu_timers *timers, VALUE thread) {
  st_data_t key = (st_data_t) thread, index;
  if (st_delete(timers->threads, &key, &index)) delete_slot_timer((int) index);
}

// Deletes an entry's timer: every entry, or with `only_dead` those of dead threads.
static int delete_timer_entry(st_data_t thread, st_data_t index, st_data_t only_dead) {
  if (only_dead && contprof_vm_thread_alive((VALUE) thread)) return ST_CONTINUE;
  delete_slot_timer((int) index);
  return ST_DELETE;
}

// Capture buffers are kept while timers run (for the slots' next owners); with no timer
// left (a stop) they go. A slot whose lock a late handler holds keeps its buffer (it sees
// the slot given back, and writes nothing there): freed at the next stop.
static void free_capture_buffers(void) {
  if (free_slot_count < 0) return;
  for (int i = 0; i < CPU_TIMER_SLOTS; i++) {
    timer_slot *slot = &slots[i];
    int expected = CAPTURE_FREE;
    if (!slot->frames || !atomic_compare_exchange_strong(&slot->capture_lock, &expected, CAPTURE_READING)) continue;
    free(slot->frames);
    slot->frames = NULL;
    slot->vm_scratch = NULL;
    slot->capacity = 0;
    slot->captured = 0;
    atomic_store(&slot->capture_lock, CAPTURE_FREE);
  }
}

void contprof_cpu_timers_delete_all(contprof_cpu_timers *timers) {
  if (timers->threads) st_foreach(timers->threads, delete_timer_entry, false);
  free_capture_buffers();
}

size_t contprof_cpu_timers_capture_bytes(void) {
  size_t bytes = 0;
  if (free_slot_count < 0) return 0;
  for (int i = 0; i < CPU_TIMER_SLOTS; i++) {
    if (slots[i].frames) {
      bytes += 2 * (size_t) slots[i].capacity * sizeof(contprof_raw_frame) + contprof_vm_capture_scratch_size(slots[i].capacity);
    }
  }
  return bytes;
}

void contprof_cpu_timers_delete_dead(contprof_cpu_timers *timers) {
  if (timers->threads->num_entries > 0) st_foreach(timers->threads, delete_timer_entry, true);
}

static int rearm_timer_entry(st_data_t CONTPROF_UNUSED thread, st_data_t index, st_data_t data) {
  contprof_cpu_timers *timers = (contprof_cpu_timers *) data;
  stop_timer((int) index);
  if (start_timer((int) index, timers->period_ns)) return ST_CONTINUE;
  give_back_slot((int) index);
  timers->failed++;
  return ST_DELETE;
}

void contprof_cpu_timers_set_period(contprof_cpu_timers *timers, int64_t period_ns) {
  if (period_ns == timers->period_ns) return;
  timers->period_ns = period_ns;
  st_foreach(timers->threads, rearm_timer_entry, (st_data_t) timers);
}

// In a forked child, for each of the parent's timers: its perf event descriptor (watching
// the parent's thread) closed, never disabled (that would stop the parent's timer; see
// close_perf_event); a POSIX timer (not inherited) forgotten without timer_delete (its id
// may be the child's own next). Its slot is given back, with its lock: the parent's
// handler may have held it at the fork.
static int forget_inherited_timer(st_data_t CONTPROF_UNUSED thread, st_data_t index, st_data_t CONTPROF_UNUSED unused) {
  close_perf_event(&timer_entries[index], false);
  atomic_store(&slots[index].capture_lock, CAPTURE_FREE);
  slots[index].captured = 0;
  give_back_slot((int) index);
  return ST_CONTINUE;
}

void contprof_cpu_timers_forget_after_fork(contprof_cpu_timers *timers) {
  // Only the parent's timers' slots are touched: rewriting all of them (608 KB) cost each
  // child 5-13 ms of CPU in copy-on-write faults before its own code ran.
  st_foreach(timers->threads, forget_inherited_timer, 0);
  st_clear(timers->threads);
}

void contprof_cpu_timers_set_kind(contprof_cpu_timer_kind kind) { atomic_store(&timer_kind_wanted, kind); }

size_t contprof_cpu_timers_live(const contprof_cpu_timers *timers) {
  return timers->threads ? timers->threads->num_entries : 0;
}

// ---------------------------------------------------------------------------------------
// The collector's view (holding the GVL)

// Gives the slot a capture buffer when its handler asked for one (lock held by the reader).
static void provide_buffer(timer_slot *slot, long capacity) {
  if (!atomic_load(&slot->capture_wanted) && slot->frames) return;
  atomic_store(&slot->capture_wanted, false);
  if (slot->frames && slot->capacity >= capacity) return;
  // Plain malloc: no Ruby allocation (and so no GC) inside a round. Kept for the slot's
  // next owners; without memory the thread's native CPU just goes uncaptured.
  // (One block: the frames, then the backend's scratch.)
  size_t frames_size = 2 * (size_t) capacity * sizeof(contprof_raw_frame);
  contprof_raw_frame *frames = malloc(frames_size + contprof_vm_capture_scratch_size(capacity));
  if (!frames) return;
  free(slot->frames);
  slot->frames = frames;
  slot->vm_scratch = (char *) frames + frames_size;
  slot->capacity = capacity;
  slot->captured = 0;
}

// A capture stays valid while no GC ran since (its frames' objects can be neither freed
// nor moved), or, when they were all old, while no major GC started (minor GCs leave old
// objects alone). The handler notes the major GCs a round counted before the capture: the
// same count now means none started since that round, so none since the capture.
static bool capture_valid(const contprof_stack_capture_info *info) {
  return rb_gc_count() == info->gc_count ||
         (info->all_old && contprof_vm_major_gc_count() == info->major_gc_count && !contprof_vm_during_gc());
}

// The thread's CPU time at its latest expiry. A perf event's handler read its counter
// then (see "Random periods"); should it not have (no expiry handled yet), the counter,
// which counts every period even when signals merged, gives the periods so far. A POSIX
// timer armed at CPU time A with period P that expired n times: A + nP. (SIGPROF is a
// standard signal: the overflows that come while one is pending, as while the thread
// blocks it, become one signal, and a perf event's signal says nothing of how many: its
// si_overrun is a POLL_ signal's si_band.) Not the clock itself: the CPU since the latest
// expiry belongs to wherever the next one lands, not to where the thread is when a round
// reads it.
static int64_t timer_cpu_ns(const timer_slot *slot, cpu_timer *timer, uint64_t expirations) {
#ifdef CONTPROF_HAVE_PERF_EVENTS
  if (timer->perf_fd >= 0) {
    uint64_t counted = atomic_load(&slot->perf_counted);
    if (counted > 0) return timer->armed_at_cpu_ns + (int64_t) counted;
    if (read(timer->perf_fd, &counted, sizeof(counted)) == (ssize_t) sizeof(counted)) {
      uint64_t periods = counted / (uint64_t) timer->period_ns;
      if (periods > expirations) expirations = periods;
    }
  }
#else
  (void) slot;
#endif
  return timer->armed_at_cpu_ns + (int64_t) expirations * timer->period_ns;
}

static bool read_timer(void *context, VALUE thread, contprof_cpu_timer_reading *reading) {
  contprof_cpu_timers *timers = context;
  st_data_t value;
  // A thread sharing native threads (M:N) has none (it may have been found sharing since
  // it got one): not a thread waiting for its timer either.
  if (contprof_vm_thread_shares_native(thread)) {
    contprof_cpu_timers_delete(timers, thread);
    return false;
  }
  if (!st_lookup(timers->threads, (st_data_t) thread, &value)) {
    timers->unarmed_seen++;
    return false;
  }
  int index = (int) value;
  timer_slot *slot = &slots[index];
  cpu_timer *timer = &timer_entries[index];
  memset(reading, 0, sizeof(*reading));
  uint64_t word = atomic_load(&slot->word);
  if ((word >> SLOT_COUNT_BITS) != timer->lease) return true; // (cannot happen: a live timer owns its slot)
  uint64_t expirations = word & SLOT_COUNT_MASK;
  uint64_t in_gc = atomic_load(&slot->in_gc);
  reading->expirations = expirations - timer->expirations_read;
  reading->in_gc = in_gc - timer->in_gc_read;
  if (reading->in_gc > reading->expirations) reading->in_gc = reading->expirations;
  if (reading->in_gc > 0) reading->gc_moment = atomic_load(&slot->gc_moment);
  timer->expirations_read = expirations;
  timer->in_gc_read = in_gc;
  if (reading->expirations > 0) reading->cpu_ns = timer_cpu_ns(slot, timer, expirations);
  reading->timer_generation = (uint64_t) index << 32 | timer->lease;
  reading->period_ns = timer->period_ns;
  reading->tid = timer->tid;

  int expected = CAPTURE_FREE;
  if (!atomic_compare_exchange_strong(&slot->capture_lock, &expected, CAPTURE_READING)) return true;
  provide_buffer(slot, timers->capture_frames);
  if (slot->captured > 0 && slot->capture_lease == timer->lease) {
    reading->captured = slot->captured;
    if (reading->captured > reading->expirations) reading->captured = reading->expirations;
    reading->captured_cpu_ns = slot->captured_cpu_ns;
    if (reading->captured < slot->captured) { // (expirations the reading does not cover yet)
      reading->captured_cpu_ns = (int64_t) ((double) slot->captured_cpu_ns * (double) reading->captured / (double) slot->captured);
    }
    reading->captured_holding_gvl = slot->captured_holding_gvl;
    reading->captured_frames = slot->frames;
    reading->captured_total = slot->captured_total < slot->capacity ? slot->captured_total : slot->capacity;
    reading->capture_valid = capture_valid(&slot->capture_info);
    if (!reading->capture_valid) atomic_fetch_add(&stats.captures_stale, reading->captured);
  }
  return true;
}

static void reading_done(void *context, VALUE thread) {
  contprof_cpu_timers *timers = context;
  st_data_t value;
  if (!st_lookup(timers->threads, (st_data_t) thread, &value)) return;
  timer_slot *slot = &slots[(int) value];
  if (atomic_load(&slot->capture_lock) != CAPTURE_READING) return;
  slot->captured = 0;
  atomic_store(&slot->capture_lock, CAPTURE_FREE);
}

contprof_cpu_timer_source contprof_cpu_timers_source(contprof_cpu_timers *timers) {
  atomic_store(&major_gcs_seen, contprof_vm_major_gc_count());
  timers->unarmed_seen = 0; // (counted afresh by each round)
  return (contprof_cpu_timer_source) {
    .read = read_timer, .done = reading_done, .context = timers, .period_ns = timers->period_ns};
}

bool contprof_cpu_timers_count_expiry(contprof_cpu_timers *timers, VALUE thread) {
  st_data_t index;
  if (!timers->threads || !st_lookup(timers->threads, (st_data_t) thread, &index)) return false;
  atomic_fetch_add(&slots[index].word, 1);
  return true;
}

contprof_cpu_timers_stats contprof_cpu_timers_get_stats(void) {
  return (contprof_cpu_timers_stats) {.captures = atomic_load(&stats.captures),
                                      .captures_missed = atomic_load(&stats.captures_missed),
                                      .captures_stale = atomic_load(&stats.captures_stale),
                                      .expirations_in_gc = atomic_load(&stats.expirations_in_gc),
                                      .signals_timed = atomic_load(&stats.signals_timed),
                                      .signal_lag_ns_total = atomic_load(&stats.signal_lag_ns_total),
                                      .signal_lag_ns_max = atomic_load(&stats.signal_lag_ns_max),
                                      .signals_late = atomic_load(&stats.signals_late)};
}

void contprof_cpu_timers_reset_stats(void) {
  atomic_store(&stats.captures, 0);
  atomic_store(&stats.captures_missed, 0);
  atomic_store(&stats.captures_stale, 0);
  atomic_store(&stats.expirations_in_gc, 0);
  atomic_store(&stats.signals_timed, 0);
  atomic_store(&stats.signal_lag_ns_total, 0);
  atomic_store(&stats.signal_lag_ns_max, 0);
  atomic_store(&stats.signals_late, 0);
}

#else // No timer_create: every thread's CPU comes from clock reads at wall rounds.
// (Stubs, which ignore their arguments.)
#pragma GCC diagnostic ignored "-Wunused-parameter"

bool contprof_cpu_timers_built(void) { return false; }
void contprof_cpu_timers_init(contprof_cpu_timers *timers, int64_t period_ns, long capture_frames) {
  memset(timers, 0, sizeof(*timers));
  timers->period_ns = period_ns;
}
void contprof_cpu_timers_mark(const contprof_cpu_timers *timers) {}
void contprof_cpu_timers_free(contprof_cpu_timers *timers) {}
bool contprof_cpu_timers_arm(contprof_cpu_timers *timers, VALUE thread) { return false; }
void contprof_cpu_timers_arm_all(contprof_cpu_timers *timers, VALUE except_thread) {}
void contprof_cpu_timers_delete(contprof_cpu_timers *timers, VALUE thread) {}
void contprof_cpu_timers_delete_all(contprof_cpu_timers *timers) {}
void contprof_cpu_timers_delete_dead(contprof_cpu_timers *timers) {}
void contprof_cpu_timers_set_period(contprof_cpu_timers *timers, int64_t period_ns) {}
void contprof_cpu_timers_forget_after_fork(contprof_cpu_timers *timers) {}
size_t contprof_cpu_timers_live(const contprof_cpu_timers *timers) { return 0; }
contprof_timer_signal contprof_cpu_timers_on_signal(const siginfo_t *info) { return CONTPROF_TIMER_NOT_OURS; }
static bool no_timer(void *context, VALUE thread, contprof_cpu_timer_reading *reading) { return false; }
static void no_done(void *context, VALUE thread) {}
contprof_cpu_timer_source contprof_cpu_timers_source(contprof_cpu_timers *timers) {
  return (contprof_cpu_timer_source) {.read = no_timer, .done = no_done, .context = timers};
}
contprof_cpu_timers_stats contprof_cpu_timers_get_stats(void) { return (contprof_cpu_timers_stats) {0}; }
size_t contprof_cpu_timers_capture_bytes(void) { return 0; }
const char *contprof_cpu_timers_perf_events_refused(char *why, size_t size) {
  snprintf(why, size, "built without CPU timers (no timer_create)");
  return why;
}
bool contprof_cpu_timers_count_expiry(contprof_cpu_timers *timers, VALUE thread) { return false; }
void contprof_cpu_timers_reset_stats(void) {}
void contprof_cpu_timers_set_kind(contprof_cpu_timer_kind kind) {}

#endif
