// Clock readings in nanoseconds, for plain-C files and Ruby-facing ones alike.
#pragma once

#include <stdint.h>
#include <time.h>

static inline int64_t contprof_timespec_ns(struct timespec ts) { return (int64_t) ts.tv_sec * 1000000000 + ts.tv_nsec; }

static inline struct timespec contprof_ns_timespec(int64_t ns) {
  return (struct timespec) {.tv_sec = ns / 1000000000, .tv_nsec = ns % 1000000000};
}

// `clock`'s reading, or 0 when it cannot be read.
static inline int64_t contprof_clock_ns(clockid_t clock) {
  struct timespec ts;
  return clock_gettime(clock, &ts) == 0 ? contprof_timespec_ns(ts) : 0;
}
