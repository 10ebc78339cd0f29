// libFuzzer target for the pprof core's reader, summary and merger: the input is a pprof
// file (gzip or plain protobuf), read whole, summed up, and merged twice into one profile
// (over the whole time, or over a range taken from the input's first bytes when its first
// byte is odd), whose serialized result must decode with the tests' independent decoder.
// Any crash, leak, sanitizer report, timeout or undecodable result is a finding.
//
//   make -C test/fuzz run FUZZ_SECONDS=60
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../ext/contprof/pprof/pprof_merge.h"
#include "../../ext/contprof/pprof/pprof_reader.h"
#include "../c/pprof_decode.h"

static int64_t take_i64(const uint8_t *p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; i++) v = (v << 8) | p[i];
  return (int64_t) v;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  pprof_error error = {{0}};
  pprof_reader reader = {0};
  pprof_summary summary;
  pprof_status read = pprof_reader_read(&reader, data, size, PPROF_READ_ALL, &error);
  pprof_status summed = pprof_summarize(&reader, data, size, &summary, &error);
  // What reads whole also sums up (the summary reads less of it).
  if (read == PPROF_OK && reader.sample_type_count <= PPROF_MAX_SAMPLE_TYPES && summed != PPROF_OK) abort();
  pprof_reader_free(&reader);

  int64_t from = INT64_MIN, to = INT64_MAX;
  const uint8_t *profile = data;
  size_t len = size;
  if (size >= 17 && (data[0] & 1)) {
    from = take_i64(data + 1);
    to = take_i64(data + 9);
    profile = data + 17;
    len = size - 17;
  }
  pprof_merge *merge;
  if (pprof_merge_new(&merge, from, to, &error) != PPROF_OK) abort();
  bool merged = false;
  for (int round = 0; round < 2; round++) {
    if (pprof_merge_add(merge, profile, len, "fuzz.pprof", &merged, &error) != PPROF_OK) break;
  }
  pprof_buffer out = {0};
  if (pprof_merge_finish(merge, &out, &error) == PPROF_OK) {
    char decode_error[200];
    if (dec_profile_check(out.data, out.len, decode_error) != 0) {
      fprintf(stderr, "merged profile does not decode: %s\n", decode_error);
      abort();
    }
  }
  for (size_t i = 0; i < pprof_merge_comment_count(merge); i++) (void) pprof_merge_comment(merge, i);
  pprof_buffer_free(&out);
  pprof_merge_free(merge);
  return 0;
}
