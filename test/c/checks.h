// The C unit tests' checks: each counts, and a failed one prints where and what, and the
// test goes on (main reports the failures at the end). One copy per test program.
#pragma once

#include <stdio.h>
#include <string.h>

static int failures;
static int checks;
static const char *current_test;

#define CHECK(condition)                                                                              \
  do {                                                                                                \
    checks++;                                                                                         \
    if (!(condition)) {                                                                               \
      failures++;                                                                                     \
      fprintf(stderr, "FAIL %s (%s:%d): %s\n", current_test, __FILE__, __LINE__, #condition);         \
    }                                                                                                 \
  } while (0)

#define CHECK_EQ_INT(expected, actual)                                                                \
  do {                                                                                                \
    checks++;                                                                                         \
    long long expected_ = (long long) (expected), actual_ = (long long) (actual);                     \
    if (expected_ != actual_) {                                                                       \
      failures++;                                                                                     \
      fprintf(stderr, "FAIL %s (%s:%d): %s expected %lld, got %lld\n", current_test, __FILE__,        \
              __LINE__, #actual, expected_, actual_);                                                 \
    }                                                                                                 \
  } while (0)

#define CHECK_EQ_STR(expected, actual)                                                                \
  do {                                                                                                \
    checks++;                                                                                         \
    const char *expected_ = (expected), *actual_ = (actual);                                          \
    if (strcmp(expected_, actual_) != 0) {                                                            \
      failures++;                                                                                     \
      fprintf(stderr, "FAIL %s (%s:%d): %s expected \"%s\", got \"%s\"\n", current_test, __FILE__,    \
              __LINE__, #actual, expected_, actual_);                                                 \
    }                                                                                                 \
  } while (0)
