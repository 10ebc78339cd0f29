// Contprof::StackRecorder: two pprof profiles (pprof_profile.h) so that samples can be
// recorded while the previous period is being serialized. How the two change hands
// between the sampler and the serializer, without the sampler ever waiting, is in
// recorder/profile_slots.h; this file is the Ruby class around them, and the record path
// the collectors call in their rounds (contprof_recorder_record and _add_again: plain C,
// never raising). #serialize, which ends a period and encodes its profile, is
// recorder/serialize.c; the state both share, recorder/stack_recorder_internal.h.
//
// ## Exceptions and memory
//
// Nothing allocated with malloc may be left behind by a Ruby exception. Argument
// conversion in #record_sample uses scratch buffers owned by the recorder (sized before
// any argument is read, so that no allocation, and so no GC, happens while pointers into
// Ruby strings are held). (#serialize's part is in recorder/serialize.c.)
#include "recorder/stack_recorder.h"

#include <stdatomic.h>
#include <stdbool.h>
#include <string.h>

#include "pprof/pprof_alloc.h"
#include "pprof/pprof_util.h"
#include "recorder/profile_slots.h"
#include "recorder/sample_copies.h"
#include "recorder/stack_recorder_internal.h"
#include "ruby_helpers.h"

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
  {PPROF_STR("wall-samples"), PPROF_STR("count")},
};

static VALUE recorder_alloc(VALUE klass) {
  recorder_state *state = ruby_xcalloc(1, sizeof(recorder_state));
  state->copy_to = Qnil;
  return TypedData_Wrap_Struct(klass, &recorder_type, state);
}

static void recorder_free(void *data) {
  recorder_state *state = data;
  if (state->initialized) contprof_slots_destroy(&state->slots);
  for (size_t i = 0; i < PPROF_MAX_SAMPLE_TYPES; i++) {
    ruby_xfree(state->type_names[i]);
    ruby_xfree(state->unit_names[i]);
  }
  ruby_xfree(state->scratch_frames);
  contprof_copy_map_release(&state->copies);
  ruby_xfree(state);
}

// (Called from a GC, possibly while a serializer works on a profile: the slots report
// what their owners last measured, without reading either profile.)
static size_t recorder_memsize(const void *data) {
  const recorder_state *state = data;
  size_t size = sizeof(*state) + state->scratch_frames_capacity * sizeof(pprof_frame);
  if (state->initialized) size += contprof_slots_held_bytes(&state->slots);
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
  return contprof_recorder_initialized(state_or_null(contprof_enforce_recorder(recorder)));
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
  if (state->initialized) rb_raise(contprof_error_class, "this StackRecorder is already initialized");

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
  pprof_profile *first = NULL, *second = NULL;
  pprof_status status = pprof_profile_new(&first, types, count, NULL, 0, now, &error);
  if (status == PPROF_OK) status = pprof_profile_new(&second, types, count, NULL, 0, now, &error);
  // Readers show the first sample type by default (cpu-time, unless chosen otherwise).
  if (status == PPROF_OK) status = pprof_profile_set_default_sample_type(first, 0, &error);
  if (status == PPROF_OK) status = pprof_profile_set_default_sample_type(second, 0, &error);
  if (status != PPROF_OK) {
    pprof_profile_free(first);
    pprof_profile_free(second);
    contprof_raise_pprof_error(status, &error, "StackRecorder.new");
  }
  int failed = contprof_slots_init(&state->slots, first, second);
  state->initialized = true; // (the slots own the profiles: freed with the recorder)
  if (failed) rb_syserr_fail(failed, "StackRecorder.new: the profile slots' locks");
  return self;
}

// ---------------------------------------------------------------------------------------
// The sampler.

pprof_status contprof_recorder_record(VALUE recorder, const pprof_sample *sample, pprof_error *error) {
  return contprof_recorder_record_with_ref(recorder, sample, NULL, error);
}

pprof_status contprof_recorder_record_with_ref(VALUE recorder, const pprof_sample *sample, pprof_sample_ref *ref,
                                               pprof_error *error) {
  recorder_state *state = state_or_null(recorder);
  if (!state || !state->initialized) return pprof_fail(error, PPROF_ERR_INVALID, "not an initialized Contprof::StackRecorder");
  int slot;
  pprof_profile *profile = contprof_slots_lock_active(&state->slots, &slot);
  if (!profile) {
    state->samples_failed++;
    return pprof_fail(error, PPROF_ERR_LIMIT, "could not find the active profile slot (both were taken); sample dropped");
  }
  pprof_sample_ref own_ref;
  pprof_status status = pprof_profile_add_with_ref(profile, sample, &own_ref, error);
  contprof_slots_unlock(&state->slots, slot);
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
      // (Without memory to remember the copy, the next add_again records anew, into both.)
      contprof_remember_copy(&state->copies, &own_ref, &copy_ref);
    } else {
      state->samples_not_copied++;
    }
  }
  return status;
}

bool contprof_recorder_add_again(VALUE recorder, const pprof_sample_ref *ref, const int64_t *values,
                                 size_t value_count, int64_t timestamp_ns) {
  recorder_state *state = state_or_null(recorder);
  if (!state || !state->initialized) return false;
  pprof_sample_ref *copy = NULL;
  if (!NIL_P(state->copy_to) && !(copy = contprof_copy_of(&state->copies, ref))) return false; // recorded anew, into both
  int slot;
  pprof_profile *profile = contprof_slots_lock_active(&state->slots, &slot);
  if (!profile) return false;
  bool added = pprof_profile_add_again(profile, ref, values, value_count, timestamp_ns);
  contprof_slots_unlock(&state->slots, slot);
  if (added) state->samples_recorded++;
  if (added && copy && !contprof_recorder_add_again(state->copy_to, copy, values, value_count, timestamp_ns)) {
    copy->profile = NULL; // (the copy was flipped meanwhile: it never is while copying)
    state->samples_not_copied++;
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

// recorder.serialize(...): recorder/serialize.c. (self is a StackRecorder: the method is
// defined on the class.)
static VALUE recorder_serialize(int argc, VALUE *argv, VALUE self) {
  return contprof_recorder_serialize(state_or_null(self), argc, argv);
}

// recorder.add_comment(text): a comment in the profile the next serialize returns (for
// facts of the period that are not samples, such as requests counted per endpoint).
static VALUE recorder_add_comment(VALUE self, VALUE text) {
  recorder_state *state = initialized_state(self);
  CONTPROF_ENFORCE_TYPE(text, T_STRING, "text", "String");
  int slot;
  pprof_profile *profile = contprof_slots_lock_active(&state->slots, &slot);
  if (!profile) rb_raise(contprof_error_class, "StackRecorder#add_comment: both profile slots were taken");
  pprof_error error;
  pprof_status status =
    pprof_profile_add_comment(profile, (pprof_str) {RSTRING_PTR(text), (size_t) RSTRING_LEN(text)}, &error);
  contprof_slots_unlock(&state->slots, slot);
  if (status != PPROF_OK) contprof_raise_pprof_error(status, &error, "StackRecorder#add_comment");
  return Qnil;
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

// #stats, in its order: each statistic named once, with its value.
static VALUE recorder_stats(VALUE self) {
  recorder_state *state = initialized_state(self);
  VALUE stats = rb_hash_new();
#define STAT(name, value) rb_hash_aset(stats, ID2SYM(rb_intern(#name)), (value));
#define SAMPLER_COUNTER(name) STAT(name, ULL2NUM(state->name))
#define SERIALIZER_COUNTER(name) STAT(name, ULL2NUM(atomic_load(&state->name)))
  SAMPLER_COUNTER(samples_recorded) SAMPLER_COUNTER(samples_failed) SAMPLER_COUNTER(samples_not_copied)
  SERIALIZER_COUNTER(serializations) SERIALIZER_COUNTER(serialization_failures)
  SERIALIZER_COUNTER(last_serialize_ns) SERIALIZER_COUNTER(timeline_samples_merged)
  STAT(compressor, rb_str_new_cstr(pprof_compressor_name()))
#undef SERIALIZER_COUNTER
#undef SAMPLER_COUNTER
#undef STAT
  return stats;
}

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
  contprof_copy_map_clear(&state->copies);
  state->copy_to = other;
  return self;
}

// In a forked child only the forking thread survives: a serializer that was running in
// the parent is gone, possibly leaving a slot taken. Start over with fresh locks and
// empty profiles (the child must not report the parent's samples).
static VALUE recorder_reset_after_fork(VALUE self) {
  recorder_state *state = initialized_state(self);
  int failed = contprof_slots_reset_after_fork(&state->slots, contprof_realtime_ns());
  if (failed) rb_syserr_fail(failed, "StackRecorder#reset_after_fork: the profile slots' locks");
  state->samples_recorded = 0;
  state->samples_failed = state->samples_not_copied = 0;
  return self;
}

static VALUE testing_active_slot(VALUE CONTPROF_UNUSED module, VALUE recorder) {
  return INT2NUM(initialized_state(recorder)->slots.active + 1);
}

static VALUE testing_slot_one_taken(VALUE CONTPROF_UNUSED module, VALUE recorder) {
  return contprof_slots_taken(&initialized_state(recorder)->slots, 0) ? Qtrue : Qfalse;
}
static VALUE testing_slot_two_taken(VALUE CONTPROF_UNUSED module, VALUE recorder) {
  return contprof_slots_taken(&initialized_state(recorder)->slots, 1) ? Qtrue : Qfalse;
}

// Bytes currently held by every pprof profile of the process (allocation counter).
static VALUE testing_pprof_allocated_bytes(VALUE CONTPROF_UNUSED module) { return SIZET2NUM(pprof_alloc_current_bytes()); }

void contprof_stack_recorder_init(VALUE contprof_module) {
  stack_recorder_class = rb_define_class_under(contprof_module, "StackRecorder", rb_cObject);
  // A TypedData class must control allocation, or Ruby could create a half-built object.
  rb_define_alloc_func(stack_recorder_class, recorder_alloc);
  rb_define_method(stack_recorder_class, "initialize", recorder_initialize, -1);
  rb_define_method(stack_recorder_class, "record_sample", recorder_record_sample, -1);
  rb_define_method(stack_recorder_class, "serialize", recorder_serialize, -1);
  rb_define_method(stack_recorder_class, "add_comment", recorder_add_comment, 1);
  rb_define_method(stack_recorder_class, "sample_types", recorder_sample_types, 0);
  rb_define_method(stack_recorder_class, "stats", recorder_stats, 0);
  rb_define_method(stack_recorder_class, "reset_after_fork", recorder_reset_after_fork, 0);
  rb_define_method(stack_recorder_class, "copy_samples_to", recorder_copy_samples_to, 1);
  // The types a recorder made without sample_types: has, as [type, unit] pairs (frozen).
  size_t default_count = sizeof(default_sample_types) / sizeof(default_sample_types[0]);
  VALUE defaults = rb_ary_new_capa((long) default_count);
  for (size_t i = 0; i < default_count; i++) {
    const pprof_value_type *type = &default_sample_types[i];
    VALUE pair = rb_ary_new_from_args(2, rb_str_freeze(rb_str_new(type->type.ptr, (long) type->type.len)),
                                      rb_str_freeze(rb_str_new(type->unit.ptr, (long) type->unit.len)));
    rb_ary_push(defaults, rb_obj_freeze(pair));
  }
  rb_define_const(stack_recorder_class, "DEFAULT_SAMPLE_TYPES", rb_obj_freeze(defaults));

  VALUE testing = rb_define_module_under(stack_recorder_class, "Testing");
  rb_define_singleton_method(testing, "active_slot", testing_active_slot, 1);
  rb_define_singleton_method(testing, "slot_one_taken?", testing_slot_one_taken, 1);
  rb_define_singleton_method(testing, "slot_two_taken?", testing_slot_two_taken, 1);
  rb_define_singleton_method(testing, "pprof_allocated_bytes", testing_pprof_allocated_bytes, 0);
}
