// What StackRecorder#serialize is asked to encode besides the pprof, checked and copied
// out of Ruby (see serialize_options.h).
#include "recorder/serialize_options.h"

#include <stdlib.h>
#include <string.h>

#include "ruby_helpers.h"

// A String's bytes, copied (malloc'd: freed by contprof_free_serialize_options, whatever
// happens).
static char *copy_string(VALUE string, pprof_str *out) {
  long len = RSTRING_LEN(string);
  char *copy = malloc((size_t) len + 1);
  if (!copy) rb_raise(rb_eNoMemError, "StackRecorder#serialize: out of memory");
  memcpy(copy, RSTRING_PTR(string), (size_t) len);
  *out = (pprof_str) {copy, (size_t) len};
  return copy;
}

static void free_otlp_options(pprof_otlp_options *options) {
  for (size_t i = 0; i < options->resource_count; i++) {
    free((void *) options->resource[i].key.ptr);
    free((void *) options->resource[i].str.ptr);
  }
  free((void *) options->resource);
  free((void *) options->scope_name.ptr);
  free((void *) options->scope_version.ptr);
  *options = (pprof_otlp_options) {0};
}

static VALUE otlp_option(VALUE otlp, const char *name) {
  return rb_hash_lookup2(otlp, ID2SYM(rb_intern(name)), Qundef);
}

static VALUE string_option(VALUE options, const char *name) {
  VALUE value = otlp_option(options, name);
  if (value == Qundef || NIL_P(value)) return rb_str_new_cstr("");
  CONTPROF_ENFORCE_TYPE(value, T_STRING, name, "String");
  return value;
}

// otlp: {resource: [[key, String or Integer], ...], scope_name:, scope_version:, gzip:}
// (see recorder_serialize). Raises before anything is copied when a value is wrong.
static void read_otlp_options(VALUE otlp, pprof_otlp_options *options) {
  CONTPROF_ENFORCE_TYPE(otlp, T_HASH, "otlp", "Hash");
  static const char *const known[] = {"resource", "scope_name", "scope_version", "gzip"};
  size_t found = 0;
  for (size_t i = 0; i < sizeof(known) / sizeof(known[0]); i++) found += otlp_option(otlp, known[i]) != Qundef;
  if (found != RHASH_SIZE(otlp)) {
    rb_raise(rb_eArgError, "otlp: the keys are resource, scope_name, scope_version and gzip (got %+" PRIsVALUE ")", otlp);
  }
  VALUE resource = otlp_option(otlp, "resource");
  if (resource == Qundef || NIL_P(resource)) resource = rb_ary_new();
  CONTPROF_ENFORCE_TYPE(resource, T_ARRAY, "otlp resource", "Array of [key, value]");
  long count = RARRAY_LEN(resource);
  for (long i = 0; i < count; i++) {
    VALUE pair = RARRAY_AREF(resource, i);
    if (!RB_TYPE_P(pair, T_ARRAY) || RARRAY_LEN(pair) != 2 || !RB_TYPE_P(RARRAY_AREF(pair, 0), T_STRING) ||
        !(RB_TYPE_P(RARRAY_AREF(pair, 1), T_STRING) || RB_INTEGER_TYPE_P(RARRAY_AREF(pair, 1)))) {
      rb_raise(rb_eArgError, "otlp resource: each attribute is [String key, String or Integer value] (got %+" PRIsVALUE ")", pair);
    }
    if (RB_INTEGER_TYPE_P(RARRAY_AREF(pair, 1))) NUM2LL(RARRAY_AREF(pair, 1)); // raises when out of range
  }
  VALUE scope_name = string_option(otlp, "scope_name"), scope_version = string_option(otlp, "scope_version");
  VALUE gzip = otlp_option(otlp, "gzip");
  options->gzip = gzip != Qundef && RTEST(gzip);
  options->resource = calloc((size_t) count + 1, sizeof(pprof_otlp_attribute));
  if (!options->resource) rb_raise(rb_eNoMemError, "StackRecorder#serialize: out of memory");
  // Nothing below raises but running out of memory, after which the caller frees what was copied.
  for (long i = 0; i < count; i++) {
    VALUE pair = RARRAY_AREF(resource, i), value = RARRAY_AREF(pair, 1);
    pprof_otlp_attribute *attribute = (pprof_otlp_attribute *) &options->resource[i];
    options->resource_count = (size_t) i + 1;
    copy_string(RARRAY_AREF(pair, 0), &attribute->key);
    if (RB_TYPE_P(value, T_STRING)) {
      copy_string(value, &attribute->str);
    } else {
      attribute->is_int = true;
      attribute->num = NUM2LL(value);
    }
  }
  copy_string(scope_name, &options->scope_name);
  copy_string(scope_version, &options->scope_version);
}

typedef struct {
  VALUE otlp;
  pprof_otlp_options *options;
} otlp_options_call;

static VALUE read_otlp_options_protected(VALUE data) {
  otlp_options_call *call = (otlp_options_call *) data;
  read_otlp_options(call->otlp, call->options);
  return Qnil;
}

static void free_relabel(pprof_rewrite *relabel) {
  free((void *) relabel->label_key.ptr);
  free((void *) relabel->new_label_key.ptr);
  for (size_t i = 0; i < relabel->value_count; i++) {
    free((void *) relabel->values[i].ptr);
    free((void *) relabel->new_values[i].ptr);
  }
  free((void *) relabel->values);
  free((void *) relabel->new_values);
  *relabel = (pprof_rewrite) {0};
}

typedef struct {
  VALUE relabel;
  pprof_rewrite *out;
} relabel_call;

// relabel: [key, new key, [[value, new value], ...]] (see recorder_serialize).
static VALUE read_relabel_protected(VALUE data) {
  VALUE relabel = ((relabel_call *) data)->relabel;
  pprof_rewrite *out = ((relabel_call *) data)->out;
  static const char usage[] = "relabel: [key, new key, [[value, new value], ...]] (Strings; at most %d values), got %+" PRIsVALUE;
  if (!RB_TYPE_P(relabel, T_ARRAY) || RARRAY_LEN(relabel) != 3 || !RB_TYPE_P(RARRAY_AREF(relabel, 0), T_STRING) ||
      !RB_TYPE_P(RARRAY_AREF(relabel, 1), T_STRING) || !RB_TYPE_P(RARRAY_AREF(relabel, 2), T_ARRAY) ||
      RARRAY_LEN(RARRAY_AREF(relabel, 2)) > PPROF_MAX_REWRITE_VALUES) {
    rb_raise(rb_eArgError, usage, PPROF_MAX_REWRITE_VALUES, relabel);
  }
  VALUE pairs = RARRAY_AREF(relabel, 2);
  long count = RARRAY_LEN(pairs);
  for (long i = 0; i < count; i++) {
    VALUE pair = RARRAY_AREF(pairs, i);
    if (!RB_TYPE_P(pair, T_ARRAY) || RARRAY_LEN(pair) != 2 || !RB_TYPE_P(RARRAY_AREF(pair, 0), T_STRING) ||
        !RB_TYPE_P(RARRAY_AREF(pair, 1), T_STRING)) {
      rb_raise(rb_eArgError, usage, PPROF_MAX_REWRITE_VALUES, relabel);
    }
  }
  out->values = calloc((size_t) count + 1, sizeof(pprof_str));
  out->new_values = calloc((size_t) count + 1, sizeof(pprof_str));
  if (!out->values || !out->new_values) rb_raise(rb_eNoMemError, "StackRecorder#serialize: out of memory");
  copy_string(RARRAY_AREF(relabel, 0), &out->label_key);
  copy_string(RARRAY_AREF(relabel, 1), &out->new_label_key);
  for (long i = 0; i < count; i++) {
    VALUE pair = RARRAY_AREF(pairs, i);
    out->value_count = (size_t) i + 1; // (before the copies: free_relabel frees what they made)
    copy_string(RARRAY_AREF(pair, 0), (pprof_str *) &out->values[i]);
    copy_string(RARRAY_AREF(pair, 1), (pprof_str *) &out->new_values[i]);
  }
  return Qnil;
}

static void read_protected(VALUE (*read)(VALUE), VALUE data, contprof_serialize_options *out) {
  int exception_state = 0;
  rb_protect(read, data, &exception_state);
  if (exception_state) {
    contprof_free_serialize_options(out);
    rb_jump_tag(exception_state);
  }
}

void contprof_read_serialize_options(VALUE otlp, VALUE merged_timeline, VALUE relabel,
                                     contprof_serialize_options *out) {
  *out = (contprof_serialize_options) {
    .want_otlp = otlp != Qundef && !NIL_P(otlp),
    .want_merged = merged_timeline != Qundef && RTEST(merged_timeline),
    .want_relabeled = relabel != Qundef && !NIL_P(relabel),
  };
  if (out->want_relabeled) {
    relabel_call read = {.relabel = relabel, .out = &out->relabel};
    read_protected(read_relabel_protected, (VALUE) &read, out);
  }
  if (out->want_otlp) {
    otlp_options_call read = {.otlp = otlp, .options = &out->otlp};
    read_protected(read_otlp_options_protected, (VALUE) &read, out);
  }
}

void contprof_free_serialize_options(contprof_serialize_options *options) {
  free_otlp_options(&options->otlp);
  free_relabel(&options->relabel);
}
