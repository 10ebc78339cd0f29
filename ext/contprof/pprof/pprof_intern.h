// The pprof core's interning structures: an open-addressing index and blob tables (byte
// strings interned into one arena), which a pprof_profile's tables are made of. Plain C.
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "pprof_profile.h"
#include "pprof_util.h"

// Entries per table are identified by uint32_t; keep clear of the sentinel values.
#define PPROF_MAX_ENTRIES (UINT32_MAX - 2)
#define PPROF_INITIAL_INDEX_CAPACITY 64

// Open-addressing index: slot = (hash32 << 32) | (entry + 1); 0 = empty. Linear probing,
// load factor at most 3/4, capacity a power of two.
typedef struct {
  uint64_t *slots;
  size_t capacity;
  size_t used;
} intern_index;

// Blob tables: byte strings interned into one arena.
typedef struct {
  pprof_buffer bytes;
  size_t *offsets; // count + 1 entries; blob i is bytes[offsets[i], offsets[i + 1])
  size_t offsets_capacity;
  uint32_t count;
  intern_index index;
} blob_table;

typedef struct {
  const uint8_t *data;
  size_t len;
} byte_span;

static inline byte_span blob_get(const blob_table *table, uint32_t id) {
  return (byte_span) {.data = table->bytes.data + table->offsets[id], .len = table->offsets[id + 1] - table->offsets[id]};
}

PPROF_MUST_CHECK
pprof_status pprof_index_init(intern_index *index, pprof_error *error);
void pprof_index_release(intern_index *index);
void pprof_index_clear(intern_index *index);
// Makes sure one more entry fits; call before looking a slot up when the caller may
// insert, so that the slot found stays valid.
PPROF_MUST_CHECK
pprof_status pprof_index_reserve_one(intern_index *index, pprof_error *error);

static inline uint32_t pprof_slot_entry(uint64_t slot) { return (uint32_t) slot - 1; }

static inline void pprof_index_set(intern_index *index, uint64_t *slot, uint32_t hash32, uint32_t entry) {
  *slot = ((uint64_t) hash32 << 32) | ((uint64_t) entry + 1);
  index->used++;
}

PPROF_MUST_CHECK
pprof_status pprof_blob_table_init(blob_table *table, pprof_error *error);
void pprof_blob_table_release(blob_table *table);
// The slot of the blob (data, len) with that hash: where it is, or the empty slot where it
// would go.
uint64_t *pprof_blob_find(const blob_table *table, const uint8_t *data, size_t len, uint32_t hash32);
// The blob's id, interned if new.
PPROF_MUST_CHECK
pprof_status pprof_blob_intern(blob_table *table, const void *data, size_t len, uint64_t hash, uint32_t *id,
                               pprof_error *error);
// Keeps the first `keep` blobs, forgets the rest, and rebuilds the index.
void pprof_blob_table_truncate(blob_table *table, uint32_t keep);
size_t pprof_blob_table_bytes(const blob_table *table);
