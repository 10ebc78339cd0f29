// Creating and deleting the CPU timers (see cpu_timers.h), holding the GVL: a slot for
// each timer (cpu_timers_internal.h, "Slots"), then a perf event or a POSIX timer on the
// thread's CPU clock, whose signal names the slot; and their end, at a thread's end, a
// stop, a new period or a fork.
//
// ## The two kinds of timer
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
#include "sampling/cpu_timers.h"

#ifdef CONTPROF_HAVE_CPU_TIMERS

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
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

#include "jitter.h"
#include "ruby_helpers.h"
#include "sampling/cpu_timers_internal.h"
#include "vm/vm.h"

#ifndef sigev_notify_thread_id
#define sigev_notify_thread_id _sigev_un._tid // glibc before 2.31 names it only this way
#endif

cpu_timer contprof_timer_entries[CPU_TIMER_SLOTS];
static int free_slots[CPU_TIMER_SLOTS]; // a stack of free slot indexes
static int free_slot_count = -1; // -1: not set up yet
#ifdef CONTPROF_HAVE_PERF_EVENTS
static atomic_int perf_usable = 1; // cleared for good when the kernel refuses perf events
#endif
static atomic_int timer_kind_wanted = CONTPROF_CPU_TIMER_AUTO;

// ---------------------------------------------------------------------------------------
// Slots

// A new lease for `slot`, with no expirations counted and no capture.
static uint64_t renew_slot(int index) {
  timer_slot *slot = &contprof_timer_slots[index];
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
    atomic_store(&contprof_timer_slots[i].capture_lock, CAPTURE_FREE);
    contprof_timer_slots[i].captured = 0;
    free_slots[i] = CPU_TIMER_SLOTS - 1 - i;
  }
  free_slot_count = CPU_TIMER_SLOTS;
}

static int take_slot(void) {
  if (free_slot_count < 0) {
#ifdef CONTPROF_HAVE_PERF_EVENTS
    for (int i = 0; i < PERF_FD_TABLE; i++) atomic_store(&contprof_timer_perf_fds[i], -1);
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
// Timers

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
  if (fd < PERF_FD_TABLE) atomic_store(&contprof_timer_perf_fds[fd], -1);
  uint64_t id = 0;
  if (ioctl(fd, PERF_EVENT_IOC_ID, &id) != 0 || id != timer->perf_id) return;
  if (disable) ioctl(fd, PERF_EVENT_IOC_DISABLE, 0);
  close(fd);
}

// A task-clock perf event on the slot's thread that signals it every `period_ns` of CPU.
static bool start_perf_event(int index, int64_t period_ns) {
  if (!atomic_load(&perf_usable) || atomic_load(&timer_kind_wanted) == CONTPROF_CPU_TIMER_POSIX) return false;
  cpu_timer *timer = &contprof_timer_entries[index];
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
    timer_slot *slot = &contprof_timer_slots[index];
    atomic_store(&slot->perf_id, timer->perf_id);
    slot->jitter_state = contprof_jitter_seed((uint64_t) contprof_clock_ns(CLOCK_MONOTONIC), (uint64_t) timer->tid);
    atomic_store(&contprof_timer_perf_fds[fd], (int) (timer->lease << SLOT_INDEX_BITS | (uint64_t) index));
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
static bool start_perf_event(int CONTPROF_UNUSED index, int64_t CONTPROF_UNUSED period_ns) { return false; }
#endif

// Creates and arms the timer of slot `index` (its tid and clock set) with `period_ns`,
// under a new lease of the slot: a perf event where possible, else a POSIX timer.
static bool start_timer(int index, int64_t period_ns) {
  cpu_timer *timer = &contprof_timer_entries[index];
  timer->lease = renew_slot(index);
  timer->expirations_read = timer->in_gc_read = 0;
  timer->perf_fd = -1;
  atomic_store(&contprof_timer_slots[index].period_ns, period_ns);
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
  cpu_timer *timer = &contprof_timer_entries[index];
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
  // would count the CPU of every thread it runs (see vm/vm_thread_events.c, "M:N threads").
  if (contprof_vm_thread_shares_native(thread)) return false;
  pthread_t pthread;
  clockid_t clock;
  pid_t tid = contprof_vm_thread_tid(thread);
  if (tid <= 0 || !contprof_vm_thread_pthread(thread, &pthread) || pthread_getcpuclockid(pthread, &clock) != 0) {
    return false; // not started yet: its begin event arms it
  }
  int index = take_slot();
  if (index >= 0) {
    contprof_timer_entries[index].tid = tid;
    contprof_timer_entries[index].clock = clock;
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
  if (contprof_timer_entries[index].perf_fd >= 0) timers->perf_events_armed++;
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
    timer_slot *slot = &contprof_timer_slots[i];
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
    const timer_slot *slot = &contprof_timer_slots[i];
    if (slot->frames) {
      bytes += 2 * (size_t) slot->capacity * sizeof(contprof_raw_frame) + contprof_vm_capture_scratch_size(slot->capacity);
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
  close_perf_event(&contprof_timer_entries[index], false);
  atomic_store(&contprof_timer_slots[index].capture_lock, CAPTURE_FREE);
  contprof_timer_slots[index].captured = 0;
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

#endif
