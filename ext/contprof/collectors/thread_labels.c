// The labels of a thread's records (see thread_labels.h): written once per thread where
// they can be ("thread id"), compared by identity where they change (its name, its label
// set, its trace), so that an unchanged thread's record reuses its memo.
#include "collectors/thread_labels.h"

#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "collectors/thread_context_state.h"

// "thread id", "thread name" when it has one, and the program's labels in force on its
// fiber. Changes the memo's validity when the name or the labels changed (Thread#name=
// stores a new frozen string, so an unchanged name is the same object; every label set has
// its own serial).
void contprof_thread_context_labels(per_thread_context *context, VALUE thread, label_set *labels) {
  VALUE name = contprof_vm_thread_name(thread);
  const contprof_label_set *in_force = contprof_labels_in_force(thread);
  uint64_t serial = in_force ? in_force->serial : 0;
  contprof_trace_ids trace = {0};
  bool traced = contprof_trace_ids_of(thread, &trace);
  contprof_thread_labels_seen *seen = &context->labels_seen;
  if (name != seen->name || serial != seen->labels_serial || trace.span_id != seen->trace.span_id ||
      trace.local_root_span_id != seen->trace.local_root_span_id) {
    context->memo.valid = false;
  }
  seen->name = name;
  seen->labels_serial = serial;
  seen->trace = trace;
  labels->count = 0;
  labels->list[labels->count++] =
    (pprof_label) {.key = PPROF_STR("thread id"), .str = {context->thread_id_label, context->thread_id_label_len}};
  if (RB_TYPE_P(name, T_STRING) && RSTRING_LEN(name) > 0) {
    labels->list[labels->count++] =
      (pprof_label) {.key = PPROF_STR("thread name"), .str = {RSTRING_PTR(name), (size_t) RSTRING_LEN(name)}};
  }
  if (in_force) {
    memcpy(&labels->list[labels->count], in_force->labels, in_force->count * sizeof(pprof_label));
    labels->count += in_force->count;
  }
  if (traced) { // numbers, as Datadog's backend reads them
    labels->list[labels->count++] =
      (pprof_label) {.key = PPROF_STR("local root span id"), .num = (int64_t) trace.local_root_span_id};
    labels->list[labels->count++] = (pprof_label) {.key = PPROF_STR("span id"), .num = (int64_t) trace.span_id};
    if (contprof_span_id_label) {
      snprintf(seen->span_id_hex, sizeof(seen->span_id_hex), "%016" PRIx64, trace.local_root_span_id);
      labels->list[labels->count++] = (pprof_label) {.key = PPROF_STR("span_id"), .str = {seen->span_id_hex, 16}};
    }
  }
}

// The labels of a thread's records: its labels, then "thread state" (last, set per record
// by contprof_set_state).
void contprof_thread_labels(per_thread_context *context, VALUE thread, label_set *labels) {
  contprof_thread_context_labels(context, thread, labels);
  labels->list[labels->count++] = (pprof_label) {.key = PPROF_STR(CONTPROF_STATE_LABEL),
                                                 .str = contprof_state_name(CONTPROF_STATE_RUNNING)};
}

