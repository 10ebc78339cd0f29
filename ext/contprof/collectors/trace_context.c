// The trace a thread is in, read from the Datadog tracer's objects (see trace_context.h).
#include "collectors/trace_context.h"

#include "ruby_helpers.h"

static ID datadog_key_id; // 0: no tracer known
bool contprof_span_id_label;
static ID at_active_trace, at_root_span, at_active_span, at_id;

void contprof_trace_context_set_datadog_key(VALUE key) {
  datadog_key_id = SYMBOL_P(key) ? SYM2ID(key) : 0;
}

// A span's @id as an unsigned 64-bit number, without raising (ids are random 62- or
// 64-bit numbers: a Bignum past 2**62).
static bool span_id_of(VALUE span, uint64_t *out) {
  if (!RB_TYPE_P(span, T_OBJECT)) return false;
  VALUE id = rb_ivar_get(span, at_id);
  if (RB_FIXNUM_P(id)) {
    long value = FIX2LONG(id);
    if (value <= 0) return false;
    *out = (uint64_t) value;
    return true;
  }
  if (!RB_TYPE_P(id, T_BIGNUM)) return false;
  uint64_t value = 0;
  int sign = rb_integer_pack(id, &value, 1, sizeof(value), 0, INTEGER_PACK_LSWORD_FIRST | INTEGER_PACK_NATIVE_BYTE_ORDER);
  if (sign != 1) return false; // negative, zero or more than 64 bits
  *out = value;
  return true;
}

bool contprof_trace_ids_of(VALUE thread, contprof_trace_ids *out) {
  if (datadog_key_id == 0) return false;
  VALUE context = rb_thread_local_aref(thread, datadog_key_id);
  if (!RB_TYPE_P(context, T_OBJECT)) return false;
  VALUE trace = rb_ivar_get(context, at_active_trace);
  if (!RB_TYPE_P(trace, T_OBJECT)) return false;
  return span_id_of(rb_ivar_get(trace, at_root_span), &out->local_root_span_id) &&
         span_id_of(rb_ivar_get(trace, at_active_span), &out->span_id);
}

// Contprof::Native.datadog_context_key = Symbol or nil
static VALUE set_datadog_key(VALUE CONTPROF_UNUSED module, VALUE key) {
  if (!NIL_P(key) && !SYMBOL_P(key)) contprof_raise_type_error(key, "datadog_context_key", "a Symbol or nil");
  contprof_trace_context_set_datadog_key(key);
  return key;
}

static VALUE set_span_id_label(VALUE CONTPROF_UNUSED module, VALUE on) {
  contprof_span_id_label = RTEST(on);
  return on;
}

static VALUE get_datadog_key(VALUE CONTPROF_UNUSED module) {
  return datadog_key_id ? ID2SYM(datadog_key_id) : Qnil;
}

void contprof_trace_context_init(VALUE contprof) {
  at_active_trace = rb_intern("@active_trace");
  at_root_span = rb_intern("@root_span");
  at_active_span = rb_intern("@active_span");
  at_id = rb_intern("@id");
  VALUE native = rb_define_module_under(contprof, "Native");
  rb_define_singleton_method(native, "datadog_context_key=", set_datadog_key, 1);
  rb_define_singleton_method(native, "datadog_context_key", get_datadog_key, 0);
  rb_define_singleton_method(native, "span_id_label=", set_span_id_label, 1);
}
