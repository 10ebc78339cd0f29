// Tests of the wall clock's alarms (ext/contprof/sampling/wall_clock.c): the loop, on a
// thread of its own as on Ruby 3.3+, calls its client's alarm once at the moment set,
// between its ticks; of two alarms the earlier wins; an alarm past the next tick comes
// after that tick; stopping ends the loop whatever is pending. Orderings, not timings:
// the ticks are 200 ms apart, the alarms a few milliseconds away.
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <time.h>

#include "sampling/wall_clock.h"
#include "time_helpers.h"

#define INTERVAL_NS (200 * 1000 * 1000LL)
#define MS (1000 * 1000LL)

static int failures;
static atomic_int ticks, alarms, pthread_failures;
static atomic_int_fast64_t alarm_called_at;
static atomic_int ticks_at_alarm;

static void check(int ok, const char *what, long long value) {
  if (!ok) {
    fprintf(stderr, "FAIL: %s (%lld)\n", what, value);
    failures++;
  }
}

static contprof_tick tick(void *data) {
  (void) data;
  atomic_fetch_add(&ticks, 1);
  return CONTPROF_TICK_ASKED;
}

static int64_t rounds_cost_ns(void *data) {
  (void) data;
  return 0;
}

static void round_with_gvl(void *data) { (void) data; }

static void on_alarm(void *data) {
  (void) data;
  atomic_store(&alarm_called_at, contprof_clock_ns(CLOCK_MONOTONIC));
  atomic_store(&ticks_at_alarm, atomic_load(&ticks));
  atomic_fetch_add(&alarms, 1);
}

static void failed(void *data, int error, const char *call) {
  (void) data;
  fprintf(stderr, "pthread call failed: %s (%d)\n", call, error);
  atomic_fetch_add(&pthread_failures, 1);
}

static void sleep_ns(int64_t ns) {
  struct timespec duration = contprof_ns_timespec(ns);
  nanosleep(&duration, NULL);
}

// Waits (up to a second) for `count` alarms.
static void wait_for_alarms(int count) {
  for (int i = 0; i < 1000 && atomic_load(&alarms) < count; i++) sleep_ns(MS);
}

int main(void) {
  contprof_wall_clock clock;
  contprof_wall_clock_init(&clock, (contprof_wall_clock_client) {.tick = tick, .rounds_cost_ns = rounds_cost_ns,
                                                                 .round_with_gvl = round_with_gvl, .alarm = on_alarm,
                                                                 .failed = failed});
  uint64_t run = contprof_wall_clock_start_run(&clock, INTERVAL_NS, 0);
  contprof_wall_clock_here here = {.clock = &clock, .run = run};
  pthread_t thread;
  if (pthread_create(&thread, NULL, contprof_wall_clock_run_here, &here) != 0) {
    fprintf(stderr, "FAIL: pthread_create\n");
    return 1;
  }
  contprof_wall_clock_wait_for_start(&clock);

  // An alarm before the first tick (150-250 ms away: the intervals are drawn within ±25%).
  int64_t at = contprof_clock_ns(CLOCK_MONOTONIC) + 5 * MS;
  contprof_wall_clock_set_alarm(&clock, at);
  wait_for_alarms(1);
  check(atomic_load(&alarms) == 1, "the alarm was called once", atomic_load(&alarms));
  check(atomic_load(&alarm_called_at) >= at, "not before its moment", atomic_load(&alarm_called_at) - at);
  check(atomic_load(&ticks_at_alarm) == 0, "between ticks: before the first", atomic_load(&ticks_at_alarm));
  check(atomic_load(&clock.alarm_ns) == 0, "nothing pending after it", (long long) atomic_load(&clock.alarm_ns));

  // Of two alarms, the earlier is kept, whichever was set first.
  at = contprof_clock_ns(CLOCK_MONOTONIC) + 5 * MS;
  contprof_wall_clock_set_alarm(&clock, at + 100 * MS);
  contprof_wall_clock_set_alarm(&clock, at);
  contprof_wall_clock_set_alarm(&clock, at + 50 * MS);
  wait_for_alarms(2);
  check(atomic_load(&alarms) == 2, "the earlier alarm came", atomic_load(&alarms));
  check(atomic_load(&alarm_called_at) >= at, "at its moment", atomic_load(&alarm_called_at) - at);
  sleep_ns(150 * MS);
  check(atomic_load(&alarms) == 2, "the later ones did not come", atomic_load(&alarms));

  // An alarm beyond the next tick comes after that tick, and does not wake the loop before
  // it (each wakeup of a sleeping thread is dear: the loop looks at the alarm at the tick).
  int ticks_before = atomic_load(&ticks);
  uint_fast64_t wakeups_before = atomic_load(&clock.thread_wakeups);
  contprof_wall_clock_set_alarm(&clock, contprof_clock_ns(CLOCK_MONOTONIC) + 300 * MS);
  sleep_ns(5 * MS);
  if (atomic_load(&ticks) == ticks_before) {
    check(atomic_load(&clock.thread_wakeups) == wakeups_before, "not woken for an alarm past the tick",
          (long long) (atomic_load(&clock.thread_wakeups) - wakeups_before));
  }
  wait_for_alarms(3);
  check(atomic_load(&alarms) == 3, "the alarm past a tick came", atomic_load(&alarms));
  check(atomic_load(&ticks_at_alarm) > ticks_before, "after the tick", atomic_load(&ticks_at_alarm) - ticks_before);

  // Stopping ends the loop with an alarm pending.
  contprof_wall_clock_set_alarm(&clock, contprof_clock_ns(CLOCK_MONOTONIC) + 10 * 1000 * MS);
  contprof_wall_clock_stop(&clock);
  pthread_join(thread, NULL);
  check(atomic_load(&alarms) == 3, "no alarm after stop", atomic_load(&alarms));
  check(atomic_load(&pthread_failures) == 0, "no pthread call failed", atomic_load(&pthread_failures));
  contprof_wall_clock_destroy(&clock);

  if (failures) return 1;
  printf("wall clock alarms: ok\n");
  return 0;
}
