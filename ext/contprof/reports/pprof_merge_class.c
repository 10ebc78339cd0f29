// Contprof::Native::PprofMerge (pprof files merged over a time range, for the viewer and
// `contprof report`: see pprof/pprof_merge.h for what merging does) and
// Contprof::Native.pprof_summary (a file's sample types, period, totals and comments, for
// the viewer's index).
//
// Reading a file, decompressing, decoding and merging run without the GVL, on memory Ruby
// does not own (bytes given by #add are copied first): other threads run meanwhile, and
// nothing Ruby touched moves under us. A merge object works for one thread at a time; a
// second one calling it meanwhile gets an exception rather than a corrupted merge.
#include "reports/reports.h"

#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "pprof/pprof_gzip.h"
#include "pprof/pprof_merge.h"
#include "pprof/pprof_reader.h"
#include "ruby_helpers.h"

static VALUE decode_error_class = Qnil;
static VALUE types_differ_class = Qnil;

typedef struct {
  pprof_merge *merge;
  bool busy; // a call runs without the GVL (set and read with the GVL held)
} merge_object;

static void merge_object_free(void *data) {
  merge_object *object = data;
  pprof_merge_free(object->merge);
  ruby_xfree(object);
}

static size_t merge_object_memsize(const void *data) {
  const merge_object *object = data;
  return sizeof(*object) + (object->merge ? pprof_merge_held_bytes(object->merge) : 0);
}

static const rb_data_type_t merge_type = {
  .wrap_struct_name = "Contprof::Native::PprofMerge",
  .function = {.dmark = NULL, .dfree = merge_object_free, .dsize = merge_object_memsize},
  .flags = RUBY_TYPED_FREE_IMMEDIATELY,
};

static VALUE merge_allocate(VALUE klass) {
  merge_object *object;
  return TypedData_Make_Struct(klass, merge_object, &merge_type, object);
}

// The merge of `self`, checked ready for a call: initialized, and not in use by another
// thread (calls then mark it busy until they end).
static merge_object *ready(VALUE self) {
  merge_object *object = rb_check_typeddata(self, &merge_type);
  if (!object->merge) rb_raise(rb_eRuntimeError, "PprofMerge was not initialized");
  if (object->busy) rb_raise(rb_eRuntimeError, "PprofMerge is in use by another thread");
  return object;
}

static int64_t range_side(VALUE value, int64_t open) { return NIL_P(value) ? open : NUM2LL(value); }

// PprofMerge.new(from_ns, to_ns, max_frames = nil): Integers (nanoseconds since the
// epoch) or nil (open); max_frames: keep only that many innermost frames of each stack.
static VALUE merge_initialize(int argc, VALUE *argv, VALUE self) {
  VALUE from, to, max_frames;
  rb_scan_args(argc, argv, "21", &from, &to, &max_frames);
  merge_object *object = rb_check_typeddata(self, &merge_type);
  if (object->merge) rb_raise(rb_eRuntimeError, "PprofMerge is already initialized");
  int64_t from_ns = range_side(from, INT64_MIN), to_ns = range_side(to, INT64_MAX);
  size_t frames = NIL_P(max_frames) ? 0 : NUM2SIZET(max_frames);
  pprof_error error = {{0}};
  pprof_status status = pprof_merge_new(&object->merge, from_ns, to_ns, &error);
  if (status != PPROF_OK) contprof_raise_pprof_error(status, &error, "PprofMerge.new");
  pprof_merge_set_max_frames(object->merge, frames);
  return self;
}

// Files are read whole: larger than the biggest decompressed profile we accept, they are
// refused as too big (EFBIG) before any allocation. Only regular files: a FIFO named like
// a profile would block the read forever (O_NONBLOCK keeps even its open from waiting).
static int read_whole_file(const char *path, uint8_t **data, size_t *len) {
  *data = NULL;
  *len = 0;
  int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) return errno;
  struct stat status;
  int error = 0;
  if (fstat(fd, &status) != 0) {
    error = errno;
  } else if (S_ISDIR(status.st_mode)) {
    error = EISDIR;
  } else if (!S_ISREG(status.st_mode)) {
    error = EINVAL;
  } else if ((uint64_t) status.st_size > PPROF_GUNZIP_MAX_BYTES) {
    error = EFBIG;
  } else {
    size_t capacity = (size_t) status.st_size + 1; // (+ 1: reading on to see the end)
    uint8_t *buffer = malloc(capacity);
    size_t used = 0;
    while (buffer && error == 0) {
      if (used == capacity) {
        if (capacity > PPROF_GUNZIP_MAX_BYTES) {
          error = EFBIG;
          break;
        }
        uint8_t *grown = realloc(buffer, capacity * 2);
        if (!grown) break;
        buffer = grown;
        capacity *= 2;
      }
      ssize_t got = read(fd, buffer + used, capacity - used);
      if (got < 0 && errno == EINTR) continue;
      if (got < 0) error = errno;
      if (got <= 0) break;
      used += (size_t) got;
    }
    if (!buffer || (error == 0 && used == capacity)) error = ENOMEM;
    if (error != 0) {
      free(buffer);
    } else {
      *data = buffer;
      *len = used;
    }
  }
  close(fd);
  return error;
}

// One call's work without the GVL: its inputs are C memory, freed by finish_call.
typedef struct {
  merge_object *object;
  char *path; // a file to read, or NULL
  uint8_t *data; // else (and then) its bytes
  size_t len;
  char *name;
  int read_errno;
  pprof_status status;
  pprof_error error;
  bool merged;
} add_call;

static void *add_without_gvl(void *data) {
  add_call *call = data;
  if (call->path && (call->read_errno = read_whole_file(call->path, &call->data, &call->len)) != 0) return NULL;
  call->status = pprof_merge_add(call->object->merge, call->data, call->len, call->name, &call->merged, &call->error);
  return NULL;
}

// Work for contprof_call_without_gvl, run under rb_ensure (which takes a VALUE).
typedef struct {
  void *(*func)(void *);
  void *data;
} gvl_free_work;

static VALUE run_without_gvl(VALUE work) {
  const gvl_free_work *w = (const gvl_free_work *) work;
  contprof_call_without_gvl(w->func, w->data, NULL, NULL);
  return Qnil;
}

static VALUE finish_call(VALUE data) {
  add_call *call = (add_call *) data;
  free(call->path);
  free(call->data);
  free(call->name);
  call->object->busy = false;
  return Qnil;
}

// A NUL-terminated copy in C memory, or NULL without memory.
static char *copy_string(VALUE string) {
  char *copy = malloc((size_t) RSTRING_LEN(string) + 1);
  if (!copy) return NULL;
  memcpy(copy, RSTRING_PTR(string), (size_t) RSTRING_LEN(string));
  copy[RSTRING_LEN(string)] = 0;
  return copy;
}

NORETURN(static void raise_merge_error(const add_call *call, VALUE path));

static void raise_merge_error(const add_call *call, VALUE path) {
  if (call->read_errno) rb_syserr_fail_str(call->read_errno, path);
  const char *types_differ = pprof_merge_types_differ(call->object->merge);
  if (types_differ) rb_raise(types_differ_class, "%s", types_differ);
  if (call->status == PPROF_ERR_INVALID) rb_raise(decode_error_class, "%s", call->error.message);
  contprof_raise_pprof_error(call->status, &call->error, "PprofMerge");
}

// Both adds: `path` names the file to read (or is nil), `bytes` (or nil) are the profile.
static VALUE merge_add_call(VALUE self, VALUE path, VALUE bytes, VALUE name) {
  merge_object *object = ready(self);
  add_call call = {.object = object, .status = PPROF_OK, .len = NIL_P(bytes) ? 0 : (size_t) RSTRING_LEN(bytes)};
  call.name = copy_string(name);
  if (!NIL_P(path)) call.path = copy_string(path);
  if (!NIL_P(bytes)) call.data = (uint8_t *) copy_string(bytes);
  if (!call.name || (!NIL_P(path) && !call.path) || (!NIL_P(bytes) && !call.data)) {
    finish_call((VALUE) &call);
    rb_raise(rb_eNoMemError, "out of memory copying a profile to merge");
  }
  object->busy = true;
  gvl_free_work work = {add_without_gvl, &call};
  rb_ensure(run_without_gvl, (VALUE) &work, finish_call, (VALUE) &call);
  if (call.read_errno || call.status != PPROF_OK) raise_merge_error(&call, path);
  RB_GC_GUARD(path);
  RB_GC_GUARD(bytes);
  return call.merged ? Qtrue : Qfalse;
}

// merge.add_file(path) => true (merged) or false (outside the range).
static VALUE merge_add_file(VALUE self, VALUE path) {
  path = rb_get_path(path);
  StringValueCStr(path);
  return merge_add_call(self, path, Qnil, path);
}

// merge.add(bytes, name) => true or false, for a profile in memory; `name` for messages.
static VALUE merge_add(VALUE self, VALUE bytes, VALUE name) {
  StringValue(bytes);
  name = rb_obj_as_string(name);
  return merge_add_call(self, Qnil, bytes, name);
}

typedef struct {
  merge_object *object;
  pprof_buffer out;
  pprof_status status;
  pprof_error error;
} finish_call_data;

static void *finish_without_gvl(void *data) {
  finish_call_data *call = data;
  call->status = pprof_merge_finish(call->object->merge, &call->out, &call->error);
  return NULL;
}

static VALUE release_finish(VALUE data) {
  ((finish_call_data *) data)->object->busy = false;
  return Qnil;
}

static VALUE build_result(VALUE data) {
  finish_call_data *call = (finish_call_data *) data;
  const pprof_merge *merge = call->object->merge;
  VALUE pprof = rb_str_new((const char *) call->out.data, (long) call->out.len);
  VALUE comments = rb_ary_new_capa((long) pprof_merge_comment_count(merge));
  for (size_t i = 0; i < pprof_merge_comment_count(merge); i++) {
    pprof_str comment = pprof_merge_comment(merge, i);
    rb_ary_push(comments, rb_utf8_str_new(comment.ptr, (long) comment.len));
  }
  return rb_ary_new_from_args(3, pprof, comments, SIZET2NUM(pprof_merge_sample_count(merge)));
}

// merge.result => [gzipped pprof (binary String), comments (UTF-8 Strings, each distinct
// one once, in first-seen order), distinct samples], or nil when no profile was merged.
// Merging may go on after it.
static VALUE merge_result(VALUE self) {
  merge_object *object = ready(self);
  if (pprof_merge_profile_count(object->merge) == 0) return Qnil;
  object->busy = true;
  finish_call_data call = {.object = object, .out = {0}, .status = PPROF_OK};
  gvl_free_work work = {finish_without_gvl, &call};
  rb_ensure(run_without_gvl, (VALUE) &work, release_finish, (VALUE) &call);
  if (call.status != PPROF_OK) {
    pprof_buffer_free(&call.out);
    contprof_raise_pprof_error(call.status, &call.error, "PprofMerge#result");
  }
  int state = 0;
  VALUE result = rb_protect(build_result, (VALUE) &call, &state);
  pprof_buffer_free(&call.out);
  if (state) rb_jump_tag(state);
  return result;
}

typedef struct {
  char *path;
  int read_errno;
  uint8_t *bytes; // the file's (the summary's strings may point into them)
  size_t len;
  pprof_reader reader;
  pprof_summary summary;
  pprof_status status;
  pprof_error error;
} summary_call;

static void *summarize_without_gvl(void *data) {
  summary_call *call = data;
  if ((call->read_errno = read_whole_file(call->path, &call->bytes, &call->len)) != 0) return NULL;
  call->status = pprof_summarize(&call->reader, call->bytes, call->len, &call->summary, &call->error);
  return NULL;
}

static VALUE str_of(pprof_str s) { return rb_utf8_str_new(s.ptr, (long) s.len); }

static VALUE build_summary(VALUE data) {
  const summary_call *call = (const summary_call *) data;
  const pprof_summary *summary = &call->summary;
  const pprof_reader *reader = &call->reader;
  VALUE types = rb_ary_new_capa((long) summary->sample_type_count);
  VALUE totals = rb_ary_new_capa((long) summary->sample_type_count);
  for (size_t t = 0; t < summary->sample_type_count; t++) {
    rb_ary_push(types, rb_ary_new_from_args(2, str_of(summary->sample_types[t].type), str_of(summary->sample_types[t].unit)));
    rb_ary_push(totals, LL2NUM(summary->totals[t]));
  }
  VALUE comments = rb_ary_new_capa((long) reader->comment_count);
  for (size_t i = 0; i < reader->comment_count; i++) {
    rb_ary_push(comments, str_of(pprof_reader_string(reader, reader->comments[i])));
  }
  VALUE reach = summary->has_reach ? rb_ary_new_from_args(2, LL2NUM(summary->reach_start), LL2NUM(summary->reach_end))
                                   : rb_ary_new();
  return rb_ary_new_from_args(6, types, LL2NUM(summary->time_nanos), LL2NUM(summary->duration_nanos), totals, comments,
                              reach);
}

// Native.pprof_summary(path) => [[[type, unit], ...], time_nanos, duration_nanos,
// [total per type], [comments], reach]: reach is [earliest stretch start, latest
// timestamp] of its timeline samples, [] without any (pprof_summary).
static VALUE pprof_summary_of(VALUE CONTPROF_UNUSED module, VALUE path) {
  path = rb_get_path(path);
  StringValueCStr(path);
  summary_call call = {.status = PPROF_OK};
  if (!(call.path = copy_string(path))) rb_raise(rb_eNoMemError, "out of memory copying a path");
  int state = 0;
  VALUE result = Qnil;
  gvl_free_work work = {summarize_without_gvl, &call};
  rb_protect(run_without_gvl, (VALUE) &work, &state);
  if (!state && !call.read_errno && call.status == PPROF_OK) result = rb_protect(build_summary, (VALUE) &call, &state);
  free(call.path);
  free(call.bytes);
  pprof_reader_free(&call.reader);
  if (state) rb_jump_tag(state);
  if (call.read_errno) rb_syserr_fail_str(call.read_errno, path);
  if (call.status == PPROF_ERR_INVALID) rb_raise(decode_error_class, "%s", call.error.message);
  if (call.status != PPROF_OK) contprof_raise_pprof_error(call.status, &call.error, "pprof_summary");
  RB_GC_GUARD(path);
  return result;
}

void contprof_pprof_merge_init(VALUE contprof_module) {
  VALUE native = rb_define_module_under(contprof_module, "Native");
  VALUE merge_class = rb_define_class_under(native, "PprofMerge", rb_cObject);
  rb_define_alloc_func(merge_class, merge_allocate);
  rb_define_method(merge_class, "initialize", merge_initialize, -1);
  rb_define_method(merge_class, "add_file", merge_add_file, 1);
  rb_define_method(merge_class, "add", merge_add, 2);
  rb_define_method(merge_class, "result", merge_result, 0);
  // Data that is not a pprof profile (the message says what is wrong, not which file).
  decode_error_class = rb_define_class_under(merge_class, "DecodeError", rb_eStandardError);
  rb_global_variable(&decode_error_class);
  // Profiles of different kinds (the message names both files and their sample types).
  types_differ_class = rb_define_class_under(merge_class, "TypesDiffer", rb_eStandardError);
  rb_global_variable(&types_differ_class);
  rb_define_singleton_method(native, "pprof_summary", pprof_summary_of, 1);
}
