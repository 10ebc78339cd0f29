// Contprof::LabelSet: the labels a program puts on its samples (see labels.h).
#include "collectors/labels.h"

#include <string.h>

#include "ruby_helpers.h"

#define MAX_KEY_BYTES 128
#define MAX_VALUE_BYTES 1024

static ID fiber_local_id; // the fiber-local variable holding the set in force
static uint64_t last_serial; // changed only with the GVL held

// Contprof's own label keys: a sample carries them already, a program may not set them.
static const char *const reserved_keys[] = {
  "thread id", "thread name", "allocation class", "gc type", "gc cause", "gc major reason", "gc age",
};

static void label_set_free(void *data) {
  contprof_label_set *set = data;
  for (size_t i = 0; i < set->count; i++) {
    ruby_xfree((void *) set->labels[i].key.ptr);
    ruby_xfree((void *) set->labels[i].str.ptr);
  }
  ruby_xfree(set);
}

static size_t label_set_memsize(const void *data) {
  const contprof_label_set *set = data;
  size_t size = sizeof(*set);
  for (size_t i = 0; i < set->count; i++) size += set->labels[i].key.len + set->labels[i].str.len;
  return size;
}

static const rb_data_type_t label_set_type = {
  .wrap_struct_name = "Contprof::LabelSet",
  .function = {.dfree = label_set_free, .dsize = label_set_memsize},
  .flags = RUBY_TYPED_FREE_IMMEDIATELY | RUBY_TYPED_FROZEN_SHAREABLE,
};

const contprof_label_set *contprof_labels_in_force(VALUE thread) {
  VALUE set = rb_thread_local_aref(thread, fiber_local_id);
  if (NIL_P(set) || !rb_typeddata_is_kind_of(set, &label_set_type)) return NULL;
  return RTYPEDDATA_DATA(set);
}

static pprof_str copy_string(const char *ptr, size_t len) {
  char *copy = ruby_xmalloc(len + 1);
  memcpy(copy, ptr, len);
  copy[len] = '\0';
  return (pprof_str) {copy, len};
}

// A label key or value as a String (Symbols and, for values, Integers are converted).
static VALUE label_string(VALUE value, bool is_key, VALUE key_for_message) {
  if (RB_TYPE_P(value, T_SYMBOL)) return rb_sym2str(value);
  if (RB_TYPE_P(value, T_STRING)) return value;
  if (!is_key && RB_INTEGER_TYPE_P(value)) return rb_obj_as_string(value);
  if (is_key) {
    rb_raise(rb_eArgError, "with_labels: label key %" PRIsVALUE " must be a Symbol or a String", rb_inspect(value));
  }
  rb_raise(rb_eArgError, "with_labels: label %" PRIsVALUE " has value %" PRIsVALUE
                         ", which must be a String, a Symbol, an Integer or nil (nil removes the label)",
           rb_inspect(key_for_message), rb_inspect(value));
}

static long find_key(const contprof_label_set *set, const char *key, size_t len) {
  for (size_t i = 0; i < set->count; i++) {
    if (set->labels[i].key.len == len && memcmp(set->labels[i].key.ptr, key, len) == 0) return (long) i;
  }
  return -1;
}

static void remove_label(contprof_label_set *set, size_t index) {
  ruby_xfree((void *) set->labels[index].key.ptr);
  ruby_xfree((void *) set->labels[index].str.ptr);
  memmove(&set->labels[index], &set->labels[index + 1], (set->count - index - 1) * sizeof(set->labels[0]));
  set->count--;
}

typedef struct {
  contprof_label_set *set;
} merge_context;

static int merge_label(VALUE key, VALUE value, VALUE data) {
  contprof_label_set *set = ((merge_context *) data)->set;
  VALUE key_string = label_string(key, true, key);
  const char *key_ptr = RSTRING_PTR(key_string);
  size_t key_len = (size_t) RSTRING_LEN(key_string);
  if (key_len == 0 || key_len > MAX_KEY_BYTES || memchr(key_ptr, '\0', key_len)) {
    rb_raise(rb_eArgError, "with_labels: label key %" PRIsVALUE " must be 1 to %d bytes, without NUL",
             rb_inspect(key), MAX_KEY_BYTES);
  }
  for (size_t i = 0; i < sizeof(reserved_keys) / sizeof(reserved_keys[0]); i++) {
    if (strlen(reserved_keys[i]) == key_len && memcmp(reserved_keys[i], key_ptr, key_len) == 0) {
      rb_raise(rb_eArgError, "with_labels: label key %" PRIsVALUE " is one Contprof sets itself", rb_inspect(key));
    }
  }
  long existing = find_key(set, key_ptr, key_len);
  if (NIL_P(value)) { // removes what an enclosing block set
    if (existing >= 0) remove_label(set, (size_t) existing);
    return ST_CONTINUE;
  }
  VALUE value_string = label_string(value, false, key);
  size_t value_len = (size_t) RSTRING_LEN(value_string);
  if (value_len == 0 || value_len > MAX_VALUE_BYTES) {
    rb_raise(rb_eArgError, "with_labels: label %" PRIsVALUE " has value %" PRIsVALUE ", which must be 1 to %d bytes",
             rb_inspect(key), rb_inspect(value), MAX_VALUE_BYTES);
  }
  if (existing >= 0) {
    ruby_xfree((void *) set->labels[existing].str.ptr);
    set->labels[existing].str = copy_string(RSTRING_PTR(value_string), value_len);
    return ST_CONTINUE;
  }
  if (set->count >= CONTPROF_MAX_USER_LABELS) {
    rb_raise(rb_eArgError, "with_labels: at most %d labels may be in force at once (adding %" PRIsVALUE ")",
             CONTPROF_MAX_USER_LABELS, rb_inspect(key));
  }
  set->labels[set->count++] =
    (pprof_label) {.key = copy_string(key_ptr, key_len), .str = copy_string(RSTRING_PTR(value_string), value_len)};
  return ST_CONTINUE;
}

static VALUE label_set_alloc(VALUE klass) {
  contprof_label_set *set = ruby_xcalloc(1, sizeof(*set));
  return TypedData_Wrap_Struct(klass, &label_set_type, set);
}

// LabelSet.new(enclosing, labels): the enclosing set (or nil) with `labels` (a Hash) merged in.
static VALUE label_set_initialize(VALUE self, VALUE enclosing, VALUE labels) {
  contprof_label_set *set = RTYPEDDATA_DATA(self);
  if (set->serial != 0) rb_raise(rb_eRuntimeError, "LabelSet: already initialized");
  CONTPROF_ENFORCE_TYPE(labels, T_HASH, "labels", "Hash");
  if (!NIL_P(enclosing)) {
    const contprof_label_set *outer = rb_check_typeddata(enclosing, &label_set_type);
    for (size_t i = 0; i < outer->count; i++) {
      set->labels[i] = (pprof_label) {.key = copy_string(outer->labels[i].key.ptr, outer->labels[i].key.len),
                                      .str = copy_string(outer->labels[i].str.ptr, outer->labels[i].str.len)};
      set->count = i + 1;
    }
  }
  merge_context context = {set};
  rb_hash_foreach(labels, merge_label, (VALUE) &context);
  set->serial = ++last_serial;
  rb_obj_freeze(self);
  return self;
}

static VALUE label_set_to_h(VALUE self) {
  const contprof_label_set *set = rb_check_typeddata(self, &label_set_type);
  VALUE hash = rb_hash_new();
  for (size_t i = 0; i < set->count; i++) {
    rb_hash_aset(hash, rb_utf8_str_new(set->labels[i].key.ptr, (long) set->labels[i].key.len),
                 rb_utf8_str_new(set->labels[i].str.ptr, (long) set->labels[i].str.len));
  }
  return hash;
}

static VALUE label_set_empty_p(VALUE self) {
  const contprof_label_set *set = rb_check_typeddata(self, &label_set_type);
  return set->count == 0 ? Qtrue : Qfalse;
}

void contprof_labels_class_init(VALUE contprof) {
  fiber_local_id = rb_intern("__contprof_labels");
  VALUE klass = rb_define_class_under(contprof, "LabelSet", rb_cObject);
  rb_define_alloc_func(klass, label_set_alloc);
  rb_define_method(klass, "initialize", label_set_initialize, 2);
  rb_define_method(klass, "to_h", label_set_to_h, 0);
  rb_define_method(klass, "empty?", label_set_empty_p, 0);
  // The fiber-local variable's name, for lib/contprof/requests/labels.rb.
  rb_define_const(klass, "FIBER_LOCAL", ID2SYM(fiber_local_id));
}
