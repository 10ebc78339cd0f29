// The profiler's own threads (see profiler_threads.h).
#include "profiler_threads.h"

#include "attributes.h"

#include "vm/vm.h"

static VALUE profiler_threads = Qnil; // Array of Thread: a handful at most
// Blocks of profiler threads created but not started yet (Thread => Proc).
static VALUE pending_blocks = Qnil;

bool contprof_profiler_thread(VALUE thread) {
  for (long i = 0; i < RARRAY_LEN(profiler_threads); i++) {
    if (RARRAY_AREF(profiler_threads, i) == thread) return true;
  }
  return false;
}

// Keeps the list as short as the profiler's live threads. Called from Ruby, never in a
// round, so Thread#alive? may answer: unlike contprof_vm_thread_alive, it counts a thread
// that has not started yet as alive.
static void forget_dead_threads(void) {
  static ID alive;
  if (!alive) alive = rb_intern("alive?");
  for (long i = RARRAY_LEN(profiler_threads) - 1; i >= 0; i--) {
    if (!RTEST(rb_funcall(RARRAY_AREF(profiler_threads, i), alive, 0))) rb_ary_delete_at(profiler_threads, i);
  }
}

void contprof_profiler_threads_add(VALUE thread) {
  if (!contprof_profiler_thread(thread)) rb_ary_push(profiler_threads, thread);
  forget_dead_threads(); // after: Thread#alive? checks interrupts, where a round may run
}

static VALUE profiler_thread_body(CONTPROF_UNUSED void *unused) {
  VALUE block = rb_hash_delete(pending_blocks, rb_thread_current());
  return NIL_P(block) ? Qnil : rb_proc_call(block, rb_ary_new());
}

// Contprof::Native.profiler_thread { ... }: Thread.new for the profiler's own threads.
// The thread is registered before any round can see it: nothing between its creation and
// its registration checks for interrupts (where sampling jobs run), and it cannot start
// before this returns (it needs the GVL). (Thread.new would check interrupts on its way
// out, after the thread joined the VM's list.)
static VALUE native_profiler_thread(VALUE CONTPROF_UNUSED module) {
  rb_need_block();
  VALUE block = rb_block_proc();
  forget_dead_threads();
  VALUE thread = rb_thread_create(profiler_thread_body, NULL);
  rb_ary_push(profiler_threads, thread);
  rb_hash_aset(pending_blocks, thread, block);
  RB_GC_GUARD(block);
  return thread;
}

static VALUE native_profiler_threads(VALUE CONTPROF_UNUSED module) {
  forget_dead_threads();
  return rb_ary_dup(profiler_threads);
}

void contprof_profiler_threads_init(VALUE contprof_module) {
  profiler_threads = rb_ary_new();
  rb_global_variable(&profiler_threads);
  pending_blocks = rb_hash_new();
  rb_global_variable(&pending_blocks);
  VALUE native = rb_define_module_under(contprof_module, "Native");
  rb_define_singleton_method(native, "profiler_thread", native_profiler_thread, 0);
  rb_define_singleton_method(native, "profiler_threads", native_profiler_threads, 0);
}
