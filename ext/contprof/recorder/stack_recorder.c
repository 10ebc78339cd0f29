// Contprof::StackRecorder: wraps two pprof profiles (pprof_profile.h) so that samples can
// be recorded while the previous period is being serialized.
//
// ## Who touches the recorder
//
// - The **sampler**: whoever records a sample. Samples are only ever recorded by a thread
//   holding the GVL (from Ruby through #record_sample, or from the collectors in C), so
//   there is exactly one sampler at any instant. The sampler must never block.
// - The **serializer**: a thread in #serialize. It does its work with the GVL released,
//   so it runs truly in parallel with the sampler. `serializer_mutex` admits one
//   serializer at a time; a second one waits (without the GVL) for the first.
//
// ## Two slots, and which one is active
//
// The recorder holds two profiles, slot one and slot two, each guarded by its own mutex.
// Exactly one slot is *active* (samples go there); the other is *inactive* (it is being
// serialized, or waits to become active again). The state is encoded in the mutexes
// themselves: **the active slot is the one whose mutex is unlocked**; the inactive
// slot's mutex stays locked between serializations. A new recorder starts with slot one
// active (slot two's mutex locked).
//
// `active_slot` mirrors the state for the serializer and for tests. The sampler never
// reads it: the mutexes are the single source of truth for the sampler.
//
// ## The sampler's side
//
// To record, the sampler try-locks slot one, then slot two; the first it gets is the
// active slot. It records, then unlocks. trylock never waits, so recording is never
// slowed by serialization. Both try-locks can fail only when a flip (below) lands
// exactly between them; the sampler then tries again. Because a flip needs the
// serializer to have been admitted, and a serializer can only be admitted after the
// previous one returned, only a few flips can fit in one sampling attempt; after
// MAX_SAMPLER_ATTEMPTS rounds the sampler gives up and reports an error instead of
// spinning: the sample is dropped, the application is never stalled.
//
// ## The serializer's side: the flip
//
// 1. Set the inactive profile's start time to now (it holds that slot's lock, so this
//    does not race with the sampler). The profile was reset after its last
//    serialization, so it is empty.
// 2. Unlock the inactive slot: it becomes active; samplers start recording into it.
// 3. Lock the previously active slot. This waits only if a sampler is recording into it
//    right now, i.e. for microseconds; from here on it is inactive.
// 4. Update `active_slot`.
//
// Between 2 and 3 both slots are unlocked and a sampler may pick either one. Both are
// correct: a sample in the new slot belongs to the next period, a sample in the old slot
// is part of the profile about to be serialized. No sample is lost or counted twice.
//
// The serializer then encodes the now-inactive profile (GVL released: the application
// keeps running), resets it, and keeps its mutex locked until the next flip. Periods are
// contiguous: a profile's finish time is the flip time, which is the next profile's
// start time.
//
// ## Exceptions and memory
//
// Nothing allocated with malloc may be left behind by a Ruby exception. Argument
// conversion in #record_sample uses scratch buffers owned by the recorder (sized before
// any argument is read, so that no allocation, and so no GC, happens while pointers into
// Ruby strings are held). #serialize checks for pending interrupts only before its
// GVL-free work, and hands its C buffer to Ruby under rb_protect.
#include "recorder/stack_recorder.h"

#include <errno.h>
#include <pthread.h>
#include <ruby/thread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <string.h>

#include "pprof/pprof_alloc.h"
#include "pprof/pprof_util.h"
#include "ruby_helpers.h"

#define MAX_SAMPLER_ATTEMPTS 16

// ## Copies
//
// While `copy_to` is set, every sample recorded here is also recorded there. A sample
// counted again through its ref (contprof_recorder_add_again) must be counted again in the
// copy too: `copies` maps the index of each sample recorded here since the copy began (in
// the active profile it was recorded into) to the copy's ref. A ref from before the copy
// began has no entry: add_again then answers false, and the caller records the sample
// anew, into both.
typedef struct {
  pprof_sample_ref *refs; // indexed by sample index; .profile NULL: none
  uint32_t capacity;
  const pprof_profile *profile; // the profile (and reset) the indexes belong to
  uint64_t reset_count;
} copy_map;

typedef struct {
  pthread_mutex_t slot_one_mutex;
  pprof_profile *slot_one_profile;
  pthread_mutex_t slot_two_mutex;
  pprof_profile *slot_two_profile;
  pthread_mutex_t serializer_mutex;
  int active_slot; // 1 or 2. NEVER read by the sampler: see the notes above.

  size_t value_count;
  char *type_names[PPROF_MAX_SAMPLE_TYPES];
  char *unit_names[PPROF_MAX_SAMPLE_TYPES];

  // Argument scratch space for #record_sample.
  pprof_frame *scratch_frames;
  size_t scratch_frames_capacity;
  pprof_label scratch_labels[PPROF_MAX_LABELS];
  size_t scratch_label_count;
  int64_t scratch_values[PPROF_MAX_SAMPLE_TYPES];

  // A recorder that gets a copy of every sample recorded here (Contprof.profile inside
  // continuous profiling), or Qnil; see "Copies" below. Only touched holding the GVL.
  VALUE copy_to;
  copy_map copies;

  // Statistics. The sampler's counters change under the GVL; the serializer's without it.
  uint64_t samples_recorded;
  uint64_t samples_failed;
  atomic_uint_fast64_t serializations;
  atomic_uint_fast64_t serialization_failures;
  atomic_uint_fast64_t last_serialize_ns;
} recorder_state;

static VALUE stack_recorder_class = Qnil;

static void recorder_free(void *data);
static size_t recorder_memsize(const void *data);

static void recorder_mark(void *data) {
  rb_gc_mark(((recorder_state *) data)->copy_to); // pinned: the sampler holds it without the VM's knowledge
}

static const rb_data_type_t recorder_type = {
  .wrap_struct_name = "Contprof::StackRecorder",
  .function = {.dmark = recorder_mark, .dfree = recorder_free, .dsize = recorder_memsize},
  .flags = RUBY_TYPED_FREE_IMMEDIATELY,
};

static const pprof_value_type default_sample_types[] = {
  {PPROF_STR("cpu-time"), PPROF_STR("nanoseconds")},
  {PPROF_STR("cpu-samples"), PPROF_STR("count")},
  {PPROF_STR("wall-time"), PPROF_STR("nanoseconds")},
};

static void init_mutexes(recorder_state *state) {
  pthread_mutex_init(&state->slot_one_mutex, NULL);
  pthread_mutex_init(&state->slot_two_mutex, NULL);
  pthread_mutex_init(&state->serializer_mutex, NULL);
  // Slot one starts active, so slot two's mutex starts locked.
  pthread_mutex_lock(&state->slot_two_mutex);
  state->active_slot = 1;
}

static VALUE recorder_alloc(VALUE klass) {
  recorder_state *state = ruby_xcalloc(1, sizeof(recorder_state));
  state->copy_to = Qnil;
  init_mutexes(state);
  return TypedData_Wrap_Struct(klass, &recorder_type, state);
}

static void recorder_free(void *data) {
  recorder_state *state = data;
  // Release the inactive slot's lock so that both mutexes are destroyed unlocked.
  pthread_mutex_unlock(state->active_slot == 1 ? &state->slot_two_mutex : &state->slot_one_mutex);
  pthread_mutex_destroy(&state->slot_one_mutex);
  pthread_mutex_destroy(&state->slot_two_mutex);
  pthread_mutex_destroy(&state->serializer_mutex);
  pprof_profile_free(state->slot_one_profile);
  pprof_profile_free(state->slot_two_profile);
  for (size_t i = 0; i < PPROF_MAX_SAMPLE_TYPES; i++) {
    ruby_xfree(state->type_names[i]);
    ruby_xfree(state->unit_names[i]);
  }
  ruby_xfree(state->scratch_frames);
  free(state->copies.refs);
  ruby_xfree(state);
}

static size_t recorder_memsize(const void *data) {
  const recorder_state *state = data;
  size_t size = sizeof(*state) + state->scratch_frames_capacity * sizeof(pprof_frame);
  // Reading the stats of the inactive profile while a serializer works is only an
  // estimate for ObjectSpace.memsize_of; it does not modify anything.
  if (state->slot_one_profile) size += pprof_profile_get_stats(state->slot_one_profile).held_bytes;
  if (state->slot_two_profile) size += pprof_profile_get_stats(state->slot_two_profile).held_bytes;
  return size;
}

// Returns the recorder's state, or NULL when `recorder` is not a StackRecorder. Never raises.
static recorder_state *state_or_null(VALUE recorder) {
  if (!RB_TYPE_P(recorder, T_DATA) || !RTYPEDDATA_P(recorder) || RTYPEDDATA_TYPE(recorder) != &recorder_type) {
    return NULL;
  }
  return RTYPEDDATA_DATA(recorder);
}

VALUE contprof_enforce_recorder(VALUE recorder) {
  if (!state_or_null(recorder)) contprof_raise_type_error(recorder, "recorder", "a Contprof::StackRecorder");
  return recorder;
}

// The state of an initialized recorder, raising otherwise.
static recorder_state *initialized_state(VALUE recorder) {
  recorder_state *state = state_or_null(contprof_enforce_recorder(recorder));
  if (!state->slot_one_profile || !state->slot_two_profile) {
    rb_raise(contprof_error_class, "this StackRecorder was not initialized");
  }
  return state;
}

// Checks `sample_types:` (nil, or an Array of [type, unit] String pairs); returns how many.
static size_t check_sample_types(VALUE sample_types) {
  if (NIL_P(sample_types)) return sizeof(default_sample_types) / sizeof(default_sample_types[0]);
  if (!RB_TYPE_P(sample_types, T_ARRAY) || RARRAY_LEN(sample_types) < 1 ||
      RARRAY_LEN(sample_types) > PPROF_MAX_SAMPLE_TYPES) {
    rb_raise(rb_eArgError,
             "sample_types must be an Array of 1 to %d [type, unit] String pairs, e.g. "
             "[[\"cpu-time\", \"nanoseconds\"]]; got %" PRIsVALUE,
             PPROF_MAX_SAMPLE_TYPES, rb_inspect(sample_types));
  }
  size_t count = (size_t) RARRAY_LEN(sample_types);
  for (size_t i = 0; i < count; i++) {
    VALUE pair = rb_ary_entry(sample_types, (long) i);
    if (!RB_TYPE_P(pair, T_ARRAY) || RARRAY_LEN(pair) != 2 || !RB_TYPE_P(rb_ary_entry(pair, 0), T_STRING) ||
        !RB_TYPE_P(rb_ary_entry(pair, 1), T_STRING) || RSTRING_LEN(rb_ary_entry(pair, 0)) == 0) {
      rb_raise(rb_eArgError,
               "sample_types[%zu] must be a [type, unit] pair of Strings with a non-empty type; got %" PRIsVALUE, i,
               rb_inspect(pair));
    }
    for (size_t j = 0; j < i; j++) {
      if (rb_str_equal(rb_ary_entry(rb_ary_entry(sample_types, (long) j), 0), rb_ary_entry(pair, 0)) == Qtrue) {
        rb_raise(rb_eArgError, "sample_types has %" PRIsVALUE " twice", rb_inspect(rb_ary_entry(pair, 0)));
      }
    }
  }
  return count;
}

static char *copy_cstring(const char *text, size_t length) {
  char *copy = ruby_xmalloc(length + 1);
  memcpy(copy, text, length);
  copy[length] = '\0';
  return copy;
}

// A Ruby String's bytes, read after the allocation: ruby_xmalloc may run a GC that
// compacts, moving an embedded string's bytes (the strings inside sample_types are only
// reachable through arrays, so nothing pins them).
static char *copy_rstring(VALUE string, size_t *length) {
  *length = (size_t) RSTRING_LEN(string);
  char *copy = ruby_xmalloc(*length + 1);
  memcpy(copy, RSTRING_PTR(string), *length);
  copy[*length] = '\0';
  return copy;
}

// StackRecorder.new(sample_types: nil)
static VALUE recorder_initialize(int argc, VALUE *argv, VALUE self) {
  VALUE options;
  rb_scan_args(argc, argv, "0:", &options);
  VALUE sample_types = contprof_optional_keyword(options, rb_intern("sample_types"));
  if (sample_types == Qundef) sample_types = Qnil;
  recorder_state *state = state_or_null(self);
  if (state->slot_one_profile) rb_raise(contprof_error_class, "this StackRecorder is already initialized");

  pprof_value_type types[PPROF_MAX_SAMPLE_TYPES];
  size_t count = check_sample_types(sample_types);
  // Copy the names first: ruby_xmalloc may raise, and the state owns whatever it holds.
  for (size_t i = 0; i < count; i++) {
    ruby_xfree(state->type_names[i]);
    ruby_xfree(state->unit_names[i]);
    state->type_names[i] = state->unit_names[i] = NULL;
    if (NIL_P(sample_types)) {
      types[i] = default_sample_types[i];
      state->type_names[i] = copy_cstring(types[i].type.ptr, types[i].type.len);
      state->unit_names[i] = copy_cstring(types[i].unit.ptr, types[i].unit.len);
    } else {
      VALUE pair = rb_ary_entry(sample_types, (long) i);
      state->type_names[i] = copy_rstring(rb_ary_entry(pair, 0), &types[i].type.len);
      state->unit_names[i] = copy_rstring(rb_ary_entry(pair, 1), &types[i].unit.len);
    }
    types[i].type.ptr = state->type_names[i];
    types[i].unit.ptr = state->unit_names[i];
  }
  RB_GC_GUARD(sample_types);
  state->value_count = count;

  int64_t now = contprof_realtime_ns();
  pprof_error error;
  pprof_status status = pprof_profile_new(&state->slot_one_profile, types, count, NULL, 0, now, &error);
  if (status == PPROF_OK) status = pprof_profile_new(&state->slot_two_profile, types, count, NULL, 0, now, &error);
  // Readers show the first sample type by default (cpu-time, unless chosen otherwise).
  if (status == PPROF_OK) status = pprof_profile_set_default_sample_type(state->slot_one_profile, 0, &error);
  if (status == PPROF_OK) status = pprof_profile_set_default_sample_type(state->slot_two_profile, 0, &error);
  if (status != PPROF_OK) {
    pprof_profile_free(state->slot_one_profile);
    pprof_profile_free(state->slot_two_profile);
    state->slot_one_profile = state->slot_two_profile = NULL;
    contprof_raise_pprof_error(status, &error, "StackRecorder.new");
  }
  return self;
}

// ---------------------------------------------------------------------------------------
// The sampler.

// Finds and locks the active slot without ever waiting; false when no slot was found.
static bool sampler_lock_active_profile(recorder_state *state, pthread_mutex_t **mutex, pprof_profile **profile) {
  for (int attempt = 0; attempt < MAX_SAMPLER_ATTEMPTS; attempt++) {
    if (pthread_mutex_trylock(&state->slot_one_mutex) == 0) {
      *mutex = &state->slot_one_mutex;
      *profile = state->slot_one_profile;
      return true;
    }
    if (pthread_mutex_trylock(&state->slot_two_mutex) == 0) {
      *mutex = &state->slot_two_mutex;
      *profile = state->slot_two_profile;
      return true;
    }
  }
  return false;
}

pprof_status contprof_recorder_record(VALUE recorder, const pprof_sample *sample, pprof_error *error) {
  return contprof_recorder_record_with_ref(recorder, sample, NULL, error);
}

// The copy's ref for the sample `ref` denotes here, or NULL.
static pprof_sample_ref *copy_of(copy_map *copies, const pprof_sample_ref *ref) {
  if (!ref->profile || ref->profile != copies->profile || ref->reset_count != copies->reset_count ||
      ref->sample_index >= copies->capacity || !copies->refs[ref->sample_index].profile) {
    return NULL;
  }
  return &copies->refs[ref->sample_index];
}

// Remembers that the sample `ref` denotes here is `copy` there. Plain malloc: this runs
// in the sampler, which must not raise; without memory the entry is just not kept.
static void remember_copy(copy_map *copies, const pprof_sample_ref *ref, const pprof_sample_ref *copy) {
  if (!ref->profile) return;
  if (ref->profile != copies->profile || ref->reset_count != copies->reset_count) { // another period
    if (copies->refs) memset(copies->refs, 0, copies->capacity * sizeof(*copies->refs));
    copies->profile = ref->profile;
    copies->reset_count = ref->reset_count;
  }
  if (ref->sample_index >= copies->capacity) {
    uint32_t capacity = copies->capacity ? copies->capacity : 256;
    while (capacity <= ref->sample_index && capacity < UINT32_MAX / 2) capacity *= 2;
    if (capacity <= ref->sample_index) return;
    pprof_sample_ref *grown = realloc(copies->refs, capacity * sizeof(*grown));
    if (!grown) return;
    memset(grown + copies->capacity, 0, (capacity - copies->capacity) * sizeof(*grown));
    copies->refs = grown;
    copies->capacity = capacity;
  }
  copies->refs[ref->sample_index] = *copy;
}

pprof_status contprof_recorder_record_with_ref(VALUE recorder, const pprof_sample *sample, pprof_sample_ref *ref,
                                               pprof_error *error) {
  recorder_state *state = state_or_null(recorder);
  if (!state || !state->slot_one_profile || !state->slot_two_profile) {
    return pprof_fail(error, PPROF_ERR_INVALID, "not an initialized Contprof::StackRecorder");
  }
  pthread_mutex_t *mutex;
  pprof_profile *profile;
  if (!sampler_lock_active_profile(state, &mutex, &profile)) {
    state->samples_failed++;
    return pprof_fail(error, PPROF_ERR_LIMIT, "could not find the active profile slot (both were locked); sample dropped");
  }
  pprof_sample_ref own_ref;
  pprof_status status = pprof_profile_add_with_ref(profile, sample, &own_ref, error);
  pthread_mutex_unlock(mutex);
  if (ref) *ref = own_ref;
  if (status == PPROF_OK) {
    state->samples_recorded++;
  } else {
    state->samples_failed++;
  }
  if (!NIL_P(state->copy_to)) {
    pprof_sample_ref copy_ref;
    pprof_error copy_error;
    if (contprof_recorder_record_with_ref(state->copy_to, sample, &copy_ref, &copy_error) == PPROF_OK) {
      remember_copy(&state->copies, &own_ref, &copy_ref);
    }
  }
  return status;
}

bool contprof_recorder_add_again(VALUE recorder, const pprof_sample_ref *ref, const int64_t *values,
                                 size_t value_count) {
  recorder_state *state = state_or_null(recorder);
  if (!state || !state->slot_one_profile || !state->slot_two_profile) return false;
  pprof_sample_ref *copy = NULL;
  if (!NIL_P(state->copy_to) && !(copy = copy_of(&state->copies, ref))) return false; // recorded anew, into both
  pthread_mutex_t *mutex;
  pprof_profile *profile;
  if (!sampler_lock_active_profile(state, &mutex, &profile)) return false;
  bool added = pprof_profile_add_again(profile, ref, values, value_count);
  pthread_mutex_unlock(mutex);
  if (added) state->samples_recorded++;
  if (added && copy && !contprof_recorder_add_again(state->copy_to, copy, values, value_count)) {
    copy->profile = NULL; // (the copy was flipped meanwhile: it never is while copying)
  }
  return added;
}

size_t contprof_recorder_value_count(VALUE recorder) {
  recorder_state *state = state_or_null(recorder);
  return state ? state->value_count : 0;
}

int contprof_recorder_value_index(VALUE recorder, const char *name, size_t name_len) {
  recorder_state *state = state_or_null(recorder);
  if (!state) return -1;
  for (size_t i = 0; i < state->value_count; i++) {
    if (strlen(state->type_names[i]) == name_len && memcmp(state->type_names[i], name, name_len) == 0) return (int) i;
  }
  return -1;
}

static VALUE sample_type_list(const recorder_state *state) {
  VALUE names = rb_str_new_cstr("");
  for (size_t i = 0; i < state->value_count; i++) {
    if (i > 0) rb_str_cat_cstr(names, ", ");
    rb_str_cat_cstr(names, state->type_names[i]);
  }
  return names;
}

// A Hash key given as a String or a Symbol, as a String; raises otherwise.
static VALUE string_key(VALUE key, const char *argument, const char *expected) {
  if (RB_TYPE_P(key, T_SYMBOL)) return rb_sym2str(key);
  CONTPROF_ENFORCE_TYPE(key, T_STRING, argument, expected);
  return key;
}

typedef struct {
  VALUE recorder;
  recorder_state *state;
} record_arguments;

static int parse_value(VALUE key, VALUE value, VALUE data) {
  record_arguments *args = (record_arguments *) data;
  VALUE name = string_key(key, "values key", "a sample type name (String or Symbol)");
  int index = contprof_recorder_value_index(args->recorder, RSTRING_PTR(name), (size_t) RSTRING_LEN(name));
  if (index < 0) {
    rb_raise(rb_eArgError, "values: unknown sample type %" PRIsVALUE " (this recorder's sample types are %" PRIsVALUE ")",
             rb_inspect(name), sample_type_list(args->state));
  }
  if (!RB_INTEGER_TYPE_P(value)) contprof_raise_type_error(value, "values[...] (a sample value)", "an Integer");
  args->state->scratch_values[index] = NUM2LL(value);
  return ST_CONTINUE;
}

static int parse_label(VALUE key, VALUE value, VALUE data) {
  record_arguments *args = (record_arguments *) data;
  recorder_state *state = args->state;
  if (state->scratch_label_count >= PPROF_MAX_LABELS) {
    rb_raise(rb_eArgError, "labels: at most %d labels are accepted per sample", PPROF_MAX_LABELS);
  }
  VALUE name = string_key(key, "labels key", "a String or Symbol");
  if (RSTRING_LEN(name) == 0) rb_raise(rb_eArgError, "labels: a label key must not be empty");
  pprof_label *label = &state->scratch_labels[state->scratch_label_count];
  memset(label, 0, sizeof(*label));
  label->key = (pprof_str) {RSTRING_PTR(name), (size_t) RSTRING_LEN(name)};
  if (RB_TYPE_P(value, T_STRING)) {
    if (RSTRING_LEN(value) == 0) {
      rb_raise(rb_eArgError, "labels: the value of label %" PRIsVALUE " is empty (pprof cannot tell it from no value)",
               rb_inspect(name));
    }
    label->str = (pprof_str) {RSTRING_PTR(value), (size_t) RSTRING_LEN(value)};
  } else if (RB_INTEGER_TYPE_P(value)) {
    label->num = NUM2LL(value);
  } else {
    contprof_raise_type_error(value, "labels[...] (a label value)", "a String or an Integer");
  }
  state->scratch_label_count++;
  return ST_CONTINUE;
}

contprof_sample_arguments contprof_recorder_parse_arguments(VALUE recorder, VALUE values, VALUE labels) {
  recorder_state *state = initialized_state(recorder);
  CONTPROF_ENFORCE_TYPE(values, T_HASH, "values", "a Hash of sample type name => Integer");
  if (!NIL_P(labels)) CONTPROF_ENFORCE_TYPE(labels, T_HASH, "labels", "a Hash of String => String or Integer");
  record_arguments args = {.recorder = recorder, .state = state};
  memset(state->scratch_values, 0, sizeof(state->scratch_values));
  rb_hash_foreach(values, parse_value, (VALUE) &args);
  state->scratch_label_count = 0;
  if (!NIL_P(labels)) rb_hash_foreach(labels, parse_label, (VALUE) &args);
  return (contprof_sample_arguments) {
    .values = state->scratch_values,
    .value_count = state->value_count,
    .labels = state->scratch_labels,
    .label_count = state->scratch_label_count,
  };
}

// recorder.record_sample(locations, values, labels = {})
//   locations: Array of [function_name, file_name, line], leaf first
//   values:    Hash of sample type name => Integer (absent types are 0)
//   labels:    Hash of String => String or Integer
static VALUE recorder_record_sample(int argc, VALUE *argv, VALUE self) {
  VALUE locations, values, labels;
  rb_scan_args(argc, argv, "21", &locations, &values, &labels);
  recorder_state *state = initialized_state(self);
  CONTPROF_ENFORCE_TYPE(locations, T_ARRAY, "locations", "an Array of [function_name, file_name, line] Arrays");

  long frame_count = RARRAY_LEN(locations);
  if (frame_count > PPROF_MAX_FRAMES) {
    rb_raise(rb_eArgError, "locations: at most %d frames are accepted, got %ld", PPROF_MAX_FRAMES, frame_count);
  }
  // Size the scratch space before reading any argument: ruby_xrealloc may run the GC,
  // which must not happen while we hold pointers into argument strings.
  if ((size_t) frame_count > state->scratch_frames_capacity) {
    state->scratch_frames = ruby_xrealloc2(state->scratch_frames, (size_t) frame_count, sizeof(pprof_frame));
    state->scratch_frames_capacity = (size_t) frame_count;
  }
  contprof_sample_arguments arguments = contprof_recorder_parse_arguments(self, values, labels);

  for (long i = 0; i < frame_count; i++) {
    VALUE location = RARRAY_AREF(locations, i);
    if (!RB_TYPE_P(location, T_ARRAY) || RARRAY_LEN(location) != 3) {
      rb_raise(rb_eArgError, "locations[%ld] must be a [function_name, file_name, line] Array, got %" PRIsVALUE, i,
               rb_inspect(location));
    }
    VALUE name = RARRAY_AREF(location, 0), file = RARRAY_AREF(location, 1), line = RARRAY_AREF(location, 2);
    CONTPROF_ENFORCE_TYPE(name, T_STRING, "a location's function_name", "a String");
    CONTPROF_ENFORCE_TYPE(file, T_STRING, "a location's file_name", "a String");
    if (!RB_INTEGER_TYPE_P(line)) contprof_raise_type_error(line, "a location's line", "an Integer");
    state->scratch_frames[i] = (pprof_frame) {
      .function_name = {RSTRING_PTR(name), (size_t) RSTRING_LEN(name)},
      .file_name = {RSTRING_PTR(file), (size_t) RSTRING_LEN(file)},
      .line = NUM2LL(line),
    };
  }

  pprof_sample sample = {
    .frames = state->scratch_frames,
    .frame_count = (size_t) frame_count,
    .values = arguments.values,
    .value_count = arguments.value_count,
    .labels = arguments.labels,
    .label_count = arguments.label_count,
  };
  pprof_error error;
  pprof_status status = contprof_recorder_record(self, &sample, &error);
  RB_GC_GUARD(locations);
  RB_GC_GUARD(values);
  RB_GC_GUARD(labels);
  if (status != PPROF_OK) contprof_raise_pprof_error(status, &error, "record_sample");
  return Qnil;
}

// ---------------------------------------------------------------------------------------
// The serializer.

typedef struct {
  recorder_state *state;
  int pthread_error;
  pprof_status status;
  pprof_error error;
  pprof_buffer pprof;
  int64_t start_ns;
  int64_t finish_ns;
} serialize_call;

// Steps 1-4 of the flip (see the notes at the top). Returns the previously active
// profile, now inactive and owned by the serializer, or NULL on a pthread error.
static pprof_profile *serializer_flip_slots(recorder_state *state, int64_t now_ns, int *pthread_error) {
  bool one_was_active = state->active_slot == 1;
  pthread_mutex_t *previously_active = one_was_active ? &state->slot_one_mutex : &state->slot_two_mutex;
  pthread_mutex_t *previously_inactive = one_was_active ? &state->slot_two_mutex : &state->slot_one_mutex;
  pprof_profile *becoming_active = one_was_active ? state->slot_two_profile : state->slot_one_profile;

  pprof_profile_set_start_time_ns(becoming_active, now_ns);
  if ((*pthread_error = pthread_mutex_unlock(previously_inactive)) != 0) return NULL;
  if ((*pthread_error = pthread_mutex_lock(previously_active)) != 0) return NULL;
  state->active_slot = one_was_active ? 2 : 1;
  return one_was_active ? state->slot_one_profile : state->slot_two_profile;
}

static void *serialize_without_gvl(void *data) {
  serialize_call *call = data;
  recorder_state *state = call->state;
  if ((call->pthread_error = pthread_mutex_lock(&state->serializer_mutex)) != 0) return NULL;

  int64_t started = contprof_monotonic_ns();
  call->finish_ns = contprof_realtime_ns();
  pprof_profile *profile = serializer_flip_slots(state, call->finish_ns, &call->pthread_error);
  if (profile) {
    call->start_ns = pprof_profile_start_time_ns(profile);
    call->status = pprof_profile_serialize(profile, call->finish_ns, &call->pprof, &call->error);
    // Reset whatever the outcome: a profile that could not be encoded (out of memory) is
    // dropped rather than mixed into the next period. Its start time is set at the flip
    // that makes it active again.
    pprof_profile_reset(profile, call->finish_ns);
  }
  atomic_fetch_add(call->pthread_error == 0 && call->status == PPROF_OK ? &state->serializations
                                                                        : &state->serialization_failures,
                   1);
  atomic_store(&state->last_serialize_ns, (uint_fast64_t) (contprof_monotonic_ns() - started));
  pthread_mutex_unlock(&state->serializer_mutex);
  return NULL;
}

static VALUE string_from_buffer(VALUE data) {
  const pprof_buffer *buffer = (const pprof_buffer *) data;
  return rb_str_new((const char *) buffer->data, (long) buffer->len);
}

// recorder.serialize(release_gvl: true) => [start_time, finish_time, gzip_pprof_bytes]
//
// release_gvl: false keeps the GVL while encoding. Only for a last flush at exit: behind
// busy application threads, taking the GVL back can cost a time slice per thread.
static VALUE recorder_serialize(int argc, VALUE *argv, VALUE self) {
  VALUE options;
  rb_scan_args(argc, argv, "0:", &options);
  VALUE release_gvl_value = contprof_optional_keyword(options, rb_intern("release_gvl"));
  bool release_gvl = release_gvl_value == Qundef || RTEST(release_gvl_value);
  recorder_state *state = initialized_state(self);
  serialize_call call = {.state = state, .status = PPROF_OK};
  if (release_gvl) {
    // Pending interrupts are handled (and may raise) only before the serializer runs,
    // while nothing is allocated yet.
    contprof_call_without_gvl(serialize_without_gvl, &call, NULL, NULL);
  } else {
    serialize_without_gvl(&call); // the name says what it can do, not what it must
  }

  if (call.pthread_error != 0) {
    pprof_buffer_free(&call.pprof);
    rb_syserr_fail(call.pthread_error, "StackRecorder#serialize: a profile slot mutex failed");
  }
  if (call.status != PPROF_OK) {
    pprof_buffer_free(&call.pprof);
    contprof_raise_pprof_error(call.status, &call.error, "StackRecorder#serialize failed (the profile was dropped)");
  }
  int exception_state = 0;
  VALUE bytes = rb_protect(string_from_buffer, (VALUE) &call.pprof, &exception_state);
  pprof_buffer_free(&call.pprof);
  if (exception_state) rb_jump_tag(exception_state);
  return rb_ary_new_from_args(3, contprof_time_from_ns(call.start_ns), contprof_time_from_ns(call.finish_ns), bytes);
}

// ---------------------------------------------------------------------------------------
// Introspection, fork support and testing helpers.

static VALUE recorder_sample_types(VALUE self) {
  recorder_state *state = initialized_state(self);
  VALUE result = rb_ary_new_capa((long) state->value_count);
  for (size_t i = 0; i < state->value_count; i++) {
    rb_ary_push(result, rb_ary_new_from_args(2, rb_str_new_cstr(state->type_names[i]),
                                             rb_str_new_cstr(state->unit_names[i])));
  }
  return result;
}

static VALUE recorder_stats(VALUE self) {
  recorder_state *state = initialized_state(self);
  VALUE stats = rb_hash_new();
  rb_hash_aset(stats, ID2SYM(rb_intern("samples_recorded")), ULL2NUM(state->samples_recorded));
  rb_hash_aset(stats, ID2SYM(rb_intern("samples_failed")), ULL2NUM(state->samples_failed));
  rb_hash_aset(stats, ID2SYM(rb_intern("serializations")), ULL2NUM(atomic_load(&state->serializations)));
  rb_hash_aset(stats, ID2SYM(rb_intern("serialization_failures")),
               ULL2NUM(atomic_load(&state->serialization_failures)));
  rb_hash_aset(stats, ID2SYM(rb_intern("last_serialize_ns")), ULL2NUM(atomic_load(&state->last_serialize_ns)));
  rb_hash_aset(stats, ID2SYM(rb_intern("compressor")), rb_str_new_cstr(pprof_compressor_name()));
  return stats;
}

// In a forked child only the forking thread survives: a serializer that was running in
// the parent is gone, possibly leaving mutexes locked. Start over with fresh mutexes and
// empty profiles (the child must not report the parent's samples).
// #copy_samples_to(other): from now on every sample recorded here is also recorded into
// `other`, a StackRecorder with the same sample types, until #copy_samples_to(nil).
static VALUE recorder_copy_samples_to(VALUE self, VALUE other) {
  recorder_state *state = initialized_state(self);
  if (NIL_P(other)) {
    state->copy_to = Qnil;
    return self;
  }
  recorder_state *target = initialized_state(other);
  if (other == self) rb_raise(rb_eArgError, "a StackRecorder cannot copy its samples to itself");
  if (!NIL_P(state->copy_to)) {
    rb_raise(contprof_error_class, "this StackRecorder already copies its samples (copy_samples_to(nil) first)");
  }
  if (!NIL_P(target->copy_to)) rb_raise(rb_eArgError, "the target StackRecorder copies its own samples elsewhere");
  bool same_types = target->value_count == state->value_count;
  for (size_t i = 0; same_types && i < state->value_count; i++) {
    same_types = strcmp(target->type_names[i], state->type_names[i]) == 0 &&
                 strcmp(target->unit_names[i], state->unit_names[i]) == 0;
  }
  if (!same_types) rb_raise(rb_eArgError, "the target StackRecorder has other sample types");
  if (state->copies.refs) memset(state->copies.refs, 0, state->copies.capacity * sizeof(*state->copies.refs));
  state->copies.profile = NULL;
  state->copy_to = other;
  return self;
}

static VALUE recorder_reset_after_fork(VALUE self) {
  recorder_state *state = initialized_state(self);
  init_mutexes(state);
  int64_t now = contprof_realtime_ns();
  pprof_profile_reset(state->slot_one_profile, now);
  pprof_profile_reset(state->slot_two_profile, now);
  state->samples_recorded = 0;
  state->samples_failed = 0;
  return self;
}

static VALUE testing_active_slot(VALUE module, VALUE recorder) {
  return INT2NUM(initialized_state(recorder)->active_slot);
}

// Observing a mutex means try-locking it; when that succeeds it is released again.
static VALUE slot_mutex_locked(VALUE recorder, int slot) {
  recorder_state *state = initialized_state(recorder);
  pthread_mutex_t *mutex = slot == 1 ? &state->slot_one_mutex : &state->slot_two_mutex;
  int result = pthread_mutex_trylock(mutex);
  if (result == 0) {
    pthread_mutex_unlock(mutex);
    return Qfalse;
  }
  if (result == EBUSY) return Qtrue;
  rb_syserr_fail(result, "pthread_mutex_trylock");
}

static VALUE testing_slot_one_locked(VALUE module, VALUE recorder) { return slot_mutex_locked(recorder, 1); }
static VALUE testing_slot_two_locked(VALUE module, VALUE recorder) { return slot_mutex_locked(recorder, 2); }

// Bytes currently held by every pprof profile of the process (allocation counter).
static VALUE testing_pprof_allocated_bytes(VALUE module) { return SIZET2NUM(pprof_alloc_current_bytes()); }

void contprof_stack_recorder_init(VALUE contprof_module) {
  stack_recorder_class = rb_define_class_under(contprof_module, "StackRecorder", rb_cObject);
  // A TypedData class must control allocation, or Ruby could create a half-built object.
  rb_define_alloc_func(stack_recorder_class, recorder_alloc);
  rb_define_method(stack_recorder_class, "initialize", recorder_initialize, -1);
  rb_define_method(stack_recorder_class, "record_sample", recorder_record_sample, -1);
  rb_define_method(stack_recorder_class, "serialize", recorder_serialize, -1);
  rb_define_method(stack_recorder_class, "sample_types", recorder_sample_types, 0);
  rb_define_method(stack_recorder_class, "stats", recorder_stats, 0);
  rb_define_method(stack_recorder_class, "reset_after_fork", recorder_reset_after_fork, 0);
  rb_define_method(stack_recorder_class, "copy_samples_to", recorder_copy_samples_to, 1);

  VALUE testing = rb_define_module_under(stack_recorder_class, "Testing");
  rb_define_singleton_method(testing, "active_slot", testing_active_slot, 1);
  rb_define_singleton_method(testing, "slot_one_mutex_locked?", testing_slot_one_locked, 1);
  rb_define_singleton_method(testing, "slot_two_mutex_locked?", testing_slot_two_locked, 1);
  rb_define_singleton_method(testing, "pprof_allocated_bytes", testing_pprof_allocated_bytes, 0);
}
