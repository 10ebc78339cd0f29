// Contprof::Collectors::Stack: records one sample of any Ruby thread's current stack into
// a StackRecorder. The CPU/wall-time collector uses the C functions below directly.
#pragma once

#include <ruby.h>
#include <stdbool.h>

#include "pprof/pprof_profile.h"
#include "vm/vm.h"

// max_frames when none is given (Contprof::Limits::MAX_FRAMES, read at load time).
int contprof_default_max_frames(void);

// Scratch space for sampling stacks of up to `max_frames` frames, allocated once.
typedef struct contprof_stack_sampler contprof_stack_sampler;

// Raises ArgumentError unless `max_frames` is an Integer within the accepted range.
int contprof_validate_max_frames(VALUE max_frames);
contprof_stack_sampler *contprof_stack_sampler_new(int max_frames);
void contprof_stack_sampler_free(contprof_stack_sampler *sampler);
size_t contprof_stack_sampler_memsize(const contprof_stack_sampler *sampler);

// What a thread's previous sample looked like, so that an unchanged stack (a thread
// blocked where it was) is counted again without being looked up. Owned by the caller,
// zero-initialized; release with contprof_stack_memo_release.
typedef struct {
  void *frames; // the raw frames of the previous sample
  long capacity;
  long frame_count;
  long total;
  size_t gc_count; // a GC may free and reuse the addresses the frames are made of
  int64_t timed_since_ns; // the timestamp the previous sample was recorded with
  bool valid;
  pprof_sample_ref ref;
} contprof_stack_memo;

void contprof_stack_memo_release(contprof_stack_memo *memo);
size_t contprof_stack_memo_memsize(const contprof_stack_memo *memo);

// Samples `thread`'s stack and records it with the given values and labels. Allocates no
// Ruby object and never raises: returns PPROF_OK or an error with a message (a dead
// thread is PPROF_ERR_INVALID). Must hold the GVL. `memo` may be NULL; when given, the
// caller vouches that the labels are the same as at the memo's previous sample, or
// clears memo->valid.
PPROF_MUST_CHECK
pprof_status contprof_stack_sample(contprof_stack_sampler *sampler, VALUE thread, VALUE recorder,
                                   const int64_t *values, size_t value_count, const pprof_label *labels,
                                   size_t label_count, contprof_stack_memo *memo, pprof_error *error);

// contprof_stack_sample in two steps, for callers that want to know whether the stack
// changed before deciding on the values: read the stack (and compare it with the memo),
// then record it.
PPROF_MUST_CHECK
pprof_status contprof_stack_read(contprof_stack_sampler *sampler, VALUE thread, const contprof_stack_memo *memo,
                                 bool *unchanged, pprof_error *error);
// Instead of reading a thread's stack: frames read earlier (a signal handler's capture),
// `total` deep, of which `count` were kept. Record without a memo.
void contprof_stack_use_frames(contprof_stack_sampler *sampler, const contprof_raw_frame *frames, long count,
                               long total);
// Synthetic frames (leaf first) on top of the stack the next contprof_stack_record
// records, e.g. "Garbage Collection". The names must be static strings. Record without a
// memo; `ref` (or NULL) receives where that record went (see contprof_recorder_add_again).
#define CONTPROF_MAX_LEAVES 2
void contprof_stack_add_leaves(contprof_stack_sampler *sampler, const pprof_str *names, int count,
                               pprof_sample_ref *ref);
// The next record (only) is a timeline sample taken at `timestamp_ns` (since the Unix
// epoch): never merged with another, except that it extends the thread's previous record
// (moving its timestamp on) when that has the same stack and labels and spans less than
// CONTPROF_TIMELINE_SPAN_NS: the memo's record, or for a record without a memo `extend`
// (NULL: none; the caller checks the span). A thread that stays where it is (a sleep, a
// wait) then costs one sample a second, not one per round. `moves_end` false (values
// without wall time, such as CPU alone): a record it extends keeps its end, and it joins
// the latest record of the same stack and labels taken within a span (pprof_sample's
// merge_window_ns), which keeps a busy thread's CPU samples to its distinct stacks per
// second.
#define CONTPROF_TIMELINE_SPAN_NS (1000 * 1000 * 1000)
void contprof_stack_set_timestamp(contprof_stack_sampler *sampler, int64_t timestamp_ns, bool moves_end,
                                  const pprof_sample_ref *extend);
PPROF_MUST_CHECK
pprof_status contprof_stack_record(contprof_stack_sampler *sampler, VALUE recorder, const int64_t *values,
                                   size_t value_count, const pprof_label *labels, size_t label_count,
                                   contprof_stack_memo *memo, bool unchanged, pprof_error *error);

// The frames of the stack last read or used (contprof_stack_read, contprof_stack_use_frames),
// leaf first, named as a record would name them, the profiler's own left out: `visit` gets
// each (its strings valid during the call only). For keeping a stack beyond the next GC.
long contprof_stack_frame_count(const contprof_stack_sampler *sampler);
// Stacks that could not be read for lack of memory (recorded as one frame saying so).
uint64_t contprof_stack_unread_count(const contprof_stack_sampler *sampler);
// The leaf of the stack last read, or NULL when it has no Ruby frame.
const contprof_raw_frame *contprof_stack_leaf(const contprof_stack_sampler *sampler);
PPROF_MUST_CHECK
pprof_status contprof_stack_each_frame(contprof_stack_sampler *sampler,
                                       pprof_status (*visit)(void *context, const pprof_frame *frame, pprof_error *error),
                                       void *context, pprof_error *error);
// Frames of the profiler's own Ruby code (its files, and C methods they call) are left
// out of every stack: `Contprof.profile`'s frame under a profiled block, the fork and
// exec hooks, the at-exit stop. Set once at load time (lib/contprof.rb).
void contprof_stack_class_init(VALUE contprof_module);
