// Reading stacks through the VM's own structures, at offsets this file pair knows (Ruby 3.3
// to 4.0) and checks at load time on whatever Ruby it runs: the fast and faithful stack
// reader of the public-API backend (vm/vm_public_api.c), which falls back to
// rb_profile_thread_frames when the check fails.
//
// Why: the public API names a block's frame as its method (it hands out the method entry
// for both), cannot be asked for a frame's iseq, and computes every frame's line at every
// sample. Reading the control frames directly gives the iseq, the program counter and the
// method entry of each frame, as on Ruby 3.1 (vm/vm_ruby31.c), and leaves naming and lines
// to the first time a frame is seen.
//
// Raw frames hold the iseq, the pc in it and the method entry (lowest bit set for a C
// frame), as the Ruby 3.1 backend's do.
#pragma once

#include <stdbool.h>
#include <stddef.h>

#include "vm/vm.h"

// Checks, holding the GVL, that the structures are laid out as this reader expects: the
// calling thread's stack is read both ways (here and with rb_profile_frames) and must
// agree frame for frame, object for object, line for line. On failure writes why into
// `why_not` and returns false; nothing else here may then be called.
bool contprof_layout_check(char *why_not, size_t size);
// After a check that passed: how the running Ruby's backtraces look, which the walk copies
// (asked of it by the check), for `contprof doctor`.
const char *contprof_layout_note(void);

// As contprof_vm_read_stack, for a live Thread (holding the GVL).
long contprof_layout_read_stack(VALUE thread, contprof_raw_frame *frames, long capacity);
// Whether the newest frame of `thread` (the calling thread, in a signal handler) is a C
// method's (async-signal-safe).
bool contprof_layout_in_c_method(VALUE thread);
// Reads the stack of the calling thread, `thread`, from a signal handler while it is off
// the GVL or inside a C method (async-signal-safe); see contprof_vm_capture_current_stack.
long contprof_layout_capture_stack(VALUE thread, contprof_raw_frame *frames, long capacity,
                                   contprof_stack_capture_info *info);

int64_t contprof_layout_frame_line(const contprof_raw_frame *frame);
pprof_str contprof_layout_frame_file(const contprof_raw_frame *frame);
pprof_str contprof_layout_frame_name(const contprof_raw_frame *frame, char *buffer, size_t buffer_size);
bool contprof_layout_frame_key_rememberable(const contprof_raw_frame *frame);
