// Contprof::Collectors::Stack (see stack.h).
//
// A sample is taken in two steps. First the thread's frames are read from the VM as raw
// pointers (vm/vm_ruby31.c): no names, no strings, no Ruby objects. Then the sample is
// recorded with one *frame key* per frame (the addresses of the frame's VM objects and
// its position): the profile finds most frames by key alone, and only asks for a frame's
// name, file and line (the resolver below) the first time it sees the key. The key of a
// frame whose VM objects are young is not remembered, and samples taken during a major
// GC carry no keys: those objects could be freed or moved and their addresses reused, so
// such frames are looked up by their strings instead; see contprof_vm_frame_key.
//
// Frame names follow Ruby's backtraces, with methods qualified by their owner, as Ruby
// 3.4 prints them: "Integer#times", "Foo.bar", "block in Foo#bar", "<main>". A stack
// deeper than max_frames keeps its newest max_frames - 1 frames plus one frame named
// "N frames omitted"; a live thread with no Ruby-level frame is one "In native code" frame.
#include "collectors/stack.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pprof/pprof_util.h"
#include "ruby_helpers.h"
#include "recorder/stack_recorder.h"
#include "vm/vm.h"

#define NAME_BUFFER_SIZE 1024

struct contprof_stack_sampler {
  int max_frames;
  contprof_raw_frame *raw_frames; // max_frames
  pprof_frame_key *keys; // max_frames
  // The stack just read, for contprof_stack_record and the resolver.
  long total;
  size_t gc_count;
  long frame_count;
  long omitted; // > 0: the last frame stands for this many frames left out
  bool in_native_code; // the single frame is the "In native code" placeholder
  bool unread; // the single frame is the "Stack not read (out of memory)" placeholder
  uint64_t unread_stacks; // stacks read as that placeholder, so far
  const pprof_str *leaves; // synthetic frames on top of the next recorded stack
  int leaf_count;
  pprof_sample_ref *ref_wanted; // where the next record without a memo goes, or NULL
  int64_t timestamp_ns; // the next record's (a timeline sample), or 0
  bool timestamp_moves_end; // whether it also moves the end of a record it extends
  const pprof_sample_ref *extend; // the record a record without a memo may extend, or NULL
  char name_buffer[NAME_BUFFER_SIZE];
};

// Where the profiler's own Ruby code lives (see contprof_stack_class_init): its
// directory with a trailing slash, and its main file. Frames there are left out.
static char *own_code_directory, *own_code_file;
static size_t own_code_directory_len, own_code_file_len;

static bool profilers_own_file(pprof_str file) {
  return (own_code_directory && file.len > own_code_directory_len &&
          memcmp(file.ptr, own_code_directory, own_code_directory_len) == 0) ||
         (own_code_file && file.len == own_code_file_len && memcmp(file.ptr, own_code_file, file.len) == 0);
}

static const pprof_frame_key no_key = {0, 0, 0};

// max_frames' default and bounds, from Contprof::Limits (lib/contprof/configuration/limits.rb).
static int default_max_frames, fewest_max_frames, most_max_frames;

int contprof_default_max_frames(void) { return default_max_frames; }

int contprof_validate_max_frames(VALUE max_frames) {
  if (!RB_INTEGER_TYPE_P(max_frames) || !FIXNUM_P(max_frames) || FIX2LONG(max_frames) < fewest_max_frames ||
      FIX2LONG(max_frames) > most_max_frames) {
    rb_raise(rb_eArgError, "max_frames must be an Integer from %d to %d, got %" PRIsVALUE, fewest_max_frames,
             most_max_frames, rb_inspect(max_frames));
  }
  return (int) FIX2LONG(max_frames);
}

contprof_stack_sampler *contprof_stack_sampler_new(int max_frames) {
  contprof_stack_sampler *sampler = ruby_xcalloc(1, sizeof(contprof_stack_sampler));
  sampler->max_frames = max_frames;
  sampler->raw_frames = ruby_xcalloc((size_t) max_frames, sizeof(contprof_raw_frame));
  sampler->keys = ruby_xcalloc((size_t) max_frames + CONTPROF_MAX_LEAVES, sizeof(pprof_frame_key));
  return sampler;
}

void contprof_stack_sampler_free(contprof_stack_sampler *sampler) {
  if (!sampler) return;
  ruby_xfree(sampler->raw_frames);
  ruby_xfree(sampler->keys);
  ruby_xfree(sampler);
}

size_t contprof_stack_sampler_memsize(const contprof_stack_sampler *sampler) {
  return sizeof(*sampler) + (size_t) sampler->max_frames * sizeof(contprof_raw_frame) +
         ((size_t) sampler->max_frames + CONTPROF_MAX_LEAVES) * sizeof(pprof_frame_key);
}

PPROF_MUST_CHECK
static pprof_status resolve_frame(void *context, size_t index, pprof_frame *frame, bool *remember_key,
                                  CONTPROF_UNUSED pprof_error *error) {
  contprof_stack_sampler *sampler = context;
  if ((long) index < sampler->leaf_count) {
    *frame = (pprof_frame) {.function_name = sampler->leaves[index], .file_name = PPROF_STR(""), .line = 0};
    return PPROF_OK;
  }
  index -= (size_t) sampler->leaf_count;
  if (sampler->unread) {
    *frame = (pprof_frame) {.function_name = PPROF_STR("Stack not read (out of memory)"), .file_name = PPROF_STR(""), .line = 0};
  } else if (sampler->in_native_code) {
    *frame = (pprof_frame) {.function_name = PPROF_STR("In native code"), .file_name = PPROF_STR(""), .line = 0};
  } else if (sampler->omitted > 0 && (long) index == sampler->frame_count - 1) {
    int len = snprintf(sampler->name_buffer, sizeof(sampler->name_buffer), "%ld frames omitted", sampler->omitted);
    *frame = (pprof_frame) {.function_name = {sampler->name_buffer, (size_t) len}, .file_name = PPROF_STR(""), .line = 0};
  } else {
    const contprof_raw_frame *raw = &sampler->raw_frames[index];
    *remember_key = contprof_vm_frame_key_rememberable(raw);
    frame->function_name = contprof_vm_frame_name(raw, sampler->name_buffer, sizeof(sampler->name_buffer));
    frame->file_name = contprof_vm_frame_file(raw);
    frame->line = contprof_vm_frame_line(raw);
    frame->omit = profilers_own_file(frame->file_name);
    if (contprof_vm_frame_names_unreliable()) *remember_key = false; // (named again at its next sample)
  }
  return PPROF_OK;
}

// Sets what contprof_stack_read sets, for a stack of `total` frames already in raw_frames.
static void take_stack(contprof_stack_sampler *sampler, long total) {
  contprof_vm_frames_valid_now();
  sampler->unread = false;
  sampler->total = total;
  sampler->in_native_code = total == 0;
  sampler->omitted = total > sampler->max_frames ? total - (sampler->max_frames - 1) : 0;
  sampler->frame_count = sampler->in_native_code ? 1 : (total > sampler->max_frames ? sampler->max_frames : total);
  sampler->gc_count = rb_gc_count();
}

void contprof_stack_use_frames(contprof_stack_sampler *sampler, const contprof_raw_frame *frames, long count,
                               long total) {
  if (count > sampler->max_frames) count = sampler->max_frames;
  if (total < count) total = count;
  if (count > 0) memcpy(sampler->raw_frames, frames, (size_t) count * sizeof(contprof_raw_frame));
  take_stack(sampler, total);
  // Frames the capture could not keep cannot be named: the stack ends where it does.
  if (sampler->frame_count > count && !sampler->in_native_code) sampler->frame_count = count;
}

void contprof_stack_add_leaves(contprof_stack_sampler *sampler, const pprof_str *names, int count,
                               pprof_sample_ref *ref) {
  sampler->leaves = names;
  sampler->leaf_count = count > CONTPROF_MAX_LEAVES ? CONTPROF_MAX_LEAVES : count;
  sampler->ref_wanted = ref;
}

pprof_status contprof_stack_read(contprof_stack_sampler *sampler, VALUE thread, const contprof_stack_memo *memo,
                                 bool *unchanged, pprof_error *error) {
  *unchanged = false;
  if (!contprof_vm_supported()) return pprof_fail(error, PPROF_ERR_INVALID, "stack sampling is not supported here");
  long total = contprof_vm_read_stack(thread, sampler->raw_frames, sampler->max_frames);
  if (total == CONTPROF_VM_NOT_A_THREAD) return pprof_fail(error, PPROF_ERR_INVALID, "not a Thread");
  if (total == CONTPROF_VM_THREAD_DEAD) return pprof_fail(error, PPROF_ERR_INVALID, "the thread is dead");
  // Without memory to read it, the time still goes somewhere it says so (never to "In
  // native code", which would be wrong), and is counted.
  bool unread = total == CONTPROF_VM_NO_MEMORY;
  take_stack(sampler, unread ? 0 : total);
  if (unread) {
    sampler->unread = true;
    sampler->unread_stacks++;
  }
  // The same frames as this thread's previous sample, with no GC in between (which could
  // have freed and reused their addresses): the very same stack.
  *unchanged = memo && memo->valid && memo->total == total && memo->gc_count == sampler->gc_count &&
               memo->frame_count == sampler->frame_count && !sampler->in_native_code &&
               memcmp(memo->frames, sampler->raw_frames, (size_t) sampler->frame_count * sizeof(contprof_raw_frame)) == 0;
  return PPROF_OK;
}

long contprof_stack_frame_count(const contprof_stack_sampler *sampler) { return sampler->frame_count; }

uint64_t contprof_stack_unread_count(const contprof_stack_sampler *sampler) { return sampler ? sampler->unread_stacks : 0; }

const contprof_raw_frame *contprof_stack_leaf(const contprof_stack_sampler *sampler) {
  return sampler->in_native_code || sampler->frame_count == 0 ? NULL : &sampler->raw_frames[0];
}

pprof_status contprof_stack_each_frame(contprof_stack_sampler *sampler,
                                       pprof_status (*visit)(void *context, const pprof_frame *frame, pprof_error *error),
                                       void *context, pprof_error *error) {
  int leaves = sampler->leaf_count;
  sampler->leaf_count = 0;
  pprof_status status = PPROF_OK;
  for (long i = 0; i < sampler->frame_count && status == PPROF_OK; i++) {
    pprof_frame frame = {0};
    bool remember = true;
    status = resolve_frame(sampler, (size_t) i, &frame, &remember, error);
    if (status == PPROF_OK && !frame.omit) status = visit(context, &frame, error);
  }
  sampler->leaf_count = leaves;
  return status;
}

pprof_status contprof_stack_record(contprof_stack_sampler *sampler, VALUE recorder, const int64_t *values,
                                   size_t value_count, const pprof_label *labels, size_t label_count,
                                   contprof_stack_memo *memo, bool unchanged, pprof_error *error) {
  int64_t timestamp_ns = sampler->timestamp_ns;
  bool moves_end = sampler->timestamp_moves_end;
  const pprof_sample_ref *extend = sampler->extend;
  sampler->timestamp_ns = 0; // for this record only
  sampler->extend = NULL;
  // Whether the memo's record may take this one: always, or a timeline sample while it
  // spans less than CONTPROF_TIMELINE_SPAN_NS.
  bool memo_extends = memo && (timestamp_ns == 0 || timestamp_ns - memo->timed_since_ns < CONTPROF_TIMELINE_SPAN_NS);
  // The same stack as last time: count that sample again, without looking anything up.
  if (memo_extends && unchanged && memo->valid &&
      contprof_recorder_add_again(recorder, &memo->ref, values, value_count, moves_end ? timestamp_ns : 0)) {
    return PPROF_OK;
  }
  uint64_t epoch;
  bool keys_allowed = contprof_vm_key_epoch(&epoch);
  int leaves = sampler->leaf_count;
  sampler->leaf_count = 0; // for this record only
  for (int i = 0; i < leaves; i++) {
    // Static names: their address is their identity (no VM object is that small).
    sampler->keys[i] = (pprof_frame_key) {.a = 1, .b = (uintptr_t) sampler->leaves[i].ptr};
  }
  for (long i = 0; i < sampler->frame_count; i++) {
    bool special = sampler->in_native_code || (sampler->omitted > 0 && i == sampler->frame_count - 1);
    sampler->keys[leaves + i] = special || !keys_allowed ? no_key : contprof_vm_frame_key(&sampler->raw_frames[i]);
  }
  sampler->leaf_count = leaves; // the resolver needs it
  pprof_sample sample = {
    .frame_keys = sampler->keys,
    .frame_key_epoch = epoch,
    .resolve_frame = resolve_frame,
    .resolve_context = sampler,
    .frame_count = (size_t) (sampler->frame_count + leaves),
    .values = values,
    .value_count = value_count,
    .labels = labels,
    .label_count = label_count,
    .timestamp_ns = timestamp_ns,
    .keep_end = !moves_end,
    // A record without wall time (CPU alone) stands for an instant: equal ones within a
    // span share a sample, at the first one's time.
    .merge_window_ns = moves_end ? 0 : CONTPROF_TIMELINE_SPAN_NS,
  };
  // A timeline record may extend the thread's previous one if that is the same stack and
  // labels (the profile compares them: a GC since may have made the memo's frames unusable
  // for comparison, not the interned stack).
  pprof_sample_ref previous = memo ? memo->ref : (pprof_sample_ref) {.profile = NULL};
  if (timestamp_ns != 0) {
    if (memo && leaves == 0) {
      if (previous.profile && memo_extends) sample.extend = &previous;
    } else {
      sample.extend = extend;
    }
  }
  if (!memo || leaves > 0) {
    pprof_status status = sampler->ref_wanted ? contprof_recorder_record_with_ref(recorder, &sample, sampler->ref_wanted, error)
                                              : contprof_recorder_record(recorder, &sample, error);
    sampler->leaf_count = 0;
    sampler->ref_wanted = NULL;
    return status;
  }
  pprof_status status = contprof_recorder_record_with_ref(recorder, &sample, &memo->ref, error);
  memo->valid = false;
  if (status != PPROF_OK) return status;
  bool extended = sample.extend && memo->ref.profile == previous.profile && memo->ref.sample_index == previous.sample_index;
  // A record that may have joined an older one (merge_window_ns) is no record for wall time
  // to extend: that one's stretch ended earlier.
  if (!extended) memo->timed_since_ns = sample.merge_window_ns > 0 ? 0 : timestamp_ns;
  size_t raw_size = (size_t) sampler->frame_count * sizeof(contprof_raw_frame);
  if (memo->capacity < sampler->frame_count) {
    // Plain realloc: no Ruby allocation (and so no GC) while sampling. Without memory the
    // memo stays invalid, which only costs speed.
    void *grown = realloc(memo->frames, raw_size);
    if (!grown) return PPROF_OK;
    memo->frames = grown;
    memo->capacity = sampler->frame_count;
  }
  if (raw_size > 0) memcpy(memo->frames, sampler->raw_frames, raw_size);
  memo->frame_count = sampler->frame_count;
  memo->total = sampler->total;
  memo->gc_count = sampler->gc_count;
  memo->valid = true;
  return PPROF_OK;
}

void contprof_stack_set_timestamp(contprof_stack_sampler *sampler, int64_t timestamp_ns, bool moves_end,
                                  const pprof_sample_ref *extend) {
  sampler->timestamp_ns = timestamp_ns;
  sampler->timestamp_moves_end = moves_end;
  sampler->extend = extend;
}

pprof_status contprof_stack_sample(contprof_stack_sampler *sampler, VALUE thread, VALUE recorder,
                                   const int64_t *values, size_t value_count, const pprof_label *labels,
                                   size_t label_count, contprof_stack_memo *memo, pprof_error *error) {
  bool unchanged;
  pprof_status status = contprof_stack_read(sampler, thread, memo, &unchanged, error);
  if (status != PPROF_OK) return status;
  return contprof_stack_record(sampler, recorder, values, value_count, labels, label_count, memo, unchanged, error);
}

void contprof_stack_memo_release(contprof_stack_memo *memo) {
  free(memo->frames);
  memset(memo, 0, sizeof(*memo));
}

size_t contprof_stack_memo_memsize(const contprof_stack_memo *memo) {
  return (size_t) memo->capacity * sizeof(contprof_raw_frame);
}

// The sampler behind Stack.sample, kept between calls and resized when max_frames
// changes. Only used holding the GVL, so one at a time.
static contprof_stack_sampler *shared_sampler;

// Contprof::Collectors::Stack.sample(thread, recorder, values, labels, max_frames: 400)
static VALUE stack_sample(int argc, VALUE *argv, VALUE CONTPROF_UNUSED module) {
  VALUE thread, recorder, values, labels, options;
  rb_scan_args(argc, argv, "4:", &thread, &recorder, &values, &labels, &options);
  VALUE max_frames_value = contprof_optional_keyword(options, rb_intern("max_frames"));
  int max_frames =
    max_frames_value == Qundef ? default_max_frames : contprof_validate_max_frames(max_frames_value);
  if (!contprof_vm_supported()) rb_raise(contprof_error_class, "stack sampling is not supported by this build");
  if (!contprof_vm_is_thread(thread)) contprof_raise_type_error(thread, "thread", "a Thread");
  contprof_enforce_recorder(recorder);
  // Called from Ruby, not in a round: Thread#alive? may answer (a thread that has not
  // started yet is alive, in native code, unlike for contprof_vm_thread_alive).
  if (!RTEST(rb_funcall(thread, rb_intern("alive?"), 0))) {
    rb_raise(rb_eArgError, "cannot sample %" PRIsVALUE ": the thread is dead", rb_inspect(thread));
  }
  if (!shared_sampler || shared_sampler->max_frames != max_frames) {
    contprof_stack_sampler *resized = contprof_stack_sampler_new(max_frames); // may raise: nothing to leak yet
    contprof_stack_sampler_free(shared_sampler);
    shared_sampler = resized;
  }
  // Converting the arguments is the last step that may raise or allocate; the label
  // strings it points at stay put because nothing allocates from here on.
  contprof_sample_arguments arguments = contprof_recorder_parse_arguments(recorder, values, labels);
  pprof_error error;
  pprof_status status = contprof_stack_sample(shared_sampler, thread, recorder, arguments.values, arguments.value_count,
                                              arguments.labels, arguments.label_count, NULL, &error);
  RB_GC_GUARD(values);
  RB_GC_GUARD(labels);
  if (status != PPROF_OK) contprof_raise_pprof_error(status, &error, "Collectors::Stack.sample");
  return Qnil;
}

static char *copy_string(VALUE string, size_t *len) {
  *len = (size_t) RSTRING_LEN(string);
  char *copy = ruby_xmalloc(*len + 1);
  memcpy(copy, RSTRING_PTR(string), *len);
  copy[*len] = '\0';
  return copy;
}

// Contprof::Native.hide_frames_from(directory, file): frames whose file is in `directory`
// or is `file` are left out of every stack.
static VALUE native_hide_frames_from(VALUE CONTPROF_UNUSED module, VALUE directory, VALUE file) {
  CONTPROF_ENFORCE_TYPE(directory, T_STRING, "directory", "a String");
  CONTPROF_ENFORCE_TYPE(file, T_STRING, "file", "a String");
  VALUE with_slash = rb_str_plus(directory, rb_str_new_cstr("/"));
  ruby_xfree(own_code_directory);
  ruby_xfree(own_code_file);
  own_code_directory = copy_string(with_slash, &own_code_directory_len);
  own_code_file = copy_string(file, &own_code_file_len);
  return Qnil;
}

void contprof_stack_class_init(VALUE contprof_module) {
  VALUE native = rb_define_module_under(contprof_module, "Native");
  rb_define_singleton_method(native, "hide_frames_from", native_hide_frames_from, 2);
  VALUE collectors = rb_define_module_under(contprof_module, "Collectors");
  VALUE stack = rb_define_module_under(collectors, "Stack");
  rb_define_singleton_method(stack, "sample", stack_sample, -1);
  VALUE limits = rb_const_get(contprof_module, rb_intern("Limits"));
  VALUE range = rb_const_get(limits, rb_intern("MAX_FRAMES_RANGE"));
  default_max_frames = NUM2INT(rb_const_get(limits, rb_intern("MAX_FRAMES")));
  fewest_max_frames = NUM2INT(rb_funcall(range, rb_intern("min"), 0));
  most_max_frames = NUM2INT(rb_funcall(range, rb_intern("max"), 0));
}
