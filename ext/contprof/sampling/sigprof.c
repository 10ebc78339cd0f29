// SIGPROF's disposition while the worker runs (see worker.h): Contprof's handler, used by
// CPU timers (and the clock, under M:N threads: rounds.c), installed at start, given up
// when the application takes SIGPROF, and the previous disposition restored at stop.
//
// The worker refuses to install its handler over another one (another profiler, or the
// application's own). The handler uses SA_RESTART, saves errno and does nothing but
// async-signal-safe work; the clock's thread blocks SIGPROF. At stop, once no timer can
// signal any more, SIGPROF is set to SIG_IGN, which discards any signal still pending, and
// the previous disposition comes back: a stopped profiler never leaves a SIGPROF behind
// to kill an exec'd program.
#include <errno.h>
#include <string.h>

#include "ruby_helpers.h"
#include "sampling/worker.h"

#define REARM_EVERY_WALL_ROUNDS 32

// SIGPROF's disposition before Contprof installed its handler. One per process, as the
// handler is.
static struct sigaction disposition_before_contprof;

// What a CPU timer's signal is handed to (the sampling job's side: rounds.c). CPU timers
// send SIGPROF, and the wall clock to a GVL holder under M:N threads (rounds.c); anything
// else (a stray kill -PROF) is the receiver's to ignore.
static void (*_Atomic on_timer_signal)(const siginfo_t *info);

static void handle_sigprof(int CONTPROF_UNUSED signal_number, siginfo_t *info, CONTPROF_UNUSED void *ucontext) {
  int saved_errno = errno;
  void (*receiver)(const siginfo_t *) = atomic_load(&on_timer_signal);
  if (receiver && info) receiver(info);
  errno = saved_errno;
}

static bool is_ours(const struct sigaction *action) {
  return (action->sa_flags & SA_SIGINFO) && action->sa_sigaction == handle_sigprof;
}

static bool ours_is_installed(void) {
  struct sigaction current;
  return sigaction(SIGPROF, NULL, &current) == 0 && is_ours(&current);
}

static const char *describe(const struct sigaction *action) {
  if (is_ours(action)) return "contprof";
  if (action->sa_flags & SA_SIGINFO) return "another handler";
  if (action->sa_handler == SIG_DFL) return "default";
  if (action->sa_handler == SIG_IGN) return "ignored";
  return "another handler";
}

// What was there is kept for contprof_sigprof_restore, unless it is Contprof's own (left
// by a start that failed half-way): then what was there before it.
void contprof_sigprof_install(worker_state *state, void (*receiver)(const siginfo_t *info)) {
  atomic_store(&on_timer_signal, receiver);
  struct sigaction current;
  if (sigaction(SIGPROF, NULL, &current) != 0) rb_sys_fail("sigaction(SIGPROF)");
  bool ours = is_ours(&current);
  bool foreign = !ours && ((current.sa_flags & SA_SIGINFO) || (current.sa_handler != SIG_DFL && current.sa_handler != SIG_IGN));
  if (foreign) {
    rb_raise(contprof_error_class,
             "cannot start: a SIGPROF handler is already installed (%s; another profiler such as stackprof, or "
             "the application's own). Stop it first, or start Contprof with cpu_timers: false (no signals)",
             describe(&current));
  }
  struct sigaction action;
  memset(&action, 0, sizeof(action));
  action.sa_sigaction = handle_sigprof;
  action.sa_flags = SA_SIGINFO | SA_RESTART;
  sigemptyset(&action.sa_mask);
  if (sigaction(SIGPROF, &action, ours ? NULL : &disposition_before_contprof) != 0) rb_sys_fail("sigaction(SIGPROF)");
  state->signal_handler_installed = true;
  atomic_store(&state->wall_signals_allowed, true);
}

void contprof_sigprof_restore(worker_state *state) {
  // The clock sends its signals holding tick_mutex: none is sent after this. (Not checked
  // with contprof_pthread_ok, which rounds.c defines and rounds.c calls this file: a lock
  // that failed still clears the flag.)
  bool locked = pthread_mutex_lock(&state->tick_mutex) == 0;
  atomic_store(&state->wall_signals_allowed, false);
  if (locked) pthread_mutex_unlock(&state->tick_mutex);
  if (state->signal_handler_installed && ours_is_installed()) {
    struct sigaction ignore;
    memset(&ignore, 0, sizeof(ignore));
    ignore.sa_handler = SIG_IGN;
    sigemptyset(&ignore.sa_mask);
    sigaction(SIGPROF, &ignore, NULL);
    sigaction(SIGPROF, &disposition_before_contprof, NULL);
  }
  state->signal_handler_installed = false;
}

// No timer sends a signal after this; while SIGPROF is still ours, SIG_IGN discards the
// signals already pending, and the disposition from before the start comes back, for the
// application to replace.
void contprof_sigprof_give_up(worker_state *state, const char *reason) {
  if (!state->use_cpu_timers) return;
  state->use_cpu_timers = false;
  state->cpu_timers_given_up = reason;
  contprof_cpu_timers_delete_all(&state->timers);
  contprof_sigprof_restore(state);
}

void contprof_sigprof_maintain_timers(worker_state *state) {
  if (!state->use_cpu_timers) return;
  if (state->signal_handler_installed && !ours_is_installed()) {
    contprof_sigprof_give_up(state, "SIGPROF's handler was replaced by code outside Ruby");
    return;
  }
  // Threads seen without a timer (their kernel thread was not known yet) get one once it
  // is, tried every few rounds (arming one that still cannot be costs little, but a
  // refused timer_create would be tried at every round).
  // (A thread counts as without one when two such tries in a row met it: a thread just
  // born gets its timer from its begin hook a moment after a round may have seen it.)
  uint64_t unarmed = state->timers.unarmed_seen;
  if (unarmed == 0) state->threads_without_timer = state->unarmed_at_last_try = 0;
  if (unarmed > 0 && ++state->rounds_since_arming >= REARM_EVERY_WALL_ROUNDS) {
    state->threads_without_timer = unarmed < state->unarmed_at_last_try ? unarmed : state->unarmed_at_last_try;
    state->unarmed_at_last_try = unarmed;
    state->rounds_since_arming = 0;
    contprof_cpu_timers_arm_all(&state->timers, state->worker_thread);
  }
  if (contprof_cpu_timers_live(&state->timers) == 0) return;
  contprof_cpu_timers_delete_dead(&state->timers);
  int64_t wanted = atomic_load(&state->clock.effective_interval_ns);
  int64_t current = state->timers.period_ns;
  if (wanted > current + current / 4 || wanted < current - current / 4) {
    contprof_cpu_timers_set_period(&state->timers, wanted);
  }
}
