// The labels a thread's records carry (thread_labels.c).
#pragma once

#include <ruby.h>
#include <stdint.h>

#include "collectors/thread_context_types.h"
#include "collectors/trace_context.h"

// What a thread's labels were made of at its previous sample: when one changes, its
// labels do, and its memo no longer holds its record.
typedef struct {
  VALUE name; // its name object (labels change when it does; marked)
  uint64_t labels_serial; // the serial of its label set then (0: none)
  contprof_trace_ids trace; // its trace's span ids then (zeros: none)
  char span_id_hex[17]; // the "span_id" label's text
} contprof_thread_labels_seen;

// The labels every sample of the thread carries ("thread id", "thread name", and those of
// Contprof.with_labels in force on its current fiber, and of its trace); room is left for
// three more.
void contprof_thread_context_labels(per_thread_context *context, VALUE thread, label_set *labels);

// The labels of a thread's records of time: its labels, then "thread state" (last, set
// per record by contprof_set_state).
void contprof_thread_labels(per_thread_context *context, VALUE thread, label_set *labels);
