// Contprof::StackRecorder: the double-buffered pprof profile that samplers record into
// without ever blocking, and that a serializer flips and encodes with the GVL released.
// See the design notes at the top of stack_recorder.c.
#pragma once

#include <ruby.h>

#include "pprof_profile.h"

// Raises TypeError unless `recorder` is a Contprof::StackRecorder; returns it.
VALUE contprof_enforce_recorder(VALUE recorder);

// Records one sample into the recorder's active profile slot. Never blocks and never
// raises: on failure it returns the status and fills `error`. Must be called holding
// the GVL (there is one sampler at a time because of it).
pprof_status contprof_recorder_record(VALUE recorder, const pprof_sample *sample, pprof_error *error);

// Number of sample types, and the index of the sample type called `name` (or -1).
size_t contprof_recorder_value_count(VALUE recorder);
int contprof_recorder_value_index(VALUE recorder, const char *name, size_t name_len);

void contprof_stack_recorder_init(VALUE contprof_module);
