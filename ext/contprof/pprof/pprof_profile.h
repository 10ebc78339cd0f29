// The pprof core: an in-memory profile that interns strings, functions, locations,
// stacks and label sets, aggregates samples with equal stacks and labels by summing
// their values, and serializes itself as gzip-compressed pprof (protobuf
// perftools.profiles.Profile). Our counterpart of libdatadog's profile.
//
// Plain C: no Ruby headers, no global state besides the allocation counters of
// pprof_alloc.h. A profile is not thread-safe: callers serialize access (the
// StackRecorder does so with its two-slot locking protocol).
//
// Every fallible function returns PPROF_OK or an error status and fills the optional
// `pprof_error` with a human-readable message. A failed call leaves the profile valid:
// a sample is either fully recorded or not recorded at all as far as the serialized
// output is concerned.
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct pprof_profile pprof_profile;

// A string slice; need not be NUL-terminated. `ptr` may be NULL only when `len` is 0.
typedef struct {
  const char *ptr;
  size_t len;
} pprof_str;

#define PPROF_STR(literal) ((pprof_str) {.ptr = "" literal, .len = sizeof(literal) - 1})

typedef struct {
  pprof_str type;
  pprof_str unit;
} pprof_value_type;

// One frame of a stack: the function's name, its file and the line being executed.
// `omit` leaves the frame out of the stack altogether (a profiler hiding its own frames);
// for a keyed frame that answer is remembered with the key. A sample whose frames are all
// omitted is not recorded.
typedef struct {
  pprof_str function_name;
  pprof_str file_name;
  int64_t line;
  bool omit;
} pprof_frame;

// A label: `key` with a non-empty string value (`str.ptr != NULL`) or with a number `num`
// and an optional `num_unit` (empty for none). Keys may repeat.
typedef struct {
  pprof_str key;
  pprof_str str;
  int64_t num;
  pprof_str num_unit;
} pprof_label;

// An identity the caller gives a frame so that the profile can find the frame's location
// without hashing and comparing its strings: two keys are equal when all words are.
// While a sample's `frame_key_epoch` stays the same, a key must always denote the
// same name, file and line; different keys may denote the same frame. The all-zero key
// means "no key": that frame is looked up by its strings.
typedef struct {
  uint64_t a;
  uint64_t b;
  uint64_t c;
} pprof_frame_key;

typedef enum {
  PPROF_OK = 0,
  PPROF_ERR_INVALID = 1, // bad arguments; the profile is unchanged
  PPROF_ERR_NO_MEMORY = 2, // an allocation failed; the profile is unchanged
  PPROF_ERR_LIMIT = 3, // a table would exceed its maximum size
  PPROF_ERR_COMPRESS = 4, // the compressor failed
  PPROF_ERR_RESOLVE = 5, // a frame resolver reported an error
} pprof_status;

// On every function that returns a pprof_status: a status dropped is a failure lost.
#define PPROF_MUST_CHECK __attribute__((warn_unused_result))

typedef struct {
  char message[200];
} pprof_error;

// Called for a keyed frame the profile has not seen yet, to obtain its strings. They need
// to stay valid only until the resolver is called again or pprof_profile_add returns.
// Setting `*remember_key` to false (it starts true) keeps the profile from remembering
// the key, e.g. when the caller cannot guarantee it will keep denoting this frame.
// Returns PPROF_OK, or any other status (with a message) to abandon the sample. The
// sample's labels have been copied before the resolver first runs: it may run code that
// moves what they point at.
typedef pprof_status (*pprof_frame_resolver)(void *context, size_t index, pprof_frame *frame, bool *remember_key,
                                             pprof_error *error);

// A sample's frames come either as strings (`frames`), or as keys (`frame_keys`) with the
// strings supplied on a key miss by `frames` (when given) or by `resolve_frame`.
typedef struct {
  const pprof_frame *frames; // leaf first
  const pprof_frame_key *frame_keys; // optional, leaf first
  uint64_t frame_key_epoch; // when it changes, the profile forgets the keys it knows
  pprof_frame_resolver resolve_frame; // optional
  void *resolve_context;
  size_t frame_count;
  const int64_t *values; // one per sample type, in the profile's order
  size_t value_count;
  const pprof_label *labels;
  size_t label_count;
  // 0: the sample is aggregated with those of equal frames and labels. Otherwise when it
  // was taken (nanoseconds since the Unix epoch): a timeline sample, kept apart from every
  // other and serialized with the numeric label PPROF_TIMESTAMP_LABEL (the sample's end,
  // as Datadog's timeline reads it).
  int64_t timestamp_ns;
  // For a timeline sample: an earlier timeline sample (`extend`, or NULL) to add this one
  // to instead, when it has the same frames and labels, moving its timestamp on to this
  // one's unless `keep_end` (values that do not stretch it). The caller decides how long a
  // sample may grow; the profile checks that it is the same.
  const struct pprof_sample_ref *extend;
  bool keep_end;
  // For a timeline sample not extending one: when > 0, it is added to the latest timeline
  // sample of the same frames and labels if that one's timestamp is at most this much
  // older (whose timestamp then stays). For samples that stand for an instant (CPU alone),
  // where a coarser time costs less than a sample each.
  int64_t merge_window_ns;
} pprof_sample;

#define PPROF_TIMESTAMP_LABEL "end_timestamp_ns"
// Serialized timeline samples have their timestamps, and their values in nanoseconds, in
// whole ticks of this many nanoseconds (2^20, about 1 ms); every total stays exact (see
// pprof_timeline.c).
#define PPROF_TIMELINE_TICK_NS ((int64_t) 1 << 20)
// 200,000 timeline samples: a minute of about 30 threads busy on new stacks at 100 Hz (a
// minute of Rails on puma with 2 busy threads makes 15,000); a profile of three sample
// types then holds 11.6 MB.
#define PPROF_DEFAULT_TIMELINE_LIMIT 200000

// A growable byte buffer owned by the caller; release with pprof_buffer_free.
typedef struct {
  uint8_t *data;
  size_t len;
  size_t capacity;
} pprof_buffer;

void pprof_buffer_free(pprof_buffer *buffer);

#define PPROF_MAX_SAMPLE_TYPES 16
#define PPROF_MAX_LABELS 64
#define PPROF_MAX_FRAMES 100000

// Creates a profile. `period_type` may be NULL (no period). `start_time_ns` is the
// collection start in nanoseconds since the Unix epoch.
PPROF_MUST_CHECK
pprof_status pprof_profile_new(pprof_profile **out, const pprof_value_type *sample_types, size_t sample_type_count,
                               const pprof_value_type *period_type, int64_t period, int64_t start_time_ns,
                               pprof_error *error);
void pprof_profile_free(pprof_profile *profile);

// Which sample type readers show by default (an index into the sample types); without
// it, readers show the last one. Returns PPROF_ERR_INVALID for an index out of range.
PPROF_MUST_CHECK
pprof_status pprof_profile_set_default_sample_type(pprof_profile *profile, size_t index, pprof_error *error);

// Adds a comment to the profile (Profile.comment: free text readers show, e.g.
// `go tool pprof -comments`), until the next reset. At most PPROF_MAX_COMMENTS per period;
// PPROF_ERR_LIMIT beyond.
#define PPROF_MAX_COMMENTS 8
PPROF_MUST_CHECK
pprof_status pprof_profile_add_comment(pprof_profile *profile, pprof_str comment, pprof_error *error);

// Records one sample. Values of samples with equal frames and labels are summed
// (saturating at INT64_MIN/INT64_MAX), unless they carry a timestamp. Label order does
// not matter.
PPROF_MUST_CHECK
pprof_status pprof_profile_add(pprof_profile *profile, const pprof_sample *sample, pprof_error *error);

// Where a sample was recorded, so that the same sample (same frames, same labels) can be
// counted again without looking it up: see pprof_profile_add_again.
typedef struct pprof_sample_ref {
  const pprof_profile *profile;
  uint64_t reset_count;
  uint32_t sample_index;
} pprof_sample_ref;

// pprof_profile_add, also filling `ref` (when not NULL) with where the sample went.
PPROF_MUST_CHECK
pprof_status pprof_profile_add_with_ref(pprof_profile *profile, const pprof_sample *sample, pprof_sample_ref *ref,
                                        pprof_error *error);

// Adds `values` to the sample `ref` denotes, if `ref` was filled by this profile since
// its last reset; returns false (and changes nothing) otherwise. The caller vouches that
// the sample's frames and labels are the same as when `ref` was filled. A timeline
// sample's timestamp moves on to `timestamp_ns` when that is later (0: stays): it then
// stands for a longer stretch that ends later.
bool pprof_profile_add_again(pprof_profile *profile, const pprof_sample_ref *ref, const int64_t *values,
                             size_t value_count, int64_t timestamp_ns);

// Encodes the profile as gzip-compressed pprof into `out` (which is cleared first),
// with time_nanos = start and duration_nanos = finish_time_ns - start. The profile is
// not modified; call pprof_profile_reset to start the next period.
PPROF_MUST_CHECK
pprof_status pprof_profile_serialize(const pprof_profile *profile, int64_t finish_time_ns, pprof_buffer *out,
                                     pprof_error *error);

// Another pprof of the same samples, for a destination that reads them otherwise (its
// rewriting is then done here, without the GVL, rather than in Ruby on the pprof):
typedef struct {
  // Timeline samples summed per stack and labels, without timestamps (Pyroscope: a
  // timestamp label would make each sample a series of its own).
  bool merge_timeline;
  // Labels with key `label_key` (when not empty) get the key `new_label_key`, and those
  // of their string values found in `values` the matching `new_values` (Datadog's
  // names for thread states).
  pprof_str label_key, new_label_key;
  const pprof_str *values, *new_values;
  size_t value_count; // at most PPROF_MAX_REWRITE_VALUES
} pprof_rewrite;

#define PPROF_MAX_REWRITE_VALUES 16

PPROF_MUST_CHECK
pprof_status pprof_profile_serialize_rewritten(const pprof_profile *profile, int64_t finish_time_ns,
                                               const pprof_rewrite *rewrite, pprof_buffer *out, pprof_error *error);

// Forgets every sample and interned entry, keeping allocated capacity for reuse, and
// starts a new period at `start_time_ns`. Never fails.
void pprof_profile_reset(pprof_profile *profile, int64_t start_time_ns);

// A profile keeps at most this many timeline samples (by default
// PPROF_DEFAULT_TIMELINE_LIMIT); beyond, until its reset, a timeline sample is merged with
// equal stacks like one without a timestamp (extending one still works), so its memory
// stays bounded however many threads run.
void pprof_profile_set_timeline_limit(pprof_profile *profile, uint32_t limit);

int64_t pprof_profile_start_time_ns(const pprof_profile *profile);
void pprof_profile_set_start_time_ns(pprof_profile *profile, int64_t start_time_ns);

typedef struct {
  size_t samples; // distinct (stack, labels) pairs, and timeline samples
  size_t stacks;
  size_t locations;
  size_t functions;
  size_t strings;
  size_t label_sets;
  size_t frame_keys;
  size_t held_bytes; // memory owned by this profile
  uint64_t timeline_merged; // timeline samples merged with equal stacks: the timeline was full
} pprof_profile_stats;

pprof_profile_stats pprof_profile_get_stats(const pprof_profile *profile);

const char *pprof_compressor_name(void);
