// Helpers shared by the Ruby-facing C files (see ruby_helpers.h).
#include "ruby_helpers.h"
#include "fault_injection.h"

#include <limits.h>
#include <stdbool.h>
#include <time.h>

VALUE contprof_error_class = Qnil;

void contprof_raise_type_error(VALUE value, const char *argument, const char *expected) {
  rb_raise(rb_eTypeError, "%s must be %s, got %" PRIsVALUE, argument, expected, rb_inspect(value));
}

void contprof_raise_pprof_error(pprof_status status, const pprof_error *error, const char *context) {
  VALUE exception_class = status == PPROF_ERR_INVALID ? rb_eArgError : contprof_error_class;
  rb_raise(exception_class, "%s: %s", context, error->message);
}

VALUE contprof_optional_keyword(VALUE options, ID name) {
  VALUE value = Qundef;
  if (!NIL_P(options)) rb_get_kwargs(options, &name, 0, 1, &value);
  return value;
}

typedef struct {
  void *(*func)(void *);
  void *data;
  bool ran;
} gvl_free_call;

static void *run_gvl_free_call(void *data) {
  gvl_free_call *call = data;
  call->ran = true;
  return call->func(call->data);
}

void contprof_call_without_gvl(void *(*func)(void *), void *data, rb_unblock_function_t *ubf, void *ubf_data) {
  gvl_free_call call = {.func = func, .data = data, .ran = false};
  for (;;) {
    rb_thread_call_without_gvl2(run_gvl_free_call, &call, ubf, ubf_data);
    if (call.ran) return;
    rb_thread_check_ints();
  }
}

int64_t contprof_realtime_ns(void) { return contprof_clock_ns(CLOCK_REALTIME); }
int64_t contprof_monotonic_ns(void) { return contprof_clock_ns(CLOCK_MONOTONIC); }

VALUE contprof_time_from_ns(int64_t ns) {
  struct timespec ts = contprof_ns_timespec(ns);
  // INT_MAX - 1 is Ruby's marker for "UTC" in rb_time_timespec_new.
  return rb_time_timespec_new(&ts, INT_MAX - 1);
}

atomic_int contprof_failing_allocations[CONTPROF_ALLOC_SITES];
