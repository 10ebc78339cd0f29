// The pprof core's interning structures (see pprof_intern.h): open-addressing indexes and
// blob tables.
#include "pprof_intern.h"

#include <string.h>

#include "pprof_alloc.h"
#include "pprof_hash.h"

// ---------------------------------------------------------------------------------------
// Open-addressing index: slot = (hash32 << 32) | (entry + 1); 0 = empty. Linear probing,
// load factor at most 3/4, capacity a power of two.

pprof_status pprof_index_init(intern_index *index, pprof_error *error) {
  index->slots = pprof_malloc(PPROF_INITIAL_INDEX_CAPACITY * sizeof(uint64_t));
  if (!index->slots) return pprof_fail(error, PPROF_ERR_NO_MEMORY, "out of memory creating a profile index");
  memset(index->slots, 0, PPROF_INITIAL_INDEX_CAPACITY * sizeof(uint64_t));
  index->capacity = PPROF_INITIAL_INDEX_CAPACITY;
  index->used = 0;
  return PPROF_OK;
}

void pprof_index_release(intern_index *index) {
  pprof_free(index->slots, index->capacity * sizeof(uint64_t));
  index->slots = NULL;
  index->capacity = 0;
  index->used = 0;
}

void pprof_index_clear(intern_index *index) {
  memset(index->slots, 0, index->capacity * sizeof(uint64_t));
  index->used = 0;
}

static void pprof_index_place(uint64_t *slots, size_t mask, uint64_t slot) {
  size_t position = (uint32_t) (slot >> 32) & mask;
  while (slots[position] != 0) position = (position + 1) & mask;
  slots[position] = slot;
}

pprof_status pprof_index_reserve_one(intern_index *index, pprof_error *error) {
  // Load factor at most 3/4: lookups stay short (slots carry hash tags, so probing is a
  // sequential scan of 8-byte words) and indexes stay a small part of a profile's memory.
  if ((index->used + 1) * 4 <= index->capacity * 3) return PPROF_OK;
  if (index->used >= PPROF_MAX_ENTRIES) return pprof_fail(error, PPROF_ERR_LIMIT, "profile table is full (%zu entries)", index->used);
  size_t new_capacity = index->capacity * 2;
  uint64_t *slots = pprof_malloc(new_capacity * sizeof(uint64_t));
  if (!slots) return pprof_fail(error, PPROF_ERR_NO_MEMORY, "out of memory growing a profile index");
  memset(slots, 0, new_capacity * sizeof(uint64_t));
  for (size_t i = 0; i < index->capacity; i++) {
    if (index->slots[i] != 0) pprof_index_place(slots, new_capacity - 1, index->slots[i]);
  }
  pprof_free(index->slots, index->capacity * sizeof(uint64_t));
  index->slots = slots;
  index->capacity = new_capacity;
  return PPROF_OK;
}


// ---------------------------------------------------------------------------------------
// Blob tables: byte strings interned into one arena.

pprof_status pprof_blob_table_init(blob_table *table, pprof_error *error) {
  memset(table, 0, sizeof(*table));
  void *offsets = NULL;
  pprof_status status = pprof_grow_array(&offsets, &table->offsets_capacity, 64, sizeof(size_t), error);
  if (status != PPROF_OK) return status;
  table->offsets = offsets;
  table->offsets[0] = 0;
  // Never NULL, not even while every blob is empty: NULL + 0 is undefined behaviour.
  status = pprof_buffer_reserve(&table->bytes, 64, error);
  if (status != PPROF_OK) return status;
  return pprof_index_init(&table->index, error);
}

void pprof_blob_table_release(blob_table *table) {
  pprof_buffer_free(&table->bytes);
  pprof_free(table->offsets, table->offsets_capacity * sizeof(size_t));
  pprof_index_release(&table->index);
  memset(table, 0, sizeof(*table));
}

uint64_t *pprof_blob_find(const blob_table *table, const uint8_t *data, size_t len, uint32_t hash32) {
  size_t mask = table->index.capacity - 1;
  size_t position = hash32 & mask;
  for (;;) {
    uint64_t slot = table->index.slots[position];
    if (slot == 0) return &table->index.slots[position];
    if ((uint32_t) (slot >> 32) == hash32) {
      byte_span existing = blob_get(table, pprof_slot_entry(slot));
      if (existing.len == len && (len == 0 || memcmp(existing.data, data, len) == 0)) return &table->index.slots[position];
    }
    position = (position + 1) & mask;
  }
}

pprof_status pprof_blob_intern(blob_table *table, const void *data, size_t len, uint64_t hash, uint32_t *id,
                                pprof_error *error) {
  pprof_status status = pprof_index_reserve_one(&table->index, error);
  if (status != PPROF_OK) return status;
  uint64_t *slot = pprof_blob_find(table, data, len, (uint32_t) hash);
  if (*slot != 0) {
    *id = pprof_slot_entry(*slot);
    return PPROF_OK;
  }
  if (table->count >= PPROF_MAX_ENTRIES) return pprof_fail(error, PPROF_ERR_LIMIT, "profile table is full");
  void *offsets = table->offsets;
  status = pprof_grow_array(&offsets, &table->offsets_capacity, (size_t) table->count + 2, sizeof(size_t), error);
  table->offsets = offsets;
  if (status != PPROF_OK) return status;
  status = pprof_buffer_append(&table->bytes, data, len, error);
  if (status != PPROF_OK) return status;
  table->offsets[table->count + 1] = table->bytes.len;
  *id = table->count++;
  pprof_index_set(&table->index, slot, (uint32_t) hash, *id);
  return PPROF_OK;
}

void pprof_blob_table_truncate(blob_table *table, uint32_t keep) {
  if (keep > table->count) keep = table->count;
  table->count = keep;
  table->bytes.len = table->offsets[keep];
  pprof_index_clear(&table->index);
  for (uint32_t id = 0; id < keep; id++) {
    byte_span blob = blob_get(table, id);
    uint32_t hash32 = (uint32_t) pprof_hash_bytes(blob.data, blob.len, 0);
    // Cannot grow: the index held at least these entries before.
    pprof_index_set(&table->index, pprof_blob_find(table, blob.data, blob.len, hash32), hash32, id);
  }
}

size_t pprof_blob_table_bytes(const blob_table *table) {
  return table->bytes.capacity + table->offsets_capacity * sizeof(size_t) + table->index.capacity * sizeof(uint64_t);
}
