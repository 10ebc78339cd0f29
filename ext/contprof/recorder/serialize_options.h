// What StackRecorder#serialize is asked to encode besides the pprof: an OTLP request, the
// pprof with its timeline merged, and the pprof with one label renamed (see
// serialize.c). Read from Ruby values with the GVL, and copied out of them: the
// encoding runs without the GVL, while a compacting GC may move a String's bytes.
#pragma once

#include <ruby.h>
#include <stdbool.h>

#include "pprof/pprof_otlp.h"
#include "pprof/pprof_profile.h"

typedef struct {
  bool want_otlp;
  pprof_otlp_options otlp;
  bool want_merged;
  bool want_relabeled;
  pprof_rewrite relabel;
} contprof_serialize_options;

// Reads serialize's keywords otlp:, merged_timeline: and relabel: (Qundef when not given)
// into `out`. Raises ArgumentError naming the keyword when one is wrong, having freed what
// it copied.
void contprof_read_serialize_options(VALUE otlp, VALUE merged_timeline, VALUE relabel,
                                     contprof_serialize_options *out);
// Frees what was copied; `options` is then empty.
void contprof_free_serialize_options(contprof_serialize_options *options);
