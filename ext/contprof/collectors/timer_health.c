// Whether a thread hears its CPU timer (see timer_health.h).
//
// Every SILENT_TIMER_CHECK_ROUNDS wall rounds of silence the thread's clock is read; a
// thread that used more than SILENT_TIMER_PERIODS periods of CPU (and SILENT_TIMER_SLACK_NS)
// from one such reading to the next, without one expiry, does not hear its timer.
// Silences are measured per timer: a timer replaced (a new period when sampling slows down
// to keep its overhead target, or speeds up again) restarts the check, since CPU counted
// under the old one may rightly have brought no expiry. The verdict says why when /proc
// shows it (SIGPROF in the thread's blocked mask, native code's pthread_sigmask), and is
// taken back as soon as an expiry arrives, or the timer is replaced (checked afresh).
// Meanwhile the thread's CPU is read from its clock; the baseline stays, so the CPU since
// its last expiry is not lost.
#include "collectors/timer_health.h"

#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "collectors/thread_clocks.h"
#include "collectors/thread_context_state.h"

// Whether the thread's signal mask blocks SIGPROF, as /proc tells (false when it cannot
// be read). Plain system calls: a round may make them.
static bool blocks_sigprof(pid_t tid) {
  if (tid <= 0) return false;
  char path[64], text[4096];
  snprintf(path, sizeof(path), "/proc/self/task/%d/status", (int) tid);
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  ssize_t length = read(fd, text, sizeof(text) - 1);
  close(fd);
  if (length <= 0) return false;
  text[length] = '\0';
  const char *line = strstr(text, "\nSigBlk:");
  unsigned long long mask = 0;
  return line && sscanf(line, "\nSigBlk: %llx", &mask) == 1 && (mask >> (SIGPROF - 1)) & 1;
}

bool contprof_timer_unheard(contprof_timer_health_counts *counts, per_thread_context *context, VALUE thread,
                            const contprof_cpu_timer_reading *reading, contprof_round_kind kind) {
  contprof_thread_timer_health *health = &context->timer_health;
  bool new_timer = reading->timer_generation != health->check_timer;
  if (new_timer || reading->expirations > 0) {
    health->check_timer = reading->timer_generation;
    health->check_started = false;
    health->silent_rounds = 0;
    if (health->unheard) {
      health->unheard = false;
      counts->threads_not_hearing_timers--;
      if (reading->expirations > 0) counts->timers_heard_again++;
    }
    if (reading->expirations > 0) return false;
  }
  if (health->unheard) return true;
  if (kind != CONTPROF_ROUND_WALL || ++health->silent_rounds < SILENT_TIMER_CHECK_ROUNDS) return false;
  health->silent_rounds = 0;
  int64_t clock_ns = contprof_thread_cpu_time_ns(context, thread);
  if (clock_ns < 0) return false;
  bool measured = health->check_started;
  int64_t used = clock_ns - health->check_cpu_ns;
  health->check_started = true;
  health->check_cpu_ns = clock_ns;
  if (!measured || used <= SILENT_TIMER_PERIODS * reading->period_ns + SILENT_TIMER_SLACK_NS) return false;
  health->unheard = true;
  counts->threads_not_hearing_timers++;
  if (blocks_sigprof(reading->tid)) {
    if (!health->counted_blocking_sigprof) counts->threads_blocking_sigprof++;
    health->counted_blocking_sigprof = true;
  } else {
    if (!health->counted_silent_timer) counts->threads_with_silent_timer++;
    health->counted_silent_timer = true;
  }
  return true;
}
