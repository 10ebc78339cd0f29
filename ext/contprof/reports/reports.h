// What the reports (lib/contprof/reports, the viewer) read through C: pprof files merged
// and summed up by the pprof core's reader and merger (pprof_merge.c), without the GVL.
#pragma once

#include <ruby.h>

void contprof_pprof_merge_init(VALUE contprof_module);

// Contprof::Native.call_tree: Report::CallTree's trees (the flame graph's), built in C.
void contprof_call_tree_init(VALUE contprof_module);
