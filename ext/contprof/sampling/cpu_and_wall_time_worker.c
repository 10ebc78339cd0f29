// Contprof::Collectors::CpuAndWallTimeWorker: decides when to sample. The Ruby class and
// its lifecycle (start, stop, fork); the sampling job and the clock's ticks are in
// rounds.c, SIGPROF's disposition in sigprof.c, the wall clock in wall_clock.c.
//
// Wall time is sampled on the wall clock's ticks (why: wall_clock.c), CPU time on each
// thread's own CPU timer (cpu_timers.c), GC time where samples find a GC; where each
// sample's time goes is the collector's to decide (collectors/thread_context.c).
//
// ## exec and fork
//
// The Ruby side stops the worker before exec (a pending SIGPROF would kill the new
// program) and restarts it in forked children; a child inherits no timers, so it forgets
// the parent's and arms its own.
#include <errno.h>
#include <ruby.h>
#include <ruby/debug.h>
#include <ruby/thread.h>
#include <string.h>
#include <unistd.h>

#include "collectors/thread_context.h"
#include "fault_injection.h"
#include "pprof/pprof_util.h"
#include "ruby_helpers.h"
#include "sampling/cpu_and_wall_time_worker.h"
#include "sampling/worker.h"
#include "vm/vm.h"

static VALUE active_worker_object = Qnil;

static void worker_mark(void *data) {
  worker_state *state = data;
  rb_gc_mark(state->collector);
  rb_gc_mark(state->failure);
  rb_gc_mark(state->round_failure_class);
  rb_gc_mark(state->worker_thread);
  contprof_cpu_timers_mark(&state->timers);
  contprof_allocation_sampler_mark(&state->allocations);
}

static void worker_free(void *data) {
  worker_state *state = data;
  contprof_cpu_timers_free(&state->timers);
  contprof_allocation_sampler_free(&state->allocations);
  pthread_mutex_destroy(&state->tick_mutex);
  contprof_wall_clock_destroy(&state->clock);
  ruby_xfree(state);
}

static const rb_data_type_t worker_type = {
  .wrap_struct_name = "Contprof::Collectors::CpuAndWallTimeWorker",
  .function = {.dmark = worker_mark, .dfree = worker_free},
  .flags = RUBY_TYPED_FREE_IMMEDIATELY,
};

static VALUE worker_alloc(VALUE klass) {
  worker_state *state = ruby_xcalloc(1, sizeof(worker_state));
  state->collector = Qnil;
  state->failure = Qnil;
  state->round_failure_class = Qnil;
  state->worker_thread = Qnil;
  atomic_store(&state->gc_thread_at_tick, (uintptr_t) Qnil);
  atomic_store(&state->holder_at_tick, (uintptr_t) Qnil);
  pthread_mutex_init(&state->tick_mutex, NULL);
  contprof_wall_clock_init(&state->clock, contprof_worker_clock_client(state));
  contprof_cpu_timers_init(&state->timers, 0, 0); // period and depth: see _native_initialize
  return TypedData_Wrap_Struct(klass, &worker_type, state);
}

static worker_state *state_of(VALUE self) { return rb_check_typeddata(self, &worker_type); }

// _native_initialize(collector, interval_seconds, overhead_target, cpu_timers, max_frames,
// allocation_interval): cpu_timers is false, true (perf events where allowed, else POSIX
// timers) or :posix; allocation_interval the mean allocations between allocation samples
// (0: none sampled; negative: automatic, at least its absolute value).
static VALUE worker_native_initialize(VALUE self, VALUE collector, VALUE interval, VALUE overhead_target,
                                      VALUE cpu_timers, VALUE max_frames, VALUE allocation_interval) {
  worker_state *state = state_of(self);
  if (contprof_active_worker() == state) rb_raise(contprof_error_class, "this worker is running");
  state->collector = contprof_enforce_thread_context(collector);
  state->interval_ns = (int64_t) (NUM2DBL(interval) * 1e9);
  state->cpu_timers_wanted = state->use_cpu_timers = RTEST(cpu_timers) && contprof_cpu_timers_built();
  state->timer_kind = SYMBOL_P(cpu_timers) ? CONTPROF_CPU_TIMER_POSIX : CONTPROF_CPU_TIMER_AUTO;
  state->overhead_target = NUM2DBL(overhead_target);
  atomic_store(&state->clock.effective_interval_ns, state->interval_ns);
  state->timers.period_ns = state->interval_ns;
  state->timers.capture_frames = NUM2LONG(max_frames);
  contprof_allocation_sampler_free(&state->allocations);
  long long allocations = NUM2LL(allocation_interval);
  contprof_allocation_sampler_init(&state->allocations, (uint64_t) llabs(allocations), allocations < 0,
                                   NUM2LONG(max_frames));
  return self;
}

// ---------------------------------------------------------------------------------------
// The worker thread

typedef struct {
  worker_state *state;
  uint64_t run;
  bool clock_here; // the clock runs on this thread (else on a thread of its own)
  contprof_wall_clock_thread clock_thread;
  contprof_prompt_thread previous_scheduling;
} worker_thread_call;

static bool current_run(worker_state *state, uint64_t run) {
  return atomic_load(&state->should_run) && atomic_load(&state->run) == run;
}

static void wake_clock(void *clock) { contprof_wall_clock_wake(clock); }
static void interrupt_worker(void *thread) { contprof_wall_clock_thread_interrupt(thread); }

static VALUE answer_the_clock(VALUE data) {
  worker_thread_call *call = (worker_thread_call *) data;
  worker_state *state = call->state;
  // This thread runs the rounds nobody else can: it must run as soon as the clock hands
  // one over, for the same reason as the clock itself (see wall_clock.c).
  contprof_wall_clock_make_prompt(&call->previous_scheduling);
  if (call->clock_here) {
    contprof_wall_clock_here here = {.clock = &state->clock, .run = call->run};
    while (current_run(state, call->run)) {
      // Interrupts (Thread#kill, VM shutdown) wake the clock; Ruby then handles them here.
      rb_thread_call_without_gvl(contprof_wall_clock_run_here, &here, wake_clock, &state->clock);
    }
    return Qnil;
  }
  while (current_run(state, call->run) && !contprof_wall_clock_thread_ended(&call->clock_thread)) {
    // Interrupts (Thread#kill, VM shutdown) end the wait; Ruby then handles them here.
    rb_thread_call_without_gvl(contprof_wall_clock_thread_wait, &call->clock_thread, interrupt_worker,
                               &call->clock_thread);
    if (contprof_wall_clock_thread_take_round(&call->clock_thread)) contprof_worker_round_with_gvl(state);
  }
  return Qnil;
}

static VALUE leave_the_clock(VALUE data) {
  worker_thread_call *call = (worker_thread_call *) data;
  contprof_wall_clock_restore(&call->previous_scheduling);
  if (!call->clock_here) contprof_wall_clock_thread_stop(&call->clock_thread);
  return Qnil;
}

// _native_sampling_loop(run): runs on the worker thread until the run (the one the thread
// was made for) stops; returns the failure (an exception) if sampling failed, else nil. A
// thread of an earlier run that only gets to run now ends at once: reading the current
// run here would give a second loop to the current run.
static VALUE worker_native_sampling_loop(VALUE self, VALUE run) {
  worker_state *state = state_of(self);
  worker_thread_call call = {.state = state, .run = NUM2ULL(run)};
  if (!current_run(state, call.run)) return Qnil;
  state->worker_thread = rb_thread_current();
  contprof_cpu_timers_delete(&state->timers, state->worker_thread); // armed by the thread-begin hook
  call.clock_here = contprof_vm_request_job_from_ruby_threads();
  if (!call.clock_here && !contprof_wall_clock_thread_start(&call.clock_thread, &state->clock, call.run)) {
    contprof_worker_fail(state, rb_exc_new_cstr(contprof_error_class, "could not start the wall clock thread"));
    return state->failure;
  }
  // A clock thread points at `call`, on this stack: it is joined whatever ends this loop.
  rb_ensure(answer_the_clock, (VALUE) &call, leave_the_clock, (VALUE) &call);
  int pthread_error = atomic_load(&state->pthread_error);
  if (pthread_error && NIL_P(contprof_worker_failure(state))) {
    contprof_worker_fail(state, rb_syserr_new(pthread_error, atomic_load(&state->pthread_error_call)));
  }
  return atomic_load(&state->run) == call.run ? contprof_worker_failure(state) : Qnil;
}

static VALUE worker_native_run(VALUE self) { return ULL2NUM(atomic_load(&state_of(self)->run)); }

// ---------------------------------------------------------------------------------------
// Starting and stopping (holding the GVL)

static void on_thread_event(rb_event_flag_t event, VALUE CONTPROF_UNUSED data, VALUE CONTPROF_UNUSED self, ID CONTPROF_UNUSED mid, VALUE CONTPROF_UNUSED klass) {
  worker_state *state = contprof_active_worker();
  if (!state || !atomic_load(&state->should_run)) return;
  VALUE thread = rb_thread_current();
  if (thread == state->worker_thread) return;
  if (event == RUBY_EVENT_THREAD_BEGIN) {
    contprof_thread_context_on_thread_begin(state->collector, thread);
    if (state->use_cpu_timers) contprof_cpu_timers_arm(&state->timers, thread);
  } else {
    contprof_cpu_timers_delete(&state->timers, thread);
    // The thread's last record: a round of one thread, under a round's rules.
    if (!contprof_vm_round_begin("a thread's last record")) {
      atomic_fetch_add(&state->rounds_refused, 1);
      return;
    }
    pprof_error error;
    if (contprof_thread_context_on_thread_end(state->collector, thread, &error) != PPROF_OK) {
      atomic_fetch_add(&state->sampling_errors, 1);
    }
    contprof_vm_round_end();
  }
}

// _native_give_up_cpu_timers: Ruby's trap("PROF") is about to install the application's
// disposition (see ProcessHooks::Signals).
static VALUE worker_native_give_up_cpu_timers(VALUE self) {
  contprof_sigprof_give_up(state_of(self), "the application trapped SIGPROF");
  return self;
}

// Whether GC.measure_total_time is on: the GC's clock then counts GC time.
static bool gc_clock_running(void) {
  ID measure_total_time = rb_intern("measure_total_time");
  VALUE gc = rb_const_get(rb_cObject, rb_intern("GC"));
  return rb_respond_to(gc, measure_total_time) && RTEST(rb_funcall(gc, measure_total_time, 0));
}

// Starts allocation sampling (when on), with its first check when it asks for one.
static void start_allocation_sampler(worker_state *state) {
  int64_t first_check = contprof_allocation_sampler_start(&state->allocations);
  if (first_check > 0) contprof_wall_clock_set_alarm(&state->clock, first_check);
}

// _native_prepare_start: installs the signal handler and event hooks, and makes this
// worker the active one. The Ruby side then starts the worker thread.
static VALUE worker_native_prepare_start(VALUE self) {
  worker_state *state = state_of(self);
  if (NIL_P(state->collector)) rb_raise(contprof_error_class, "this worker was not initialized");
  worker_state *active = contprof_active_worker();
  if (active && active != state) {
    rb_raise(contprof_error_class, "another CpuAndWallTimeWorker is running; stop it first (one per process)");
  }
  atomic_store(&state->pthread_error, 0);
  atomic_store(&state->pthread_error_call, NULL);
  state->use_cpu_timers = state->cpu_timers_wanted;
  state->cpu_timers_given_up = NULL;
  if (state->use_cpu_timers) {
    contprof_sigprof_install(state, contprof_worker_on_timer_signal);
    contprof_cpu_timers_set_kind(state->timer_kind);
  }
  state->failure = Qnil;
  atomic_store(&state->round_failed, false);
  state->worker_thread = Qnil;
  atomic_store(&state->wall_round_requested, false);
  atomic_store(&state->latest_tick_ns, 0);
  // Every thread's clocks start now, so the first samples cover the time from here.
  contprof_thread_context_start_clocks(state->collector, gc_clock_running());
  atomic_store(&state->run, contprof_wall_clock_start_run(&state->clock, state->interval_ns, state->overhead_target));
  atomic_store(&state->should_run, true);
  contprof_set_active_worker(state);
  active_worker_object = self;
  rb_add_event_hook(on_thread_event, RUBY_EVENT_THREAD_BEGIN | RUBY_EVENT_THREAD_END, Qnil);
  // After the hook: a thread born meanwhile is armed once.
  if (state->use_cpu_timers) contprof_cpu_timers_arm_all(&state->timers, Qnil);
  start_allocation_sampler(state);
  return self;
}

// Ends the clock's ticks: returns once none is in flight (one in progress finishes in
// microseconds), and the clock asks for no more.
static void stop_ticks(worker_state *state) {
  atomic_store(&state->should_run, false);
  if (CONTPROF_PTHREAD_OK(state, pthread_mutex_lock(&state->tick_mutex))) {
    CONTPROF_PTHREAD_OK(state, pthread_mutex_unlock(&state->tick_mutex));
  }
}

// _native_request_stop: ends sampling, and returns once no tick is in flight. It does not
// wait for the worker thread: that thread needs the GVL to finish, and behind busy
// application threads each GVL handoff can take a time slice per thread (100 ms each),
// which would make stopping slow exactly when the application exits.
static VALUE worker_native_request_stop(VALUE self) {
  worker_state *state = state_of(self);
  stop_ticks(state);
  contprof_cpu_timers_delete_all(&state->timers);
  contprof_allocation_sampler_stop(&state->allocations);
  contprof_vm_cancel_call_on_next_resume();
  contprof_wall_clock_stop(&state->clock);
  return self;
}

// _native_finish_stop(run): removes hooks and the signal handler, if `run` is still the
// current run (a worker thread from an earlier run ending late does nothing).
static VALUE worker_native_finish_stop(VALUE self, VALUE run) {
  worker_state *state = state_of(self);
  if (NUM2ULL(run) != atomic_load(&state->run)) return self;
  stop_ticks(state); // no signal in flight from here on
  contprof_cpu_timers_delete_all(&state->timers);
  if (contprof_active_worker() == state) {
    rb_remove_event_hook(on_thread_event);
    contprof_set_active_worker(NULL);
    active_worker_object = Qnil;
  }
  // No more signals can be sent (sampling is off and no tick is in flight).
  contprof_sigprof_restore(state);
  state->worker_thread = Qnil;
  return self;
}

// In a forked child: the worker thread did not survive the fork. Reset the state so
// that the Ruby side can start a fresh worker thread. (The C fork handler already gave the
// running worker new locks before any Ruby code ran, rounds.c "Fork"; a worker forked in
// the middle of its stop was no longer the running one.)
static VALUE worker_native_reset_after_fork(VALUE self) {
  worker_state *state = state_of(self);
  contprof_worker_new_locks_after_fork(state);
  state->worker_thread = Qnil;
  atomic_store(&state->wall_round_requested, false);
#define RESET_COUNTER(name) atomic_store(&state->name, 0);
  WORKER_COUNTERS(RESET_COUNTER)
#undef RESET_COUNTER
  contprof_cpu_timers_reset_stats();
  contprof_thread_context_reset(state->collector);
  // The child inherited none of the parent's timers: forget them and arm new ones.
  contprof_cpu_timers_forget_after_fork(&state->timers);
  if (atomic_load(&state->should_run)) {
    // The forking thread's clocks start now (else its first stretch would only start them).
    contprof_thread_context_start_clocks(state->collector, gc_clock_running());
    atomic_store(&state->run, contprof_wall_clock_start_run(&state->clock, state->interval_ns, state->overhead_target));
    if (state->use_cpu_timers) contprof_cpu_timers_arm_all(&state->timers, Qnil);
    contprof_allocation_sampler_stop(&state->allocations); // the parent's pending sample is not the child's
    start_allocation_sampler(state);
  }
  atomic_store(&state->awaiting_fork_reset, false);
  return self;
}

// #stats, in its order: each statistic named once, with its value. CLOCK_COUNTER lists one
// of the wall clock's counters (wall_clock.h) as clock_<name>.
static VALUE worker_native_stats(VALUE self) {
  worker_state *state = state_of(self);
  VALUE stats = rb_hash_new();
  uint64_t rounds = atomic_load(&state->rounds);
  contprof_cpu_timers_stats timer_stats = contprof_cpu_timers_get_stats();
#define STAT(name, value) rb_hash_aset(stats, ID2SYM(rb_intern(#name)), (value));
#define COUNTER(name) STAT(name, ULL2NUM(atomic_load(&state->name)))
#define CLOCK_COUNTER(name) STAT(clock_##name, ULL2NUM(atomic_load(&state->clock.name)))
#define TIMER_STAT(name) STAT(name, ULL2NUM(timer_stats.name))
  WORKER_COUNTERS(COUNTER)
  STAT(sampling_ns_average, ULL2NUM(rounds ? atomic_load(&state->sampling_ns_total) / rounds : 0))
  STAT(effective_interval_ns, LL2NUM(atomic_load(&state->clock.effective_interval_ns)))
  CONTPROF_WALL_CLOCK_COUNTERS(CLOCK_COUNTER)
  STAT(cpu_timers, state->use_cpu_timers ? Qtrue : Qfalse)
  STAT(cpu_timers_given_up, state->cpu_timers_given_up ? rb_str_new_cstr(state->cpu_timers_given_up) : Qnil)
  STAT(cpu_timers_armed, ULL2NUM(state->timers.armed))
  STAT(cpu_timers_failed, ULL2NUM(state->timers.failed))
  STAT(cpu_timers_live, SIZET2NUM(contprof_cpu_timers_live(&state->timers)))
  STAT(cpu_timers_period_ns, LL2NUM(state->timers.period_ns))
  STAT(threads_without_cpu_timer, ULL2NUM(state->threads_without_timer))
  STAT(perf_events_armed, ULL2NUM(state->timers.perf_events_armed))
  STAT(posix_timers_armed, ULL2NUM(state->timers.armed - state->timers.perf_events_armed))
  STAT(capture_buffer_bytes, SIZET2NUM(contprof_cpu_timers_capture_bytes()))
  CONTPROF_CPU_TIMERS_STATS(TIMER_STAT)
#undef TIMER_STAT
#undef CLOCK_COUNTER
#undef COUNTER
#undef STAT
  contprof_allocation_sampler_stats(&state->allocations, stats);
  return stats;
}

// _native_wait_until_started: returns once the wall clock runs. Without it, a new worker
// thread could wait up to a whole GVL time slice (100 ms) behind a busy thread before its
// first sample.
static void *wait_for_clock(void *clock) {
  contprof_wall_clock_wait_for_start(clock);
  return NULL;
}

static VALUE worker_native_wait_until_started(VALUE self) {
  worker_state *state = state_of(self);
  rb_thread_call_without_gvl(wait_for_clock, &state->clock, wake_clock, &state->clock);
  return self;
}

// _native_final_round: the final round, from the calling thread, between the request to
// stop and the end of it (so that the time since the last rounds is not lost).
static VALUE worker_native_final_round(VALUE self) {
  worker_state *state = state_of(self);
  if (NIL_P(state->collector)) return self;
  contprof_worker_round(state, CONTPROF_ROUND_FINAL);
  return self;
}

// _native_wall_round_now: a wall round on the calling thread, now (running only): every
// thread's time so far is recorded (Contprof.profile begins and ends a block with one).
static VALUE worker_native_wall_round_now(VALUE self) {
  worker_state *state = state_of(self);
  if (contprof_active_worker() == state) contprof_worker_round(state, CONTPROF_ROUND_WALL);
  return self;
}

static VALUE worker_native_failure(VALUE self) { return contprof_worker_failure(state_of(self)); }
static VALUE worker_native_active_p(VALUE self) { return contprof_active_worker() == state_of(self) ? Qtrue : Qfalse; }
static VALUE worker_native_sampling_p(VALUE self) {
  worker_state *state = state_of(self);
  return contprof_active_worker() == state && atomic_load(&state->should_run) ? Qtrue : Qfalse;
}

// ---------------------------------------------------------------------------------------
// Testing

static worker_state *running_worker(void) {
  worker_state *state = contprof_active_worker();
  if (!state) rb_raise(contprof_error_class, "no worker is running");
  return state;
}

static VALUE testing_fail_next_sample(VALUE CONTPROF_UNUSED module) {
  contprof_worker_fail_next_round();
  return Qnil;
}

// The next `count` allocations at `site` fail (see fault_injection.h): :thread_state,
// :thread_entry or :stack_scratch.
static VALUE testing_fail_allocations(VALUE CONTPROF_UNUSED module, VALUE site, VALUE count) {
  static const char *const names[CONTPROF_ALLOC_SITES] = {"thread_state", "thread_entry", "stack_scratch"};
  for (int i = 0; i < CONTPROF_ALLOC_SITES; i++) {
    if (site == ID2SYM(rb_intern(names[i]))) {
      atomic_store(&contprof_failing_allocations[i], NUM2INT(count));
      return Qnil;
    }
  }
  rb_raise(rb_eArgError, "site must be :thread_state, :thread_entry or :stack_scratch, got %" PRIsVALUE, rb_inspect(site));
}

static VALUE testing_switch_thread_in_next_round(VALUE CONTPROF_UNUSED module) {
  contprof_worker_switch_in_next_round();
  return Qnil;
}

// Whether this build aborts when a round lets the thread switch (rake test:round_checks).
static VALUE testing_round_checks_p(VALUE CONTPROF_UNUSED module) {
#ifdef CONTPROF_ROUND_CHECKS
  return Qtrue;
#else
  return Qfalse;
#endif
}

static VALUE testing_final_round_saw_sampling(VALUE CONTPROF_UNUSED module) {
  return contprof_worker_final_round_saw_sampling() ? Qtrue : Qfalse;
}

// Reports a failed pthread call of the running worker, as a real one would be.
static VALUE testing_fail_pthread_call(VALUE CONTPROF_UNUSED module) {
  worker_state *state = running_worker();
  contprof_pthread_ok(state, EINVAL, "pthread_mutex_lock(injected)");
  contprof_wall_clock_wake(&state->clock);
  return Qnil;
}

// Queues a sampling job on the calling thread, as a CPU timer's signal would, then yields:
// the job runs at the first interrupt check inside the block. Returns the block's value.
static VALUE testing_queue_sampling_job(VALUE CONTPROF_UNUSED module) {
  running_worker();
  contprof_worker_queue_cpu_round();
  return rb_yield(Qnil);
}

// Asks for a wall round on the calling thread, as the wall clock would, then yields (see
// queue_sampling_job).
static VALUE testing_queue_wall_round(VALUE CONTPROF_UNUSED module) {
  worker_state *state = running_worker();
  atomic_store(&state->wall_round_requested, true);
  contprof_vm_job_trigger_here();
  return rb_yield(Qnil);
}

// (And bench/sample_cost.rb) One CPU round exactly as the calling thread's timer would
// start it (an expiry counted, then the sampling job), without the kernel's part. The
// expiry never happened, so the CPU it records runs ahead of the thread's clock: for
// measuring the cost of a round, not its values. False without a timer for the thread.
static VALUE testing_cpu_round(VALUE CONTPROF_UNUSED module) {
  worker_state *state = running_worker();
  if (!contprof_cpu_timers_count_expiry(&state->timers, rb_thread_current())) return Qfalse;
  atomic_store(&state->cpu_round_wanted, true);
  contprof_worker_job(NULL);
  return Qtrue;
}

// Replaces every timer of the running worker with one of `period` (seconds), as a new
// effective interval does (see contprof_sigprof_maintain_timers).
static VALUE testing_rearm_timers(VALUE CONTPROF_UNUSED module, VALUE period) {
  worker_state *state = running_worker();
  contprof_cpu_timers_set_period(&state->timers, (int64_t) (NUM2DBL(period) * 1e9));
  return Qnil;
}

// Yields holding one of the running worker's locks, :clock (its clock thread holds it for
// a moment at every tick) or :tick (held while a tick asks for a round, which on Ruby 3.1
// allocates the request): a child forked inside the block gets the lock as the fork found
// it (held). Only the process that took it gives it back.
typedef struct {
  pthread_mutex_t *lock;
  pid_t locker;
} lock_holder;

static VALUE give_lock_back(VALUE data) {
  lock_holder *holder = (lock_holder *) data;
  if (getpid() == holder->locker) pthread_mutex_unlock(holder->lock);
  return Qnil;
}

static VALUE testing_holding_lock(VALUE CONTPROF_UNUSED module, VALUE which) {
  worker_state *state = running_worker();
  lock_holder holder = {NULL, getpid()};
  if (which == ID2SYM(rb_intern("clock"))) holder.lock = &state->clock.mutex;
  if (which == ID2SYM(rb_intern("tick"))) holder.lock = &state->tick_mutex;
  if (!holder.lock) rb_raise(rb_eArgError, "lock must be :clock or :tick, got %" PRIsVALUE, rb_inspect(which));
  int locked = pthread_mutex_lock(holder.lock);
  if (locked) rb_syserr_fail(locked, "pthread_mutex_lock");
  return rb_ensure(rb_yield, Qnil, give_lock_back, (VALUE) &holder);
}

// Wakes the running worker's clock, as stopping does (it takes the clock's lock).
static VALUE testing_wake_clock(VALUE CONTPROF_UNUSED module) {
  contprof_wall_clock_wake(&running_worker()->clock);
  return Qnil;
}

// (And bench/sample_cost.rb) One wall round on the calling thread, as the clock's request
// would run it.
static VALUE testing_wall_round(VALUE CONTPROF_UNUSED module) {
  worker_state *state = running_worker();
  atomic_store(&state->wall_round_requested, true);
  contprof_worker_job(NULL);
  return Qtrue;
}

// At exit, after the program's at_exit blocks and before Ruby runs its finalizers: no more
// allocation sampling. A worker still running then (never stopped) would otherwise sample
// the finalizers' allocations, and its live-heap tracking give each tracked object a
// weak reference (on Ruby 3.1, a finalizer) while Ruby is busy running them all.
static void stop_allocation_sampling_at_exit(CONTPROF_UNUSED VALUE unused) {
  worker_state *state = contprof_active_worker();
  if (state) contprof_allocation_sampler_stop(&state->allocations);
}

void contprof_worker_class_init(VALUE contprof_module) {
  contprof_vm_job_register(contprof_worker_job);
  contprof_worker_install_fork_handler();
  VALUE collectors = rb_define_module_under(contprof_module, "Collectors");
  VALUE klass = rb_define_class_under(collectors, "CpuAndWallTimeWorker", rb_cObject);
  rb_define_alloc_func(klass, worker_alloc);
  rb_set_end_proc(stop_allocation_sampling_at_exit, Qnil);
  rb_define_private_method(klass, "_native_initialize", worker_native_initialize, 6);
  rb_define_private_method(klass, "_native_prepare_start", worker_native_prepare_start, 0);
  rb_define_private_method(klass, "_native_sampling_loop", worker_native_sampling_loop, 1);
  rb_define_private_method(klass, "_native_request_stop", worker_native_request_stop, 0);
  rb_define_private_method(klass, "_native_finish_stop", worker_native_finish_stop, 1);
  rb_define_private_method(klass, "_native_run", worker_native_run, 0);
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
  rb_define_singleton_method(testing, "switch_thread_in_next_round", testing_switch_thread_in_next_round, 0);
  rb_define_singleton_method(testing, "round_checks?", testing_round_checks_p, 0);
  rb_define_singleton_method(testing, "fail_pthread_call", testing_fail_pthread_call, 0);
  rb_define_singleton_method(testing, "queue_sampling_job", testing_queue_sampling_job, 0);
  rb_define_singleton_method(testing, "queue_wall_round", testing_queue_wall_round, 0);
  rb_define_singleton_method(testing, "cpu_round", testing_cpu_round, 0);
  rb_define_singleton_method(testing, "wall_round", testing_wall_round, 0);
  rb_define_singleton_method(testing, "holding_lock", testing_holding_lock, 1);
  rb_define_singleton_method(testing, "wake_clock", testing_wake_clock, 0);
  rb_define_singleton_method(testing, "rearm_timers", testing_rearm_timers, 1);
  rb_define_singleton_method(testing, "fail_allocations", testing_fail_allocations, 2);
}
