// The backend of vm/vm.h for a Ruby Contprof cannot sample (neither Ruby 3.1's VM header
// nor the public APIs of Ruby 3.3+ are there): it builds, and reports itself unsupported;
// Contprof.unsupported_reason says why (extconf.rb writes the reason).
#include <ruby.h>

// Every function here is a stub that ignores its arguments.
#pragma GCC diagnostic ignored "-Wunused-parameter"

#include "vm/vm.h"
#include "vm/vm_common.h"
#include "attributes.h"

bool contprof_vm_supported(void) { return false; }
const char *contprof_vm_backend_name(void) { return "unsupported"; }
const char *contprof_vm_backend_note(void) { return ""; }
uint64_t contprof_vm_threads_unknown_no_memory(void) { return 0; } // (threads are Ruby's own structures)
int64_t contprof_vm_thread_cpu_accounted_ns(VALUE thread) { return -1; }
bool contprof_vm_thread_shares_native(VALUE thread) { return false; }
pid_t contprof_vm_sharing_holder_tid(void) { return 0; }
bool contprof_vm_mn_threads_requested(void) { return false; }
uint64_t contprof_vm_threads_sharing_native(void) { return 0; }
void contprof_vm_frames_valid_now(void) {}
bool contprof_vm_frame_names_unreliable(void) { return false; } // (naming never moves objects here)
const char *contprof_vm_gc_hooks_unaffordable(void) { return NULL; }
void contprof_vm_init(void) { contprof_vm_common_init(); }

bool contprof_vm_is_thread(VALUE object) { return rb_obj_is_kind_of(object, rb_cThread) == Qtrue; }
bool contprof_vm_thread_alive(VALUE thread) { return false; }
contprof_thread_state contprof_vm_thread_state(VALUE thread) { return CONTPROF_THREAD_RUNNING; }
int64_t contprof_vm_thread_gvl_waited_ns(VALUE thread, int64_t now_ns) { return -1; }
bool contprof_vm_thread_stretch(VALUE thread, contprof_vm_stretch *stretch) { return false; }
void contprof_vm_thread_mark_stretch(VALUE thread, uint64_t seq) {}
int64_t contprof_vm_thread_marked_stretch_end(VALUE thread, uint64_t seq) { return 0; }
bool contprof_vm_call_on_next_resume(void (*call)(void *), void *data) { return false; }
void contprof_vm_cancel_call_on_next_resume(void) {}
VALUE contprof_vm_thread_name(VALUE thread) { return Qnil; }
bool contprof_vm_thread_pthread(VALUE thread, pthread_t *pthread) { return false; }
pid_t contprof_vm_thread_tid(VALUE thread) { return 0; }
void contprof_vm_each_thread(contprof_vm_thread_visitor visit, void *context) {}
bool contprof_vm_current_thread_holds_gvl(void) { return false; }
bool contprof_vm_current_thread_in_c_method(void) { return false; }

bool contprof_vm_job_register(void (*job)(void *)) { return false; }
int contprof_vm_job_trigger_here(void) { return 0; }
bool contprof_vm_gvl_held(void) { return false; }

int contprof_vm_request_job(atomic_uintptr_t *holder, atomic_uintptr_t *gc_thread, atomic_uint *gc_moment) {
  atomic_store(holder, (uintptr_t) Qnil);
  atomic_store(gc_thread, (uintptr_t) Qnil);
  atomic_store(gc_moment, 0);
  return 0;
}

long contprof_vm_read_stack(VALUE thread, contprof_raw_frame *frames, long capacity) { return CONTPROF_VM_NOT_A_THREAD; }
int64_t contprof_vm_frame_line(const contprof_raw_frame *frame) { return 0; }
pprof_str contprof_vm_frame_file(const contprof_raw_frame *frame) { return (pprof_str) {"", 0}; }
pprof_str contprof_vm_frame_name(const contprof_raw_frame *frame, char *buffer, size_t buffer_size) {
  return (pprof_str) {"", 0};
}
size_t contprof_vm_capture_scratch_size(long capacity) { return 0; }
long contprof_vm_capture_current_stack(contprof_raw_frame *frames, long capacity, void *scratch,
                                       contprof_stack_capture_info *info) {
  return -1;
}
bool contprof_vm_frame_key_rememberable(const contprof_raw_frame *frame) { return false; }

bool contprof_vm_request_job_from_ruby_threads(void) { return false; }
