// Helpers shared by the Ruby-facing C files: argument checks with clear messages,
// exceptions, pending-interrupt handling and time conversions. Uses only Ruby's public API.
#pragma once

#include <ruby.h>
#include <ruby/thread.h>
#include <stdint.h>
#include <time.h>

#include "pprof/pprof_profile.h"
#include "attributes.h"
#include "time_helpers.h"

#define CONTPROF_EXPORT __attribute__((visibility("default")))

// Contprof::Error, raised for failures that are not the caller's fault.
extern VALUE contprof_error_class;

// Raises TypeError naming the argument and the expected type, e.g.
// "locations[3][0] must be a String, got nil".
NORETURN(void contprof_raise_type_error(VALUE value, const char *argument, const char *expected));

#define CONTPROF_ENFORCE_TYPE(value, type, argument, expected)                                         \
  do {                                                                                                  \
    if (RB_UNLIKELY(!RB_TYPE_P((value), (type)))) contprof_raise_type_error((value), (argument), (expected)); \
  } while (0)

// Raises the Ruby exception matching a pprof core failure: ArgumentError for invalid
// input, Contprof::Error for anything else. `context` prefixes the message.
NORETURN(void contprof_raise_pprof_error(pprof_status status, const pprof_error *error, const char *context));

// The value of keyword `name` in `options` (a method's keyword Hash, or nil when none was
// given), or Qundef when absent. Any other keyword raises ArgumentError. Pass the name as
// rb_intern("literal"), which Ruby's header caches at the call site.
VALUE contprof_optional_keyword(VALUE options, ID name);

// Runs func(data) once, without the GVL. rb_thread_call_without_gvl2 declines to start
// while an interrupt is pending on this thread; such interrupts are handled here (and may
// raise, before func has run) until it does run. `ubf` is Ruby's unblocking function for
// interrupts arriving while func runs (NULL for none).
void contprof_call_without_gvl(void *(*func)(void *), void *data, rb_unblock_function_t *ubf, void *ubf_data);

// Nanoseconds since the Unix epoch (CLOCK_REALTIME) and of CLOCK_MONOTONIC.
int64_t contprof_realtime_ns(void);
int64_t contprof_monotonic_ns(void);


// A UTC Time from nanoseconds since the Unix epoch.
VALUE contprof_time_from_ns(int64_t ns);

// This VM function is exported but declared in no public header: is the current
// thread holding the global VM lock?
int ruby_thread_has_gvl_p(void);
