// How many allocations lie between two sampled ones (plain C, tested by test/c/test_jitter.c).
//
// Every allocation is sampled with the same probability 1/mean, independently of the
// others: the gaps between samples are geometric. No allocation site can hide between
// fixed strides (a loop allocating in step with a fixed stride would be sampled at the
// same site every time), and since the draw has no memory, the allocations a gap spans
// are no more likely to come from one site than from another: each sample may stand for
// the whole gap before it, which keeps totals exact.
#pragma once

#include <math.h>
#include <stdint.h>

#include "jitter.h"

#define CONTPROF_ALLOCATION_GAP_MAX 1000000000000000ULL

static inline uint64_t contprof_allocation_gap(uint64_t *state, uint64_t mean) {
  if (mean <= 1) return 1;
  double unit = contprof_random_unit(state); // [0, 1)
  double gap = floor(log1p(-unit) / log1p(-1.0 / (double) mean)) + 1.0;
  if (!(gap < (double) CONTPROF_ALLOCATION_GAP_MAX)) return CONTPROF_ALLOCATION_GAP_MAX;
  return (uint64_t) gap;
}
