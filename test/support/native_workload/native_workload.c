// Native methods whose time the known-answer tests know exactly: CPU burnt or time slept
// in C, with the GVL held or released, optionally calling back into Ruby. Each measures
// nothing itself: the caller reads its clocks around the call.
#include <errno.h>
#include <ruby.h>
#include <ruby/thread.h>
#include <stdbool.h>
#include <stdint.h>
#include <time.h>

static int64_t now_ns(clockid_t clock) {
  struct timespec ts;
  clock_gettime(clock, &ts);
  return (int64_t) ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static int64_t seconds_to_ns(VALUE seconds) {
  double value = NUM2DBL(seconds);
  if (!(value >= 0 && value <= 3600)) rb_raise(rb_eArgError, "seconds must be within 0..3600, got %f", value);
  return (int64_t) (value * 1e9);
}

typedef struct {
  int64_t ns;
  volatile bool interrupted;
} native_call;

// Spins until this thread has used `ns` of CPU.
static void burn(native_call *call) {
  int64_t end = now_ns(CLOCK_THREAD_CPUTIME_ID) + call->ns;
  volatile uint64_t x = 0;
  while (!call->interrupted && now_ns(CLOCK_THREAD_CPUTIME_ID) < end) {
    for (int i = 0; i < 2000; i++) x = x * 31 + (uint64_t) i;
  }
}

// Sleeps `ns` of wall time (to an absolute deadline: a signal does not stretch it).
static void doze(native_call *call) {
  int64_t end = now_ns(CLOCK_MONOTONIC) + call->ns;
  struct timespec deadline = {.tv_sec = end / 1000000000LL, .tv_nsec = end % 1000000000LL};
  while (!call->interrupted && clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &deadline, NULL) == EINTR) {
  }
}

static void *burn_without_gvl(void *call) { burn(call); return NULL; }
static void *doze_without_gvl(void *call) { doze(call); return NULL; }
static void interrupt(void *call) { ((native_call *) call)->interrupted = true; }

static VALUE busy_with_gvl(VALUE self, VALUE seconds) {
  native_call call = {.ns = seconds_to_ns(seconds)};
  burn(&call);
  return Qnil;
}

static VALUE sleep_with_gvl(VALUE self, VALUE seconds) {
  native_call call = {.ns = seconds_to_ns(seconds)};
  doze(&call);
  return Qnil;
}

static VALUE busy_without_gvl(VALUE self, VALUE seconds) {
  native_call call = {.ns = seconds_to_ns(seconds)};
  rb_thread_call_without_gvl(burn_without_gvl, &call, interrupt, &call);
  return Qnil;
}

static VALUE sleep_without_gvl(VALUE self, VALUE seconds) {
  native_call call = {.ns = seconds_to_ns(seconds)};
  rb_thread_call_without_gvl(doze_without_gvl, &call, interrupt, &call);
  return Qnil;
}

// Burns `seconds` of CPU holding the GVL, yielding to the block after each `every`
// seconds of it (the block's own time is not counted in `seconds`).
static VALUE busy_with_gvl_yielding(VALUE self, VALUE seconds, VALUE every) {
  int64_t left = seconds_to_ns(seconds), step = seconds_to_ns(every);
  if (step <= 0) rb_raise(rb_eArgError, "every must be positive");
  while (left > 0) {
    native_call call = {.ns = left < step ? left : step};
    burn(&call);
    left -= call.ns;
    rb_yield(Qnil);
  }
  return Qnil;
}

void Init_native_workload(void) {
  VALUE module = rb_define_module("NativeWorkload");
  rb_define_singleton_method(module, "busy_with_gvl", busy_with_gvl, 1);
  rb_define_singleton_method(module, "sleep_with_gvl", sleep_with_gvl, 1);
  rb_define_singleton_method(module, "busy_without_gvl", busy_without_gvl, 1);
  rb_define_singleton_method(module, "sleep_without_gvl", sleep_without_gvl, 1);
  rb_define_singleton_method(module, "busy_with_gvl_yielding", busy_with_gvl_yielding, 2);
}
