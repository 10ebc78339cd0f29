// The CPU timers' part of the SIGPROF handler (contprof_cpu_timers_on_signal, see
// cpu_timers.h): all the code it runs is in this file, but for the calls the rules below
// name and two inline helpers (contprof_jittered_interval, jitter.h: arithmetic;
// contprof_update_max, statistics.h: a compare-and-swap loop), and all the memory it
// touches is defined here.
//
// Every function in this file runs inside a signal handler, which may interrupt any code
// of its thread (malloc, a lock held, the VM halfway through a change), and obeys these
// rules:
// - no allocation, no lock, no stdio: shared state changes through lock-free atomics
//   (compare-and-swap, fetch-add) only;
// - no Ruby API: of the VM, only the vm.h functions documented for signal handlers
//   (contprof_vm_current_thread_holds_gvl, contprof_vm_current_thread_in_c_method,
//   contprof_vm_gc_moment, contprof_vm_capture_current_stack), which read the VM's state
//   and never change it;
// - of the C library, only read and ioctl on a perf event's descriptor (system calls that
//   take no lock; the errno they may set is restored by the handler that calls in,
//   sigprof.c) and memcmp;
// - memory: the static state defined below, never freed, and a slot's capture buffer only
//   holding its capture_lock (a buffer is replaced or freed only by whoever took that lock:
//   provide_buffer in cpu_timers.c, free_capture_buffers in cpu_timers_arming.c);
// - it gives up rather than waits: a capture lock already taken, or a slot whose lease is
//   no longer the signal's, ends the work for that signal.
//
// ## Random periods
//
// A perf event's period is drawn anew at each expiry (jitter.h: a fixed period
// samples a steady loop at the same few points). The handler sets the next one
// (PERF_EVENT_IOC_PERIOD, which restarts the count from there) and reads the counter, so
// the CPU at each expiry is known without assuming a period. POSIX timers keep their
// fixed period: the scheduler tick that checks them (see "The two kinds of timer" in
// cpu_timers_arming.c) already spreads their expiries over the loop, only less evenly.
#include "sampling/cpu_timers.h"

#ifdef CONTPROF_HAVE_CPU_TIMERS

#include <stdatomic.h>
#include <string.h>
#include <unistd.h>
#ifdef CONTPROF_HAVE_PERF_EVENTS
#include <linux/perf_event.h>
#include <sys/ioctl.h>
#endif

#include "jitter.h"
#include "sampling/cpu_timers_internal.h"
#include "sampling/statistics.h"
#include "vm/vm.h"

timer_slot contprof_timer_slots[CPU_TIMER_SLOTS];
#ifdef CONTPROF_HAVE_PERF_EVENTS
atomic_int contprof_timer_perf_fds[PERF_FD_TABLE];
#endif
atomic_uint_fast64_t contprof_timer_major_gcs_seen;
cpu_timer_counters contprof_timer_stats;

// The slot value (lease << SLOT_INDEX_BITS | slot) a signal carries, or -1.
static int signal_value(const siginfo_t *info) {
  if (info->si_code == SI_TIMER) return info->si_value.sival_int;
#ifdef CONTPROF_HAVE_PERF_EVENTS
  // fcntl(F_SETSIG) signals carry a POLL_* code and the descriptor.
  if (info->si_code >= POLL_IN && info->si_code <= POLL_HUP && info->si_fd >= 0 && info->si_fd < PERF_FD_TABLE) {
    return atomic_load(&contprof_timer_perf_fds[info->si_fd]);
  }
#endif
  return -1;
}

static void try_capture(timer_slot *slot, uint64_t lease, uint64_t expirations, int64_t cpu_ns, bool holding_gvl) {
  int expected = CAPTURE_FREE;
  if (!atomic_compare_exchange_strong(&slot->capture_lock, &expected, CAPTURE_WRITING)) {
    atomic_fetch_add(&contprof_timer_stats.captures_missed, 1);
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
      info.major_gc_count = atomic_load(&contprof_timer_major_gcs_seen);
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
  atomic_fetch_add(stored ? &contprof_timer_stats.captures : &contprof_timer_stats.captures_missed, 1);
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
      atomic_fetch_add(&contprof_timer_stats.cpu_signals_timed, 1);
      atomic_fetch_add(&contprof_timer_stats.cpu_signal_lag_ns_total, lag);
      contprof_update_max(&contprof_timer_stats.cpu_signal_lag_ns_max, lag);
      if (lag > 1000 * 1000) atomic_fetch_add(&contprof_timer_stats.cpu_signals_late, 1);
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
  timer_slot *slot = &contprof_timer_slots[value & (CPU_TIMER_SLOTS - 1)];
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
      atomic_fetch_add(&contprof_timer_stats.expirations_in_gc, expirations);
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

#endif
