// Tests of the random sampling intervals (ext/contprof/jitter.h): every draw
// within ±CONTPROF_JITTER of the nominal interval, their mean the nominal one, spread
// evenly over that range, and no pattern between one draw and the next (which would
// bring back the periodicity the draws are there to break). And of the gaps between
// sampled allocations (sampling/allocation_gaps.h): geometric, so every allocation is
// sampled with the same probability whatever came before it.
#include <math.h>
#include <stdio.h>

#include "sampling/allocation_gaps.h"
#include "jitter.h"

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
  // The chance a tick falls in a stretch placed apart from the ticks (what a timed stretch
  // off the GVL is weighted by): ticks drawn as the wall clock draws them, stretches
  // starting at the instants of a Poisson process of their own (which see the ticks'
  // phase as any instant apart from them does); the share of stretches of each length
  // that a tick falls in, against contprof_tick_chance, within 4 binomial standard errors.
  const double lengths[] = {0.3, 0.75, 0.9, 1.0, 1.1, 1.2, 1.25, 1.6};
  const long stretches = 200000;
  uint64_t tick_state = contprof_jitter_seed(7, 7), place_state = contprof_jitter_seed(8, 9);
  for (size_t l = 0; l < sizeof(lengths) / sizeof(lengths[0]); l++) {
    int64_t length = (int64_t) (lengths[l] * nominal);
    long seen = 0;
    int64_t tick = 0, start = 0;
    for (long i = 0; i < stretches; i++) {
      // The next start, three intervals later on average; the ticks up to just past it.
      start += (int64_t) (-log(1 - contprof_random_unit(&place_state)) * 3 * nominal);
      while (tick <= start) tick += contprof_jittered_interval(&tick_state, nominal);
      seen += tick < start + length;
    }
    double share = seen / (double) stretches, expected = contprof_tick_chance(length, nominal, CONTPROF_JITTER);
    double error = sqrt(expected * (1 - expected) / stretches);
    check(fabs(share - expected) <= 4 * error + 1e-9, "a tick falls in a stretch as often as contprof_tick_chance says",
          share - expected);
  }
  // A moment apart from the ticks (where a parked clock starts again, wall_clock.c): the
  // time since the previous tick and until the next, drawn by contprof_moment_among_intervals,
  // against those of Poisson-placed moments among ticks drawn as the clock draws them:
  // their means, and the share of each in each eighth of [0, 1.25 T] and of their sum in
  // each of [0.75 T, 1.25 T], within 4 standard errors of the difference of two samples.
  const long moments = 200000;
  enum { SHARES = 8 };
  double sums[2][3] = {{0}}, squares[2][3] = {{0}};
  long shares[2][3][SHARES] = {{{0}}};
  uint64_t moment_state = contprof_jitter_seed(11, 12), draw_state = contprof_jitter_seed(13, 14);
  int64_t previous_tick = 0, next_tick = 0, moment = 0;
  for (long i = 0; i < moments; i++) {
    int64_t parts[2][2];
    moment += (int64_t) (-log(1 - contprof_random_unit(&moment_state)) * 3 * nominal);
    while (next_tick <= moment) {
      previous_tick = next_tick;
      next_tick += contprof_jittered_interval(&tick_state, nominal);
    }
    parts[0][0] = moment - previous_tick;
    parts[0][1] = next_tick - moment;
    contprof_moment_among_intervals(&draw_state, nominal, &parts[1][0], &parts[1][1]);
    for (int sample = 0; sample < 2; sample++) {
      double values[3] = {(double) parts[sample][0] / nominal, (double) parts[sample][1] / nominal,
                          (double) (parts[sample][0] + parts[sample][1]) / nominal};
      for (int v = 0; v < 3; v++) {
        sums[sample][v] += values[v];
        squares[sample][v] += values[v] * values[v];
        double from = v == 2 ? 1 - CONTPROF_JITTER : 0, to = 1 + CONTPROF_JITTER;
        int share = (int) ((values[v] - from) / (to - from) * SHARES);
        if (share >= 0 && share < SHARES) shares[sample][v][share]++;
      }
    }
  }
  for (int v = 0; v < 3; v++) {
    double means[2], variances[2];
    for (int sample = 0; sample < 2; sample++) {
      means[sample] = sums[sample][v] / moments;
      variances[sample] = squares[sample][v] / moments - means[sample] * means[sample];
    }
    double error = sqrt((variances[0] + variances[1]) / moments);
    check(fabs(means[0] - means[1]) <= 4 * error, "a moment among ticks: mean since / until / between ticks",
          means[1] - means[0]);
    for (int share = 0; share < SHARES; share++) {
      double p0 = shares[0][v][share] / (double) moments, p1 = shares[1][v][share] / (double) moments;
      double share_error = sqrt((p0 * (1 - p0) + p1 * (1 - p1)) / moments);
      check(fabs(p0 - p1) <= 4 * share_error + 1e-9, "a moment among ticks: distribution", p1 - p0);
    }
  }
  // Different seeds give different sequences (two clocks, two threads' timers).
  uint64_t a = contprof_jitter_seed(1, 2), b = contprof_jitter_seed(1, 3);
  check(contprof_jittered_interval(&a, nominal) != contprof_jittered_interval(&b, nominal), "seeds differ", 0);
  check(contprof_jitter_seed(0, 0) != 0, "a nonzero seed", 0);
  // Geometric gaps of mean 100: mean, P(gap = 1) = 1/100, and no memory: of the gaps
  // longer than 150, the share longer than 150 + 100 is the share of all gaps longer than
  // 100, (1 - 1/100)^100 = 0.366.
  const uint64_t mean_gap = 100;
  uint64_t gap_state = contprof_jitter_seed(99, 1);
  double gap_sum = 0;
  long ones = 0, beyond_150 = 0, beyond_250 = 0, beyond_100 = 0;
  for (long i = 0; i < DRAWS; i++) {
    uint64_t gap = contprof_allocation_gap(&gap_state, mean_gap);
    check(gap >= 1, "a gap of at least one allocation", (double) gap);
    gap_sum += (double) gap;
    ones += gap == 1;
    beyond_100 += gap > 100;
    beyond_150 += gap > 150;
    beyond_250 += gap > 250;
  }
  double gap_mean = gap_sum / DRAWS;
  check(fabs(gap_mean - mean_gap) < mean_gap * 0.005, "gaps average the interval", gap_mean);
  check(fabs(ones / (double) DRAWS - 0.01) < 0.0006, "one allocation in a hundred sampled right after a sample",
        ones / (double) DRAWS);
  double expected_tail = pow(1 - 1.0 / mean_gap, 100);
  check(fabs(beyond_100 / (double) DRAWS - expected_tail) < 0.003, "P(gap > 100)", beyond_100 / (double) DRAWS);
  check(fabs(beyond_250 / (double) beyond_150 - expected_tail) < 0.006, "gaps have no memory",
        beyond_250 / (double) beyond_150);
  check(contprof_allocation_gap(&gap_state, 1) == 1 && contprof_allocation_gap(&gap_state, 0) == 1,
        "an interval of one samples every allocation", 0);
  if (failures == 0) printf("allocation gaps: mean %.3f for %llu: ok\n", gap_mean, (unsigned long long) mean_gap);
  if (failures == 0) printf("jitter: %d draws, mean %.4f of nominal, lag-1 correlation %.4f: ok\n", DRAWS, mean / nominal, lag_one);
  return failures == 0 ? 0 : 1;
}
