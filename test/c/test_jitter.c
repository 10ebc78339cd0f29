// Tests of the random sampling intervals (ext/contprof/sampling/jitter.h): every draw
// within ±CONTPROF_JITTER of the nominal interval, their mean the nominal one, spread
// evenly over that range, and no pattern between one draw and the next (which would
// bring back the periodicity the draws are there to break).
#include <math.h>
#include <stdio.h>

#include "sampling/jitter.h"

#define DRAWS 1000000
#define BINS 10

static int failures;

static void check(int ok, const char *what, double value) {
  if (!ok) {
    fprintf(stderr, "FAIL: %s (%g)\n", what, value);
    failures++;
  }
}

int main(void) {
  const int64_t nominal = 10 * 1000 * 1000;
  const double low = nominal * (1 - CONTPROF_JITTER), high = nominal * (1 + CONTPROF_JITTER);
  uint64_t state = contprof_jitter_seed(12345, 678);
  long bins[BINS] = {0};
  double sum = 0, sum_products = 0, sum_squares = 0, previous = 0;
  for (long i = 0; i < DRAWS; i++) {
    double draw = (double) contprof_jittered_interval(&state, nominal);
    check(draw >= low && draw < high, "draw within the range", draw);
    int bin = (int) ((draw - low) / (high - low) * BINS);
    if (bin >= 0 && bin < BINS) bins[bin]++;
    double centered = draw - nominal;
    sum += draw;
    sum_squares += centered * centered;
    if (i > 0) sum_products += centered * previous;
    previous = centered;
  }
  double mean = sum / DRAWS;
  check(fabs(mean - nominal) < nominal * 0.001, "mean within 0.1% of the nominal interval", mean);
  for (int b = 0; b < BINS; b++) {
    // Uniform: each tenth of the range gets 10% of the draws (binomial sigma 0.03%).
    check(fabs(bins[b] / (double) DRAWS - 1.0 / BINS) < 0.002, "a tenth of the range gets a tenth of the draws",
          bins[b] / (double) DRAWS);
  }
  double lag_one = sum_products / sum_squares;
  check(fabs(lag_one) < 0.01, "successive draws uncorrelated", lag_one);
  // Different seeds give different sequences (two clocks, two threads' timers).
  uint64_t a = contprof_jitter_seed(1, 2), b = contprof_jitter_seed(1, 3);
  check(contprof_jittered_interval(&a, nominal) != contprof_jittered_interval(&b, nominal), "seeds differ", 0);
  check(contprof_jitter_seed(0, 0) != 0, "a nonzero seed", 0);
  if (failures == 0) printf("jitter: %d draws, mean %.4f of nominal, lag-1 correlation %.4f: ok\n", DRAWS, mean / nominal, lag_one);
  return failures == 0 ? 0 : 1;
}
