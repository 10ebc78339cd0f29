// Contprof::Collectors::CpuAndWallTime (see collectors_cpu_and_wall_time.h).
//
// Per thread it keeps the CPU time (the thread's own CPU clock,
// pthread_getcpuclockid) and the wall time (CLOCK_MONOTONIC) at its previous sample.
// Each sample records the differences, so the values are exact whatever the sampling
// interval and however late a sample comes: a late sample only blurs *where* the time
// went, never *how much*. cpu-samples is 1 when the thread used CPU since its previous
// sample, 0 otherwise.
//
// A thread's first sample only starts its clocks, unless the worker's thread-begin hook
// started them at the thread's birth. The CPU the sampling itself costs the thread that
// runs it is left out (see the end of contprof_cpu_and_wall_time_sample). Reading a CPU
// clock is a system call, the largest cost of a round: waiting threads are not always
// asked (MAX_SKIPPED_CPU_READS), and the thread running the round takes its CPU time
// from the round's source when it has one (the worker: the count of its CPU timer's
// expirations).
//
// The per-thread table is an st_table keyed by Thread object. Keys are marked with
// rb_gc_mark, which pins them: GC compaction never moves them, so their hashes stay
// valid. Entries of dead threads are removed at every sample.
#include "collectors/collectors_cpu_and_wall_time.h"

#include <ruby/st.h>
#include <string.h>
#include <time.h>

#include "collectors/collectors_stack.h"
#include "pprof/pprof_util.h"
#include "ruby_helpers.h"
#include "recorder/stack_recorder.h"
#include "vm/vm.h"

typedef struct {
  long thread_id; // the "thread id" label: 1, 2, 3... in the order threads were first seen
  bool has_cpu_clock;
  clockid_t cpu_clock;
  bool clocks_started;
  // False while the thread's CPU clock could not be read (a thread not started yet):
  // its first readable value is then a baseline, not a delta.
  bool cpu_baseline_valid;
  int64_t cpu_time_at_previous_sample_ns;
  int64_t wall_time_at_previous_sample_ns;
  int64_t sampled_at_ns; // CLOCK_MONOTONIC when its CPU clock was last read
  VALUE name_at_previous_sample; // its name object (labels change when it does)
  contprof_stack_memo memo;
  int cpu_reads_skipped; // see MAX_SKIPPED_CPU_READS
  // The thread's last sample taken while it was not waiting (see sample_thread).
  pprof_sample_ref running_ref;
  bool has_running_ref;
} per_thread_context;

// Reading a thread's CPU clock is a system call, the biggest cost of sampling an idle
// thread. A thread found waiting where it waited at its previous sample (same frames) is
// not asked for up to this many samples in a row: its CPU delta is then 0, and whatever
// it used meanwhile is counted (not lost) at the next read.
#define MAX_SKIPPED_CPU_READS 9

typedef struct {
  VALUE recorder;
  VALUE ignored_threads; // Array of threads never sampled (the profiler's own)
  contprof_stack_sampler *sampler;
  st_table *threads; // Thread => per_thread_context *
  long next_thread_id;
  uint64_t sample_rounds;
  uint64_t cpu_clock_reads; // CPU clocks read (system calls)
  uint64_t cpu_times_from_source; // the calling thread's CPU taken from the round's time source
  int cpu_time_index, cpu_samples_index, wall_time_index; // in the recorder's values, or -1
  size_t value_count;
} collector_state;

static void collector_mark(void *data);
static void collector_free(void *data);
static size_t collector_memsize(const void *data);

static const rb_data_type_t collector_type = {
  .wrap_struct_name = "Contprof::Collectors::CpuAndWallTime",
  .function = {.dmark = collector_mark, .dfree = collector_free, .dsize = collector_memsize},
  .flags = RUBY_TYPED_FREE_IMMEDIATELY,
};

static int mark_thread(st_data_t key, st_data_t value, st_data_t unused) {
  rb_gc_mark((VALUE) key); // pins: the table hashes by address
  return ST_CONTINUE;
}

static void collector_mark(void *data) {
  collector_state *state = data;
  rb_gc_mark(state->recorder);
  rb_gc_mark(state->ignored_threads);
  if (state->threads) st_foreach(state->threads, mark_thread, 0);
}

static void free_context_memory(per_thread_context *context) {
  contprof_stack_memo_release(&context->memo);
  ruby_xfree(context);
}

static int free_context(st_data_t key, st_data_t value, st_data_t unused) {
  free_context_memory((per_thread_context *) value);
  return ST_DELETE;
}

static void collector_free(void *data) {
  collector_state *state = data;
  if (state->threads) {
    st_foreach(state->threads, free_context, 0);
    st_free_table(state->threads);
  }
  contprof_stack_sampler_free(state->sampler);
  ruby_xfree(state);
}

static int add_memo_size(st_data_t key, st_data_t value, st_data_t size) {
  *(size_t *) size += contprof_stack_memo_memsize(&((per_thread_context *) value)->memo);
  return ST_CONTINUE;
}

static size_t collector_memsize(const void *data) {
  const collector_state *state = data;
  size_t size = sizeof(*state);
  if (state->sampler) size += contprof_stack_sampler_memsize(state->sampler);
  if (state->threads) {
    size += st_memsize(state->threads) + state->threads->num_entries * sizeof(per_thread_context);
    st_foreach(state->threads, add_memo_size, (st_data_t) &size);
  }
  return size;
}

static VALUE collector_alloc(VALUE klass) {
  collector_state *state = ruby_xcalloc(1, sizeof(collector_state));
  state->recorder = Qnil;
  state->ignored_threads = Qnil;
  state->cpu_time_index = state->cpu_samples_index = state->wall_time_index = -1;
  return TypedData_Wrap_Struct(klass, &collector_type, state);
}

VALUE contprof_enforce_cpu_and_wall_time(VALUE collector) {
  if (!rb_typeddata_is_kind_of(collector, &collector_type)) {
    contprof_raise_type_error(collector, "collector", "a Contprof::Collectors::CpuAndWallTime");
  }
  return collector;
}

static collector_state *initialized_state(VALUE collector) {
  collector_state *state = rb_check_typeddata(collector, &collector_type);
  if (!state->threads) rb_raise(contprof_error_class, "this CpuAndWallTime collector was not initialized");
  return state;
}

// CpuAndWallTime.new(recorder:, max_frames: 400)
static VALUE collector_initialize(int argc, VALUE *argv, VALUE self) {
  VALUE options;
  rb_scan_args(argc, argv, "0:", &options);
  static ID keywords[2];
  if (!keywords[0]) {
    keywords[0] = rb_intern("recorder");
    keywords[1] = rb_intern("max_frames");
  }
  VALUE values[2] = {Qundef, Qundef};
  rb_get_kwargs(NIL_P(options) ? rb_hash_new() : options, keywords, 1, 1, values);
  VALUE recorder = contprof_enforce_recorder(values[0]);
  int max_frames = values[1] == Qundef ? CONTPROF_DEFAULT_MAX_FRAMES : contprof_validate_max_frames(values[1]);
  if (!contprof_vm_supported()) rb_raise(contprof_error_class, "CPU and wall-time sampling is not supported by this build");

  collector_state *state = rb_check_typeddata(self, &collector_type);
  if (state->threads) rb_raise(contprof_error_class, "this CpuAndWallTime collector is already initialized");
  state->recorder = recorder;
  state->value_count = contprof_recorder_value_count(recorder);
  state->cpu_time_index = contprof_recorder_value_index(recorder, "cpu-time", strlen("cpu-time"));
  state->cpu_samples_index = contprof_recorder_value_index(recorder, "cpu-samples", strlen("cpu-samples"));
  state->wall_time_index = contprof_recorder_value_index(recorder, "wall-time", strlen("wall-time"));
  if (state->cpu_time_index < 0 && state->cpu_samples_index < 0 && state->wall_time_index < 0) {
    rb_raise(rb_eArgError, "recorder: its sample types must include cpu-time, cpu-samples or wall-time");
  }
  state->sampler = contprof_stack_sampler_new(max_frames);
  state->next_thread_id = 1;
  state->threads = st_init_numtable();
  state->ignored_threads = rb_ary_new();
  return self;
}

static int64_t monotonic_ns(void) { return contprof_monotonic_ns(); }

// The thread's CPU time, or -1 when it cannot be read (not started, or finished).
static int64_t thread_cpu_time_ns(per_thread_context *context, VALUE thread) {
  if (!context->has_cpu_clock) {
    pthread_t pthread;
    if (!contprof_vm_thread_pthread(thread, &pthread)) return -1;
    if (pthread_getcpuclockid(pthread, &context->cpu_clock) != 0) return -1;
    context->has_cpu_clock = true;
  }
  struct timespec ts;
  if (clock_gettime(context->cpu_clock, &ts) != 0) return -1;
  return contprof_timespec_ns(ts);
}

static per_thread_context *context_for(collector_state *state, VALUE thread) {
  st_data_t value;
  if (st_lookup(state->threads, (st_data_t) thread, &value)) return (per_thread_context *) value;
  per_thread_context *context = ruby_xcalloc(1, sizeof(per_thread_context));
  context->thread_id = state->next_thread_id++;
  st_insert(state->threads, (st_data_t) thread, (st_data_t) context);
  return context;
}

// Makes `cpu_now` (the thread's CPU clock value, or -1 when unknown) its new baseline;
// returns the CPU time used since the previous one (0 when there is no valid previous one).
static int64_t advance_cpu_baseline(per_thread_context *context, int64_t cpu_now) {
  context->sampled_at_ns = contprof_monotonic_ns();
  if (cpu_now < 0) return 0;
  int64_t delta = context->cpu_baseline_valid ? cpu_now - context->cpu_time_at_previous_sample_ns : 0;
  context->cpu_time_at_previous_sample_ns = cpu_now;
  context->cpu_baseline_valid = true;
  return delta > 0 ? delta : 0;
}

// Reads the thread's CPU clock (a system call) and makes it the new baseline.
static int64_t advance_cpu_clock(collector_state *state, per_thread_context *context, VALUE thread) {
  state->cpu_clock_reads++;
  return advance_cpu_baseline(context, thread_cpu_time_ns(context, thread));
}

static void start_clocks(collector_state *state, per_thread_context *context, VALUE thread, int64_t wall_now) {
  advance_cpu_clock(state, context, thread);
  context->wall_time_at_previous_sample_ns = wall_now;
  context->clocks_started = true;
}

// A sample's values in the recorder's order: cpu-time, cpu-samples (1 when there is CPU),
// wall-time, for those of them the recorder has.
static void fill_values(const collector_state *state, int64_t values[PPROF_MAX_SAMPLE_TYPES], int64_t cpu_delta,
                        int64_t wall_delta) {
  memset(values, 0, PPROF_MAX_SAMPLE_TYPES * sizeof(int64_t));
  if (state->cpu_time_index >= 0) values[state->cpu_time_index] = cpu_delta;
  if (state->cpu_samples_index >= 0) values[state->cpu_samples_index] = cpu_delta > 0 ? 1 : 0;
  if (state->wall_time_index >= 0) values[state->wall_time_index] = wall_delta;
}

// Adds CPU and wall time to a sample recorded earlier; false when that sample is no
// longer in the active profile.
static bool add_to_earlier_sample(collector_state *state, const pprof_sample_ref *ref, int64_t cpu_delta,
                                  int64_t wall_delta) {
  int64_t values[PPROF_MAX_SAMPLE_TYPES];
  fill_values(state, values, cpu_delta, wall_delta);
  return contprof_recorder_add_again(state->recorder, ref, values, state->value_count);
}

static int64_t advance_wall_clock(per_thread_context *context, int64_t wall_now) {
  int64_t wall_delta = wall_now - context->wall_time_at_previous_sample_ns;
  context->wall_time_at_previous_sample_ns = wall_now;
  return wall_delta > 0 ? wall_delta : 0;
}

// Records one sample of `thread`: its stack with the time elapsed since its previous sample.
// `final_round`: read the CPU clock whatever the thread does; `calling_thread`: this is the
// thread running the sampling.
static pprof_status sample_thread(collector_state *state, VALUE thread, per_thread_context *context, int64_t wall_now,
                                  bool final_round, bool calling_thread, contprof_cpu_time_source cpu_source,
                                  pprof_error *error) {
  if (!context->clocks_started) {
    start_clocks(state, context, thread, wall_now);
    return PPROF_OK;
  }
  // The thread running the final round is inside the profiler's stop: the time since its
  // previous sample was spent before it called stop, in the application. Its CPU goes to
  // its last sample taken while running, its wall time to its previous sample (where it
  // was last seen), rather than to the profiler's own frames. Recorded with its current
  // stack only when those samples have left the active profile.
  bool deltas_known = final_round && calling_thread;
  int64_t cpu_delta = 0, wall_delta = 0;
  if (deltas_known) {
    cpu_delta = advance_cpu_clock(state, context, thread);
    wall_delta = advance_wall_clock(context, wall_now);
    if (cpu_delta > 0 && context->has_running_ref &&
        add_to_earlier_sample(state, &context->running_ref, cpu_delta, 0)) {
      cpu_delta = 0;
    }
    if (context->memo.valid && add_to_earlier_sample(state, &context->memo.ref, cpu_delta, wall_delta)) {
      return PPROF_OK;
    }
  }
  // Thread#name= stores a new frozen string, so an unchanged name is the same object.
  VALUE name = contprof_vm_thread_name(thread);
  if (name != context->name_at_previous_sample) context->memo.valid = false;
  context->name_at_previous_sample = name;
  bool unchanged;
  pprof_status status = contprof_stack_read(state->sampler, thread, &context->memo, &unchanged, error);
  if (status != PPROF_OK) return status;

  bool waiting = contprof_vm_thread_waiting(thread);
  if (!deltas_known) {
    int64_t cpu_from_source;
    if (!final_round && unchanged && waiting && context->cpu_reads_skipped < MAX_SKIPPED_CPU_READS) {
      context->cpu_reads_skipped++;
    } else if (calling_thread && cpu_source && context->cpu_baseline_valid && cpu_source(thread, &cpu_from_source) &&
               cpu_from_source > context->cpu_time_at_previous_sample_ns) {
      // (The final round never gets here: it reads every clock, so totals end exact.)
      cpu_delta = advance_cpu_baseline(context, cpu_from_source);
      state->cpu_times_from_source++;
    } else {
      cpu_delta = advance_cpu_clock(state, context, thread);
      context->cpu_reads_skipped = 0;
    }
    // A thread waiting in Ruby (sleep, Queue#pop, Mutex#lock, ConditionVariable#wait,
    // Thread#join) uses no CPU where it waits: the CPU it used since its previous sample
    // was used before it started waiting. Recorded with the waiting stack it would show up
    // as CPU in Kernel#sleep; it goes to the thread's last sample taken while it was
    // running instead (when that sample is still in the active profile).
    if (waiting && cpu_delta > 0 && context->has_running_ref &&
        add_to_earlier_sample(state, &context->running_ref, cpu_delta, 0)) {
      cpu_delta = 0;
    }
    wall_delta = advance_wall_clock(context, wall_now);
  }

  int64_t values[PPROF_MAX_SAMPLE_TYPES];
  fill_values(state, values, cpu_delta, wall_delta);

  pprof_label labels[2];
  size_t label_count = 0;
  labels[label_count++] = (pprof_label) {.key = PPROF_STR("thread id"), .num = context->thread_id};
  if (RB_TYPE_P(name, T_STRING) && RSTRING_LEN(name) > 0) {
    labels[label_count++] =
      (pprof_label) {.key = PPROF_STR("thread name"), .str = {RSTRING_PTR(name), (size_t) RSTRING_LEN(name)}};
  }
  status = contprof_stack_record(state->sampler, state->recorder, values, state->value_count, labels, label_count,
                                 &context->memo, unchanged, error);
  if (status == PPROF_OK && !waiting && !deltas_known && context->memo.valid) {
    context->running_ref = context->memo.ref;
    context->has_running_ref = true;
  }
  return status;
}

typedef struct {
  collector_state *state;
  VALUE current_thread;
  int64_t wall_now;
  bool final_round;
  contprof_cpu_time_source cpu_source;
  size_t threads_seen;
  pprof_status status;
  pprof_error *error;
} sampling_round;

static bool ignored(const collector_state *state, VALUE thread) {
  for (long i = 0; i < RARRAY_LEN(state->ignored_threads); i++) {
    if (RARRAY_AREF(state->ignored_threads, i) == thread) return true;
  }
  return false;
}

static void sample_visited_thread(VALUE thread, void *data) {
  sampling_round *round = data;
  if (ignored(round->state, thread)) return;
  round->threads_seen++;
  per_thread_context *context = context_for(round->state, thread);
  pprof_error error;
  pprof_status status = sample_thread(round->state, thread, context, round->wall_now, round->final_round,
                                      thread == round->current_thread, round->cpu_source, &error);
  if (status != PPROF_OK && round->status == PPROF_OK) {
    round->status = status;
    *round->error = error;
  }
}

static int remove_dead_thread(st_data_t key, st_data_t value, st_data_t unused) {
  if (contprof_vm_thread_alive((VALUE) key)) return ST_CONTINUE;
  free_context_memory((per_thread_context *) value);
  return ST_DELETE;
}

pprof_status contprof_cpu_and_wall_time_sample(VALUE collector, bool final_round,
                                               contprof_cpu_time_source calling_thread_cpu, pprof_error *error) {
  collector_state *state = RTYPEDDATA_DATA(collector);
  sampling_round round = {.state = state,
                          .current_thread = rb_thread_current(),
                          .wall_now = monotonic_ns(),
                          .final_round = final_round,
                          .cpu_source = calling_thread_cpu,
                          .status = PPROF_OK,
                          .error = error};
  contprof_vm_each_thread(sample_visited_thread, &round);
  state->sample_rounds++;

  // Leave out what this round cost the thread that ran it: that thread was busy sampling
  // from its own sample on, so the wall time since then is CPU time (a second read of its
  // CPU clock would cost a system call).
  VALUE current = round.current_thread;
  st_data_t value;
  if (!ignored(state, current) && st_lookup(state->threads, (st_data_t) current, &value)) {
    per_thread_context *context = (per_thread_context *) value;
    // (Only when this round read or took its CPU time: a skipped read leaves an older
    // sampled_at_ns, and adding the time since then would push the baseline past its clock.)
    if (context->cpu_baseline_valid && context->sampled_at_ns >= round.wall_now) {
      context->cpu_time_at_previous_sample_ns += contprof_monotonic_ns() - context->sampled_at_ns;
    }
  }
  // Every live thread has an entry; more entries than live threads means some died.
  if (state->threads->num_entries > round.threads_seen) st_foreach(state->threads, remove_dead_thread, 0);
  return round.status;
}

void contprof_cpu_and_wall_time_on_thread_begin(VALUE collector, VALUE thread) {
  collector_state *state = RTYPEDDATA_DATA(collector);
  if (ignored(state, thread)) return;
  per_thread_context *context = context_for(state, thread);
  if (!context->clocks_started) {
    start_clocks(state, context, thread, monotonic_ns());
  } else if (!context->cpu_baseline_valid) {
    // Seen by a sample before it started running: its CPU clock starts now.
    advance_cpu_clock(state, context, thread);
  }
}

pprof_status contprof_cpu_and_wall_time_on_thread_end(VALUE collector, VALUE thread, pprof_error *error) {
  collector_state *state = RTYPEDDATA_DATA(collector);
  if (ignored(state, thread)) return PPROF_OK;
  st_data_t key = (st_data_t) thread, value;
  if (!st_lookup(state->threads, key, &value)) return PPROF_OK;
  per_thread_context *context = (per_thread_context *) value;
  pprof_status status = PPROF_OK;
  if (context->clocks_started) status = sample_thread(state, thread, context, monotonic_ns(), true, false, NULL, error);
  st_delete(state->threads, &key, &value);
  free_context_memory((per_thread_context *) value);
  return status;
}

static void start_visited_thread_clocks(VALUE thread, void *data) {
  contprof_cpu_and_wall_time_on_thread_begin((VALUE) data, thread);
}

void contprof_cpu_and_wall_time_start_clocks(VALUE collector) {
  contprof_vm_each_thread(start_visited_thread_clocks, (void *) collector);
}

void contprof_cpu_and_wall_time_reset(VALUE collector) {
  collector_state *state = initialized_state(collector);
  st_foreach(state->threads, free_context, 0);
  state->sample_rounds = state->cpu_clock_reads = state->cpu_times_from_source = 0;
}

void contprof_cpu_and_wall_time_ignore_thread(VALUE collector, VALUE thread) {
  collector_state *state = initialized_state(collector);
  if (!ignored(state, thread)) rb_ary_push(state->ignored_threads, thread);
  // Forget threads that are gone, so the list stays as short as the profiler's threads.
  for (long i = RARRAY_LEN(state->ignored_threads) - 1; i >= 0; i--) {
    if (!contprof_vm_thread_alive(RARRAY_AREF(state->ignored_threads, i))) {
      rb_ary_delete_at(state->ignored_threads, i);
    }
  }
}

static VALUE collector_ignore_thread(VALUE self, VALUE thread) {
  if (!contprof_vm_is_thread(thread)) contprof_raise_type_error(thread, "thread", "a Thread");
  contprof_cpu_and_wall_time_ignore_thread(self, thread);
  return self;
}

// collector.sample: samples every live thread once.
static VALUE collector_sample(VALUE self) {
  initialized_state(self);
  pprof_error error;
  pprof_status status = contprof_cpu_and_wall_time_sample(self, false, NULL, &error);
  if (status != PPROF_OK) contprof_raise_pprof_error(status, &error, "CpuAndWallTime#sample");
  return Qnil;
}

static VALUE collector_reset_after_fork(VALUE self) {
  contprof_cpu_and_wall_time_reset(self);
  return self;
}

static VALUE collector_sample_rounds(VALUE self) { return ULL2NUM(initialized_state(self)->sample_rounds); }

// collector.stats: rounds, CPU clocks read, and CPU times taken from the rounds' source.
static VALUE collector_stats(VALUE self) {
  collector_state *state = initialized_state(self);
  VALUE stats = rb_hash_new();
  rb_hash_aset(stats, ID2SYM(rb_intern("sample_rounds")), ULL2NUM(state->sample_rounds));
  rb_hash_aset(stats, ID2SYM(rb_intern("cpu_clock_reads")), ULL2NUM(state->cpu_clock_reads));
  rb_hash_aset(stats, ID2SYM(rb_intern("cpu_times_from_timers")), ULL2NUM(state->cpu_times_from_source));
  return stats;
}

static int add_context_to_hash(st_data_t key, st_data_t value, st_data_t hash) {
  const per_thread_context *context = (const per_thread_context *) value;
  VALUE entry = rb_hash_new();
  rb_hash_aset(entry, ID2SYM(rb_intern("thread_id")), LONG2NUM(context->thread_id));
  rb_hash_aset(entry, ID2SYM(rb_intern("clocks_started")), context->clocks_started ? Qtrue : Qfalse);
  rb_hash_aset(entry, ID2SYM(rb_intern("cpu_time_at_previous_sample_ns")),
               context->cpu_baseline_valid ? LL2NUM(context->cpu_time_at_previous_sample_ns) : Qnil);
  rb_hash_aset(entry, ID2SYM(rb_intern("wall_time_at_previous_sample_ns")),
               LL2NUM(context->wall_time_at_previous_sample_ns));
  rb_hash_aset((VALUE) hash, (VALUE) key, entry);
  return ST_CONTINUE;
}

static VALUE per_thread_context_hash(VALUE collector) {
  collector_state *state = initialized_state(collector);
  VALUE hash = rb_hash_new();
  st_foreach(state->threads, add_context_to_hash, (st_data_t) hash);
  return hash;
}

static VALUE collector_inspect(VALUE self) {
  collector_state *state = rb_check_typeddata(self, &collector_type);
  if (!state->threads) return rb_sprintf("#<Contprof::Collectors::CpuAndWallTime (not initialized)>");
  return rb_sprintf("#<Contprof::Collectors::CpuAndWallTime threads=%" PRIsVALUE " sample_rounds=%llu "
                    "next_thread_id=%ld recorder=%" PRIsVALUE ">",
                    per_thread_context_hash(self), (unsigned long long) state->sample_rounds, state->next_thread_id,
                    rb_inspect(state->recorder));
}

static VALUE testing_per_thread_context(VALUE module, VALUE collector) {
  return per_thread_context_hash(contprof_enforce_cpu_and_wall_time(collector));
}

void contprof_collectors_cpu_and_wall_time_init(VALUE contprof_module) {
  VALUE collectors = rb_define_module_under(contprof_module, "Collectors");
  VALUE klass = rb_define_class_under(collectors, "CpuAndWallTime", rb_cObject);
  rb_define_alloc_func(klass, collector_alloc);
  rb_define_method(klass, "initialize", collector_initialize, -1);
  rb_define_method(klass, "sample", collector_sample, 0);
  rb_define_method(klass, "sample_rounds", collector_sample_rounds, 0);
  rb_define_method(klass, "stats", collector_stats, 0);
  rb_define_method(klass, "ignore_thread", collector_ignore_thread, 1);
  rb_define_method(klass, "reset_after_fork", collector_reset_after_fork, 0);
  rb_define_method(klass, "inspect", collector_inspect, 0);
  VALUE testing = rb_define_module_under(klass, "Testing");
  rb_define_singleton_method(testing, "per_thread_context", testing_per_thread_context, 1);
}
