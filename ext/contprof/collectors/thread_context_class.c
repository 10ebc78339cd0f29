// Contprof::Collectors::ThreadContext (also known by the seed's name, CpuAndWallTime), the
// Ruby class: allocation, GC marking, the constructor, methods and statistics. What its
// rounds record is in thread_context.c, which knows nothing of this file.
#include <string.h>

#include "collectors/allocations.h"
#include "collectors/thread_context.h"
#include "collectors/thread_context_state.h"
#include "profiler_threads.h"
#include "recorder/stack_recorder.h"
#include "ruby_helpers.h"

static void collector_mark(void *data);
static void collector_free(void *data);
static size_t collector_memsize(const void *data);
static void collector_compact(void *data);

static const rb_data_type_t collector_type = {
  .wrap_struct_name = "Contprof::Collectors::ThreadContext",
  .function = {.dmark = collector_mark, .dfree = collector_free, .dsize = collector_memsize, .dcompact = collector_compact},
  .flags = RUBY_TYPED_FREE_IMMEDIATELY,
};

static int mark_thread(st_data_t key, st_data_t value, st_data_t CONTPROF_UNUSED unused) {
  rb_gc_mark((VALUE) key); // pins: the table hashes by address
  rb_gc_mark(((per_thread_context *) value)->labels_seen.name); // compared by identity: pinned too
  return ST_CONTINUE;
}

static void collector_mark(void *data) {
  collector_state *state = data;
  rb_gc_mark(state->recorder);
  rb_gc_mark(state->gc.last_thread);
  if (state->threads) st_foreach(state->threads, mark_thread, 0);
}

// Everything marked above is pinned (rb_gc_mark); only the live-heap tracker's objects,
// which it never marks, may have moved.
static void collector_compact(void *data) {
  collector_state *state = data;
  contprof_heap_tracker_update_references(state->allocations.heap);
}

static void collector_free(void *data) {
  collector_state *state = data;
  if (state->threads) {
    contprof_thread_context_forget_all(state);
    st_free_table(state->threads);
  }
  contprof_stack_sampler_free(state->sampler);
  contprof_heap_tracker_free(state->allocations.heap);
  ruby_xfree(state);
}

static int add_memo_size(st_data_t CONTPROF_UNUSED key, st_data_t value, st_data_t size) {
  *(size_t *) size += contprof_stack_memo_memsize(&((per_thread_context *) value)->memo);
  return ST_CONTINUE;
}

static size_t collector_memsize(const void *data) {
  const collector_state *state = data;
  size_t size = sizeof(*state);
  if (state->sampler) size += contprof_stack_sampler_memsize(state->sampler);
  size += contprof_heap_tracker_stats_of(state->allocations.heap).bytes;
  if (state->threads) {
    size += st_memsize(state->threads) + state->threads->num_entries * sizeof(per_thread_context);
    st_foreach(state->threads, add_memo_size, (st_data_t) &size);
  }
  return size;
}

static VALUE collector_alloc(VALUE klass) {
  collector_state *state = ruby_xcalloc(1, sizeof(collector_state));
  state->recorder = Qnil;
  state->gc.last_thread = Qnil;
  state->cpu_time_index = state->cpu_samples_index = state->wall_time_index = state->wall_samples_index = -1;
  contprof_allocations_init(&state->allocations);
  return TypedData_Wrap_Struct(klass, &collector_type, state);
}

VALUE contprof_enforce_thread_context(VALUE collector) {
  if (!rb_typeddata_is_kind_of(collector, &collector_type)) {
    contprof_raise_type_error(collector, "collector", "a Contprof::Collectors::ThreadContext");
  }
  if (!((collector_state *) RTYPEDDATA_DATA(collector))->threads) {
    rb_raise(contprof_error_class, "this ThreadContext collector was not initialized (create it with new)");
  }
  return collector;
}

static collector_state *initialized_state(VALUE collector) {
  collector_state *state = rb_check_typeddata(collector, &collector_type);
  if (!state->threads) rb_raise(contprof_error_class, "this ThreadContext collector was not initialized");
  return state;
}

// ThreadContext.new(recorder:, max_frames: 400, timeline: false)
static VALUE collector_initialize(int argc, VALUE *argv, VALUE self) {
  VALUE options;
  rb_scan_args(argc, argv, "0:", &options);
  static ID keywords[3];
  if (!keywords[0]) {
    keywords[0] = rb_intern("recorder");
    keywords[1] = rb_intern("max_frames");
    keywords[2] = rb_intern("timeline");
  }
  VALUE values[3] = {Qundef, Qundef, Qundef};
  rb_get_kwargs(NIL_P(options) ? rb_hash_new() : options, keywords, 1, 2, values);
  if (values[2] != Qundef && values[2] != Qtrue && values[2] != Qfalse) {
    rb_raise(rb_eArgError, "timeline: expected true or false, got %" PRIsVALUE, rb_inspect(values[2]));
  }
  VALUE recorder = contprof_enforce_recorder(values[0]);
  int max_frames = values[1] == Qundef ? contprof_default_max_frames() : contprof_validate_max_frames(values[1]);
  if (!contprof_vm_supported()) rb_raise(contprof_error_class, "CPU and wall-time sampling is not supported by this build");

  collector_state *state = rb_check_typeddata(self, &collector_type);
  if (state->threads) rb_raise(contprof_error_class, "this ThreadContext collector is already initialized");
  state->recorder = recorder;
  state->timeline.on = values[2] == Qtrue;
  state->value_count = contprof_recorder_value_count(recorder);
  state->cpu_time_index = contprof_recorder_value_index(recorder, "cpu-time", strlen("cpu-time"));
  state->cpu_samples_index = contprof_recorder_value_index(recorder, "cpu-samples", strlen("cpu-samples"));
  state->wall_time_index = contprof_recorder_value_index(recorder, "wall-time", strlen("wall-time"));
  state->wall_samples_index = contprof_recorder_value_index(recorder, "wall-samples", strlen("wall-samples"));
  if (state->cpu_time_index < 0 && state->cpu_samples_index < 0 && state->wall_time_index < 0) {
    rb_raise(rb_eArgError, "recorder: its sample types must include cpu-time, cpu-samples or wall-time");
  }
  contprof_allocations_bind(state);
  state->sampler = contprof_stack_sampler_new(max_frames);
  state->next_thread_id = 1;
  state->threads = st_init_numtable();
  return self;
}

void contprof_thread_context_reset(VALUE collector) {
  collector_state *state = initialized_state(collector);
  contprof_thread_context_forget_all(state);
#define RESET_COUNTER(name, field) state->field = 0;
  COLLECTOR_COUNTERS(RESET_COUNTER)
#undef RESET_COUNTER
  contprof_allocations_reset(&state->allocations);
  contprof_gc_time_reset(&state->gc);
}

void contprof_thread_context_ignore_thread(VALUE CONTPROF_UNUSED collector, VALUE thread) { contprof_profiler_threads_add(thread); }

static VALUE collector_ignore_thread(VALUE self, VALUE thread) {
  if (!contprof_vm_is_thread(thread)) contprof_raise_type_error(thread, "thread", "a Thread");
  contprof_thread_context_ignore_thread(self, thread);
  return self;
}

// ---------------------------------------------------------------------------------------
// Ruby methods

// collector.sample: one wall round of every live thread (CPU from their clocks).
static VALUE collector_sample(VALUE self) {
  initialized_state(self);
  pprof_error error;
  contprof_round round = {.kind = CONTPROF_ROUND_WALL, .gc_thread_at_tick = Qnil, .gc_moment_at_tick = 0,
                          .holder_at_tick = Qnil};
  pprof_status status = contprof_thread_context_sample(self, &round, &error);
  if (status != PPROF_OK) contprof_raise_pprof_error(status, &error, "ThreadContext#sample");
  return Qnil;
}

static VALUE collector_reset_after_fork(VALUE self) {
  contprof_thread_context_reset(self);
  return self;
}

// collector.record_heap_live: records every tracked object still alive into the
// recorder's heap-live types (right before the recorder is serialized); no-op without them.
static VALUE collector_record_heap_live(VALUE self) {
  collector_state *state = initialized_state(self);
  const contprof_allocation_state *allocations = &state->allocations;
  if (!allocations->heap) return Qnil;
  pprof_error error;
  pprof_status status = contprof_heap_tracker_record_live(allocations->heap, state->recorder, allocations->heap_samples_index,
                                                          allocations->heap_size_index, allocations->heap_unscaled_index,
                                                          state->value_count, &error);
  if (status != PPROF_OK) contprof_raise_pprof_error(status, &error, "ThreadContext#record_heap_live");
  return Qnil;
}

// collector.charge_stretches: records, up to now, the time of every stretch off the GVL
// that a tick found and that still goes on (right before the recorder is serialized: the
// wall clock may have parked, thread_context.h).
static VALUE collector_charge_stretches(VALUE self) {
  initialized_state(self);
  pprof_error error;
  pprof_status status = contprof_thread_context_charge_stretches(self, &error);
  if (status != PPROF_OK) contprof_raise_pprof_error(status, &error, "ThreadContext#charge_stretches");
  return Qnil;
}

static VALUE collector_rounds(VALUE self) { return ULL2NUM(initialized_state(self)->rounds); }

// Live threads' GVL waits, by "thread id" label (those of finished threads are in the total).
static int add_gvl_wait(st_data_t CONTPROF_UNUSED key, st_data_t value, st_data_t hash) {
  const per_thread_context *context = (const per_thread_context *) value;
  if (context->gvl.wait_ns > 0) {
    rb_hash_aset((VALUE) hash, rb_str_new(context->thread_id_label, (long) context->thread_id_label_len),
                 LL2NUM(context->gvl.wait_ns));
  }
  return ST_CONTINUE;
}

// collector.stats: rounds, CPU clocks read, and records by kind.
static VALUE collector_stats(VALUE self) {
  collector_state *state = initialized_state(self);
  VALUE stats = rb_hash_new();
#define STAT(name, field) rb_hash_aset(stats, ID2SYM(rb_intern(#name)), ULL2NUM(state->field));
  COLLECTOR_COUNTERS(STAT)
#undef STAT
  VALUE by_thread = rb_hash_new();
  st_foreach(state->threads, add_gvl_wait, (st_data_t) by_thread);
  rb_hash_aset(stats, ID2SYM(rb_intern("gvl_wait_ns_by_thread")), by_thread);
  rb_hash_aset(stats, ID2SYM(rb_intern("thread_state_names_read")), ULL2NUM(state->states.names_read));
  rb_hash_aset(stats, ID2SYM(rb_intern("stacks_unread_no_memory")), ULL2NUM(contprof_stack_unread_count(state->sampler)));
  rb_hash_aset(stats, ID2SYM(rb_intern("threads_unknown_no_memory")), ULL2NUM(contprof_vm_threads_unknown_no_memory()));
  rb_hash_aset(stats, ID2SYM(rb_intern("mn_threads_requested")), contprof_vm_mn_threads_requested() ? Qtrue : Qfalse);
  rb_hash_aset(stats, ID2SYM(rb_intern("threads_sharing_native")), ULL2NUM(contprof_vm_threads_sharing_native()));
  contprof_heap_tracker_stats heap = contprof_heap_tracker_stats_of(state->allocations.heap);
  rb_hash_aset(stats, ID2SYM(rb_intern("heap_tracked")), ULL2NUM(heap.tracked));
  rb_hash_aset(stats, ID2SYM(rb_intern("heap_tracking_dropped")), ULL2NUM(heap.dropped));
  rb_hash_aset(stats, ID2SYM(rb_intern("heap_live_recorded")), ULL2NUM(heap.live_recorded));
  rb_hash_aset(stats, ID2SYM(rb_intern("heap_tracked_died")), ULL2NUM(heap.died));
  rb_hash_aset(stats, ID2SYM(rb_intern("heap_tracked_replaced")), ULL2NUM(heap.replaced));
  rb_hash_aset(stats, ID2SYM(rb_intern("heap_tracking_stopped")),
               heap.stopped_because ? rb_str_new_cstr(heap.stopped_because) : Qnil);
  rb_hash_aset(stats, ID2SYM(rb_intern("heap_tracker_bytes")), SIZET2NUM(heap.bytes));
  return stats;
}

static int add_context_to_hash(st_data_t key, st_data_t value, st_data_t hash) {
  const per_thread_context *context = (const per_thread_context *) value;
  VALUE entry = rb_hash_new();
  rb_hash_aset(entry, ID2SYM(rb_intern("thread_id")), LONG2NUM(context->thread_id));
  const contprof_thread_clocks *clocks = &context->clocks;
  rb_hash_aset(entry, ID2SYM(rb_intern("clocks_started")), clocks->started ? Qtrue : Qfalse);
  rb_hash_aset(entry, ID2SYM(rb_intern("cpu_time_at_previous_sample_ns")),
               clocks->cpu_baseline_valid ? LL2NUM(clocks->cpu_baseline_ns) : Qnil);
  rb_hash_aset(entry, ID2SYM(rb_intern("wall_time_at_previous_sample_ns")), LL2NUM(clocks->wall_baseline_ns));
  rb_hash_aset(entry, ID2SYM(rb_intern("gc_cpu_debt_ns")), LL2NUM(context->gc_debt.cpu_ns));
  rb_hash_aset(entry, ID2SYM(rb_intern("gc_wall_debt_ns")), LL2NUM(context->gc_debt.wall_ns));
  rb_hash_aset(entry, ID2SYM(rb_intern("gvl_wait_ns")), LL2NUM(context->gvl.wait_ns));
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
  if (!state->threads) return rb_sprintf("#<Contprof::Collectors::ThreadContext (not initialized)>");
  return rb_sprintf("#<Contprof::Collectors::ThreadContext threads=%" PRIsVALUE " rounds=%llu "
                    "next_thread_id=%ld recorder=%" PRIsVALUE ">",
                    per_thread_context_hash(self), (unsigned long long) state->rounds, state->next_thread_id,
                    rb_inspect(state->recorder));
}

static VALUE testing_per_thread_context(VALUE CONTPROF_UNUSED module, VALUE collector) {
  return per_thread_context_hash(contprof_enforce_thread_context(collector));
}

void contprof_thread_context_class_init(VALUE contprof_module) {
  contprof_profiler_threads_init(contprof_module);

  VALUE collectors = rb_define_module_under(contprof_module, "Collectors");
  VALUE klass = rb_define_class_under(collectors, "ThreadContext", rb_cObject);
  // The seed's name for it, which a user of the building blocks may know.
  rb_define_const(collectors, "CpuAndWallTime", klass);
  rb_define_alloc_func(klass, collector_alloc);
  rb_define_method(klass, "initialize", collector_initialize, -1);
  rb_define_method(klass, "sample", collector_sample, 0);
  rb_define_method(klass, "rounds", collector_rounds, 0);
  rb_define_method(klass, "record_heap_live", collector_record_heap_live, 0);
  rb_define_method(klass, "charge_stretches", collector_charge_stretches, 0);
  rb_define_method(klass, "stats", collector_stats, 0);
  rb_define_method(klass, "ignore_thread", collector_ignore_thread, 1);
  rb_define_method(klass, "reset_after_fork", collector_reset_after_fork, 0);
  rb_define_method(klass, "inspect", collector_inspect, 0);
  VALUE testing = rb_define_module_under(klass, "Testing");
  rb_define_singleton_method(testing, "per_thread_context", testing_per_thread_context, 1);
}
