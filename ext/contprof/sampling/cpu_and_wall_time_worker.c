// Contprof::Collectors::CpuAndWallTimeWorker: decides when to sample, and makes sure every
// sample is taken by a thread holding the GVL, the only safe place to read threads'
// stacks.
//
// ## Two clocks, one for each kind of time
//
// - **Wall time** is sampled on the worker thread's clock (wall_clock.c): every interval,
//   whatever the threads do, it asks the thread holding the GVL for a *wall round*
//   (through the VM's thread-safe job queue: no signal), or takes the GVL itself when
//   nobody holds it, and the round records every thread's wall time since its previous
//   one at the stack it has then. Instants independent of the threads are what makes wall
//   time unbiased: a thread that computes for 1 ms and sleeps for 2 ms is found asleep two
//   times in three.
// - **CPU time** is sampled on each thread's own CPU clock (cpu_timers.c): when a thread
//   has used one interval of CPU, its timer's SIGPROF lands on it right where it burns
//   that CPU, and a *CPU round* of that thread alone records it there. A thread in native
//   code without the GVL cannot run the round: its signal handler captures its stack, and
//   the next round records the CPU with it. Without timers (cpu_timers: false, or a
//   kernel that refuses them) a thread's CPU is read from its clock at wall rounds
//   instead, which places it less exactly (see collectors_cpu_and_wall_time.c).
// - **GC time** is read, not hooked: the signal handler and the wall clock note whether
//   the thread holding the GVL is inside a GC (and in which phase), and the GC's own clock
//   says how much GC time there was (see collectors_cpu_and_wall_time.c). No GC event is
//   subscribed to: on Ruby 3.1 any GC event hook slows every allocation.
//
// All three run as the same postponed job (contprof_worker_job) on a thread holding the
// GVL: a wall round when one was asked for, else a CPU round of the thread it runs on.
// Exceptions are caught there (the application
// never sees them), stored, and re-raised on the worker thread, which then stops.
//
// ## Signals, exec and fork
//
// SIGPROF is used by CPU timers only. The worker refuses to start them when another
// SIGPROF handler is installed (another profiler, or the application's own). Its handler
// uses SA_RESTART, saves errno and does nothing but async-signal-safe work; the worker
// thread blocks SIGPROF. Timers are deleted at stop (and at each thread's end); then
// SIGPROF is set to SIG_IGN, which discards any signal still pending, and the previous
// disposition comes back: a stopped profiler never leaves a SIGPROF behind to kill an
// exec'd program. The Ruby side stops the worker before exec and restarts it in forked
// children; a child inherits no timers, so it forgets the parent's and arms its own.
#include <errno.h>
#include <ruby.h>
#include <ruby/debug.h>
#include <ruby/thread.h>
#include <string.h>

#include "collectors/thread_context.h"
#include "pprof/pprof_util.h"
#include "ruby_helpers.h"
#include "sampling/worker.h"
#include "vm/vm.h"

// The running worker. There is one SIGPROF handler per process, so one running worker.
// Atomic: the signal handler reads it.
static _Atomic(worker_state *) active_worker;
static VALUE active_worker_object = Qnil;

// Testing: makes the next sampling round raise, to exercise failure handling.
static bool fail_next_sample;
// Testing: whether sampling was on (should_run) when the latest final round ran.
static bool final_round_saw_sampling;

static void worker_mark(void *data) {
  worker_state *state = data;
  rb_gc_mark(state->collector);
  rb_gc_mark(state->failure);
  rb_gc_mark(state->worker_thread);
  contprof_cpu_timers_mark(&state->timers);
}

static void worker_free(void *data) {
  worker_state *state = data;
  contprof_cpu_timers_free(&state->timers);
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

static void init_locks(worker_state *state) {
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
  atomic_store(&state->gc_thread_at_tick, (uintptr_t) Qnil);
  init_locks(state);
  contprof_cpu_timers_init(&state->timers, 0, 0); // period and depth: see _native_initialize
  return TypedData_Wrap_Struct(klass, &worker_type, state);
}

static worker_state *state_of(VALUE self) { return rb_check_typeddata(self, &worker_type); }

// _native_initialize(collector, interval_seconds, overhead_target, cpu_timers, max_frames):
// cpu_timers is false, true (perf events where allowed, else POSIX timers) or :posix.
static VALUE worker_native_initialize(VALUE self, VALUE collector, VALUE interval, VALUE overhead_target,
                                      VALUE cpu_timers, VALUE max_frames) {
  worker_state *state = state_of(self);
  state->collector = contprof_enforce_thread_context(collector);
  state->interval_ns = (int64_t) (NUM2DBL(interval) * 1e9);
  state->cpu_timers_wanted = state->use_cpu_timers = RTEST(cpu_timers) && contprof_cpu_timers_built();
  state->timer_kind = SYMBOL_P(cpu_timers) ? CONTPROF_CPU_TIMER_POSIX : CONTPROF_CPU_TIMER_AUTO;
  state->overhead_target = NUM2DBL(overhead_target);
  atomic_store(&state->effective_interval_ns, state->interval_ns);
  state->timers.period_ns = state->interval_ns;
  state->timers.capture_frames = NUM2LONG(max_frames);
  return self;
}

// ---------------------------------------------------------------------------------------
// The sampling job (holding the GVL)

static void record_failure(worker_state *state, VALUE exception) {
  if (NIL_P(state->failure)) state->failure = exception;
  atomic_store(&state->should_run, false);
  contprof_wall_clock_wake(state);
}

typedef struct {
  worker_state *state;
  contprof_round round;
} round_call;

static VALUE take_round(VALUE data) {
  round_call *call = (round_call *) data;
  worker_state *state = call->state;
  if (fail_next_sample) {
    fail_next_sample = false;
    rb_raise(rb_eRuntimeError, "injected sampling failure (testing)");
  }
  contprof_cpu_timer_source timers = contprof_cpu_timers_source(&state->timers);
  call->round.timers = state->use_cpu_timers ? &timers : NULL;
  pprof_error error;
  pprof_status status = contprof_thread_context_sample(state->collector, &call->round, &error);
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

static void update_max(atomic_uint_fast64_t *max, uint64_t value) {
  uint_fast64_t seen = atomic_load(max);
  while (value > seen && !atomic_compare_exchange_weak(max, &seen, value)) {
  }
}

// SIGPROF's disposition before Contprof installed its handler. One per process, as the
// handler is.
static struct sigaction disposition_before_contprof;

// SIG_IGN discards any SIGPROF still pending anywhere in the process (a pending SIGPROF
// would kill an exec'd program, or the application once SIG_DFL is back); then the
// disposition from before the start comes back. Only once no timer can signal any more.
static void restore_disposition(void) {
  struct sigaction ignore;
  memset(&ignore, 0, sizeof(ignore));
  ignore.sa_handler = SIG_IGN;
  sigemptyset(&ignore.sa_mask);
  sigaction(SIGPROF, &ignore, NULL);
  sigaction(SIGPROF, &disposition_before_contprof, NULL);
}

static bool our_handler_is_installed(void);
static void give_up_cpu_timers(worker_state *state, const char *reason);

// After a wall round: the dead threads' timers go, and the timers' period follows the
// effective (adaptive) interval when it moved by a quarter or more. When SIGPROF's handler
// is no longer ours (native code installed its own), the timers go for good.
static void maintain_cpu_timers(worker_state *state) {
  if (!state->use_cpu_timers) return;
  if (state->signal_handler_installed && !our_handler_is_installed()) {
    give_up_cpu_timers(state, "SIGPROF's handler was replaced by code outside Ruby");
    return;
  }
  if (contprof_cpu_timers_live(&state->timers) == 0) return;
  contprof_cpu_timers_delete_dead(&state->timers);
  int64_t wanted = atomic_load(&state->effective_interval_ns);
  int64_t current = state->timers.period_ns;
  if (wanted > current + current / 4 || wanted < current - current / 4) {
    contprof_cpu_timers_set_period(&state->timers, wanted);
  }
}

// Takes one round of `kind`; never raises.
static void run_round(worker_state *state, contprof_round_kind kind, VALUE gc_thread, contprof_gc_moment gc_moment) {
  // The final round runs after stop has ended sampling (and must not start it again: the
  // wall clock and the thread hooks would take it up).
  if (kind == CONTPROF_ROUND_FINAL) {
    final_round_saw_sampling = atomic_load(&state->should_run);
  } else if (!atomic_load(&state->should_run)) {
    return;
  }
  int64_t started = contprof_monotonic_ns();
  round_call call = {.state = state,
                     .round = {.kind = kind, .gc_thread_at_tick = gc_thread, .gc_moment_at_tick = gc_moment}};
  int exception_state = 0;
  rb_protect(take_round, (VALUE) &call, &exception_state);
  if (exception_state) {
    VALUE exception = rb_errinfo();
    rb_set_errinfo(Qnil);
    record_failure(state, exception);
    return;
  }
  int64_t elapsed = contprof_monotonic_ns() - started;
  atomic_fetch_add(&state->sample_rounds, 1);
  atomic_fetch_add(kind == CONTPROF_ROUND_CPU ? &state->cpu_rounds : &state->wall_rounds, 1);
  atomic_fetch_add(&state->sampling_ns_total, (uint64_t) elapsed);
  update_max(&state->sampling_ns_max, (uint64_t) elapsed);
  // The round ran on this thread's CPU: the profiler's time, not the application's.
  contprof_thread_context_charge_own_cost(state->collector, rb_thread_current(), elapsed);
  if (kind == CONTPROF_ROUND_WALL) maintain_cpu_timers(state);
}

void contprof_worker_job(void *unused) {
  (void) unused;
  // The worker may have stopped (or been replaced) since the job was queued.
  worker_state *state = atomic_load(&active_worker);
  if (!state) return;
  if (atomic_load(&state->wall_round_requested)) {
    if (rb_thread_current() == state->worker_thread) { // nobody held the GVL: the worker took it
      atomic_fetch_add(&state->samples_with_gvl_taken, 1);
      int64_t delay = contprof_monotonic_ns() - atomic_load(&state->requested_at_ns);
      if (delay > 0) {
        atomic_fetch_add(&state->gvl_taken_delay_ns_total, (uint64_t) delay);
        update_max(&state->gvl_taken_delay_ns_max, (uint64_t) delay);
      }
    }
    VALUE gc_thread = (VALUE) atomic_exchange(&state->gc_thread_at_tick, (uintptr_t) Qnil);
    run_round(state, CONTPROF_ROUND_WALL, gc_thread, atomic_exchange(&state->gc_moment_at_tick, 0));
    atomic_store(&state->wall_round_requested, false);
  } else {
    run_round(state, CONTPROF_ROUND_CPU, Qnil, 0);
  }
}

void *contprof_worker_wall_round_with_gvl(void *data) {
  worker_state *state = data;
  // (The round may have been run meanwhile by a thread that took the GVL first.)
  if (atomic_load(&state->wall_round_requested)) contprof_worker_job(NULL);
  return NULL;
}

// Asks the calling thread, which holds the GVL, to run the sampling job: from the signal
// handler of a CPU timer. (The wall clock, on a thread of its own,
// uses contprof_vm_request_job instead.)
void contprof_worker_register_job(void) {
  worker_state *state = atomic_load(&active_worker);
  int result = contprof_vm_job_trigger_here();
  if (!state) return;
  if (result == 0) atomic_fetch_add(&state->jobs_not_queued, 1);
  if (result == 2) atomic_fetch_add(&state->jobs_already_queued, 1);
}

// SIGPROF: only CPU timers send it (the wall clock never signals). Anything else (a
// stray kill -PROF) is ignored.
static void handle_sigprof(int signal_number, siginfo_t *info, void *ucontext) {
  (void) signal_number;
  (void) ucontext;
  int saved_errno = errno;
  worker_state *state = atomic_load(&active_worker);
  if (state && info) {
    contprof_timer_signal what = contprof_cpu_timers_on_signal(info);
    if (what != CONTPROF_TIMER_NOT_OURS) atomic_fetch_add(&state->timer_signals, 1);
    if (what == CONTPROF_TIMER_ON_GVL_HOLDER) contprof_worker_register_job();
  }
  errno = saved_errno;
}

// ---------------------------------------------------------------------------------------
// The worker thread

static void wake_loop(void *state) { contprof_wall_clock_wake(state); }
static void interrupt_worker(void *call) { contprof_wall_clock_interrupt(call); }

static void wake_clock_of_call(void *call) { contprof_wall_clock_wake(((contprof_wall_clock_call *) call)->state); }

static VALUE answer_the_clock(VALUE data) {
  contprof_wall_clock_call *call = (contprof_wall_clock_call *) data;
  worker_state *state = call->state;
  contprof_wall_clock_worker_begin(call);
  if (call->on_worker_thread) {
    while (contprof_wall_clock_current_run(state, call->generation)) {
      // Interrupts (Thread#kill, VM shutdown) wake the clock; Ruby then handles them here.
      rb_thread_call_without_gvl(contprof_wall_clock_run_here, call, wake_clock_of_call, call);
    }
    return Qnil;
  }
  while (contprof_wall_clock_current_run(state, call->generation) && !contprof_wall_clock_ended(call)) {
    // Interrupts (Thread#kill, VM shutdown) end the wait; Ruby then handles them here.
    rb_thread_call_without_gvl(contprof_wall_clock_wait_for_gvl_round, call, interrupt_worker, call);
    if (contprof_wall_clock_take_gvl_round(call)) contprof_worker_wall_round_with_gvl(state);
  }
  return Qnil;
}

static VALUE stop_the_clock(VALUE data) {
  contprof_wall_clock_worker_end((contprof_wall_clock_call *) data);
  contprof_wall_clock_stop((contprof_wall_clock_call *) data);
  return Qnil;
}

// _native_sampling_loop(generation): runs on the worker thread until the run `generation`
// (the one the thread was made for) stops; returns the failure (an exception) if sampling
// failed, else nil. A thread of an earlier run that only gets to run now ends at once:
// reading the current generation here would give a second loop to the current run.
static VALUE worker_native_sampling_loop(VALUE self, VALUE generation) {
  worker_state *state = state_of(self);
  contprof_wall_clock_call call = {.state = state, .generation = NUM2ULL(generation)};
  if (!contprof_wall_clock_current_run(state, call.generation)) return Qnil;
  state->worker_thread = rb_thread_current();
  contprof_cpu_timers_delete(&state->timers, state->worker_thread); // armed by the thread-begin hook
  call.on_worker_thread = contprof_vm_request_job_from_ruby_threads();
  if (!call.on_worker_thread && !contprof_wall_clock_start(&call)) {
    record_failure(state, rb_exc_new_cstr(contprof_error_class, "could not start the wall clock thread"));
    return state->failure;
  }
  // A clock thread points at `call`, on this stack: it is joined whatever ends this loop.
  rb_ensure(answer_the_clock, (VALUE) &call, stop_the_clock, (VALUE) &call);
  int pthread_error = atomic_load(&state->pthread_error);
  if (pthread_error && NIL_P(state->failure)) {
    record_failure(state, rb_syserr_new(pthread_error, atomic_load(&state->pthread_error_call)));
  }
  return atomic_load(&state->run_generation) == call.generation ? state->failure : Qnil;
}

static VALUE worker_native_generation(VALUE self) { return ULL2NUM(atomic_load(&state_of(self)->run_generation)); }

// ---------------------------------------------------------------------------------------
// Starting and stopping (holding the GVL)

static void on_thread_event(rb_event_flag_t event, VALUE data, VALUE self, ID mid, VALUE klass) {
  worker_state *state = atomic_load(&active_worker);
  if (!state || !atomic_load(&state->should_run)) return;
  VALUE thread = rb_thread_current();
  if (thread == state->worker_thread) return;
  if (event == RUBY_EVENT_THREAD_BEGIN) {
    contprof_thread_context_on_thread_begin(state->collector, thread);
    if (state->use_cpu_timers) contprof_cpu_timers_arm(&state->timers, thread);
  } else {
    contprof_cpu_timers_delete(&state->timers, thread);
    pprof_error error;
    if (contprof_thread_context_on_thread_end(state->collector, thread, &error) != PPROF_OK) {
      atomic_fetch_add(&state->sampling_errors, 1);
    }
  }
}

static bool is_our_handler(const struct sigaction *action) {
  return (action->sa_flags & SA_SIGINFO) && action->sa_sigaction == handle_sigprof;
}

static bool our_handler_is_installed(void) {
  struct sigaction current;
  return sigaction(SIGPROF, NULL, &current) == 0 && is_our_handler(&current);
}

// The rest of this run does without CPU timers (threads' CPU is read from their clocks at
// wall rounds): the application wants SIGPROF for itself. No timer sends a signal after
// this; while SIGPROF is still ours, SIG_IGN discards the signals already pending, and the
// disposition from before the start comes back, for the application to replace.
static void give_up_cpu_timers(worker_state *state, const char *reason) {
  if (!state->use_cpu_timers) return;
  state->use_cpu_timers = false;
  state->cpu_timers_given_up = reason;
  contprof_cpu_timers_delete_all(&state->timers);
  if (state->signal_handler_installed && our_handler_is_installed()) restore_disposition();
  state->signal_handler_installed = false;
}

// _native_give_up_cpu_timers: Ruby's trap("PROF") is about to install the application's
// disposition (see ProcessHooks::Signals).
static VALUE worker_native_give_up_cpu_timers(VALUE self) {
  give_up_cpu_timers(state_of(self), "the application trapped SIGPROF");
  return self;
}

static const char *describe_handler(const struct sigaction *action) {
  if (is_our_handler(action)) return "contprof";
  if (action->sa_flags & SA_SIGINFO) return "another handler";
  if (action->sa_handler == SIG_DFL) return "default";
  if (action->sa_handler == SIG_IGN) return "ignored";
  return "another handler";
}

// Installs Contprof's handler. What was there is kept for restore_disposition, unless it
// is Contprof's own (left by a start that failed half-way): then what was there before it.
static void install_signal_handler(worker_state *state) {
  struct sigaction current;
  if (sigaction(SIGPROF, NULL, &current) != 0) rb_sys_fail("sigaction(SIGPROF)");
  bool ours = is_our_handler(&current);
  bool foreign = !ours && ((current.sa_flags & SA_SIGINFO) || (current.sa_handler != SIG_DFL && current.sa_handler != SIG_IGN));
  if (foreign) {
    rb_raise(contprof_error_class,
             "cannot start: a SIGPROF handler is already installed (%s; another profiler such as stackprof, or "
             "the application's own). Stop it first, or start Contprof with cpu_timers: false (no signals)",
             describe_handler(&current));
  }
  struct sigaction action;
  memset(&action, 0, sizeof(action));
  action.sa_sigaction = handle_sigprof;
  action.sa_flags = SA_SIGINFO | SA_RESTART;
  sigemptyset(&action.sa_mask);
  if (sigaction(SIGPROF, &action, ours ? NULL : &disposition_before_contprof) != 0) rb_sys_fail("sigaction(SIGPROF)");
  state->signal_handler_installed = true;
}

// Whether GC.measure_total_time is on: the GC's clock then counts GC time.
static bool gc_clock_running(void) {
  ID measure_total_time = rb_intern("measure_total_time");
  VALUE gc = rb_const_get(rb_cObject, rb_intern("GC"));
  return rb_respond_to(gc, measure_total_time) && RTEST(rb_funcall(gc, measure_total_time, 0));
}

// _native_prepare_start: installs the signal handler and event hooks, and makes this
// worker the active one. The Ruby side then starts the worker thread.
static VALUE worker_native_prepare_start(VALUE self) {
  worker_state *state = state_of(self);
  if (NIL_P(state->collector)) rb_raise(contprof_error_class, "this worker was not initialized");
  worker_state *active = atomic_load(&active_worker);
  if (active && active != state) {
    rb_raise(contprof_error_class, "another CpuAndWallTimeWorker is running; stop it first (one per process)");
  }
  atomic_store(&state->pthread_error, 0);
  atomic_store(&state->pthread_error_call, NULL);
  state->use_cpu_timers = state->cpu_timers_wanted;
  state->cpu_timers_given_up = NULL;
  if (state->use_cpu_timers) {
    install_signal_handler(state);
    contprof_cpu_timers_set_kind(state->timer_kind);
  }
  state->failure = Qnil;
  state->worker_thread = Qnil;
  state->wakeup_requested = false;
  state->loop_started = false;
  atomic_store(&state->wall_round_requested, false);
  // Every thread's clocks start now, so the first samples cover the time from here.
  contprof_thread_context_start_clocks(state->collector, gc_clock_running());
  atomic_fetch_add(&state->run_generation, 1);
  atomic_store(&state->should_run, true);
  atomic_store(&active_worker, state);
  active_worker_object = self;
  rb_add_event_hook(on_thread_event, RUBY_EVENT_THREAD_BEGIN | RUBY_EVENT_THREAD_END, Qnil);
  // After the hook: a thread born meanwhile is armed once.
  if (state->use_cpu_timers) contprof_cpu_timers_arm_all(&state->timers, Qnil);
  return self;
}

// Ends nudging: returns once no nudge is in flight (one in progress finishes in
// microseconds), and the wall clock sends no more.
static void stop_nudging(worker_state *state) {
  atomic_store(&state->should_run, false);
  if (CONTPROF_PTHREAD_OK(state, pthread_mutex_lock(&state->nudge_mutex))) {
    CONTPROF_PTHREAD_OK(state, pthread_mutex_unlock(&state->nudge_mutex));
  }
}

bool contprof_pthread_ok(worker_state *state, int result, const char *call) {
  if (result == 0) return true;
  int none = 0;
  if (atomic_compare_exchange_strong(&state->pthread_error, &none, result)) atomic_store(&state->pthread_error_call, call);
  atomic_store(&state->should_run, false);
  return false;
}

// _native_request_stop: ends sampling, and returns once no nudge is in flight. It does
// not wait for the worker thread: that thread needs the GVL to finish, and behind busy
// application threads each GVL handoff can take a time slice per thread (100 ms each),
// which would make stopping slow exactly when the application exits.
static VALUE worker_native_request_stop(VALUE self) {
  worker_state *state = state_of(self);
  stop_nudging(state);
  contprof_cpu_timers_delete_all(&state->timers);
  contprof_wall_clock_wake(state);
  return self;
}

// _native_finish_stop(generation): removes hooks and the signal handler, if `generation`
// is still the current run (a worker thread from an earlier run ending late does nothing).
static VALUE worker_native_finish_stop(VALUE self, VALUE generation) {
  worker_state *state = state_of(self);
  if (NUM2ULL(generation) != atomic_load(&state->run_generation)) return self;
  stop_nudging(state); // no signal in flight from here on
  contprof_cpu_timers_delete_all(&state->timers);
  if (atomic_load(&active_worker) == state) {
    rb_remove_event_hook(on_thread_event);
    atomic_store(&active_worker, NULL);
    active_worker_object = Qnil;
  }
  // No more signals can be sent (should_run is off and no nudge is in flight). A handler
  // that is no longer ours belongs to someone else now: it stays.
  if (state->signal_handler_installed && our_handler_is_installed()) restore_disposition();
  state->signal_handler_installed = false;
  state->worker_thread = Qnil;
  return self;
}

// In a forked child: the worker thread did not survive the fork. Reset the state so
// that the Ruby side can start a fresh worker thread.
static VALUE worker_native_reset_after_fork(VALUE self) {
  worker_state *state = state_of(self);
  init_locks(state); // the mutex may have been held by the parent's worker thread
  state->wakeup_requested = false;
  state->loop_started = false;
  state->worker_thread = Qnil;
  atomic_store(&state->wall_round_requested, false);
#define RESET_COUNTER(name) atomic_store(&state->name, 0);
  WORKER_COUNTERS(RESET_COUNTER)
#undef RESET_COUNTER
  contprof_cpu_timers_reset_stats();
  contprof_thread_context_reset(state->collector);
  // The child inherited none of the parent's timers: forget them and arm new ones.
  contprof_cpu_timers_forget_after_fork(&state->timers);
  if (atomic_load(&state->should_run) && state->use_cpu_timers) contprof_cpu_timers_arm_all(&state->timers, Qnil);
  return self;
}

static VALUE worker_native_stats(VALUE self) {
  worker_state *state = state_of(self);
  VALUE stats = rb_hash_new();
#define STAT(name) rb_hash_aset(stats, ID2SYM(rb_intern(#name)), ULL2NUM(atomic_load(&state->name)));
  WORKER_COUNTERS(STAT)
#undef STAT
  uint64_t rounds = atomic_load(&state->sample_rounds);
  rb_hash_aset(stats, ID2SYM(rb_intern("sampling_ns_average")),
               ULL2NUM(rounds ? atomic_load(&state->sampling_ns_total) / rounds : 0));
  rb_hash_aset(stats, ID2SYM(rb_intern("effective_interval_ns")), LL2NUM(atomic_load(&state->effective_interval_ns)));
  rb_hash_aset(stats, ID2SYM(rb_intern("cpu_timers")), state->use_cpu_timers ? Qtrue : Qfalse);
  rb_hash_aset(stats, ID2SYM(rb_intern("cpu_timers_given_up")),
               state->cpu_timers_given_up ? rb_str_new_cstr(state->cpu_timers_given_up) : Qnil);
  rb_hash_aset(stats, ID2SYM(rb_intern("cpu_timers_armed")), ULL2NUM(state->timers.armed));
  rb_hash_aset(stats, ID2SYM(rb_intern("cpu_timers_failed")), ULL2NUM(state->timers.failed));
  rb_hash_aset(stats, ID2SYM(rb_intern("cpu_timers_live")), SIZET2NUM(contprof_cpu_timers_live(&state->timers)));
  rb_hash_aset(stats, ID2SYM(rb_intern("cpu_timers_period_ns")), LL2NUM(state->timers.period_ns));
  contprof_cpu_timers_stats timer_stats = contprof_cpu_timers_get_stats();
  rb_hash_aset(stats, ID2SYM(rb_intern("perf_events_armed")), ULL2NUM(state->timers.perf_events_armed));
  rb_hash_aset(stats, ID2SYM(rb_intern("posix_timers_armed")),
               ULL2NUM(state->timers.armed - state->timers.perf_events_armed));
  rb_hash_aset(stats, ID2SYM(rb_intern("captures")), ULL2NUM(timer_stats.captures));
  rb_hash_aset(stats, ID2SYM(rb_intern("captures_missed")), ULL2NUM(timer_stats.captures_missed));
  rb_hash_aset(stats, ID2SYM(rb_intern("captures_stale")), ULL2NUM(timer_stats.captures_stale));
  rb_hash_aset(stats, ID2SYM(rb_intern("expirations_in_gc")), ULL2NUM(timer_stats.expirations_in_gc));
  return stats;
}

// _native_wait_until_started: returns once the wall clock runs. Without it, a new worker
// thread could wait up to a whole GVL time slice (100 ms) behind a busy thread before its
// first sample.
static VALUE worker_native_wait_until_started(VALUE self) {
  worker_state *state = state_of(self);
  rb_thread_call_without_gvl(contprof_wall_clock_wait_for_start, state, wake_loop, state);
  return self;
}

// _native_final_round: the final round, from the calling thread, between the request to
// stop and the end of it (so that the time since the last rounds is not lost).
static VALUE worker_native_final_round(VALUE self) {
  worker_state *state = state_of(self);
  if (NIL_P(state->collector)) return self;
  run_round(state, CONTPROF_ROUND_FINAL, Qnil, 0);
  return self;
}

// _native_wall_round_now: a wall round on the calling thread, now (running only): every
// thread's time so far is recorded (Contprof.profile begins and ends a block with one).
static VALUE worker_native_wall_round_now(VALUE self) {
  worker_state *state = state_of(self);
  if (atomic_load(&active_worker) == state) run_round(state, CONTPROF_ROUND_WALL, Qnil, 0);
  return self;
}

static VALUE worker_native_failure(VALUE self) { return state_of(self)->failure; }
static VALUE worker_native_active_p(VALUE self) {
  return atomic_load(&active_worker) == state_of(self) ? Qtrue : Qfalse;
}
static VALUE worker_native_sampling_p(VALUE self) {
  worker_state *state = state_of(self);
  return atomic_load(&active_worker) == state && atomic_load(&state->should_run) ? Qtrue : Qfalse;
}

static VALUE testing_fail_next_sample(VALUE module) {
  fail_next_sample = true;
  return Qnil;
}

static VALUE testing_final_round_saw_sampling(VALUE module) { return final_round_saw_sampling ? Qtrue : Qfalse; }

// Testing: reports a failed pthread call of the running worker, as a real one would be.
static VALUE testing_fail_pthread_call(VALUE module) {
  worker_state *state = atomic_load(&active_worker);
  if (!state) rb_raise(contprof_error_class, "no worker is running");
  contprof_pthread_ok(state, EINVAL, "pthread_mutex_lock(injected)");
  contprof_wall_clock_wake(state);
  return Qnil;
}

// Testing: queues a sampling job on the calling thread, as a CPU timer's signal would,
// then yields: the job runs at the first interrupt check inside the block. Returns the
// block's value.
static VALUE testing_queue_sampling_job(VALUE module) {
  if (!atomic_load(&active_worker)) rb_raise(contprof_error_class, "no worker is running");
  contprof_worker_register_job();
  return rb_yield(Qnil);
}

// Testing: asks for a wall round on the calling thread, as the wall clock would, then
// yields (see queue_sampling_job).
static VALUE testing_queue_wall_round(VALUE module) {
  worker_state *state = atomic_load(&active_worker);
  if (!state) rb_raise(contprof_error_class, "no worker is running");
  atomic_store(&state->wall_round_requested, true);
  contprof_worker_register_job();
  return rb_yield(Qnil);
}

// Testing (and bench/sample_cost.rb): one CPU round exactly as the calling thread's timer
// would start it (an expiry counted, then the sampling job), without the kernel's part.
// The expiry never happened, so the CPU it records runs ahead of the thread's clock: for
// measuring the cost of a round, not its values. False without a timer for the thread.
static VALUE testing_cpu_round(VALUE module) {
  worker_state *state = atomic_load(&active_worker);
  if (!state) rb_raise(contprof_error_class, "no worker is running");
  if (!contprof_cpu_timers_count_expiry(&state->timers, rb_thread_current())) return Qfalse;
  contprof_worker_job(NULL);
  return Qtrue;
}

// Testing (and bench/sample_cost.rb): one wall round on the calling thread, as the wall
// clock's request would run it.
static VALUE testing_wall_round(VALUE module) {
  worker_state *state = atomic_load(&active_worker);
  if (!state) rb_raise(contprof_error_class, "no worker is running");
  atomic_store(&state->wall_round_requested, true);
  contprof_worker_job(NULL);
  return Qtrue;
}

void contprof_worker_class_init(VALUE contprof_module) {
  contprof_vm_job_register(contprof_worker_job);
  VALUE collectors = rb_define_module_under(contprof_module, "Collectors");
  VALUE klass = rb_define_class_under(collectors, "CpuAndWallTimeWorker", rb_cObject);
  rb_define_alloc_func(klass, worker_alloc);
  rb_define_private_method(klass, "_native_initialize", worker_native_initialize, 5);
  rb_define_private_method(klass, "_native_prepare_start", worker_native_prepare_start, 0);
  rb_define_private_method(klass, "_native_sampling_loop", worker_native_sampling_loop, 1);
  rb_define_private_method(klass, "_native_request_stop", worker_native_request_stop, 0);
  rb_define_private_method(klass, "_native_finish_stop", worker_native_finish_stop, 1);
  rb_define_private_method(klass, "_native_generation", worker_native_generation, 0);
  rb_define_private_method(klass, "_native_reset_after_fork", worker_native_reset_after_fork, 0);
  rb_define_private_method(klass, "_native_stats", worker_native_stats, 0);
  rb_define_private_method(klass, "_native_failure", worker_native_failure, 0);
  rb_define_private_method(klass, "_native_wait_until_started", worker_native_wait_until_started, 0);
  rb_define_private_method(klass, "_native_final_round", worker_native_final_round, 0);
  rb_define_private_method(klass, "_native_active?", worker_native_active_p, 0);
  rb_define_private_method(klass, "_native_sampling?", worker_native_sampling_p, 0);
  rb_define_private_method(klass, "_native_give_up_cpu_timers", worker_native_give_up_cpu_timers, 0);
  rb_define_private_method(klass, "_native_wall_round_now", worker_native_wall_round_now, 0);
  rb_global_variable(&active_worker_object);
  VALUE testing = rb_define_module_under(klass, "Testing");
  rb_define_singleton_method(testing, "fail_next_sample", testing_fail_next_sample, 0);
  rb_define_singleton_method(testing, "final_round_saw_sampling?", testing_final_round_saw_sampling, 0);
  rb_define_singleton_method(testing, "fail_pthread_call", testing_fail_pthread_call, 0);
  rb_define_singleton_method(testing, "queue_sampling_job", testing_queue_sampling_job, 0);
  rb_define_singleton_method(testing, "queue_wall_round", testing_queue_wall_round, 0);
  rb_define_singleton_method(testing, "cpu_round", testing_cpu_round, 0);
  rb_define_singleton_method(testing, "wall_round", testing_wall_round, 0);
}
