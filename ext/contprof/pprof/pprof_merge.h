// The pprof core's merger: many pprof files (of one kind: the same sample types) into
// one profile over a time range, as `contprof report` and the viewer merge them
// (lib/contprof/reports/profiles.rb: load, in_range, during, merge):
// - a profile whose period [time_nanos, time_nanos + duration_nanos) does not overlap
//   [from, to) is skipped;
// - a timeline sample (numeric label PPROF_TIMESTAMP_LABEL) stands for the stretch of its
//   wall time ("wall-time" value) ending at that timestamp: one outside the range is
//   dropped, one partly in it keeps that part of each value (rounded half away from zero);
//   without a range nothing is cut;
// - the timestamp label is then dropped and samples of equal stacks (frames unified by
//   function name, file name and line) and equal labels are summed;
// - a sample without frames is kept, as the profile keeps it (an empty stack);
// - the result takes period type and period from the first profile merged, and spans
//   from the earliest start to the latest finish of those merged.
// Comments are collected apart (every distinct one once, in first-seen order) and are not
// in the result's pprof: the caller decides which to keep (endpoint counts merge).
//
// Plain C: no Ruby headers; not thread-safe (one caller at a time). Memory: the merged
// profile, plus the reader's arrays sized for the largest file added.
#pragma once

#include "pprof_profile.h"
#include "pprof_util.h"

typedef struct pprof_merge pprof_merge;

// `from_ns`/`to_ns`: the range in nanoseconds since the epoch, INT64_MIN / INT64_MAX for
// an open side.
PPROF_MUST_CHECK
pprof_status pprof_merge_new(pprof_merge **merge, int64_t from_ns, int64_t to_ns, pprof_error *error);
void pprof_merge_free(pprof_merge *merge);

// Keeps only the `max_frames` innermost frames of each stack (0: all; the default), before
// summing: what a report by allocation site reads (a leaf and its caller) from profiles
// whose whole stacks it does not need. Set before the first add.
void pprof_merge_set_max_frames(pprof_merge *merge, size_t max_frames);

// Adds one profile (gzip or plain protobuf). `*merged`: false when its period is outside
// the range (nothing else happens). `name` (a file name, for messages) is copied. Bad data
// and sample types unlike the first profile's are PPROF_ERR_INVALID, found before any of
// the profile's samples is added: the merge is as it was, and adding may go on. (Running
// out of memory midway may leave part of a profile's samples merged.)
PPROF_MUST_CHECK
pprof_status pprof_merge_add(pprof_merge *merge, const uint8_t *data, size_t len, const char *name, bool *merged,
                             pprof_error *error);

// The full message (names included, which may not fit a pprof_error) when the last add
// failed because sample types differ; NULL otherwise.
const char *pprof_merge_types_differ(const pprof_merge *merge);

// The merged profile as gzip-compressed pprof, into `out` (cleared first). The merge is
// not changed: adding may go on after it. PPROF_ERR_INVALID when nothing was merged.
PPROF_MUST_CHECK
pprof_status pprof_merge_finish(const pprof_merge *merge, pprof_buffer *out, pprof_error *error);

size_t pprof_merge_profile_count(const pprof_merge *merge); // profiles merged
size_t pprof_merge_skipped_count(const pprof_merge *merge); // profiles outside the range
size_t pprof_merge_sample_count(const pprof_merge *merge); // distinct samples of the result
size_t pprof_merge_comment_count(const pprof_merge *merge);
pprof_str pprof_merge_comment(const pprof_merge *merge, size_t index);
size_t pprof_merge_held_bytes(const pprof_merge *merge);
