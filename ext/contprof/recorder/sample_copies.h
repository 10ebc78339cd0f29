// Which sample of a recorder's copy stands for which of its own. Plain C.
#pragma once

#include <stdint.h>

#include "pprof/pprof_profile.h"

// While a StackRecorder copies its samples (#copy_samples_to), every sample recorded into
// it is also recorded into the copy. A sample counted again through its ref
// (contprof_recorder_add_again) must be counted again in the copy too: the map gives, for
// the index of each sample recorded since the copy began (in the active profile it was
// recorded into), the copy's ref. A ref from before the copy began has no entry: add_again
// then answers false, and the caller records the sample anew, into both.
typedef struct {
  pprof_sample_ref *refs; // indexed by sample index; .profile NULL: none
  uint32_t capacity;
  const pprof_profile *profile; // the profile (and reset) the indexes belong to
  uint64_t reset_count;
} contprof_copy_map;

// The copy's ref for the sample `ref` denotes here, or NULL.
pprof_sample_ref *contprof_copy_of(contprof_copy_map *copies, const pprof_sample_ref *ref);
// Remembers that the sample `ref` denotes here is `copy` there. Plain malloc: this runs in
// the sampler, which must not raise; without memory the entry is just not kept.
void contprof_remember_copy(contprof_copy_map *copies, const pprof_sample_ref *ref, const pprof_sample_ref *copy);
// Forgets every entry (a new copy begins).
void contprof_copy_map_clear(contprof_copy_map *copies);
void contprof_copy_map_release(contprof_copy_map *copies);
