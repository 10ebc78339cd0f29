// StackRecorder#serialize: ends the period, and hands its profile to Ruby encoded. The
// profile slots flip (recorder/profile_slots.h) so that the sampler records into the other
// profile meanwhile; the period's profile is encoded with the GVL released (the pprof, and
// whatever else recorder/serialize_options.h asks for, all from the same samples), then
// reset for its next turn; the encodings become Ruby Strings once the GVL is back.
//
// ## Exceptions and memory
//
// Nothing allocated with malloc may be left behind by a Ruby exception. Pending interrupts
// are checked (and may raise) only before the GVL-free work, while nothing is allocated
// yet; the encoded C buffers are copied into Ruby Strings under rb_protect, and freed
// before any exception goes on.
#include <stdatomic.h>
#include <stdbool.h>

#include "pprof/pprof_util.h"
#include "recorder/serialize_options.h"
#include "recorder/stack_recorder_internal.h"
#include "ruby_helpers.h"

typedef struct {
  recorder_state *state;
  int pthread_error;
  pprof_status status;
  pprof_error error;
  pprof_buffer pprof;
  int64_t start_ns;
  int64_t finish_ns;
  contprof_serialize_options options; // what else to encode (recorder/serialize_options.h)
  pprof_buffer otlp, merged, relabeled;
} serialize_call;

static void *serialize_without_gvl(void *data) {
  serialize_call *call = data;
  recorder_state *state = call->state;
  if ((call->pthread_error = contprof_slots_begin_serialize(&state->slots)) != 0) return NULL;

  int64_t started = contprof_monotonic_ns();
  call->finish_ns = contprof_realtime_ns();
  pprof_profile *profile = contprof_slots_flip(&state->slots, call->finish_ns, &call->pthread_error);
  if (profile) {
    call->start_ns = pprof_profile_start_time_ns(profile);
    atomic_fetch_add(&state->timeline_samples_merged, pprof_profile_get_stats(profile).timeline_merged);
    call->status = pprof_profile_serialize(profile, call->finish_ns, &call->pprof, &call->error);
    const contprof_serialize_options *options = &call->options;
    if (call->status == PPROF_OK && options->want_otlp) {
      call->status = pprof_profile_serialize_otlp(profile, call->finish_ns, &options->otlp, &call->otlp, &call->error);
    }
    if (call->status == PPROF_OK && options->want_merged) {
      pprof_rewrite merge = {.merge_timeline = true};
      call->status = pprof_profile_serialize_rewritten(profile, call->finish_ns, &merge, &call->merged, &call->error);
    }
    if (call->status == PPROF_OK && options->want_relabeled) {
      call->status = pprof_profile_serialize_rewritten(profile, call->finish_ns, &options->relabel, &call->relabeled,
                                                       &call->error);
    }
    // Reset whatever the outcome: a profile that could not be encoded (out of memory) is
    // dropped rather than mixed into the next period. Its start time is set at the flip
    // that makes it active again.
    pprof_profile_reset(profile, call->finish_ns);
  }
  atomic_fetch_add(call->pthread_error == 0 && call->status == PPROF_OK ? &state->serializations
                                                                        : &state->serialization_failures,
                   1);
  atomic_store(&state->last_serialize_ns, (uint_fast64_t) (contprof_monotonic_ns() - started));
  contprof_slots_end_serialize(&state->slots, profile);
  return NULL;
}

static VALUE string_from_buffer(VALUE data) {
  const pprof_buffer *buffer = (const pprof_buffer *) data;
  return rb_str_new((const char *) buffer->data, (long) buffer->len);
}

static void free_serialize_buffers(serialize_call *call) {
  pprof_buffer_free(&call->pprof);
  pprof_buffer_free(&call->otlp);
  pprof_buffer_free(&call->merged);
  pprof_buffer_free(&call->relabeled);
}

// The extra encodings asked for: {merged_timeline:, relabeled:} (those asked for).
static VALUE extras_from_buffers(VALUE data) {
  serialize_call *call = (serialize_call *) data;
  VALUE extras = rb_hash_new();
  if (call->options.want_merged) {
    rb_hash_aset(extras, ID2SYM(rb_intern("merged_timeline")), string_from_buffer((VALUE) &call->merged));
  }
  if (call->options.want_relabeled) {
    rb_hash_aset(extras, ID2SYM(rb_intern("relabeled")), string_from_buffer((VALUE) &call->relabeled));
  }
  return extras;
}

// recorder.serialize(release_gvl: true, otlp: nil, merged_timeline: false, relabel: nil)
//   => [start_time, finish_time, gzip_pprof_bytes]
//   with otlp: {resource: [[key, value], ...], scope_name:, scope_version:, gzip: false}
//   => [start_time, finish_time, gzip_pprof_bytes, otlp_request_bytes]
//   with merged_timeline: true or relabel: [key, new key, [[value, new value], ...]]
//   => [start_time, finish_time, gzip_pprof_bytes, otlp_request_bytes or nil,
//       {merged_timeline: gzip_pprof_bytes, relabeled: gzip_pprof_bytes}]
//   (the same pprof with its timeline samples merged, without timestamps, for Pyroscope; and
//   with one label's key and values renamed, for Datadog: see pprof_rewrite).
// Every encoding comes from the same samples (see pprof/pprof_otlp.h for the OTLP request).
//
// release_gvl: false keeps the GVL while encoding. Only for a last flush at exit: behind
// busy application threads, taking the GVL back can cost a time slice per thread.
VALUE contprof_recorder_serialize(recorder_state *state, int argc, VALUE *argv) {
  VALUE options;
  rb_scan_args(argc, argv, "0:", &options);
  ID keywords[] = {rb_intern("release_gvl"), rb_intern("otlp"), rb_intern("merged_timeline"), rb_intern("relabel")};
  VALUE values[4] = {Qundef, Qundef, Qundef, Qundef};
  if (!NIL_P(options)) rb_get_kwargs(options, keywords, 0, 4, values);
  bool release_gvl = values[0] == Qundef || RTEST(values[0]);
  contprof_recorder_initialized(state);
  serialize_call call = {.state = state, .status = PPROF_OK};
  contprof_read_serialize_options(values[1], values[2], values[3], &call.options); // (raises having freed what it read)
  if (release_gvl) {
    // Pending interrupts are handled (and may raise) only before the serializer runs,
    // while nothing is allocated yet.
    contprof_call_without_gvl(serialize_without_gvl, &call, NULL, NULL);
  } else {
    serialize_without_gvl(&call); // the name says what it can do, not what it must
  }
  bool want_otlp = call.options.want_otlp, want_extras = call.options.want_merged || call.options.want_relabeled;
  contprof_free_serialize_options(&call.options);

  if (call.pthread_error != 0 || call.status != PPROF_OK) {
    free_serialize_buffers(&call);
    if (call.pthread_error != 0) {
      rb_syserr_fail(call.pthread_error, "StackRecorder#serialize: a profile slot's lock failed");
    }
    contprof_raise_pprof_error(call.status, &call.error, "StackRecorder#serialize failed (the profile was dropped)");
  }
  int exception_state = 0;
  VALUE bytes = rb_protect(string_from_buffer, (VALUE) &call.pprof, &exception_state);
  VALUE otlp_bytes = exception_state || !want_otlp ? Qnil : rb_protect(string_from_buffer, (VALUE) &call.otlp, &exception_state);
  VALUE extras = exception_state || !want_extras ? Qnil : rb_protect(extras_from_buffers, (VALUE) &call, &exception_state);
  free_serialize_buffers(&call);
  if (exception_state) rb_jump_tag(exception_state);
  VALUE start = contprof_time_from_ns(call.start_ns), finish = contprof_time_from_ns(call.finish_ns);
  if (want_extras) return rb_ary_new_from_args(5, start, finish, bytes, otlp_bytes, extras);
  return want_otlp ? rb_ary_new_from_args(4, start, finish, bytes, otlp_bytes)
                        : rb_ary_new_from_args(3, start, finish, bytes);
}
