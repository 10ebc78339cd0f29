// Contprof::Collectors::Stack: records one sample of any Ruby thread's current stack into
// a StackRecorder. The CPU/wall-time collector uses the C functions below directly.
#pragma once

#include <ruby.h>

#include "pprof_profile.h"

#define CONTPROF_MIN_MAX_FRAMES 5
#define CONTPROF_MAX_MAX_FRAMES 10000
#define CONTPROF_DEFAULT_MAX_FRAMES 400

// Scratch space for sampling stacks of up to `max_frames` frames, allocated once.
typedef struct contprof_stack_sampler contprof_stack_sampler;

// Raises ArgumentError unless `max_frames` is an Integer within the accepted range.
int contprof_validate_max_frames(VALUE max_frames);
contprof_stack_sampler *contprof_stack_sampler_new(int max_frames);
void contprof_stack_sampler_free(contprof_stack_sampler *sampler);
size_t contprof_stack_sampler_memsize(const contprof_stack_sampler *sampler);

// Samples `thread`'s stack and records it with the given values and labels. Allocates no
// Ruby object and never raises: returns PPROF_OK or an error with a message (a dead
// thread is PPROF_ERR_INVALID). Must hold the GVL.
pprof_status contprof_stack_sample(contprof_stack_sampler *sampler, VALUE thread, VALUE recorder,
                                   const int64_t *values, size_t value_count, const pprof_label *labels,
                                   size_t label_count, pprof_error *error);

void contprof_collectors_stack_init(VALUE contprof_module);
