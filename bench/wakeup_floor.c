// The platform's floor for any profiler built on a timing thread: CPU consumed by a
// thread that only wakes up every 10 ms (and optionally signals a busy thread), while
// another thread burns CPU. No Ruby, no profiling: just the cost of the wakeups, which
// depends heavily on the machine (virtual CPUs pay for every timer wakeup and
// inter-processor interrupt). Run by bench/overhead.rb.
//
// Also: what one wakeup is charged after sleeping 10 ms, 100 ms and 1 s. On a virtual
// machine the charge grows with the sleep (the hypervisor's resumption of an idle virtual
// CPU lands on the thread that wakes).
#define _GNU_SOURCE
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

enum { WAKEUPS = 300 };
static pthread_t busy_thread;
static volatile int signals_received;

static void on_signal(int signal) {
  (void) signal;
  signals_received++;
}

static double thread_cpu_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static void *waker(void *send_signals) {
  double start = thread_cpu_ms();
  struct timespec deadline;
  clock_gettime(CLOCK_MONOTONIC, &deadline);
  for (int i = 0; i < WAKEUPS; i++) {
    deadline.tv_nsec += 10 * 1000 * 1000;
    if (deadline.tv_nsec >= 1000000000) {
      deadline.tv_sec++;
      deadline.tv_nsec -= 1000000000;
    }
    clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &deadline, NULL);
    if (send_signals) pthread_kill(busy_thread, SIGPROF);
  }
  double used = thread_cpu_ms() - start;
  printf("%s_us_per_wakeup=%.1f\n", send_signals ? "signal" : "plain", used * 1000 / WAKEUPS);
  return NULL;
}

static void *sleeper(void *unused) {
  (void) unused;
  static const long sleeps_ms[] = {10, 100, 1000};
  for (int i = 0; i < 3; i++) {
    double charged = 0;
    for (int j = 0; j < 3; j++) {
      struct timespec pause = {.tv_sec = sleeps_ms[i] / 1000, .tv_nsec = sleeps_ms[i] % 1000 * 1000000};
      double before = thread_cpu_ms();
      nanosleep(&pause, NULL);
      charged += thread_cpu_ms() - before;
    }
    printf("sleep_%ldms_us_per_wakeup=%.1f\n", sleeps_ms[i], charged * 1000 / 3);
  }
  return NULL;
}

int main(void) {
  struct sigaction action;
  memset(&action, 0, sizeof(action));
  action.sa_handler = on_signal;
  action.sa_flags = SA_RESTART;
  sigaction(SIGPROF, &action, NULL);
  busy_thread = pthread_self();
  for (long send = 0; send <= 1; send++) {
    pthread_t thread;
    pthread_create(&thread, NULL, waker, (void *) send);
    struct timespec start, now;
    clock_gettime(CLOCK_MONOTONIC, &start);
    do {
      clock_gettime(CLOCK_MONOTONIC, &now);
    } while ((now.tv_sec - start.tv_sec) * 1e9 + (now.tv_nsec - start.tv_nsec) < WAKEUPS * 10e6 + 20e6);
    pthread_join(thread, NULL);
  }
  // The sleeper measures itself while this thread stays busy.
  pthread_t thread;
  pthread_create(&thread, NULL, sleeper, NULL);
  struct timespec start, now;
  clock_gettime(CLOCK_MONOTONIC, &start);
  do {
    clock_gettime(CLOCK_MONOTONIC, &now);
  } while ((now.tv_sec - start.tv_sec) * 1e9 + (now.tv_nsec - start.tv_nsec) < 3.4e9);
  pthread_join(thread, NULL);
  return 0;
}
