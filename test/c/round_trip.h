// Serializing a profile and reading it back with the independent decoder (pprof_decode.c),
// for the C tests of the pprof core. Include after checks.h.
#pragma once

#include <stdio.h>
#include <stdlib.h>

#include "../../ext/contprof/pprof/pprof_profile.h"
#include "checks.h"
#include "pprof_decode.h"

static void serialize_and_decode(pprof_profile *profile, int64_t finish, dec_profile *decoded) {
  pprof_buffer out = {0};
  pprof_error error = {{0}};
  pprof_status status = pprof_profile_serialize(profile, finish, &out, &error);
  CHECK_EQ_INT(PPROF_OK, status);
  char decode_error[200];
  if (dec_profile_parse(out.data, out.len, decoded, decode_error) != 0) {
    fprintf(stderr, "FAIL %s: serialized profile does not decode: %s\n", current_test, decode_error);
    exit(1);
  }
  pprof_buffer_free(&out);
}
