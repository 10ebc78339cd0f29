// The pprof core's profile (see pprof_profile.h): creating, resetting and freeing it, its
// settings (sample types, period, comments, timeline limit) and its stats. Adding samples
// is pprof_samples.c; encoding the profile, pprof_encode.c and pprof_otlp.c.
//
// ## Design notes
//
// Everything a profile holds lives in a handful of flat arrays with open-addressing
// indexes over them (pprof_profile_tables.h); there is no per-sample or per-frame heap
// allocation once the tables have grown to their working size. How a sample is interned
// into them: pprof_samples.c.
//
// Reset keeps every array's capacity (the next period is likely to need the same room)
// but forgets all entries: the interning tables do not survive a reset. Keeping them
// would save re-interning each distinct frame once per period (measured by
// bench/pprof_core.rb as the gap between the "new stack" and "seen stack" cost, a few
// microseconds per distinct stack, i.e. milliseconds per minute) at the price of
// unbounded growth in long-running processes whose code paths change over time.
#include "pprof_profile.h"

#include <string.h>

#include "pprof_alloc.h"
#include "pprof_hash.h"
#include "pprof_profile_tables.h"
#include "pprof_util.h"

PPROF_MUST_CHECK
static pprof_status intern_value_type(pprof_profile *profile, const pprof_value_type *type, uint32_t out[2],
                                      pprof_error *error) {
  pprof_status status = intern_string(profile, type->type, hash_str(type->type), &out[0], error);
  if (status != PPROF_OK) return status;
  return intern_string(profile, type->unit, hash_str(type->unit), &out[1], error);
}

pprof_status pprof_profile_new(pprof_profile **out, const pprof_value_type *sample_types, size_t sample_type_count,
                               const pprof_value_type *period_type, int64_t period, int64_t start_time_ns,
                               pprof_error *error) {
  if (!out) return pprof_fail(error, PPROF_ERR_INVALID, "profile output pointer is NULL");
  *out = NULL;
  if (sample_type_count == 0 || sample_type_count > PPROF_MAX_SAMPLE_TYPES) {
    return pprof_fail(error, PPROF_ERR_INVALID, "a profile needs 1 to %d sample types, got %zu", PPROF_MAX_SAMPLE_TYPES,
                      sample_type_count);
  }
  if (!sample_types) return pprof_fail(error, PPROF_ERR_INVALID, "sample types are NULL");
  for (size_t i = 0; i < sample_type_count; i++) {
    if (!str_valid(sample_types[i].type) || !str_valid(sample_types[i].unit) || sample_types[i].type.len == 0) {
      return pprof_fail(error, PPROF_ERR_INVALID, "sample type %zu has an empty or invalid name or unit", i);
    }
  }
  if (period_type && (!str_valid(period_type->type) || !str_valid(period_type->unit))) {
    return pprof_fail(error, PPROF_ERR_INVALID, "period type has an invalid name or unit");
  }

  pprof_profile *profile = pprof_malloc(sizeof(pprof_profile));
  if (!profile) return pprof_fail(error, PPROF_ERR_NO_MEMORY, "out of memory creating a profile");
  memset(profile, 0, sizeof(*profile));
  profile->value_count = sample_type_count;
  profile->start_time_ns = start_time_ns;
  profile->timeline_limit = PPROF_DEFAULT_TIMELINE_LIMIT;

  pprof_status status;
  if ((status = pprof_blob_table_init(&profile->strings, error)) != PPROF_OK ||
      (status = pprof_blob_table_init(&profile->stacks, error)) != PPROF_OK ||
      (status = pprof_blob_table_init(&profile->label_sets, error)) != PPROF_OK ||
      (status = pprof_index_init(&profile->function_index, error)) != PPROF_OK ||
      (status = pprof_index_init(&profile->location_index, error)) != PPROF_OK ||
      (status = pprof_keyed_table_init(profile, error)) != PPROF_OK ||
      (status = pprof_index_init(&profile->sample_index, error)) != PPROF_OK ||
      (status = pprof_index_init(&profile->timed_index, error)) != PPROF_OK) {
    pprof_profile_free(profile);
    return status;
  }

  uint32_t empty_string;
  status = pprof_blob_intern(&profile->strings, "", 0, pprof_hash_bytes("", 0, 0), &empty_string, error);
  for (size_t i = 0; status == PPROF_OK && i < sample_type_count; i++) {
    status = intern_value_type(profile, &sample_types[i], &profile->sample_type_strings[2 * i], error);
    pprof_str unit = sample_types[i].unit;
    profile->time_valued[i] = unit.len == strlen("nanoseconds") && memcmp(unit.ptr, "nanoseconds", unit.len) == 0;
  }
  if (status == PPROF_OK && period_type) {
    profile->has_period = true;
    profile->period = period;
    status = intern_value_type(profile, period_type, profile->period_type_strings, error);
  }
  if (status != PPROF_OK) {
    pprof_profile_free(profile);
    return status;
  }
  profile->reserved_strings = profile->strings.count;
  *out = profile;
  return PPROF_OK;
}

pprof_status pprof_profile_set_default_sample_type(pprof_profile *profile, size_t index, pprof_error *error) {
  if (!profile || index >= profile->value_count) {
    return pprof_fail(error, PPROF_ERR_INVALID, "default sample type %zu is out of range", index);
  }
  profile->has_default_sample_type = true;
  profile->default_sample_type_string = profile->sample_type_strings[2 * index];
  return PPROF_OK;
}

pprof_status pprof_profile_add_comment(pprof_profile *profile, pprof_str comment, pprof_error *error) {
  if (!profile || (!comment.ptr && comment.len > 0)) return pprof_fail(error, PPROF_ERR_INVALID, "comment is NULL");
  if (profile->comment_count >= PPROF_MAX_COMMENTS) {
    return pprof_fail(error, PPROF_ERR_LIMIT, "at most %d comments per profile", PPROF_MAX_COMMENTS);
  }
  uint32_t id;
  pprof_status status = intern_string(profile, comment, hash_str(comment), &id, error);
  if (status == PPROF_OK) profile->comments[profile->comment_count++] = id;
  return status;
}

void pprof_profile_free(pprof_profile *profile) {
  if (!profile) return;
  pprof_blob_table_release(&profile->strings);
  pprof_blob_table_release(&profile->stacks);
  pprof_blob_table_release(&profile->label_sets);
  pprof_free(profile->functions, profile->functions_capacity * sizeof(function_entry));
  pprof_index_release(&profile->function_index);
  pprof_free(profile->locations, profile->locations_capacity * sizeof(location_entry));
  pprof_index_release(&profile->location_index);
  pprof_free(profile->keyed_slots, profile->keyed_capacity * sizeof(keyed_slot));
  pprof_free(profile->sample_keys, profile->sample_keys_capacity * sizeof(sample_key));
  pprof_free(profile->sample_values, profile->sample_values_capacity * sizeof(int64_t));
  pprof_index_release(&profile->sample_index);
  pprof_index_release(&profile->timed_index);
  pprof_buffer_free(&profile->stack_scratch);
  pprof_buffer_free(&profile->label_scratch);
  pprof_free(profile, sizeof(*profile));
}

void pprof_profile_reset(pprof_profile *profile, int64_t start_time_ns) {
  pprof_blob_table_truncate(&profile->strings, profile->reserved_strings);
  pprof_blob_table_truncate(&profile->stacks, 0);
  pprof_blob_table_truncate(&profile->label_sets, 0);
  profile->function_count = 0;
  pprof_index_clear(&profile->function_index);
  profile->location_count = 0;
  pprof_index_clear(&profile->location_index);
  pprof_keyed_table_clear(profile);
  profile->sample_count = 0;
  pprof_index_clear(&profile->sample_index);
  pprof_index_clear(&profile->timed_index);
  profile->timed_count = 0;
  profile->timeline_merged = 0;
  profile->timestamp_key = 0;
  profile->comment_count = 0;
  profile->reset_count++;
  profile->start_time_ns = start_time_ns;
}

int64_t pprof_profile_start_time_ns(const pprof_profile *profile) { return profile->start_time_ns; }

void pprof_profile_set_timeline_limit(pprof_profile *profile, uint32_t limit) { profile->timeline_limit = limit; }

void pprof_profile_set_start_time_ns(pprof_profile *profile, int64_t start_time_ns) {
  profile->start_time_ns = start_time_ns;
}

pprof_profile_stats pprof_profile_get_stats(const pprof_profile *profile) {
  pprof_profile_stats stats = {
    .samples = profile->sample_count,
    .stacks = profile->stacks.count,
    .locations = profile->location_count,
    .functions = profile->function_count,
    .strings = profile->strings.count,
    .label_sets = profile->label_sets.count,
    .frame_keys = profile->keyed_count,
    .timeline_merged = profile->timeline_merged,
  };
  stats.held_bytes = sizeof(*profile) + pprof_blob_table_bytes(&profile->strings) + pprof_blob_table_bytes(&profile->stacks) +
                     pprof_blob_table_bytes(&profile->label_sets) + profile->functions_capacity * sizeof(function_entry) +
                     profile->function_index.capacity * sizeof(uint64_t) +
                     profile->locations_capacity * sizeof(location_entry) +
                     profile->location_index.capacity * sizeof(uint64_t) +
                     profile->keyed_capacity * sizeof(keyed_slot) +
                     profile->sample_keys_capacity * sizeof(sample_key) +
                     profile->sample_values_capacity * sizeof(int64_t) +
                     profile->sample_index.capacity * sizeof(uint64_t) +
                     profile->timed_index.capacity * sizeof(uint64_t) + profile->stack_scratch.capacity +
                     profile->label_scratch.capacity;
  return stats;
}
