// Entry point of Contprof's native extension: defines the Contprof module's native
// parts and registers each component (each lives in its own file).
#include <ruby.h>

#include "pprof/pprof_profile.h"
#include "ruby_helpers.h"
#include "collectors/allocations.h"
#include "collectors/labels.h"
#include "collectors/thread_context.h"
#include "collectors/trace_context.h"
#include "collectors/stack.h"
#include "recorder/stack_recorder.h"
#include "reports/reports.h"
#include "sampling/cpu_and_wall_time_worker.h"
#include "sampling/cpu_timers.h"
#include "transport/transport.h"
#include "vm/vm.h"

#ifndef CONTPROF_UNSUPPORTED_REASON
#define CONTPROF_UNSUPPORTED_REASON NULL
#endif

static VALUE native_unsupported_reason(VALUE CONTPROF_UNUSED module) {
  const char *reason = CONTPROF_UNSUPPORTED_REASON;
  return reason ? rb_str_new_cstr(reason) : Qnil;
}

static VALUE native_compressor(VALUE CONTPROF_UNUSED module) { return rb_str_new_cstr(pprof_compressor_name()); }
static VALUE native_vm_backend(VALUE CONTPROF_UNUSED module) { return rb_str_new_cstr(contprof_vm_backend_name()); }
static VALUE native_vm_backend_note(VALUE CONTPROF_UNUSED module) { return rb_str_new_cstr(contprof_vm_backend_note()); }
static VALUE native_perf_events_refused(VALUE CONTPROF_UNUSED module) {
  char why[160];
  const char *reason = contprof_cpu_timers_perf_events_refused(why, sizeof(why));
  return reason ? rb_str_new_cstr(reason) : Qnil;
}
static VALUE native_heap_unsupported_reason(VALUE CONTPROF_UNUSED module) {
  const char *reason = contprof_allocations_heap_unsupported_reason();
  return reason ? rb_str_new_cstr(reason) : Qnil;
}

// Ruby calls it when the extension is loaded.
CONTPROF_EXPORT void Init_contprof_native(void);

CONTPROF_EXPORT void Init_contprof_native(void) {
  VALUE contprof = rb_define_module("Contprof");
  contprof_error_class = rb_define_class_under(contprof, "Error", rb_eStandardError);
  rb_global_variable(&contprof_error_class);

  VALUE native = rb_define_module_under(contprof, "Native");
  // Why this build cannot profile (nil when it can); set at build time by extconf.rb.
  rb_define_singleton_method(native, "unsupported_reason", native_unsupported_reason, 0);
  rb_define_singleton_method(native, "compressor", native_compressor, 0);
  // How this build reads the VM: "ruby31", "public_api" or "unsupported" (vm/vm.h).
  rb_define_singleton_method(native, "vm_backend", native_vm_backend, 0);
  rb_define_singleton_method(native, "vm_backend_note", native_vm_backend_note, 0);
  // Why this build cannot track the live heap (nil when it can).
  rb_define_singleton_method(native, "heap_unsupported_reason", native_heap_unsupported_reason, 0);
  // Why CPU timers here are POSIX timers rather than perf events (nil: perf events work).
  rb_define_singleton_method(native, "perf_events_refused", native_perf_events_refused, 0);

  contprof_vm_init();
  contprof_stack_recorder_init(contprof);
  contprof_stack_class_init(contprof);
  contprof_thread_context_class_init(contprof);
  contprof_labels_class_init(contprof);
  contprof_trace_context_init(contprof);
  contprof_worker_class_init(contprof);
  contprof_http_transport_init(contprof);
  contprof_file_writer_init(contprof);
  contprof_pprof_merge_init(contprof);
  contprof_call_tree_init(contprof);
}
