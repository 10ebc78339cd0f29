// Adding samples to a pprof_profile (see pprof_profile.h): a sample's labels, frames and
// stack interned into the profile's tables, then its values added to the aggregated
// sample of that stack and label set, or to a timeline sample; and adding again to a
// sample found before, by its ref. Creating, resetting and freeing the profile is
// pprof_profile.c.
//
// ## Design notes
//
// - Strings, stacks and label sets are "blob tables": their bytes are appended to one
//   arena and identified by index. A stack is stored already encoded as the packed
//   varints of its location ids, and a label set already encoded as the pprof Label
//   messages of a Sample; serializing a sample is therefore a couple of memcpy calls,
//   and a 64-frame stack of small ids costs about 128 bytes, which is what keeps the
//   profile's memory close to the size of its own pprof encoding.
// - A location is looked up by the *contents* of the frame (function name, file name,
//   line) with a single probe. Only on a miss are the strings and the function interned
//   separately. Recording a sample whose frames were all seen before costs one hash of
//   each frame's strings and one probe per frame, plus one probe each for the stack, the
//   label set and the sample.
// - Index slots hold the low 32 bits of the entry's hash next to its position, so most
//   mismatches are rejected without touching the entry, and growing an index needs no
//   rehashing.
// - Keyed frames (see pprof_frame_key) skip all of that: one probe of a table from the
//   caller's key to the location. The strings are asked for (through the resolver) only
//   when a key is new, which is also the only time the caller has to build them.
// - A failed add (bad input, out of memory) leaves no sample behind. It may leave newly
//   interned strings, functions or locations: unused entries are valid pprof and are
//   dropped at the next reset.
// - Adding is the sampler's hot path, so its helpers live in this file (or inline in the
//   headers), where the compiler can inline them: an add calls out only to intern a blob,
//   to grow a table or a buffer, and to report an error.
#include "pprof_profile.h"

#include <string.h>

#include "pprof_alloc.h"
#include "pprof_hash.h"
#include "pprof_profile_tables.h"
#include "pprof_util.h"

// ---------------------------------------------------------------------------------------
// The frame keys' table.

static inline size_t keyed_position(pprof_frame_key key, size_t mask) {
  // Two independent multiplications: cheaper than chaining three combines.
  return (size_t) (pprof_hash_fold(key.a ^ PPROF_HASH_K0, key.b ^ PPROF_HASH_K1) ^
                   pprof_hash_fold(key.c ^ PPROF_HASH_K2, PPROF_HASH_K3)) &
         mask;
}

static inline bool keyed_slot_empty(const keyed_slot *slot) {
  return slot->key.a == 0 && slot->key.b == 0 && slot->key.c == 0;
}

// The slot holding `key`, or the empty slot where it belongs.
static inline keyed_slot *keyed_table_find(pprof_profile *profile, pprof_frame_key key) {
  size_t mask = profile->keyed_capacity - 1;
  size_t position = keyed_position(key, mask);
  for (;;) {
    keyed_slot *slot = &profile->keyed_slots[position];
    if (keyed_slot_empty(slot) || (slot->key.a == key.a && slot->key.b == key.b && slot->key.c == key.c)) return slot;
    position = (position + 1) & mask;
  }
}

PPROF_MUST_CHECK
static pprof_status keyed_table_reserve_one(pprof_profile *profile, pprof_error *error) {
  if ((profile->keyed_count + 1) * 4 <= profile->keyed_capacity * 3) return PPROF_OK;
  if (profile->keyed_count >= PPROF_MAX_ENTRIES) return pprof_fail(error, PPROF_ERR_LIMIT, "too many frame keys");
  size_t new_capacity = profile->keyed_capacity * 2;
  keyed_slot *slots = pprof_malloc(new_capacity * sizeof(keyed_slot));
  if (!slots) return pprof_fail(error, PPROF_ERR_NO_MEMORY, "out of memory growing the frame key table");
  memset(slots, 0, new_capacity * sizeof(keyed_slot));
  for (size_t i = 0; i < profile->keyed_capacity; i++) {
    const keyed_slot *old = &profile->keyed_slots[i];
    if (keyed_slot_empty(old)) continue;
    size_t position = keyed_position(old->key, new_capacity - 1);
    while (!keyed_slot_empty(&slots[position])) position = (position + 1) & (new_capacity - 1);
    slots[position] = *old;
  }
  pprof_free(profile->keyed_slots, profile->keyed_capacity * sizeof(keyed_slot));
  profile->keyed_slots = slots;
  profile->keyed_capacity = new_capacity;
  return PPROF_OK;
}

PPROF_MUST_CHECK
pprof_status pprof_keyed_table_init(pprof_profile *profile, pprof_error *error) {
  profile->keyed_slots = pprof_malloc(PPROF_INITIAL_INDEX_CAPACITY * sizeof(keyed_slot));
  if (!profile->keyed_slots) return pprof_fail(error, PPROF_ERR_NO_MEMORY, "out of memory creating a profile index");
  memset(profile->keyed_slots, 0, PPROF_INITIAL_INDEX_CAPACITY * sizeof(keyed_slot));
  profile->keyed_capacity = PPROF_INITIAL_INDEX_CAPACITY;
  profile->keyed_count = 0;
  return PPROF_OK;
}

void pprof_keyed_table_clear(pprof_profile *profile) {
  memset(profile->keyed_slots, 0, profile->keyed_capacity * sizeof(keyed_slot));
  profile->keyed_count = 0;
}

// ---------------------------------------------------------------------------------------
// Interning a sample's frames, stack and labels.

PPROF_MUST_CHECK
static pprof_status intern_function(pprof_profile *profile, uint32_t name, uint32_t file, uint32_t *function_id,
                                    pprof_error *error) {
  pprof_status status = pprof_index_reserve_one(&profile->function_index, error);
  if (status != PPROF_OK) return status;
  uint32_t hash32 = (uint32_t) pprof_hash_combine(pprof_hash_combine(PPROF_HASH_K0, name), file);
  size_t mask = profile->function_index.capacity - 1;
  size_t position = hash32 & mask;
  uint64_t *slots = profile->function_index.slots;
  while (slots[position] != 0) {
    if ((uint32_t) (slots[position] >> 32) == hash32) {
      const function_entry *existing = &profile->functions[pprof_slot_entry(slots[position])];
      if (existing->name == name && existing->file == file) {
        *function_id = pprof_slot_entry(slots[position]) + 1;
        return PPROF_OK;
      }
    }
    position = (position + 1) & mask;
  }
  if (profile->function_count >= PPROF_MAX_ENTRIES) return pprof_fail(error, PPROF_ERR_LIMIT, "too many functions");
  void *functions = profile->functions;
  status = pprof_grow_array(&functions, &profile->functions_capacity, (size_t) profile->function_count + 1,
                            sizeof(function_entry), error);
  profile->functions = functions;
  if (status != PPROF_OK) return status;
  uint32_t entry = profile->function_count++;
  profile->functions[entry] = (function_entry) {.name = name, .file = file};
  pprof_index_set(&profile->function_index, &slots[position], hash32, entry);
  *function_id = entry + 1;
  return PPROF_OK;
}

static inline bool string_equals(const pprof_profile *profile, uint32_t id, pprof_str s) {
  return span_equals(blob_get(&profile->strings, id), s);
}

// Finds or creates the location of one frame; location ids are 1-based.
PPROF_MUST_CHECK
static pprof_status intern_frame(pprof_profile *profile, const pprof_frame *frame, uint64_t name_hash,
                                 uint64_t file_hash, uint32_t *location_id, pprof_error *error) {
  pprof_status status = pprof_index_reserve_one(&profile->location_index, error);
  if (status != PPROF_OK) return status;
  uint32_t hash32 = (uint32_t) pprof_hash_combine(pprof_hash_combine(name_hash, file_hash), (uint64_t) frame->line);
  size_t mask = profile->location_index.capacity - 1;
  size_t position = hash32 & mask;
  uint64_t *slots = profile->location_index.slots;
  while (slots[position] != 0) {
    if ((uint32_t) (slots[position] >> 32) == hash32) {
      const location_entry *location = &profile->locations[pprof_slot_entry(slots[position])];
      if (location->line == frame->line && string_equals(profile, location->name, frame->function_name) &&
          string_equals(profile, location->file, frame->file_name)) {
        *location_id = pprof_slot_entry(slots[position]) + 1;
        return PPROF_OK;
      }
    }
    position = (position + 1) & mask;
  }

  uint32_t name = 0, file = 0, function_id = 0;
  if ((status = intern_string(profile, frame->function_name, name_hash, &name, error)) != PPROF_OK ||
      (status = intern_string(profile, frame->file_name, file_hash, &file, error)) != PPROF_OK ||
      (status = intern_function(profile, name, file, &function_id, error)) != PPROF_OK) {
    return status;
  }
  if (profile->location_count >= PPROF_MAX_ENTRIES) return pprof_fail(error, PPROF_ERR_LIMIT, "too many locations");
  void *locations = profile->locations;
  status = pprof_grow_array(&locations, &profile->locations_capacity, (size_t) profile->location_count + 1,
                            sizeof(location_entry), error);
  profile->locations = locations;
  if (status != PPROF_OK) return status;
  uint32_t entry = profile->location_count++;
  profile->locations[entry] =
    (location_entry) {.function_id = function_id, .name = name, .file = file, .line = frame->line};
  // The slot found above is still valid: interning strings and functions uses other indexes.
  pprof_index_set(&profile->location_index, &slots[position], hash32, entry);
  *location_id = entry + 1;
  return PPROF_OK;
}

static inline bool frame_valid(const pprof_frame *frame) {
  return str_valid(frame->function_name) && str_valid(frame->file_name);
}

PPROF_MUST_CHECK
static pprof_status invalid_frame(size_t index, pprof_error *error) {
  return pprof_fail(error, PPROF_ERR_INVALID, "frame %zu has a NULL name with a non-zero length", index);
}

PPROF_MUST_CHECK
static pprof_status validate_sample(const pprof_profile *profile, const pprof_sample *sample, pprof_error *error) {
  if (!sample) return pprof_fail(error, PPROF_ERR_INVALID, "sample is NULL");
  if (sample->value_count != profile->value_count) {
    return pprof_fail(error, PPROF_ERR_INVALID, "sample has %zu values but the profile has %zu sample types",
                      sample->value_count, profile->value_count);
  }
  if (!sample->values) return pprof_fail(error, PPROF_ERR_INVALID, "sample values are NULL");
  if (sample->frame_count > PPROF_MAX_FRAMES) {
    return pprof_fail(error, PPROF_ERR_INVALID, "sample has %zu frames; at most %d are accepted", sample->frame_count,
                      PPROF_MAX_FRAMES);
  }
  if (sample->frame_count > 0 && !sample->frames && !(sample->frame_keys && sample->resolve_frame)) {
    return pprof_fail(error, PPROF_ERR_INVALID, "sample has neither frames nor frame keys with a resolver");
  }
  for (size_t i = 0; sample->frames && i < sample->frame_count; i++) {
    if (!frame_valid(&sample->frames[i])) return invalid_frame(i, error);
  }
  if (sample->label_count > PPROF_MAX_LABELS) {
    return pprof_fail(error, PPROF_ERR_INVALID, "sample has %zu labels; at most %d are accepted", sample->label_count,
                      PPROF_MAX_LABELS);
  }
  if (sample->label_count > 0 && !sample->labels) return pprof_fail(error, PPROF_ERR_INVALID, "sample labels are NULL");
  if (sample->timestamp_ns < 0) return pprof_fail(error, PPROF_ERR_INVALID, "sample timestamp is negative");
  for (size_t i = 0; i < sample->label_count; i++) {
    const pprof_label *label = &sample->labels[i];
    if (!str_valid(label->key) || label->key.len == 0) {
      return pprof_fail(error, PPROF_ERR_INVALID, "label %zu has an empty or invalid key", i);
    }
    if (!str_valid(label->num_unit)) return pprof_fail(error, PPROF_ERR_INVALID, "label %zu has an invalid unit", i);
    // pprof encodes "" as string index 0, which readers take for "no string value".
    if (label->str.ptr && label->str.len == 0) {
      return pprof_fail(error, PPROF_ERR_INVALID, "label %zu (%.*s) has an empty string value", i,
                        (int) (label->key.len > 64 ? 64 : label->key.len), label->key.ptr);
    }
  }
  return PPROF_OK;
}

// The location "id" of an omitted frame: location ids are 1-based, and encode_stack
// leaves this one out. A keyed slot may remember it, so that omitted frames cost one probe.
#define OMITTED_LOCATION 0

// Interns frame `i` of a keyed sample by its strings, which come from `frames` or from
// the resolver.
PPROF_MUST_CHECK
static pprof_status intern_resolved_frame(pprof_profile *profile, const pprof_sample *sample, size_t i,
                                          uint32_t *location_id, bool *remember_key, pprof_error *error) {
  pprof_frame resolved;
  if (sample->frames) {
    resolved = sample->frames[i];
  } else {
    memset(&resolved, 0, sizeof(resolved));
    pprof_status status = sample->resolve_frame(sample->resolve_context, i, &resolved, remember_key, error);
    if (status != PPROF_OK) return status;
    if (!frame_valid(&resolved)) return invalid_frame(i, error);
  }
  if (resolved.omit) {
    *location_id = OMITTED_LOCATION;
    return PPROF_OK;
  }
  return intern_frame(profile, &resolved, hash_str(resolved.function_name), hash_str(resolved.file_name), location_id,
                      error);
}

// Finds the location of a keyed frame, resolving and interning the frame on a miss.
PPROF_MUST_CHECK
static pprof_status intern_keyed_frame(pprof_profile *profile, const pprof_sample *sample, size_t i,
                                       uint32_t *location_id, pprof_error *error) {
  pprof_frame_key key = sample->frame_keys[i];
  bool remember_key = true;
  if (key.a == 0 && key.b == 0 && key.c == 0) {
    return intern_resolved_frame(profile, sample, i, location_id, &remember_key, error);
  }
  pprof_status status = keyed_table_reserve_one(profile, error);
  if (status != PPROF_OK) return status;
  keyed_slot *slot = keyed_table_find(profile, key);
  if (slot->key.a != 0 || slot->key.b != 0 || slot->key.c != 0) {
    *location_id = slot->location_id;
    return PPROF_OK;
  }
  status = intern_resolved_frame(profile, sample, i, location_id, &remember_key, error);
  if (status != PPROF_OK || !remember_key) return status;
  // The slot found above is still free: resolving a frame does not touch this table.
  *slot = (keyed_slot) {.key = key, .location_id = *location_id};
  profile->keyed_count++;
  return PPROF_OK;
}

PPROF_MUST_CHECK
static pprof_status encode_stack(pprof_profile *profile, const pprof_sample *sample, pprof_error *error) {
  pprof_buffer *scratch = &profile->stack_scratch;
  scratch->len = 0;
  pprof_status status = pprof_buffer_reserve(scratch, sample->frame_count * 5 + 1, error);
  if (status != PPROF_OK) return status;
  uint8_t *p = scratch->data;
  if (sample->frame_keys) {
    if (sample->frame_key_epoch != profile->frame_key_epoch) {
      // The caller's keys from before may now denote other frames: forget them all.
      pprof_keyed_table_clear(profile);
      profile->frame_key_epoch = sample->frame_key_epoch;
    }
    // A key equal to the previous frame's (recursion) is that same frame: no lookup.
    pprof_frame_key previous = {0, 0, 0};
    uint32_t previous_id = 0;
    for (size_t i = 0; i < sample->frame_count; i++) {
      const pprof_frame_key *key = &sample->frame_keys[i];
      uint32_t location_id = 0;
      if ((key->a | key->b | key->c) != 0 && key->a == previous.a && key->b == previous.b && key->c == previous.c) {
        location_id = previous_id;
      } else {
        if ((status = intern_keyed_frame(profile, sample, i, &location_id, error)) != PPROF_OK) return status;
        previous = *key;
        previous_id = location_id;
      }
      if (location_id != OMITTED_LOCATION) p = put_varint(p, location_id);
    }
    scratch->len = (size_t) (p - scratch->data);
    return PPROF_OK;
  }
  // Within one call the caller's strings cannot change, so a file name at the same
  // address with the same length as the previous frame's is the same string: reuse its
  // hash (consecutive frames very often share a file).
  const char *previous_file = NULL;
  size_t previous_file_len = 0;
  uint64_t file_hash = 0;
  for (size_t i = 0; i < sample->frame_count; i++) {
    const pprof_frame *frame = &sample->frames[i];
    if (frame->omit) continue;
    if (frame->file_name.ptr != previous_file || frame->file_name.len != previous_file_len || i == 0) {
      file_hash = hash_str(frame->file_name);
      previous_file = frame->file_name.ptr;
      previous_file_len = frame->file_name.len;
    }
    uint32_t location_id = 0;
    status = intern_frame(profile, frame, hash_str(frame->function_name), file_hash, &location_id, error);
    if (status != PPROF_OK) return status;
    p = put_varint(p, location_id);
  }
  scratch->len = (size_t) (p - scratch->data);
  return PPROF_OK;
}

static bool label_less(const label_entry *a, const label_entry *b) {
  if (a->key != b->key) return a->key < b->key;
  if (a->is_str != b->is_str) return a->is_str;
  if (a->is_str) return a->str < b->str;
  if (a->num != b->num) return a->num < b->num;
  return a->num_unit < b->num_unit;
}

PPROF_MUST_CHECK
static pprof_status encode_labels(pprof_profile *profile, const pprof_sample *sample, pprof_error *error) {
  label_entry labels[PPROF_MAX_LABELS];
  size_t count = sample->label_count;
  pprof_status status;
  for (size_t i = 0; i < count; i++) {
    const pprof_label *label = &sample->labels[i];
    label_entry *out = &labels[i];
    memset(out, 0, sizeof(*out));
    out->is_str = label->str.ptr != NULL;
    out->num = label->num;
    if ((status = intern_string(profile, label->key, hash_str(label->key), &out->key, error)) != PPROF_OK) return status;
    if (out->is_str) {
      status = intern_string(profile, label->str, hash_str(label->str), &out->str, error);
    } else {
      status = intern_string(profile, label->num_unit, hash_str(label->num_unit), &out->num_unit, error);
    }
    if (status != PPROF_OK) return status;
  }
  // Insertion sort: label sets are small, and a canonical order makes equal sets equal.
  for (size_t i = 1; i < count; i++) {
    label_entry current = labels[i];
    size_t j = i;
    while (j > 0 && label_less(&current, &labels[j - 1])) {
      labels[j] = labels[j - 1];
      j--;
    }
    labels[j] = current;
  }

  pprof_buffer *scratch = &profile->label_scratch;
  scratch->len = 0;
  // Worst case per label: 2 key bytes + 5 + (1 + 10) + (1 + 5) + 1 + 5.
  status = pprof_buffer_reserve(scratch, count * 40 + 1, error);
  if (status != PPROF_OK) return status;
  uint8_t *p = scratch->data;
  for (size_t i = 0; i < count; i++) p = put_label(p, &labels[i]);
  scratch->len = (size_t) (p - scratch->data);
  return PPROF_OK;
}

// ---------------------------------------------------------------------------------------
// Adding a sample's values: the aggregated samples, the timeline, refs.

static void add_values(pprof_profile *profile, uint32_t entry, const int64_t *added) {
  int64_t *values = &profile->sample_values[(size_t) entry * profile->value_count];
  for (size_t i = 0; i < profile->value_count; i++) values[i] = saturating_add(values[i], added[i]);
}

static void fill_ref(const pprof_profile *profile, uint32_t entry, pprof_sample_ref *ref) {
  if (ref) *ref = (pprof_sample_ref) {.profile = profile, .reset_count = profile->reset_count, .sample_index = entry};
}

// Whether `ref` denotes a sample of this profile since its last reset.
static bool ref_valid(const pprof_profile *profile, const pprof_sample_ref *ref) {
  return ref && ref->profile == profile && ref->reset_count == profile->reset_count &&
         ref->sample_index < profile->sample_count;
}

// Adds `values` to sample `entry`, and moves a timeline sample's timestamp on to
// `timestamp_ns` when that is later (0: it stays).
static void add_to_sample(pprof_profile *profile, uint32_t entry, const int64_t *values, int64_t timestamp_ns) {
  add_values(profile, entry, values);
  sample_key *key = &profile->sample_keys[entry];
  if (key->timestamp_ns != 0 && timestamp_ns > key->timestamp_ns) key->timestamp_ns = timestamp_ns;
}

bool pprof_profile_add_again(pprof_profile *profile, const pprof_sample_ref *ref, const int64_t *values,
                             size_t value_count, int64_t timestamp_ns) {
  if (!profile || !ref_valid(profile, ref) || value_count != profile->value_count || !values) return false;
  add_to_sample(profile, ref->sample_index, values, timestamp_ns);
  return true;
}

// A new entry for the sample; `slot` (when not NULL) is where the aggregated samples'
// index gets it.
PPROF_MUST_CHECK
static pprof_status append_sample(pprof_profile *profile, const pprof_sample *sample, sample_key key, uint64_t *slot,
                                  uint32_t hash32, pprof_sample_ref *ref, pprof_error *error) {
  if (profile->sample_count >= PPROF_MAX_ENTRIES) return pprof_fail(error, PPROF_ERR_LIMIT, "too many samples");
  size_t value_count = profile->value_count;
  size_t needed = (size_t) profile->sample_count + 1;
  void *keys = profile->sample_keys;
  pprof_status status = pprof_grow_array(&keys, &profile->sample_keys_capacity, needed, sizeof(sample_key), error);
  profile->sample_keys = keys;
  if (status != PPROF_OK) return status;
  void *values = profile->sample_values;
  status = pprof_grow_array(&values, &profile->sample_values_capacity, needed * value_count, sizeof(int64_t), error);
  profile->sample_values = values;
  if (status != PPROF_OK) return status;

  uint32_t entry = profile->sample_count++;
  profile->sample_keys[entry] = key;
  memcpy(&profile->sample_values[(size_t) entry * value_count], sample->values, value_count * sizeof(int64_t));
  if (slot) pprof_index_set(&profile->sample_index, slot, hash32, entry);
  fill_ref(profile, entry, ref);
  return PPROF_OK;
}

// A timeline sample: added to the one it extends when that has the same frames and
// labels, else merged into the latest one of those when it was taken within the sample's
// merge window, else a new one (the latest of its key) unless the timeline is full: then
// `*full` and nothing is done.
PPROF_MUST_CHECK
static pprof_status add_timed(pprof_profile *profile, const pprof_sample *sample, sample_key key, pprof_sample_ref *ref,
                              bool *full, pprof_error *error) {
  if (ref_valid(profile, sample->extend)) {
    const sample_key *earlier = &profile->sample_keys[sample->extend->sample_index];
    if (earlier->timestamp_ns != 0 && earlier->stack == key.stack && earlier->label_set == key.label_set) {
      add_to_sample(profile, sample->extend->sample_index, sample->values, sample->keep_end ? 0 : key.timestamp_ns);
      fill_ref(profile, sample->extend->sample_index, ref);
      return PPROF_OK;
    }
  }
  pprof_status status;
  if (profile->timestamp_key == 0) {
    pprof_str name = PPROF_STR(PPROF_TIMESTAMP_LABEL);
    if ((status = intern_string(profile, name, hash_str(name), &profile->timestamp_key, error)) != PPROF_OK) return status;
  }
  if ((status = pprof_index_reserve_one(&profile->timed_index, error)) != PPROF_OK) return status;
  uint32_t hash32 = (uint32_t) pprof_hash_combine(pprof_hash_combine(PPROF_HASH_K2, key.stack), key.label_set);
  size_t mask = profile->timed_index.capacity - 1;
  uint64_t *slots = profile->timed_index.slots;
  size_t position = hash32 & mask;
  for (; slots[position] != 0; position = (position + 1) & mask) {
    if ((uint32_t) (slots[position] >> 32) != hash32) continue;
    uint32_t entry = pprof_slot_entry(slots[position]);
    const sample_key *latest = &profile->sample_keys[entry];
    if (latest->stack != key.stack || latest->label_set != key.label_set) continue;
    if (sample->merge_window_ns > 0 && latest->timestamp_ns >= key.timestamp_ns - sample->merge_window_ns) {
      add_values(profile, entry, sample->values);
      fill_ref(profile, entry, ref);
      return PPROF_OK;
    }
    if ((*full = profile->timed_count >= profile->timeline_limit)) return PPROF_OK;
    if ((status = append_sample(profile, sample, key, NULL, 0, ref, error)) != PPROF_OK) return status;
    profile->timed_count++;
    slots[position] = ((uint64_t) hash32 << 32) | ((uint64_t) profile->sample_count); // the new one is the latest
    return PPROF_OK;
  }
  if ((*full = profile->timed_count >= profile->timeline_limit)) return PPROF_OK;
  if ((status = append_sample(profile, sample, key, NULL, 0, ref, error)) != PPROF_OK) return status;
  profile->timed_count++;
  pprof_index_set(&profile->timed_index, &slots[position], hash32, profile->sample_count - 1);
  return PPROF_OK;
}

pprof_status pprof_profile_add(pprof_profile *profile, const pprof_sample *sample, pprof_error *error) {
  return pprof_profile_add_with_ref(profile, sample, NULL, error);
}

pprof_status pprof_profile_add_with_ref(pprof_profile *profile, const pprof_sample *sample, pprof_sample_ref *ref,
                                        pprof_error *error) {
  if (!profile) return pprof_fail(error, PPROF_ERR_INVALID, "profile is NULL");
  pprof_status status = validate_sample(profile, sample, error);
  if (status != PPROF_OK) return status;

  uint32_t stack_id = 0, label_set_id = 0;
  // Labels first: naming frames (the resolver) may run code that moves what the labels'
  // strings point at (a compacting GC, on a VM whose frame names allocate). Interning
  // copies them.
  if ((status = encode_labels(profile, sample, error)) != PPROF_OK) return status;
  const pprof_buffer *labels = &profile->label_scratch;
  status = pprof_blob_intern(&profile->label_sets, labels->data, labels->len, pprof_hash_bytes(labels->data, labels->len, 0),
                       &label_set_id, error);
  if (status != PPROF_OK) return status;
  if ((status = encode_stack(profile, sample, error)) != PPROF_OK) return status;
  const pprof_buffer *stack = &profile->stack_scratch;
  if (sample->frame_count > 0 && stack->len == 0) {
    // Every frame was omitted: nothing says where this sample was, so it is not recorded.
    if (ref) *ref = (pprof_sample_ref) {.profile = NULL};
    return PPROF_OK;
  }
  status = pprof_blob_intern(&profile->stacks, stack->data, stack->len, pprof_hash_bytes(stack->data, stack->len, 0),
                       &stack_id, error);
  if (status != PPROF_OK) return status;

  sample_key key = {.stack = stack_id, .label_set = label_set_id, .timestamp_ns = sample->timestamp_ns};
  if (sample->timestamp_ns != 0) {
    bool full = false;
    status = add_timed(profile, sample, key, ref, &full, error);
    if (!full) return status;
    key.timestamp_ns = 0; // merged with equal stacks: every total still counts it
    profile->timeline_merged++;
  }

  if ((status = pprof_index_reserve_one(&profile->sample_index, error)) != PPROF_OK) return status;
  uint32_t hash32 = (uint32_t) pprof_hash_combine(pprof_hash_combine(PPROF_HASH_K1, stack_id), label_set_id);
  size_t mask = profile->sample_index.capacity - 1;
  size_t position = hash32 & mask;
  uint64_t *slots = profile->sample_index.slots;
  while (slots[position] != 0) {
    if ((uint32_t) (slots[position] >> 32) == hash32) {
      uint32_t entry = pprof_slot_entry(slots[position]);
      const sample_key *found = &profile->sample_keys[entry];
      if (found->stack == stack_id && found->label_set == label_set_id) {
        add_values(profile, entry, sample->values);
        fill_ref(profile, entry, ref);
        return PPROF_OK;
      }
    }
    position = (position + 1) & mask;
  }
  return append_sample(profile, sample, key, &slots[position], hash32, ref, error);
}
