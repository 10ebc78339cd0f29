// A StackRecorder's state, shared by its two files (the interface is stack_recorder.h):
// stack_recorder.c, the Ruby class and the record path the collectors call in their
// rounds; serialize.c, #serialize, which flips the profiles and encodes one without the GVL.
#pragma once

#include <ruby.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "pprof/pprof_profile.h"
#include "recorder/profile_slots.h"
#include "recorder/sample_copies.h"
#include "ruby_helpers.h"

typedef struct {
  contprof_profile_slots slots;
  bool initialized; // the slots hold two profiles

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
  // continuous profiling), or Qnil; which copy stands for which sample is in
  // recorder/sample_copies.h. Only touched holding the GVL.
  VALUE copy_to;
  contprof_copy_map copies;

  // Statistics. The sampler's counters change under the GVL; the serializer's without it.
  uint64_t samples_recorded;
  uint64_t samples_failed;
  uint64_t samples_not_copied; // recorded here, but not (or not all of their values) into copy_to
  atomic_uint_fast64_t serializations;
  atomic_uint_fast64_t serialization_failures;
  atomic_uint_fast64_t last_serialize_ns;
  atomic_uint_fast64_t timeline_samples_merged; // for want of room (PPROF_DEFAULT_TIMELINE_LIMIT)
} recorder_state;

// `state`, raising unless StackRecorder#initialize made its profiles.
static inline recorder_state *contprof_recorder_initialized(recorder_state *state) {
  if (!state->initialized) rb_raise(contprof_error_class, "this StackRecorder was not initialized");
  return state;
}

// StackRecorder#serialize on the recorder whose state is `state` (serialize.c).
VALUE contprof_recorder_serialize(recorder_state *state, int argc, VALUE *argv);
