// Contprof::Collectors::CpuAndWallTimeWorker: decides when to sample, and makes sure each
// sample is taken by a thread holding the GVL, which is the only safe place to read
// other threads' stacks.
//
// ## The trigger
//
// With signals on (the default, on Linux), every Ruby thread has its own CPU-time timer
// (timer_create on the thread's CPU clock, delivered to that thread: SIGEV_THREAD_ID).
// The kernel sends SIGPROF to a thread each time it has used one interval of CPU, in
// the middle of that work: a busy thread signals itself and no other thread wakes up.
// A thread that is blocked or asleep uses no CPU, so its timer never fires and never
// interrupts a system call. When the signalled thread holds the GVL, its handler
// registers the sampling job, exactly as for a signal from the worker thread below.
//
// Why not only a timing thread, as the seed does: on a virtual machine, waking a thread
// every 10 ms and signalling across CPUs costs 30-80 us per round (bench/wakeup_floor.c),
// 0.3-0.8% of a core on its own; a CPU timer's signal lands on the running thread
// without any wakeup or context switch.
//
// CPU timers cannot see wall time: a program whose threads all wait uses no CPU, and a
// thread busy in native code without the GVL cannot run Ruby's job. So a background Ruby
// thread (the worker thread) stays as the fallback. It releases the GVL and loops: wait
// one interval; if a sampling round happened within that interval (CPU timers are
// driving), go back to sleep until the rounds stop (the watchdog below: while they come,
// it never wakes); otherwise nudge whichever thread holds the GVL. Without CPU timers
// (signals off, or timer_create refused) it nudges every interval:
//
// - signals on (default): pthread_kill(SIGPROF) to the GVL holder only, never to the
//   process (so blocked threads, which may be in system calls, are never interrupted).
//   The handler checks that its thread really holds the GVL and registers a postponed
//   job, which Ruby runs on that thread at its next safe point.
// - signals off: no signal at all. The worker registers the postponed job itself and
//   raises the GVL holder's postponed-job interrupt flag, as Ruby's timer thread does
//   for thread switches. For applications whose native libraries mishandle EINTR.
//
// Either way the nudge happens while holding the GVL's internal lock, so the holder can
// neither change nor exit meanwhile. When no thread holds the GVL (every thread blocked
// or asleep), the worker takes the GVL itself and samples: wall time keeps being
// recorded for sleeping programs.
//
// The sampling itself (the postponed job) samples every thread with the CpuAndWallTime
// collector. Exceptions are caught there (the application never sees them), stored, and
// re-raised on the worker thread, which then stops.
//
// ## Adaptive rate
//
// The job measures its own duration, and the worker thread its own CPU. The wait between
// samples is the configured interval, stretched when needed so that the profiler costs
// at most `overhead_target` of one core: wait >= (average sampling time + worker CPU per
// round) / overhead_target. Values stay exact because they are time deltas; only the
// resolution drops.
//
// With CPU timers a switch from busy to idle can leave up to 16 intervals without a round
// (see "The watchdog"); values stay exact (deltas), only that stretch has a coarser
// resolution.
//
// ## Signals, exec and fork
//
// The worker refuses to start when another SIGPROF handler is installed (another
// profiler, or the application's own). Its handler uses SA_RESTART, saves errno and
// does nothing but async-signal-safe work. The worker thread blocks SIGPROF. On stop,
// after the worker thread has ended (no more signals can be sent), SIGPROF is set to
// SIG_IGN, which discards any signal still pending, then the previous disposition comes
// back: a stopped profiler can never leave a SIGPROF behind to kill an exec'd program.
// CPU timers are deleted before that (at stop, and at each thread's end). The Ruby side
// stops the worker before exec and restarts it in forked children; a child inherits no
// timers (POSIX), so it forgets the parent's and arms its own.
#include <errno.h>
#include <pthread.h>
#include <ruby.h>
#include <ruby/debug.h>
#include <ruby/thread.h>
#include <ruby/st.h>
#include <signal.h>
#include <stdatomic.h>
#include <string.h>
#include <time.h>
#ifdef CONTPROF_HAVE_TIMERFD
#include <sys/timerfd.h>
#include <unistd.h>
#endif

#include "collectors/collectors_cpu_and_wall_time.h"
#include "pprof/pprof_util.h"
#include "ruby_helpers.h"
#include "vm/vm.h"

typedef struct {
  VALUE collector;
  VALUE failure; // exception raised while sampling, or nil
  VALUE worker_thread; // the Ruby thread running the trigger loop, or nil
  int64_t interval_ns;
  double overhead_target;
  bool use_signals;
  bool use_cpu_timers; // asked for (with signals on); the build may not support them

  // Per-thread CPU-time timers: Thread => timer_t. Only used holding the GVL. Keys are
  // marked (pinned), so a dead thread's entry stays recognizable until it is swept.
  st_table *cpu_timers;
  int64_t cpu_timers_period_ns; // the period the timers are armed with
  // CLOCK_MONOTONIC at the end of the latest sampling round (0: none yet).
  atomic_int_fast64_t last_round_ns;
  // CPU the trigger loop costs per sampling round (moving average), for the adaptive rate.
  atomic_int_fast64_t trigger_ns_per_round;
  // The trigger loop's wait while CPU timers drive (see "The watchdog"): the current
  // run's timerfd, or -1. Set and cleared holding the GVL; each run's loop owns its own.
  int watchdog_fd;
  pid_t watchdog_pid; // the process that made it (a forked child must not touch it)
  bool watchdog_used; // the latest run's loop had one (for #stats)
  atomic_int_fast64_t watchdog_deadline_ns; // CLOCK_MONOTONIC it is armed for

  atomic_bool should_run;
  // Incremented at every start: a trigger loop or worker thread left from an earlier run
  // (stop does not wait for them, see worker_native_request_stop) recognizes it is stale.
  atomic_uint_fast64_t run_generation;
  // Held by the trigger loop while it decides to nudge and nudges; taken by stop to know
  // that no nudge (no signal) is in flight any more.
  pthread_mutex_t nudge_mutex;
  // A nudge is outstanding: its sample has not been taken yet. No new nudge until then,
  // so that jobs never pile up and, without signals, the worker never registers a job
  // while Ruby may be running ours (see register_postponed_job).
  atomic_bool job_pending;
  pthread_mutex_t wakeup_mutex;
  pthread_cond_t wakeup_cond;
  bool wakeup_requested; // guarded by wakeup_mutex
  bool loop_started; // guarded by wakeup_mutex

  bool signal_handler_installed;
  struct sigaction previous_action;
  VALUE thread_event_hook_data;

  // Statistics: updated from the signal handler, the worker thread and the sampling job.
  atomic_uint_fast64_t sample_rounds;
  atomic_uint_fast64_t signals_sent;
  atomic_uint_fast64_t interrupts_raised;
  atomic_uint_fast64_t signals_without_gvl_holder;
  atomic_uint_fast64_t jobs_not_queued; // postponed job buffer full
  atomic_uint_fast64_t jobs_already_queued;
  atomic_uint_fast64_t nudges_skipped; // the previous nudge's sample was still pending
  atomic_uint_fast64_t nudges_lost; // pending for too long: given up on
  int64_t pending_since_ns; // when the pending nudge was sent (trigger loop only)
  atomic_uint_fast64_t samples_with_gvl_taken; // the worker took the GVL itself
  atomic_uint_fast64_t sampling_ns_total;
  atomic_uint_fast64_t sampling_ns_max;
  atomic_uint_fast64_t sampling_ns_average; // exponential moving average
  atomic_uint_fast64_t effective_interval_ns;
  atomic_uint_fast64_t sampling_errors;
  atomic_uint_fast64_t trigger_thread_cpu_ns; // CPU used by the worker thread's trigger loop
  atomic_uint_fast64_t trigger_wakeups; // times the trigger loop woke up to decide
  atomic_uint_fast64_t timer_signals; // SIGPROFs from CPU timers
  atomic_uint_fast64_t cpu_timers_armed;
  atomic_uint_fast64_t cpu_timers_failed; // timer_create or timer_settime refused
  atomic_uint_fast64_t watchdog_pushes; // rounds that moved the watchdog's deadline on
  atomic_uint_fast64_t timer_rounds; // rounds started by a CPU timer's signal
} worker_state;

// The statistics counters that start from zero in every process (a forked child resets
// them), in the order #stats lists them; effective_interval_ns is listed after them.
#define WORKER_COUNTERS(X)                                                                            \
  X(sample_rounds) X(signals_sent) X(interrupts_raised) X(signals_without_gvl_holder) X(jobs_not_queued) \
  X(jobs_already_queued) X(nudges_skipped) X(nudges_lost) X(samples_with_gvl_taken) X(sampling_ns_total)  \
  X(sampling_ns_max) X(sampling_ns_average) X(sampling_errors) X(trigger_thread_cpu_ns) X(trigger_wakeups)       \
  X(timer_signals) X(timer_rounds) X(cpu_timers_armed) X(cpu_timers_failed) X(watchdog_pushes)

// The running worker. There is one SIGPROF handler per process, so one running worker.
static worker_state *active_worker;
static VALUE active_worker_object = Qnil;

static int mark_timer_thread(st_data_t thread, st_data_t timer, st_data_t unused) {
  rb_gc_mark((VALUE) thread); // pins: the table hashes by address
  return ST_CONTINUE;
}

static void worker_mark(void *data) {
  worker_state *state = data;
  rb_gc_mark(state->collector);
  rb_gc_mark(state->failure);
  rb_gc_mark(state->worker_thread);
  st_foreach(state->cpu_timers, mark_timer_thread, 0);
}

static void delete_all_cpu_timers(worker_state *state);
static void forget_inherited_watchdog(worker_state *state);

static void worker_free(void *data) {
  worker_state *state = data;
  delete_all_cpu_timers(state);
  forget_inherited_watchdog(state); // a run's loop, which holds this worker, closed its own
  st_free_table(state->cpu_timers);
  pthread_mutex_destroy(&state->nudge_mutex);
  pthread_mutex_destroy(&state->wakeup_mutex);
  pthread_cond_destroy(&state->wakeup_cond);
  ruby_xfree(state);
}

static const rb_data_type_t worker_type = {
  .wrap_struct_name = "Contprof::Collectors::CpuAndWallTimeWorker",
  .function = {.dmark = worker_mark, .dfree = worker_free},
  .flags = RUBY_TYPED_FREE_IMMEDIATELY,
};

static void init_wakeup(worker_state *state) {
  pthread_mutex_init(&state->nudge_mutex, NULL);
  pthread_mutex_init(&state->wakeup_mutex, NULL);
  pthread_condattr_t attributes;
  pthread_condattr_init(&attributes);
  pthread_condattr_setclock(&attributes, CLOCK_MONOTONIC);
  pthread_cond_init(&state->wakeup_cond, &attributes);
  pthread_condattr_destroy(&attributes);
}

static VALUE worker_alloc(VALUE klass) {
  worker_state *state = ruby_xcalloc(1, sizeof(worker_state));
  state->collector = Qnil;
  state->failure = Qnil;
  state->worker_thread = Qnil;
  state->cpu_timers = st_init_numtable();
  state->watchdog_fd = -1;
  init_wakeup(state);
  return TypedData_Wrap_Struct(klass, &worker_type, state);
}

static worker_state *state_of(VALUE self) { return rb_check_typeddata(self, &worker_type); }

// _native_initialize(collector, interval_seconds, use_signals, overhead_target, use_cpu_timers)
static VALUE worker_native_initialize(VALUE self, VALUE collector, VALUE interval, VALUE use_signals,
                                      VALUE overhead_target, VALUE use_cpu_timers) {
  worker_state *state = state_of(self);
  state->collector = contprof_enforce_cpu_and_wall_time(collector);
  state->interval_ns = (int64_t) (NUM2DBL(interval) * 1e9);
  state->use_signals = RTEST(use_signals);
  state->use_cpu_timers = state->use_signals && RTEST(use_cpu_timers);
  state->overhead_target = NUM2DBL(overhead_target);
  atomic_store(&state->effective_interval_ns, (uint_fast64_t) state->interval_ns);
  state->cpu_timers_period_ns = state->interval_ns;
  return self;
}

// ---------------------------------------------------------------------------------------
// Per-thread CPU-time timers (holding the GVL; see "The trigger" above)

#ifdef CONTPROF_HAVE_CPU_TIMERS
#define CPU_TIMERS_BUILT true
#ifndef sigev_notify_thread_id
#define sigev_notify_thread_id _sigev_un._tid // glibc before 2.31 names it only this way
#endif

// ## Counting expirations: the signalled thread's CPU time without a system call
//
// A CPU timer armed at CPU time A with period P expires when its thread's CPU clock
// passes A + P, A + 2P, ... (the kernel keeps that cadence, and reports expirations it
// could not signal separately as si_overrun). So a thread whose timer has expired n times
// had used exactly A + nP of CPU at its latest expiry: the round that expiry triggers
// takes the thread's CPU from there instead of reading its clock, which is a system call
// (70% of a round's cost with one busy thread, measured with perf). The CPU used between
// the expiry and the round is not lost: it counts in the thread's next sample.
//
// The signal handler counts expirations in a slot of a process-wide array (a handler
// must not touch memory that another thread may free meanwhile; a slot is never freed).
// The timer's signal value names its slot and the slot's generation; a slot given back
// gets a new generation, so a late signal of a deleted timer cannot count for the
// slot's next owner. Generation and count share one atomic word.
#define CPU_TIMER_SLOTS 4096 // threads beyond that are left to the trigger loop
#define SLOT_INDEX_BITS 12
#define SLOT_COUNT_BITS 44
#define SLOT_COUNT_MASK ((UINT64_C(1) << SLOT_COUNT_BITS) - 1)
#define SLOT_GENERATION_MASK ((UINT64_C(1) << (31 - SLOT_INDEX_BITS)) - 1) // fits a positive int with the index
static atomic_uint_fast64_t cpu_timer_slots[CPU_TIMER_SLOTS]; // generation << SLOT_COUNT_BITS | expirations

// A thread's timer, in the entry of its slot: static, so that arming and deleting
// timers never allocates (a forked child arms its timers right after the fork, where a
// sanitizer's allocator may not be usable yet). Only used holding the GVL.
typedef struct {
  timer_t id;
  pid_t tid;
  clockid_t clock;
  uint64_t generation; // the slot's, when this timer was created
  int64_t armed_at_cpu_ns; // expiries at armed_at_cpu_ns + k * period_ns
  int64_t period_ns;
} cpu_timer;
static cpu_timer cpu_timer_entries[CPU_TIMER_SLOTS];
static int free_slots[CPU_TIMER_SLOTS]; // a stack of free slot indexes
static int free_slot_count = -1; // -1: not set up yet

// A new generation for `slot`, with no expirations counted.
static uint64_t renew_slot(int slot) {
  uint64_t generation = ((atomic_load(&cpu_timer_slots[slot]) >> SLOT_COUNT_BITS) + 1) & SLOT_GENERATION_MASK;
  atomic_store(&cpu_timer_slots[slot], generation << SLOT_COUNT_BITS);
  return generation;
}

static void reset_cpu_timer_slots(void) {
  for (int i = 0; i < CPU_TIMER_SLOTS; i++) {
    renew_slot(i);
    free_slots[i] = CPU_TIMER_SLOTS - 1 - i;
  }
  free_slot_count = CPU_TIMER_SLOTS;
}

static int take_slot(void) {
  if (free_slot_count < 0) reset_cpu_timer_slots();
  return free_slot_count > 0 ? free_slots[--free_slot_count] : -1;
}

static void give_back_slot(int slot) {
  renew_slot(slot); // a late signal of the deleted timer no longer counts
  free_slots[free_slot_count++] = slot;
}

// From the signal handler: async-signal-safe (lock-free atomics only).
static void count_expirations(const siginfo_t *info) {
  int value = info->si_value.sival_int;
  if (value < 0) return;
  atomic_uint_fast64_t *slot = &cpu_timer_slots[value & (CPU_TIMER_SLOTS - 1)];
  uint64_t generation = (uint64_t) value >> SLOT_INDEX_BITS;
  uint64_t expirations = 1 + (uint64_t) (info->si_overrun > 0 ? info->si_overrun : 0);
  uint_fast64_t word = atomic_load(slot);
  while ((word >> SLOT_COUNT_BITS) == generation && !atomic_compare_exchange_weak(slot, &word, word + expirations)) {
  }
}

// Creates and arms the timer of `slot` (its tid and clock set) with the current period,
// under a new generation of the slot.
static bool start_cpu_timer(worker_state *state, int slot) {
  cpu_timer *timer = &cpu_timer_entries[slot];
  timer->generation = renew_slot(slot);
  struct sigevent event;
  memset(&event, 0, sizeof(event));
  event.sigev_notify = SIGEV_THREAD_ID;
  event.sigev_signo = SIGPROF;
  event.sigev_notify_thread_id = timer->tid;
  event.sigev_value.sival_int = (int) (timer->generation << SLOT_INDEX_BITS | (uint64_t) slot);
  if (timer_create(timer->clock, &event, &timer->id) != 0) return false;
  struct timespec now;
  bool armed = clock_gettime(timer->clock, &now) == 0;
  if (armed) {
    timer->armed_at_cpu_ns = contprof_timespec_ns(now);
    timer->period_ns = state->cpu_timers_period_ns;
    struct itimerspec at = {.it_interval = contprof_ns_timespec(timer->period_ns),
                            .it_value = contprof_ns_timespec(timer->armed_at_cpu_ns + timer->period_ns)};
    armed = timer_settime(timer->id, TIMER_ABSTIME, &at, NULL) == 0;
  }
  if (!armed) timer_delete(timer->id);
  return armed;
}

// Gives `thread` a timer that sends it SIGPROF every period of CPU it uses. A refusal
// (timer limit, a sandbox, no free slot) is counted, and the thread is then covered by
// the trigger loop.
static void arm_cpu_timer(worker_state *state, VALUE thread) {
  if (!state->use_cpu_timers || st_lookup(state->cpu_timers, (st_data_t) thread, NULL)) return;
  pthread_t pthread;
  clockid_t clock;
  pid_t tid = contprof_vm_thread_tid(thread);
  if (tid <= 0 || !contprof_vm_thread_pthread(thread, &pthread) || pthread_getcpuclockid(pthread, &clock) != 0) return;
  int slot = take_slot();
  if (slot >= 0) {
    cpu_timer_entries[slot].tid = tid;
    cpu_timer_entries[slot].clock = clock;
    if (!start_cpu_timer(state, slot)) {
      give_back_slot(slot);
      slot = -1;
    }
  }
  if (slot < 0) {
    atomic_fetch_add(&state->cpu_timers_failed, 1);
    return;
  }
  st_insert(state->cpu_timers, (st_data_t) thread, (st_data_t) slot);
  atomic_fetch_add(&state->cpu_timers_armed, 1);
}

static void delete_slot_timer(int slot) {
  timer_delete(cpu_timer_entries[slot].id);
  give_back_slot(slot);
}

static void delete_cpu_timer(worker_state *state, VALUE thread) {
  st_data_t key = (st_data_t) thread, slot;
  if (st_delete(state->cpu_timers, &key, &slot)) delete_slot_timer((int) slot);
}

// Deletes an entry's timer: every entry, or with `only_dead` those of dead threads.
static int delete_timer_entry(st_data_t thread, st_data_t slot, st_data_t only_dead) {
  if (only_dead && contprof_vm_thread_alive((VALUE) thread)) return ST_CONTINUE;
  delete_slot_timer((int) slot);
  return ST_DELETE;
}

static void delete_all_cpu_timers(worker_state *state) { st_foreach(state->cpu_timers, delete_timer_entry, false); }

// A new period means a new cadence: the timer is replaced (its signal value cannot
// change), and a thread whose new timer cannot be made loses its entry.
static int rearm_timer_entry(st_data_t thread, st_data_t slot, st_data_t data) {
  worker_state *state = (worker_state *) data;
  timer_delete(cpu_timer_entries[slot].id);
  if (start_cpu_timer(state, (int) slot)) return ST_CONTINUE;
  give_back_slot((int) slot);
  atomic_fetch_add(&state->cpu_timers_failed, 1);
  return ST_DELETE;
}

// In a forked child: the parent's timers did not come along (POSIX), only their ids.
// Forgets them without deleting (an id may be reused by the child's own timers).
static void forget_cpu_timers_after_fork(worker_state *state) {
  st_clear(state->cpu_timers);
  reset_cpu_timer_slots();
}

// The collector's source of the calling thread's CPU time (holding the GVL): its CPU
// clock at its timer's latest expiry.
static bool cpu_time_at_latest_expiry(VALUE thread, int64_t *cpu_ns) {
  worker_state *state = active_worker;
  st_data_t slot;
  if (!state || !st_lookup(state->cpu_timers, (st_data_t) thread, &slot)) return false;
  const cpu_timer *timer = &cpu_timer_entries[slot];
  uint64_t word = atomic_load(&cpu_timer_slots[slot]);
  uint64_t expirations = word & SLOT_COUNT_MASK;
  if ((word >> SLOT_COUNT_BITS) != timer->generation || expirations == 0) return false;
  *cpu_ns = timer->armed_at_cpu_ns + (int64_t) expirations * timer->period_ns;
  return true;
}

// After a sampling round: deletes the timers of threads that ended without their end
// event (in Ruby 3.1 a thread killed or ended by an exception skips it; a dead thread's
// timer never fires, but holds a kernel timer), and keeps the timers' period at the
// effective (adaptive) interval. The period changes only when the interval moved by a
// quarter or more.
static void maintain_cpu_timers(worker_state *state) {
  if (state->cpu_timers->num_entries == 0) return;
  st_foreach(state->cpu_timers, delete_timer_entry, true);
  int64_t wanted = (int64_t) atomic_load(&state->effective_interval_ns);
  int64_t current = state->cpu_timers_period_ns;
  if (wanted > current + current / 4 || wanted < current - current / 4) {
    state->cpu_timers_period_ns = wanted;
    st_foreach(state->cpu_timers, rearm_timer_entry, (st_data_t) state);
  }
}

static void arm_visited_thread(VALUE thread, void *data) {
  worker_state *state = data;
  if (thread != state->worker_thread) arm_cpu_timer(state, thread);
}
static void arm_cpu_timers_for_all_threads(worker_state *state) {
  if (state->use_cpu_timers) contprof_vm_each_thread(arm_visited_thread, state);
}
#else
#define CPU_TIMERS_BUILT false
static void count_expirations(const siginfo_t *info) {}
static void forget_cpu_timers_after_fork(worker_state *state) {}
#define cpu_time_at_latest_expiry NULL
static void arm_cpu_timer(worker_state *state, VALUE thread) {}
static void delete_cpu_timer(worker_state *state, VALUE thread) {}
static void delete_all_cpu_timers(worker_state *state) {}
static void maintain_cpu_timers(worker_state *state) {}
static void arm_cpu_timers_for_all_threads(worker_state *state) {}
#endif

// ---------------------------------------------------------------------------------------
// The watchdog
//
// While CPU timers drive the rounds, the worker thread is only needed when they stop
// coming (every thread went idle, or runs native code without the GVL). Waking it up
// to check costs more than it seems on a virtual machine: a thread that slept is charged
// the hypervisor's resumption of the idle virtual CPU, 10-16 us after 10 ms of sleep and
// 75-170 us after 1 s (bench/wakeup_floor.c prints both): checking back every 8
// intervals cost ~0.05% of a core, as much as the sampling.
// So the worker blocks on a timerfd instead, and the rounds themselves keep moving its
// deadline on: it fires only when no round came for 8 to WATCHDOG_INTERVALS intervals. A
// round moves it only when fewer than half of those are left, so a busy thread pays one
// timerfd_settime (a system call, ~1.5 us here) every 8 rounds, and the worker thread
// never wakes. (With 8 intervals, one every 4 rounds made a round cost as much as a
// stackprof sample: bench/sample_cost.rb.) The price: after the busy threads go idle,
// up to WATCHDOG_INTERVALS intervals pass before the worker samples the sleepers; their
// values stay exact (deltas), only that stretch is seen at a coarser resolution.
// Waking it on purpose (stop, kill, a failure) arms the timerfd for a time in the past.
#define WATCHDOG_INTERVALS 16

// In a forked child, the parent's timerfd (shared across fork: arming it would move the
// parent's deadline) is dropped: its loop is not in this process.
static void forget_inherited_watchdog(worker_state *state) {
  if (state->watchdog_fd < 0 || state->watchdog_pid == getpid()) return;
  close(state->watchdog_fd); // the child's copy only
  state->watchdog_fd = -1;
}

// Each run's loop makes its own timerfd and closes it when it ends (a loop of an earlier
// run may still be ending when the next one starts: sharing one would let either steal
// the other's expiry). The state holds the current run's, for the rounds and wakeups.
#ifdef CONTPROF_HAVE_TIMERFD
// A timerfd for a new run (holding the GVL), or -1: the loop then waits on its condition
// variable, checking back periodically.
static int open_watchdog(worker_state *state) {
  forget_inherited_watchdog(state);
  if (!state->use_cpu_timers || !CPU_TIMERS_BUILT) return -1;
  int fd = timerfd_create(CLOCK_MONOTONIC, TFD_CLOEXEC);
  state->watchdog_fd = fd;
  state->watchdog_pid = getpid();
  state->watchdog_used = fd >= 0;
  return fd;
}

// When a run's loop ends (holding the GVL).
static void close_watchdog(worker_state *state, int fd) {
  if (fd < 0) return;
  if (state->watchdog_fd == fd) state->watchdog_fd = -1;
  close(fd);
}

// Arms `fd` to fire at `deadline_ns` (CLOCK_MONOTONIC; 1 fires at once). Setting it also
// clears an expiry not read yet.
static void arm_watchdog_fd(int fd, int64_t deadline_ns) {
  if (deadline_ns < 1) deadline_ns = 1;
  struct itimerspec at = {.it_value = contprof_ns_timespec(deadline_ns)};
  timerfd_settime(fd, TFD_TIMER_ABSTIME, &at, NULL);
}

// Blocks until `fd` fires; false when it cannot be read.
static bool wait_for_watchdog(int fd) {
  uint64_t expirations;
  for (;;) {
    if (read(fd, &expirations, sizeof(expirations)) == (ssize_t) sizeof(expirations)) return true;
    if (errno != EINTR) return false;
  }
}
#else
static int open_watchdog(worker_state *state) { return -1; }
static void close_watchdog(worker_state *state, int fd) {}
static void arm_watchdog_fd(int fd, int64_t deadline_ns) {}
static bool wait_for_watchdog(int fd) { return false; }
#endif

// Arms a run's watchdog `fd` (none: -1) and notes its deadline for push_watchdog.
static void arm_watchdog(worker_state *state, int fd, int64_t deadline_ns) {
  if (fd < 0) return;
  atomic_store(&state->watchdog_deadline_ns, deadline_ns);
  arm_watchdog_fd(fd, deadline_ns);
}

// After a round started by a CPU timer: moves the watchdog on (see above).
static void push_watchdog(worker_state *state) {
  if (state->watchdog_fd < 0 || !atomic_load(&state->should_run)) return;
  int64_t wait = (int64_t) atomic_load(&state->effective_interval_ns);
  int64_t now = contprof_monotonic_ns();
  if (atomic_load(&state->watchdog_deadline_ns) - now >= wait * (WATCHDOG_INTERVALS / 2)) return;
  arm_watchdog(state, state->watchdog_fd, now + wait * WATCHDOG_INTERVALS);
  atomic_fetch_add(&state->watchdog_pushes, 1);
}

// ---------------------------------------------------------------------------------------
// Sampling (holding the GVL)

static void wake_trigger_loop(void *data);

static void record_failure(worker_state *state, VALUE exception) {
  if (NIL_P(state->failure)) state->failure = exception;
  atomic_store(&state->should_run, false);
  wake_trigger_loop(state);
}

// Testing: makes the next sampling round raise, to exercise failure handling.
static bool fail_next_sample;

typedef struct {
  worker_state *state;
  bool final_round;
} sampling_call;

static VALUE sample_all_threads(VALUE data) {
  sampling_call *call = (sampling_call *) data;
  worker_state *state = call->state;
  if (fail_next_sample) {
    fail_next_sample = false;
    rb_raise(rb_eRuntimeError, "injected sampling failure (testing)");
  }
  pprof_error error;
  pprof_status status =
    contprof_cpu_and_wall_time_sample(state->collector, call->final_round, cpu_time_at_latest_expiry, &error);
  if (status != PPROF_OK) {
    atomic_fetch_add(&state->sampling_errors, 1);
    // Out of memory or an internal limit: give up (the worker re-raises it). A dead thread
    // or a dropped sample is not worth stopping for.
    if (status == PPROF_ERR_NO_MEMORY || status == PPROF_ERR_LIMIT) {
      contprof_raise_pprof_error(status, &error, "CpuAndWallTimeWorker sampling failed");
    }
  }
  return Qnil;
}

static void update_sampling_time(worker_state *state, uint64_t elapsed) {
  atomic_fetch_add(&state->sampling_ns_total, elapsed);
  uint_fast64_t max = atomic_load(&state->sampling_ns_max);
  while (elapsed > max && !atomic_compare_exchange_weak(&state->sampling_ns_max, &max, elapsed)) {
  }
  uint_fast64_t average = atomic_load(&state->sampling_ns_average);
  average = average == 0 ? elapsed : average - average / 8 + elapsed / 8;
  atomic_store(&state->sampling_ns_average, average);
}

// The profiler's cost per round: sampling (on the application's threads) plus the
// trigger loop's own CPU, both as moving averages. The interval is stretched so that this
// cost stays within overhead_target of one core.
static void update_effective_interval(worker_state *state) {
  int64_t interval = state->interval_ns;
  if (state->overhead_target > 0) {
    double cost = (double) atomic_load(&state->sampling_ns_average) + (double) atomic_load(&state->trigger_ns_per_round);
    int64_t needed = (int64_t) (cost / state->overhead_target);
    if (needed > interval) interval = needed;
  }
  atomic_store(&state->effective_interval_ns, (uint_fast64_t) interval);
}

// Samples every thread; must hold the GVL. Never raises.
static void sample_now(worker_state *state, bool final_round) {
  if (!atomic_load(&state->should_run)) return;
  int64_t started = contprof_monotonic_ns();
  int exception_state = 0;
  sampling_call call = {.state = state, .final_round = final_round};
  rb_protect(sample_all_threads, (VALUE) &call, &exception_state);
  if (exception_state) {
    VALUE exception = rb_errinfo();
    rb_set_errinfo(Qnil);
    record_failure(state, exception);
    return;
  }
  atomic_fetch_add(&state->sample_rounds, 1);
  int64_t finished = contprof_monotonic_ns();
  atomic_store(&state->last_round_ns, finished);
  update_sampling_time(state, (uint64_t) (finished - started));
  update_effective_interval(state);
  maintain_cpu_timers(state);
}

static void sample_from_postponed_job(void *unused) {
  (void) unused;
  // The worker may have stopped (or been replaced) since the job was queued.
  worker_state *state = active_worker;
  if (!state) return;
  bool nudged = atomic_load(&state->job_pending); // else a CPU timer's signal queued it
  sample_now(state, false);
  atomic_store(&state->job_pending, false);
  if (!nudged) {
    atomic_fetch_add(&state->timer_rounds, 1);
    push_watchdog(state);
  }
}

// Registers the sampling job. Called by the signal handler on the GVL holder, or (without
// signals) by the worker thread while it holds the GVL's internal lock. Ruby 3.1's
// postponed-job queue is built for signal handlers on the thread that runs the jobs:
// from another thread, a registration racing with a flush in progress could let Ruby
// call the slot's previous job. The job_pending guard means the worker never registers
// while our own job is queued or running, so that only a flush of some other library's
// job at that very moment could overlap, and prime_postponed_job_queue makes the worst that
// overlap can do the re-run of a job that was queued before.
static void register_postponed_job(void) {
  worker_state *state = active_worker;
  int result = rb_postponed_job_register_one(0, sample_from_postponed_job, NULL);
  if (!state) return;
  if (result == 0) {
    atomic_fetch_add(&state->jobs_not_queued, 1);
    atomic_store(&state->job_pending, false);
  }
  if (result == 2) atomic_fetch_add(&state->jobs_already_queued, 1);
}

static void handle_sigprof(int signal_number, siginfo_t *info, void *ucontext) {
  (void) signal_number;
  (void) ucontext;
  int saved_errno = errno;
  worker_state *state = active_worker;
  if (state) {
    bool from_cpu_timer = info && info->si_code == SI_TIMER;
    if (from_cpu_timer) {
      atomic_fetch_add(&state->timer_signals, 1);
      count_expirations(info);
    }
    if (contprof_vm_current_thread_holds_gvl()) {
      register_postponed_job();
    } else {
      // A CPU timer can fire on a thread busy in native code without the GVL: nothing to
      // do, its CPU is counted at the next round. A nudge that missed (the GVL moved on
      // meanwhile) is over: the trigger loop may nudge again.
      atomic_fetch_add(&state->signals_without_gvl_holder, 1);
      if (!from_cpu_timer) atomic_store(&state->job_pending, false);
    }
  }
  errno = saved_errno;
}

static void *sample_with_gvl(void *data) {
  worker_state *state = data;
  atomic_fetch_add(&state->samples_with_gvl_taken, 1);
  sample_now(state, false);
  return NULL;
}

// ---------------------------------------------------------------------------------------
// The trigger loop (worker thread, without the GVL)

// Waits until `deadline_ns` (CLOCK_MONOTONIC; with the watchdog `watchdog_fd`, later if
// rounds move it on) or until woken; returns false when the loop should end.
static bool wait_for_next_sample(worker_state *state, int watchdog_fd, int64_t deadline_ns) {
  bool watched = false;
  if (watchdog_fd >= 0) {
    // Armed before the flags are checked: a wakeup after the check arms it after this.
    arm_watchdog(state, watchdog_fd, deadline_ns);
    pthread_mutex_lock(&state->wakeup_mutex);
    bool wait = !state->wakeup_requested && atomic_load(&state->should_run);
    pthread_mutex_unlock(&state->wakeup_mutex);
    watched = !wait || wait_for_watchdog(watchdog_fd);
  }
  struct timespec deadline = contprof_ns_timespec(deadline_ns);
  pthread_mutex_lock(&state->wakeup_mutex);
  while (!watched && !state->wakeup_requested && atomic_load(&state->should_run)) {
    if (pthread_cond_timedwait(&state->wakeup_cond, &state->wakeup_mutex, &deadline) == ETIMEDOUT) break;
  }
  bool woken = state->wakeup_requested;
  state->wakeup_requested = false;
  pthread_mutex_unlock(&state->wakeup_mutex);
  return !woken && atomic_load(&state->should_run);
}

static int64_t thread_cpu_ns(void) {
  struct timespec cpu;
  if (clock_gettime(CLOCK_THREAD_CPUTIME_ID, &cpu) != 0) return 0;
  return contprof_timespec_ns(cpu);
}

typedef struct {
  worker_state *state;
  uint64_t generation;
  int watchdog_fd; // this run's, or -1
} trigger_call;

// How long a nudge may stay without its sample before it counts as lost.
#define PENDING_GIVE_UP_NS (1000LL * 1000 * 1000)

// Without the watchdog (no timerfd), while CPU timers drive, the worker thread checks
// back after 2, 4, then up to 2^MAX_QUIET_LEVEL intervals. Longer sleeps save less than
// they seem (the charge for resuming an idle virtual CPU grows with the sleep, see "The
// watchdog") and lengthen the unsampled stretch after a program goes idle.
#ifndef MAX_QUIET_LEVEL
#define MAX_QUIET_LEVEL 3
#endif

static bool current_run(worker_state *state, uint64_t generation) {
  return atomic_load(&state->should_run) && atomic_load(&state->run_generation) == generation;
}

static void *trigger_loop(void *data) {
  trigger_call *call = data;
  worker_state *state = call->state;
  // This thread never handles SIGPROF: it only sends it. The mask is restored on the way
  // out: Ruby reuses native threads, and a Ruby thread created later on this one must be
  // able to receive the signal.
  sigset_t sigprof, previous_mask;
  sigemptyset(&sigprof);
  sigaddset(&sigprof, SIGPROF);
  pthread_sigmask(SIG_BLOCK, &sigprof, &previous_mask);

  pthread_mutex_lock(&state->wakeup_mutex);
  state->loop_started = true;
  pthread_cond_broadcast(&state->wakeup_cond);
  pthread_mutex_unlock(&state->wakeup_mutex);

  // Deadlines follow a fixed cadence, so that oversleeping or a slow nudge does not slow
  // the sampling rate down; after a long stall the cadence restarts from now.
  int64_t deadline = contprof_monotonic_ns();
  int64_t loop_cpu_at_start = thread_cpu_ns();
  int64_t trigger_cpu_at_last_check = 0;
  uint64_t rounds_at_last_check = 0;
  unsigned wakeups_since_check = 0;
  // While CPU timers drive the rounds, how many times in a row this loop found a recent
  // round and went back to sleep (each time for twice as long, at most 2^MAX_QUIET_LEVEL
  // intervals).
  unsigned quiet_level = 0;
  bool timers_in_use = state->use_cpu_timers && CPU_TIMERS_BUILT;
  uint64_t timer_rounds_at_last_wakeup = 0;
  for (;;) {
    if (++wakeups_since_check == 16) {
      // Reading this thread's CPU clock is a system call: every 16 wakeups is plenty.
      int64_t cpu = thread_cpu_ns();
      uint64_t rounds = atomic_load(&state->sample_rounds);
      if (trigger_cpu_at_last_check != 0 && rounds > rounds_at_last_check) {
        int64_t per_round = (cpu - trigger_cpu_at_last_check) / (int64_t) (rounds - rounds_at_last_check);
        int64_t average = atomic_load(&state->trigger_ns_per_round);
        atomic_store(&state->trigger_ns_per_round, average == 0 ? per_round : average - average / 4 + per_round / 4);
      }
      trigger_cpu_at_last_check = cpu;
      rounds_at_last_check = rounds;
      wakeups_since_check = 0;
    }
    int64_t wait = (int64_t) atomic_load(&state->effective_interval_ns);
    int64_t now = contprof_monotonic_ns();
    if (quiet_level == 0) {
      deadline += wait;
      if (deadline < now - wait) deadline = now + wait;
    }
    if (!wait_for_next_sample(state, call->watchdog_fd, deadline)) break;
    // (A loop of an earlier run, woken after the next run started, ends here.)
    if (!current_run(state, call->generation)) break;
    atomic_fetch_add(&state->trigger_wakeups, 1);
    if (timers_in_use) {
      now = contprof_monotonic_ns();
      int64_t last_round = atomic_load(&state->last_round_ns);
      // Rounds started by CPU timers, not just their signals: a signal that found no GVL
      // holder (a thread busy in native code) starts nothing, and this loop's own rounds
      // must not pass for timer-driven ones.
      uint64_t timer_rounds = atomic_load(&state->timer_rounds);
      bool timers_drive = timer_rounds != timer_rounds_at_last_wakeup;
      timer_rounds_at_last_wakeup = timer_rounds;
      if (timers_drive && now - last_round < wait) {
        // CPU timers are driving the rounds: check back later (with the watchdog, only
        // once they stop; without it, less often each time).
        if (quiet_level < MAX_QUIET_LEVEL) quiet_level++;
        deadline = last_round + (call->watchdog_fd >= 0 ? wait * WATCHDOG_INTERVALS : wait << quiet_level);
        continue;
      }
      if (quiet_level > 0) deadline = now;
      quiet_level = 0;
    }
    pthread_mutex_lock(&state->nudge_mutex);
    if (!current_run(state, call->generation)) {
      pthread_mutex_unlock(&state->nudge_mutex);
      break;
    }
    int64_t nudge_time = contprof_monotonic_ns();
    if (atomic_exchange(&state->job_pending, true)) {
      // A nudge can be lost: its thread may exit before running the job, or block SIGPROF
      // (a native library's thread). After a while, stop waiting for it.
      bool lost = nudge_time - state->pending_since_ns > PENDING_GIVE_UP_NS;
      if (!lost) {
        pthread_mutex_unlock(&state->nudge_mutex);
        atomic_fetch_add(&state->nudges_skipped, 1);
        continue;
      }
      atomic_fetch_add(&state->nudges_lost, 1);
    }
    state->pending_since_ns = nudge_time;
    int nudged = contprof_vm_nudge_gvl_owner(state->use_signals ? SIGPROF : 0, register_postponed_job);
    pthread_mutex_unlock(&state->nudge_mutex);
    if (nudged > 0) {
      atomic_fetch_add(state->use_signals ? &state->signals_sent : &state->interrupts_raised, 1);
    } else {
      atomic_store(&state->job_pending, false);
      // Nobody holds the GVL: every thread is blocked or asleep. Take it and sample.
      if (nudged == 0) rb_thread_call_with_gvl(sample_with_gvl, state);
    }
  }
  // Added, not stored: Ruby reuses native threads, and a worker restarted on this one
  // starts from the CPU its earlier uses left on its clock.
  atomic_fetch_add(&state->trigger_thread_cpu_ns, (uint_fast64_t) (thread_cpu_ns() - loop_cpu_at_start));
  pthread_sigmask(SIG_SETMASK, &previous_mask, NULL);
  return NULL;
}

static void *wait_for_loop_start(void *data) {
  worker_state *state = data;
  struct timespec deadline;
  clock_gettime(CLOCK_MONOTONIC, &deadline);
  deadline.tv_sec += 5;
  pthread_mutex_lock(&state->wakeup_mutex);
  while (!state->loop_started && !state->wakeup_requested) {
    if (pthread_cond_timedwait(&state->wakeup_cond, &state->wakeup_mutex, &deadline) == ETIMEDOUT) break;
  }
  pthread_mutex_unlock(&state->wakeup_mutex);
  return NULL;
}

static void request_wakeup(worker_state *state) {
  pthread_mutex_lock(&state->wakeup_mutex);
  state->wakeup_requested = true;
  pthread_cond_signal(&state->wakeup_cond);
  pthread_mutex_unlock(&state->wakeup_mutex);
}

// Wakes the current run's trigger loop (stop, a failure; holding the GVL).
static void wake_trigger_loop(void *data) {
  worker_state *state = data;
  request_wakeup(state);
  arm_watchdog(state, state->watchdog_fd, 1);
}

// Wakes one run's trigger loop: Ruby calls this to interrupt its worker thread (kill,
// VM shutdown), whichever run is current.
static void wake_loop_of_call(void *data) {
  trigger_call *call = data;
  request_wakeup(call->state);
  arm_watchdog(call->state, call->watchdog_fd, 1);
}

static VALUE run_trigger_loop(VALUE data) {
  trigger_call *call = (trigger_call *) data;
  while (current_run(call->state, call->generation)) {
    // Interrupts (Thread#kill, VM shutdown) wake the loop; Ruby then handles them here.
    rb_thread_call_without_gvl(trigger_loop, call, wake_loop_of_call, call);
  }
  return Qnil;
}

static VALUE close_watchdog_of_call(VALUE data) {
  trigger_call *call = (trigger_call *) data;
  close_watchdog(call->state, call->watchdog_fd);
  return Qnil;
}

// _native_sampling_loop: runs on the worker thread until stopped; returns the failure
// (an exception) if sampling failed, else nil.
static VALUE worker_native_sampling_loop(VALUE self) {
  worker_state *state = state_of(self);
  trigger_call call = {.state = state, .generation = atomic_load(&state->run_generation), .watchdog_fd = -1};
  state->worker_thread = rb_thread_current();
  contprof_cpu_and_wall_time_ignore_thread(state->collector, state->worker_thread);
  delete_cpu_timer(state, state->worker_thread); // armed by the thread-begin hook
  if (current_run(state, call.generation)) call.watchdog_fd = open_watchdog(state);
  // The timerfd is closed however the loop ends (Thread#kill raises out of it).
  rb_ensure(run_trigger_loop, (VALUE) &call, close_watchdog_of_call, (VALUE) &call);
  return atomic_load(&state->run_generation) == call.generation ? state->failure : Qnil;
}

static VALUE worker_native_generation(VALUE self) {
  return ULL2NUM(atomic_load(&state_of(self)->run_generation));
}

// ---------------------------------------------------------------------------------------
// Starting and stopping (holding the GVL)

static void on_thread_event(rb_event_flag_t event, VALUE data, VALUE self, ID mid, VALUE klass) {
  worker_state *state = active_worker;
  if (!state || !atomic_load(&state->should_run)) return;
  VALUE thread = rb_thread_current();
  if (thread == state->worker_thread) return;
  if (event == RUBY_EVENT_THREAD_BEGIN) {
    contprof_cpu_and_wall_time_on_thread_begin(state->collector, thread);
    arm_cpu_timer(state, thread);
  } else {
    delete_cpu_timer(state, thread);
    pprof_error error;
    if (contprof_cpu_and_wall_time_on_thread_end(state->collector, thread, &error) != PPROF_OK) {
      atomic_fetch_add(&state->sampling_errors, 1);
    }
  }
}

// Ruby 3.1 publishes a postponed job by first claiming its slot (moving the queue's index)
// and only then writing the slot's function, and its queue starts out as uninitialised
// malloc memory. A flush overlapping a registration made from another thread (signals off,
// see register_postponed_job) could therefore call a slot nobody ever wrote: a jump into
// garbage. Writing every ordinary slot once, with a job that does nothing, closes that
// worst case: an overlap can then at most run a function that was really queued there
// before. Done once per process (forked children inherit the queue), holding the GVL, from
// the thread that will run the flush: the same context a signal handler registers from.
#define POSTPONED_JOB_SLOTS 1000 // MAX_POSTPONED_JOB in Ruby 3.1's vm_trace.c
static void do_nothing_job(void *unused) { (void) unused; }
static bool postponed_job_queue_primed;
static void prime_postponed_job_queue(void) {
  if (postponed_job_queue_primed) return;
  for (int i = 0; i < POSTPONED_JOB_SLOTS; i++) {
    if (rb_postponed_job_register(0, do_nothing_job, NULL) == 0) break; // full: every slot written
  }
  postponed_job_queue_primed = true;
}

static const char *describe_handler(const struct sigaction *action) {
  if (action->sa_flags & SA_SIGINFO) return action->sa_sigaction == handle_sigprof ? "contprof" : "another handler";
  if (action->sa_handler == SIG_DFL) return "default";
  if (action->sa_handler == SIG_IGN) return "ignored";
  return "another handler";
}

// _native_prepare_start: installs the signal handler and event hooks, and makes this
// worker the active one. The Ruby side then starts the worker thread.
static VALUE worker_native_prepare_start(VALUE self) {
  worker_state *state = state_of(self);
  if (NIL_P(state->collector)) rb_raise(contprof_error_class, "this worker was not initialized");
  if (active_worker && active_worker != state) {
    rb_raise(contprof_error_class, "another CpuAndWallTimeWorker is running; stop it first (one per process)");
  }
  prime_postponed_job_queue();
  if (state->use_signals) {
    struct sigaction current;
    if (sigaction(SIGPROF, NULL, &current) != 0) rb_sys_fail("sigaction(SIGPROF)");
    bool foreign = (current.sa_flags & SA_SIGINFO) ? current.sa_sigaction != handle_sigprof
                                                   : (current.sa_handler != SIG_DFL && current.sa_handler != SIG_IGN);
    if (foreign) {
      rb_raise(contprof_error_class,
               "cannot start: a SIGPROF handler is already installed (%s; another profiler such as stackprof, or "
               "the application's own). Stop it first, or start Contprof with signals: false",
               describe_handler(&current));
    }
    struct sigaction action;
    memset(&action, 0, sizeof(action));
    action.sa_sigaction = handle_sigprof;
    action.sa_flags = SA_SIGINFO | SA_RESTART;
    sigemptyset(&action.sa_mask);
    if (sigaction(SIGPROF, &action, &state->previous_action) != 0) rb_sys_fail("sigaction(SIGPROF)");
    state->signal_handler_installed = true;
  }
  state->failure = Qnil;
  state->worker_thread = Qnil;
  state->wakeup_requested = false;
  state->loop_started = false;
  atomic_store(&state->job_pending, false);
  forget_inherited_watchdog(state);
  // Every thread's clocks start now, so the first samples cover the time from here.
  contprof_cpu_and_wall_time_start_clocks(state->collector);
  atomic_fetch_add(&state->run_generation, 1);
  atomic_store(&state->should_run, true);
  active_worker = state;
  active_worker_object = self;
  rb_add_event_hook(on_thread_event, RUBY_EVENT_THREAD_BEGIN | RUBY_EVENT_THREAD_END, Qnil);
  arm_cpu_timers_for_all_threads(state); // after the hook: a thread born meanwhile is armed once
  return self;
}

// Ends nudging: returns once no nudge is in flight (one in progress finishes in
// microseconds), and the trigger loop sends no more.
static void stop_nudging(worker_state *state) {
  atomic_store(&state->should_run, false);
  pthread_mutex_lock(&state->nudge_mutex);
  pthread_mutex_unlock(&state->nudge_mutex);
}

// _native_request_stop: ends the trigger loop's nudging, and returns once no nudge is in
// flight. It does not wait for the worker thread: that thread needs the GVL to finish,
// and behind busy application threads each GVL handoff can take a time slice per thread
// (100 ms each), which would make stopping slow exactly when the application exits.
static VALUE worker_native_request_stop(VALUE self) {
  worker_state *state = state_of(self);
  stop_nudging(state);
  delete_all_cpu_timers(state);
  wake_trigger_loop(state);
  return self;
}

// _native_finish_stop(generation): removes hooks and the signal handler, if `generation`
// is still the current run (a worker thread from an earlier run ending late does nothing).
static VALUE worker_native_finish_stop(VALUE self, VALUE generation) {
  worker_state *state = state_of(self);
  if (NUM2ULL(generation) != atomic_load(&state->run_generation)) return self;
  stop_nudging(state); // no signal in flight from here on
  delete_all_cpu_timers(state);
  if (active_worker == state) {
    rb_remove_event_hook(on_thread_event);
    active_worker = NULL;
    active_worker_object = Qnil;
  }
  if (state->signal_handler_installed) {
    // No more signals can be sent (should_run is off and no nudge is in flight). SIG_IGN
    // discards any SIGPROF still pending anywhere in the process; then restore what was there.
    struct sigaction ignore;
    memset(&ignore, 0, sizeof(ignore));
    ignore.sa_handler = SIG_IGN;
    sigemptyset(&ignore.sa_mask);
    sigaction(SIGPROF, &ignore, NULL);
    sigaction(SIGPROF, &state->previous_action, NULL);
    state->signal_handler_installed = false;
  }
  state->worker_thread = Qnil;
  return self;
}

// In a forked child: the worker thread did not survive the fork. Reset the state so
// that the Ruby side can start a fresh worker thread.
static VALUE worker_native_reset_after_fork(VALUE self) {
  worker_state *state = state_of(self);
  init_wakeup(state); // the mutex may have been held by the parent's worker thread
  state->wakeup_requested = false;
  state->loop_started = false;
  state->worker_thread = Qnil;
  atomic_store(&state->job_pending, false);
  atomic_store(&state->last_round_ns, 0);
#define RESET_COUNTER(name) atomic_store(&state->name, 0);
  WORKER_COUNTERS(RESET_COUNTER)
#undef RESET_COUNTER
  contprof_cpu_and_wall_time_reset(state->collector);
  // The child inherited none of the parent's timers: forget them and arm new ones.
  forget_cpu_timers_after_fork(state);
  if (atomic_load(&state->should_run)) arm_cpu_timers_for_all_threads(state);
  forget_inherited_watchdog(state); // the parent's; the child's loop makes its own
  return self;
}

static VALUE worker_native_stats(VALUE self) {
  worker_state *state = state_of(self);
  VALUE stats = rb_hash_new();
#define STAT(name) rb_hash_aset(stats, ID2SYM(rb_intern(#name)), ULL2NUM(atomic_load(&state->name)));
  WORKER_COUNTERS(STAT)
  STAT(effective_interval_ns)
#undef STAT
  rb_hash_aset(stats, ID2SYM(rb_intern("cpu_timers_live")), SIZET2NUM(state->cpu_timers->num_entries));
  rb_hash_aset(stats, ID2SYM(rb_intern("cpu_timers_period_ns")), LL2NUM(state->cpu_timers_period_ns));
  rb_hash_aset(stats, ID2SYM(rb_intern("watchdog")), state->watchdog_used ? Qtrue : Qfalse);
  return stats;
}

// _native_wait_until_started: returns once the trigger loop runs. Without it, a new
// worker thread could wait up to a whole GVL time slice (100 ms) behind a busy thread
// before its first sample.
static VALUE worker_native_wait_until_started(VALUE self) {
  rb_thread_call_without_gvl(wait_for_loop_start, state_of(self), wake_trigger_loop, state_of(self));
  return self;
}

// _native_sample_now: one sampling round from the calling thread (used at stop, so that
// the time since the last round is not lost).
static VALUE worker_native_sample_now(VALUE self) {
  worker_state *state = state_of(self);
  if (NIL_P(state->collector)) return self;
  atomic_store(&state->should_run, true);
  sample_now(state, true);
  atomic_store(&state->should_run, false);
  return self;
}

static VALUE worker_native_failure(VALUE self) { return state_of(self)->failure; }
static VALUE worker_native_active_p(VALUE self) { return active_worker == state_of(self) ? Qtrue : Qfalse; }
static VALUE worker_native_sampling_p(VALUE self) {
  worker_state *state = state_of(self);
  return active_worker == state && atomic_load(&state->should_run) ? Qtrue : Qfalse;
}

static VALUE testing_fail_next_sample(VALUE module) {
  fail_next_sample = true;
  return Qnil;
}

// Testing: queues a sampling round on the calling thread, as a CPU timer's signal would,
// then yields: the round runs at the first interrupt check inside the block. Returns the
// block's value.
static VALUE testing_queue_sampling_job(VALUE module) {
  if (!active_worker) rb_raise(contprof_error_class, "no worker is running");
  atomic_store(&active_worker->job_pending, true);
  register_postponed_job();
  return rb_yield(Qnil);
}

// Testing (and bench/sample_cost.rb): one round exactly as the calling thread's CPU timer
// would start it (its expiry counted, then the sampling job), without the kernel's part.
// The expiry it counts never happened, so the CPU times it records run ahead of the
// thread's clock: for measuring the cost of a round, not its values. Needs a running
// worker with CPU timers; returns false without them.
static VALUE testing_timer_round(VALUE module) {
  worker_state *state = active_worker;
  if (!state) rb_raise(contprof_error_class, "no worker is running");
#ifdef CONTPROF_HAVE_CPU_TIMERS
  st_data_t slot;
  if (!st_lookup(state->cpu_timers, (st_data_t) rb_thread_current(), &slot)) return Qfalse;
  atomic_fetch_add(&cpu_timer_slots[slot], 1);
  sample_from_postponed_job(NULL);
  return Qtrue;
#else
  return Qfalse;
#endif
}

void contprof_collectors_cpu_and_wall_time_worker_init(VALUE contprof_module) {
  VALUE collectors = rb_define_module_under(contprof_module, "Collectors");
  VALUE klass = rb_define_class_under(collectors, "CpuAndWallTimeWorker", rb_cObject);
  rb_define_alloc_func(klass, worker_alloc);
  rb_define_private_method(klass, "_native_initialize", worker_native_initialize, 5);
  rb_define_private_method(klass, "_native_prepare_start", worker_native_prepare_start, 0);
  rb_define_private_method(klass, "_native_sampling_loop", worker_native_sampling_loop, 0);
  rb_define_private_method(klass, "_native_request_stop", worker_native_request_stop, 0);
  rb_define_private_method(klass, "_native_finish_stop", worker_native_finish_stop, 1);
  rb_define_private_method(klass, "_native_generation", worker_native_generation, 0);
  rb_define_private_method(klass, "_native_reset_after_fork", worker_native_reset_after_fork, 0);
  rb_define_private_method(klass, "_native_stats", worker_native_stats, 0);
  rb_define_private_method(klass, "_native_failure", worker_native_failure, 0);
  rb_define_private_method(klass, "_native_wait_until_started", worker_native_wait_until_started, 0);
  rb_define_private_method(klass, "_native_sample_now", worker_native_sample_now, 0);
  rb_define_private_method(klass, "_native_active?", worker_native_active_p, 0);
  rb_define_private_method(klass, "_native_sampling?", worker_native_sampling_p, 0);
  rb_global_variable(&active_worker_object);
  VALUE testing = rb_define_module_under(klass, "Testing");
  rb_define_singleton_method(testing, "fail_next_sample", testing_fail_next_sample, 0);
  rb_define_singleton_method(testing, "queue_sampling_job", testing_queue_sampling_job, 0);
  rb_define_singleton_method(testing, "timer_round", testing_timer_round, 0);
}
