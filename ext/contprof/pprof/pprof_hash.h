// Hashing for the pprof core's intern tables: a small multiply-fold hash that reads
// 16 bytes per round. Quality only needs to be good enough for open addressing (every
// hit is confirmed by comparing contents); speed matters because every frame of every
// sample is hashed. Written for this project; not a cryptographic or DoS-resistant hash.
#pragma once

#include <stddef.h>
#include <stdint.h>
#include <string.h>

// Odd constants taken from the hexadecimal digits of pi.
#define PPROF_HASH_K0 UINT64_C(0x243f6a8885a308d3)
#define PPROF_HASH_K1 UINT64_C(0x13198a2e03707345)
#define PPROF_HASH_K2 UINT64_C(0xa4093822299f31d1)
#define PPROF_HASH_K3 UINT64_C(0x082efa98ec4e6c89)

// Multiplies to 128 bits and folds the halves together.
static inline uint64_t pprof_hash_fold(uint64_t a, uint64_t b) {
  __extension__ typedef unsigned __int128 u128;
  u128 product = (u128) a * b;
  return (uint64_t) product ^ (uint64_t) (product >> 64);
}

static inline uint64_t pprof_hash_load64(const uint8_t *p) {
  uint64_t v;
  memcpy(&v, p, sizeof(v));
  return v;
}

// Loads 0..8 bytes into the low end of a zeroed word.
static inline uint64_t pprof_hash_load_tail(const uint8_t *p, size_t len) {
  uint64_t v = 0;
  if (len > 0) memcpy(&v, p, len);
  return v;
}

static inline uint64_t pprof_hash_bytes(const void *data, size_t len, uint64_t seed) {
  const uint8_t *p = (const uint8_t *) data;
  uint64_t h = seed ^ pprof_hash_fold((uint64_t) len ^ PPROF_HASH_K0, PPROF_HASH_K1);
  if (len > 32) {
    // Two independent lanes let the CPU overlap the multiplications.
    uint64_t h2 = h ^ PPROF_HASH_K3;
    while (len > 32) {
      h = pprof_hash_fold(pprof_hash_load64(p) ^ PPROF_HASH_K1 ^ h, pprof_hash_load64(p + 8) ^ PPROF_HASH_K2);
      h2 = pprof_hash_fold(pprof_hash_load64(p + 16) ^ PPROF_HASH_K3 ^ h2, pprof_hash_load64(p + 24) ^ PPROF_HASH_K0);
      p += 32;
      len -= 32;
    }
    h ^= h2;
  }
  if (len > 16) {
    h = pprof_hash_fold(pprof_hash_load64(p) ^ PPROF_HASH_K1 ^ h, pprof_hash_load64(p + 8) ^ PPROF_HASH_K2);
    p += 16;
    len -= 16;
  }
  uint64_t a, b;
  if (len > 8) {
    a = pprof_hash_load64(p);
    b = pprof_hash_load_tail(p + 8, len - 8);
  } else {
    a = pprof_hash_load_tail(p, len);
    b = 0;
  }
  h = pprof_hash_fold(a ^ PPROF_HASH_K1 ^ h, b ^ PPROF_HASH_K2);
  return pprof_hash_fold(h ^ PPROF_HASH_K3, PPROF_HASH_K0);
}

// Mixes a further 64-bit value into a hash.
static inline uint64_t pprof_hash_combine(uint64_t h, uint64_t value) {
  return pprof_hash_fold(h ^ value ^ PPROF_HASH_K2, PPROF_HASH_K3 ^ (h >> 29));
}
