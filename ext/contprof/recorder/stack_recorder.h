// Contprof::StackRecorder: the double-buffered pprof profile that samplers record into
// without ever blocking, and that a serializer flips and encodes with the GVL released.
// See the design notes at the top of stack_recorder.c (recording) and serialize.c.
#pragma once

#include <ruby.h>
#include <stdbool.h>

#include "pprof/pprof_profile.h"

// Raises TypeError unless `recorder` is a Contprof::StackRecorder; returns it.
VALUE contprof_enforce_recorder(VALUE recorder);

// Records one sample into the recorder's active profile slot. Never blocks and never
// raises: on failure it returns the status and fills `error`. Must be called holding
// the GVL (there is one sampler at a time because of it).
PPROF_MUST_CHECK
pprof_status contprof_recorder_record(VALUE recorder, const pprof_sample *sample, pprof_error *error);

// Adds `values` to the sample `ref` denotes if it belongs to the active profile, moving a
// timeline sample's timestamp on to `timestamp_ns` (see pprof_profile_add_again); false
// when it does not (then record the sample normally).
bool contprof_recorder_add_again(VALUE recorder, const pprof_sample_ref *ref, const int64_t *values,
                                 size_t value_count, int64_t timestamp_ns);

// contprof_recorder_record, also filling `ref` with where the sample went (for
// contprof_recorder_add_again).
PPROF_MUST_CHECK
pprof_status contprof_recorder_record_with_ref(VALUE recorder, const pprof_sample *sample, pprof_sample_ref *ref,
                                               pprof_error *error);

// Sample values and labels converted from Ruby (see contprof_recorder_parse_arguments).
typedef struct {
  const int64_t *values;
  size_t value_count;
  const pprof_label *labels;
  size_t label_count;
} contprof_sample_arguments;

// Converts `values` (Hash of sample type name => Integer) and `labels` (nil, or Hash of
// String/Symbol => String/Integer) into the recorder's scratch space, valid until the
// next call. Raises ArgumentError/TypeError on bad input. Label strings point into the
// Ruby strings: record before the VM can run Ruby code or allocate.
contprof_sample_arguments contprof_recorder_parse_arguments(VALUE recorder, VALUE values, VALUE labels);

// Number of sample types, and the index of the sample type called `name` (or -1).
size_t contprof_recorder_value_count(VALUE recorder);
int contprof_recorder_value_index(VALUE recorder, const char *name, size_t name_len);

void contprof_stack_recorder_init(VALUE contprof_module);
