// libFuzzer target for the pprof core's public functions. The input is read as a
// program: create a profile (sample types from the input), then add samples (frames as
// strings or as keys with a resolver, labels, values), change key epochs, serialize
// (and decode the result with the tests' independent decoder; and as OTLP), reset. Any crash, leak,
// sanitizer report or undecodable output is a finding.
//
//   make -C test/fuzz run FUZZ_SECONDS=60
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../ext/contprof/pprof/pprof_otlp.h"
#include "../../ext/contprof/pprof/pprof_profile.h"
#include "../c/pprof_decode.h"

typedef struct {
  const uint8_t *data;
  size_t size;
} input;

static uint8_t take_byte(input *in) {
  if (in->size == 0) return 0;
  uint8_t b = *in->data++;
  in->size--;
  return b;
}

static uint64_t take_u64(input *in) {
  uint64_t v = 0;
  for (int i = 0; i < 8; i++) v = (v << 8) | take_byte(in);
  return v;
}

// A string of up to 255 bytes taken from the input (any bytes, NUL included).
static pprof_str take_str(input *in) {
  size_t len = take_byte(in);
  if (len > in->size) len = in->size;
  pprof_str s = {(const char *) in->data, len};
  in->data += len;
  in->size -= len;
  return s;
}

enum { MAX_FRAMES = 64, MAX_LABELS = 8 };

typedef struct {
  pprof_frame frames[MAX_FRAMES];
  bool fail;
} resolver_context;

static pprof_status resolve(void *context, size_t index, pprof_frame *frame, bool *remember_key, pprof_error *error) {
  resolver_context *ctx = context;
  if (ctx->fail && index % 7 == 3) {
    snprintf(error->message, sizeof(error->message), "refused");
    return PPROF_ERR_RESOLVE;
  }
  *frame = ctx->frames[index];
  *remember_key = index % 5 != 0;
  return PPROF_OK;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  input in = {data, size};
  pprof_value_type types[PPROF_MAX_SAMPLE_TYPES];
  size_t type_count = take_byte(&in) % (PPROF_MAX_SAMPLE_TYPES + 2); // sometimes invalid on purpose
  for (size_t i = 0; i < type_count && i < PPROF_MAX_SAMPLE_TYPES; i++) {
    types[i].type = take_str(&in);
    types[i].unit = take_str(&in);
  }
  pprof_profile *profile = NULL;
  pprof_error error;
  if (pprof_profile_new(&profile, types, type_count, NULL, 0, (int64_t) take_u64(&in), &error) != PPROF_OK) return 0;

  int64_t values[PPROF_MAX_SAMPLE_TYPES + 1];
  pprof_label labels[MAX_LABELS];
  pprof_frame_key keys[MAX_FRAMES];
  resolver_context ctx;
  uint64_t epoch = 0;
  pprof_sample_ref last_ref = {0};
  while (in.size > 0) {
    uint8_t op = take_byte(&in);
    switch (op % 8) {
      case 0:
      case 1:
      case 2: { // add a sample
        size_t frame_count = take_byte(&in) % MAX_FRAMES;
        for (size_t i = 0; i < frame_count; i++) {
          ctx.frames[i].function_name = take_str(&in);
          ctx.frames[i].file_name = take_str(&in);
          ctx.frames[i].line = (int64_t) take_u64(&in);
          ctx.frames[i].omit = (take_byte(&in) & 7) == 0; // now and then, a frame left out
          keys[i] = (pprof_frame_key) {.a = take_byte(&in) % 4, .b = take_byte(&in) % 3, .c = take_byte(&in)};
        }
        size_t label_count = take_byte(&in) % (MAX_LABELS + 1);
        for (size_t i = 0; i < label_count; i++) {
          memset(&labels[i], 0, sizeof(labels[i]));
          labels[i].key = take_str(&in);
          if (take_byte(&in) & 1) {
            labels[i].str = take_str(&in);
          } else {
            labels[i].num = (int64_t) take_u64(&in);
            labels[i].num_unit = take_str(&in);
          }
        }
        size_t value_count = type_count + (op & 0x80 ? 1 : 0); // sometimes a mismatch
        for (size_t i = 0; i < value_count && i <= PPROF_MAX_SAMPLE_TYPES; i++) values[i] = (int64_t) take_u64(&in);
        ctx.fail = op & 0x40;
        pprof_sample sample = {.frame_count = frame_count, .values = values, .value_count = value_count,
                               .labels = labels, .label_count = label_count, .frame_key_epoch = epoch};
        switch ((op >> 3) % 3) {
          case 0: sample.frames = ctx.frames; break;
          case 1:
            sample.frame_keys = keys;
            sample.resolve_frame = resolve;
            sample.resolve_context = &ctx;
            break;
          default:
            sample.frames = ctx.frames;
            sample.frame_keys = keys;
        }
        // Now and then a timeline sample (sometimes a negative timestamp, refused), which may
        // extend the previous sample added.
        uint8_t timeline = take_byte(&in);
        if (timeline & 1) {
          sample.timestamp_ns = (int64_t) take_u64(&in);
          if (timeline & 2) sample.extend = &last_ref;
          sample.keep_end = timeline & 4;
          if (timeline & 16) sample.merge_window_ns = (int64_t) (take_u64(&in) >> 1);
        }
        pprof_sample_ref ref;
        if (pprof_profile_add_with_ref(profile, &sample, &ref, &error) == PPROF_OK) {
          pprof_profile_add_again(profile, &ref, values, value_count, timeline & 8 ? (int64_t) take_u64(&in) : 0);
          last_ref = ref;
        }
        break;
      }
      case 3:
        epoch += take_byte(&in) & 1;
        break;
      case 4:
      case 5: { // serialize and decode
        pprof_buffer out = {0};
        if (pprof_profile_serialize(profile, (int64_t) take_u64(&in), &out, &error) == PPROF_OK) {
          char decode_error[200];
          if (dec_profile_check(out.data, out.len, decode_error) != 0) {
            fprintf(stderr, "serialized profile does not decode: %s\n", decode_error);
            abort();
          }
          // The same tables as an OTLP request (gzip'd or not): must encode whenever
          // pprof did (test/c/test_otlp.c checks what it says).
          pprof_otlp_attribute resource = {.key = {"k", 1}, .str = {"v", 1}};
          pprof_otlp_options options = {.resource = &resource, .resource_count = 1, .gzip = take_byte(&in) & 1};
          if (pprof_profile_serialize_otlp(profile, 1, &options, &out, &error) != PPROF_OK || out.len == 0) {
            fprintf(stderr, "OTLP encoding failed: %s\n", error.message);
            abort();
          }
          // Rewritten for a destination (the timeline merged; a label key and a value
          // from the input renamed): must encode and decode too.
          pprof_str from = take_str(&in), value = take_str(&in);
          const pprof_str new_value = {"renamed", 7};
          pprof_rewrite rewrite = {.merge_timeline = take_byte(&in) & 1, .label_key = from, .new_label_key = {"key", 3},
                                   .values = &value, .new_values = &new_value, .value_count = 1};
          if (pprof_profile_serialize_rewritten(profile, 1, &rewrite, &out, &error) != PPROF_OK ||
              dec_profile_check(out.data, out.len, decode_error) != 0) {
            fprintf(stderr, "rewritten profile failed: %s %s\n", error.message, decode_error);
            abort();
          }
        }
        pprof_buffer_free(&out);
        break;
      }
      case 6:
        pprof_profile_reset(profile, (int64_t) take_u64(&in));
        break;
      case 7:
        // An index past the types is refused, and a refusal says why.
        error.message[0] = '\0';
        if (pprof_profile_set_default_sample_type(profile, take_byte(&in) % (type_count + 1), &error) != PPROF_OK &&
            error.message[0] == '\0') {
          abort();
        }
        break;
    }
  }
  pprof_profile_free(profile);
  return 0;
}
