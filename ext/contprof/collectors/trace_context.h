// Which trace a thread is in: the local root span and the active span of the Datadog
// tracer (the `datadog` gem) on the thread's current fiber, for the labels "local root span
// id" and "span id" that link Datadog's profiles to its traces.
//
// Read from the tracer's own objects, as its profiler reads them (fiber-local context →
// @active_trace → @root_span / @active_span → @id), with Ruby's C API only: no method call,
// no allocation, nothing raised, so that it can run inside any sampling round. The Ruby side
// (lib/contprof/requests/trace_context.rb) finds the tracer's fiber-local key and sets it
// here; without one, nothing is read.
#pragma once

#include <ruby.h>
#include <stdbool.h>
#include <stdint.h>

typedef struct {
  uint64_t local_root_span_id;
  uint64_t span_id;
} contprof_trace_ids;

// The fiber-local key (a Symbol) the tracer keeps its context under, or Qnil for none.
void contprof_trace_context_set_datadog_key(VALUE key);
// Whether samples also carry "span_id" (the local root span id in 16 hexadecimal digits):
// the label Pyroscope's span profiles read.
extern bool contprof_span_id_label;
// The ids of the trace active on `thread`'s current fiber; false when there is none.
bool contprof_trace_ids_of(VALUE thread, contprof_trace_ids *out);

void contprof_trace_context_init(VALUE contprof);
