// A pprof_profile's tables encoded as an OpenTelemetry profiles request: the protobuf
// message opentelemetry.proto.collector.profiles.v1development.ExportProfilesServiceRequest
// (opentelemetry-proto 1.10 and later), the body of `POST {endpoint}/v1development/profiles`.
// Plain C: no Ruby headers.
//
// One ResourceProfiles (the caller's resource attributes), one ScopeProfiles (the caller's
// scope), and one Profile per sample type, all sharing one dictionary made from the
// profile's own interned tables: its strings, functions and locations keep their indices
// (pprof's ids are 1-based, and OTLP's tables start with a zero entry), its stacks become
// the stack table as they are (packed location ids, leaf first), and its label sets
// become attribute indices. So the encoding is one pass over the tables, like the pprof
// encoder's.
//
// Labels become attributes, under the semantic conventions' names where they exist
// ("thread id" is `thread.id`, an integer; "thread name" is `thread.name`); "thread state"
// becomes `thread.state`; other keys keep their names. A timeline sample's timestamp goes
// in Sample.timestamps_unix_nano, and the timeline samples of one stack and label set
// become one Sample with a value and a timestamp each, as the protocol asks. A Profile
// leaves out the samples whose value of its type is 0.
#pragma once

#include <stdbool.h>
#include <stdint.h>

#include "pprof_profile.h"

// A resource attribute: a string, or with `is_int` an integer.
typedef struct {
  pprof_str key;
  pprof_str str;
  int64_t num;
  bool is_int;
} pprof_otlp_attribute;

typedef struct {
  const pprof_otlp_attribute *resource; // Resource.attributes
  size_t resource_count;
  pprof_str scope_name; // InstrumentationScope
  pprof_str scope_version;
  bool gzip; // compress the request (Content-Encoding: gzip)
} pprof_otlp_options;

// Encodes the profile (not modified) into `out` (cleared first): time_unix_nano = its
// start, duration_nano = finish_time_ns - start.
PPROF_MUST_CHECK
pprof_status pprof_profile_serialize_otlp(const pprof_profile *profile, int64_t finish_time_ns,
                                          const pprof_otlp_options *options, pprof_buffer *out, pprof_error *error);
