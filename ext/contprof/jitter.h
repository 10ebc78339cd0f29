// Random sampling intervals, for the wall clock's ticks and the CPU timers' periods.
//
// A program that loops with a steady period (a job queue, a request loop, a benchmark) is
// sampled at the same few points of its loop whenever that period and the sampling
// interval are near a simple ratio: those points then take all of the loop's time, more
// or less each run as the ratio drifts. (Measured with bench/accuracy_workload.rb, whose
// loop is a steady ~7 ms of wall time and ~3.5 ms of CPU: sampled every 10 ms, single
// runs put up to 4.7 points of wall time and 5.5 of CPU time in the wrong phase.) Every
// interval is therefore drawn uniformly within JITTER of its nominal length: the mean
// rate stays, neighbouring samples stay about one interval apart (so the profile is
// nearly as steady as with a fixed cadence), and within a few dozen samples the sampling
// points have drifted across any loop. Each sample weighs the time (or CPU) since the
// previous one, so the spacing changes where samples fall, never the totals.
#pragma once

#include <math.h>
#include <stdint.h>

// Intervals are drawn uniformly in [nominal * (1 - JITTER), nominal * (1 + JITTER)).
#define CONTPROF_JITTER 0.25

// A nonzero seed; any will do (the draws only need not to be periodic).
static inline uint64_t contprof_jitter_seed(uint64_t a, uint64_t b) {
  uint64_t seed = (a ^ (b << 21) ^ (b >> 43)) * 0x9E3779B97F4A7C15ULL;
  return seed ? seed : 1;
}

// A uniform draw in [0, 1), advancing `state` (xorshift64*: async-signal-safe, and
// statistically more than enough here).
static inline double contprof_random_unit(uint64_t *state) {
  uint64_t x = *state;
  x ^= x >> 12;
  x ^= x << 25;
  x ^= x >> 27;
  *state = x;
  return (double) ((x * 0x2545F4914F6CDD1DULL) >> 11) / 9007199254740992.0; // 53 bits
}

// The next interval around `nominal_ns`, advancing `state`.
static inline int64_t contprof_jittered_interval(uint64_t *state, int64_t nominal_ns) {
  double unit = contprof_random_unit(state);
  return (int64_t) ((double) nominal_ns * (1.0 - CONTPROF_JITTER + 2.0 * CONTPROF_JITTER * unit));
}

// The chance that a tick falls in a stretch of `length_ns` placed apart from the ticks,
// ticks coming at intervals drawn as above around `nominal_ns` (with `jitter`): for a
// stretch of length B, the time from its start to the next tick (whose density is the
// share of intervals still running, over the mean) is at most B. Up to the shortest
// interval that is B / nominal; it reaches 1 at the longest.
static inline double contprof_tick_chance(int64_t length_ns, int64_t nominal_ns, double jitter) {
  double length = (double) length_ns / (double) nominal_ns;
  double shortest = 1.0 - jitter, longest = 1.0 + jitter;
  if (length >= longest) return 1.0;
  if (length <= shortest) return length;
  double beyond = length - shortest;
  return shortest + beyond - beyond * beyond / (2.0 * (longest - shortest));
}
// Where a moment chosen apart from the ticks falls among intervals drawn as above: the
// time since the previous tick and until the next one, drawn together (the interval that
// holds such a moment is chosen in proportion to its length, and the moment uniformly
// within it). A clock that stopped ticking for a while and starts again at such a moment
// (wall_clock.c, "Parking") waits `until_next` for its first tick, whose interval began
// `since_previous` before: its ticks then fall as if it had never stopped.
static inline void contprof_moment_among_intervals(uint64_t *state, int64_t nominal_ns, int64_t *since_previous_ns,
                                                   int64_t *until_next_ns) {
  double shortest = 1.0 - CONTPROF_JITTER, longest = 1.0 + CONTPROF_JITTER;
  // Lengths weighted by themselves: the distribution function is (x^2 - a^2) / (b^2 - a^2).
  double squared = shortest * shortest + contprof_random_unit(state) * (longest * longest - shortest * shortest);
  double length = sqrt(squared) * (double) nominal_ns;
  double until_next = contprof_random_unit(state) * length;
  *until_next_ns = (int64_t) until_next;
  *since_previous_ns = (int64_t) (length - until_next);
}
