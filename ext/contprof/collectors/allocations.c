// What a sampled allocation records (the sampling itself is sampling/allocation_sampler.c).
//
// A sample carries the allocating thread's stack as the NEWOBJ hook read it, its labels
// plus "allocation class", and three values: alloc-samples, the allocations it stands for
// (the sampling interval, and what a late sample missed), alloc-size, that many times the
// object's size, and alloc-samples-unscaled, the samples it is (Datadog's name: the
// samples behind an estimate, its error bar; more than 1 when the sampler merged some).
// The size is read here, at the thread's next safe point, when the object has been built
// (a String's or an Array's contents are allocated after the object itself), and
// rb_obj_memsize_of counts the slot and what the object holds outside it.
//
// A GC between the hook and this record may have moved what the frames point to, or
// freed the object: the thread's current stack is recorded instead (it is still in the
// allocating code, a safe point later), and the size is the mean of the sizes read so far.
// Such a sample is not tracked for the live heap either (its object may be gone).
#include "collectors/allocations.h"
#include "collectors/thread_context_state.h"
#include "collectors/thread_labels.h"

#include <string.h>

#include "pprof/pprof_util.h"
#include "recorder/stack_recorder.h"
#include "ruby_helpers.h"

void contprof_allocations_init(contprof_allocation_state *allocations) {
  allocations->samples_index = allocations->size_index = allocations->unscaled_index = -1;
  allocations->heap_samples_index = allocations->heap_size_index = allocations->heap_unscaled_index = -1;
}

void contprof_allocations_reset(contprof_allocation_state *allocations) {
  allocations->sizes_read = allocations->bytes_read = 0;
}

static int value_index(VALUE recorder, const char *name) {
  return contprof_recorder_value_index(recorder, name, strlen(name));
}

void contprof_allocations_bind(collector_state *state) {
  contprof_allocation_state *allocations = &state->allocations;
  allocations->samples_index = value_index(state->recorder, "alloc-samples");
  allocations->size_index = value_index(state->recorder, "alloc-size");
  allocations->unscaled_index = value_index(state->recorder, "alloc-samples-unscaled");
  allocations->heap_samples_index = value_index(state->recorder, "heap-live-samples");
  allocations->heap_size_index = value_index(state->recorder, "heap-live-size");
  allocations->heap_unscaled_index = value_index(state->recorder, "heap-live-samples-unscaled");
  if (allocations->heap_samples_index < 0 && allocations->heap_size_index < 0) return;
  const char *why_not = contprof_allocations_heap_unsupported_reason();
  if (why_not) rb_raise(rb_eArgError, "recorder: heap-live-samples/heap-live-size are not available: %s", why_not);
  allocations->heap = contprof_heap_tracker_new();
}

const char *contprof_allocations_heap_unsupported_reason(void) {
  const char *why_not = contprof_vm_gc_hooks_unaffordable();
  return why_not ? why_not : contprof_heap_tracker_unsupported_reason();
}

static int64_t object_size(contprof_allocation_state *allocations, const contprof_allocation_sample *sample) {
  if (!NIL_P(sample->object)) {
    int64_t size = (int64_t) contprof_vm_object_size(sample->object);
    allocations->sizes_read++;
    allocations->bytes_read += (uint64_t) size;
    return size;
  }
  if (allocations->sizes_read == 0) return (int64_t) (5 * sizeof(VALUE)); // one slot
  return (int64_t) (allocations->bytes_read / allocations->sizes_read);
}

pprof_status contprof_thread_context_record_allocation(VALUE collector, const contprof_allocation_sample *sample,
                                                       const contprof_raw_frame *frames, pprof_error *error) {
  collector_state *state = RTYPEDDATA_DATA(collector);
  contprof_allocation_state *allocations = &state->allocations;
  if (allocations->samples_index < 0 && allocations->size_index < 0) return PPROF_OK;
  if (!contprof_vm_thread_alive(sample->thread)) return PPROF_OK;
  per_thread_context *context = contprof_thread_context_for(state, sample->thread);
  if (!context) return PPROF_OK; // (counted: threads_unsampled_no_memory)
  label_set labels;
  contprof_thread_context_labels(context, sample->thread, &labels);
  labels.list[labels.count++] = (pprof_label) {.key = PPROF_STR("allocation class"),
                                               .str = {sample->class_name, sample->class_name_len}};
  if (!NIL_P(sample->object)) {
    contprof_stack_use_frames(state->sampler, frames, sample->frame_count, sample->total);
  } else {
    bool unused;
    pprof_status status = contprof_stack_read(state->sampler, sample->thread, NULL, &unused, error);
    if (status != PPROF_OK) return status;
  }
  int64_t values[PPROF_MAX_SAMPLE_TYPES] = {0};
  // (Saturated: merged samples add their weights up, and a weight times a large object's
  // size could wrap.)
  int64_t weight = pprof_saturated_int64(sample->weight);
  if (allocations->samples_index >= 0) values[allocations->samples_index] = weight;
  if (allocations->size_index >= 0) {
    values[allocations->size_index] = pprof_saturated_product(weight, object_size(allocations, sample));
  }
  if (allocations->unscaled_index >= 0) values[allocations->unscaled_index] = sample->samples;
  pprof_status status = contprof_stack_record(state->sampler, state->recorder, values, state->value_count,
                                              labels.list, labels.count, NULL, false, error);
  if (status != PPROF_OK) return status;
  allocations->records++;
  // Live-heap profiling follows the object from here (its frames are still the sampler's),
  // unless a GC ran since the hook saw it (recording may have allocated: naming a frame
  // through the public API): it may be gone, and its slot someone else's.
  if (allocations->heap && !NIL_P(sample->object) && rb_gc_count() == sample->gc_count) {
    status = contprof_heap_tracker_track(allocations->heap, state->sampler, sample->object, sample->class_name,
                                         sample->class_name_len, sample->weight, sample->samples, error);
  }
  return status;
}
