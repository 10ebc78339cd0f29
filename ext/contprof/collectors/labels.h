// Labels a program puts on its own samples (Contprof.with_labels): the set in force on a
// thread's current fiber, read by every sample of that thread.
//
// A set is a Contprof::LabelSet, immutable, built once when a block enters
// (lib/contprof/requests/labels.rb) and kept in a fiber-local variable: the sampler reads the
// variable and the set's C copies of its strings, so a sample allocates nothing and calls
// no Ruby method. A nested block builds a new set from the enclosing one (inner keys win)
// and puts the enclosing one back when it leaves, however it leaves.
#pragma once

#include <ruby.h>
#include <stdint.h>

#include "pprof/pprof_profile.h"

// At most this many labels in one set: a sample carries Contprof's own labels too.
#define CONTPROF_MAX_USER_LABELS 10

typedef struct {
  uint64_t serial; // unique per set built: a sample's labels changed when its set's serial did
  size_t count;
  pprof_label labels[CONTPROF_MAX_USER_LABELS]; // strings owned by the set
} contprof_label_set;

// The set in force on `thread`'s current fiber, or NULL when none.
const contprof_label_set *contprof_labels_in_force(VALUE thread);

void contprof_labels_class_init(VALUE contprof);
