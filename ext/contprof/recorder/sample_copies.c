// Which sample of a recorder's copy stands for which of its own (see sample_copies.h).
#include "recorder/sample_copies.h"

#include <stdlib.h>
#include <string.h>

pprof_sample_ref *contprof_copy_of(contprof_copy_map *copies, const pprof_sample_ref *ref) {
  if (!ref->profile || ref->profile != copies->profile || ref->reset_count != copies->reset_count ||
      ref->sample_index >= copies->capacity || !copies->refs[ref->sample_index].profile) {
    return NULL;
  }
  return &copies->refs[ref->sample_index];
}

void contprof_remember_copy(contprof_copy_map *copies, const pprof_sample_ref *ref, const pprof_sample_ref *copy) {
  if (!ref->profile) return;
  if (ref->profile != copies->profile || ref->reset_count != copies->reset_count) { // another period
    if (copies->refs) memset(copies->refs, 0, copies->capacity * sizeof(*copies->refs));
    copies->profile = ref->profile;
    copies->reset_count = ref->reset_count;
  }
  if (ref->sample_index >= copies->capacity) {
    uint32_t capacity = copies->capacity ? copies->capacity : 256;
    while (capacity <= ref->sample_index && capacity < UINT32_MAX / 2) capacity *= 2;
    if (capacity <= ref->sample_index) return;
    pprof_sample_ref *grown = realloc(copies->refs, capacity * sizeof(*grown));
    if (!grown) return;
    memset(grown + copies->capacity, 0, (capacity - copies->capacity) * sizeof(*grown));
    copies->refs = grown;
    copies->capacity = capacity;
  }
  copies->refs[ref->sample_index] = *copy;
}

void contprof_copy_map_clear(contprof_copy_map *copies) {
  if (copies->refs) memset(copies->refs, 0, copies->capacity * sizeof(*copies->refs));
  copies->profile = NULL;
}

void contprof_copy_map_release(contprof_copy_map *copies) {
  free(copies->refs);
  memset(copies, 0, sizeof(*copies));
}
