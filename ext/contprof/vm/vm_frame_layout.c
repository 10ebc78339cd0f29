// Ruby's control frames, read at known offsets (vm/vm_frame_layout.h says why).
//
// Ruby ships no header with these structures any more (the MJIT header went away in 3.3),
// and we do not vendor Ruby's source: the offsets below are numbers, printed from Ruby's
// own headers by script/vm-layout for 3.3.0, 3.3.5 and 3.4.0 (identical), and for 4.0 as
// read off 4.0.0's headers except the iseq body's parent and local iseq (see there).
// Those are the Rubies known to match. extconf.rb builds this file wherever the public-API
// backend builds and rb_iseq_line_no links, whatever the version: contprof_layout_check
// proves the offsets on the running Ruby before the first use, and a Ruby whose structures
// moved (or whose JIT may leave frames stale) falls back to the public API and says why.
// How the running Ruby's backtraces show clauses and <internal:> methods, which the walk
// copies, is asked of that Ruby at the same time.
#include <ruby.h>
#include <ruby/debug.h>
#include <ruby/version.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "vm/vm_common.h"
#include "vm/vm_frame_layout.h"
#include "attributes.h"

// rb_thread_t
#define THREAD_SELF 16
#define THREAD_EC 48
// rb_execution_context_t
#define EC_VM_STACK 0
#define EC_VM_STACK_SIZE 8 // in VALUEs
#define EC_CFP 16
#define EC_THREAD 48
// rb_control_frame_t: frames grow down from the end of the VM stack, newest at ec->cfp.
#define CFP_SIZE 56
#define CFP_PC 0
#define CFP_ISEQ 16
#define CFP_EP 32
// An environment: ep[0] its flags, ep[-1] the previous environment (tagged pointer) or
// block handler, ep[-2] the method entry, or a cref, or an svar holding either.
#define EP_FLAGS 0
#define EP_SPECVAL (-1)
#define EP_ME_CREF (-2)
#define ENV_FLAG_LOCAL 0x2
#define FRAME_MAGIC_MASK 0x7fff0001
#define FRAME_MAGIC_CFUNC 0x55550001
// rb_iseq_t and its constant body
#define ISEQ_BODY 16
#define BODY_TYPE 0 // an int-sized enum
#define BODY_ISEQ_SIZE 4 // an unsigned int, between the type and the instructions
#define BODY_ISEQ_ENCODED 8
// (4.0 added a field before these two: OpenTelemetry's eBPF profiler, checked against
// 4.0.1's core dumps, reads local_iseq at 176; parent_iseq is the word before it, as on
// 3.3 and 3.4. Not run here: the check at load time decides. The field is private and
// came with no change to a public header, so no build probe can tell the two layouts
// apart: the API version is the narrowest thing that does, and picks which of them the
// check at load time is to prove.)
#if RUBY_API_VERSION_MAJOR >= 4
#define BODY_PARENT_ISEQ 168
#define BODY_LOCAL_ISEQ 176
#else
#define BODY_PARENT_ISEQ 160
#define BODY_LOCAL_ISEQ 168
#endif
#define ISEQ_TYPE_METHOD 1
#define ISEQ_TYPE_RESCUE 4
#define ISEQ_TYPE_ENSURE 5
#define ISEQ_TYPE_EVAL 6
// rb_callable_method_entry_t and rb_method_definition_t
#define ME_DEF 16
#define ME_OWNER 32
#define DEF_TYPE_MASK 0xf // a bit field, the first 4 bits of the first word
#define DEF_ISEQ 8 // body.iseq.iseqptr
#define DEF_ORIGINAL_ID 32
#define METHOD_TYPE_ISEQ 0
// struct vm_svar
#define SVAR_CREF_OR_ME 8
// T_IMEMO objects: their kind sits in the flags above the user-flag shift
#define IMEMO_KIND(flags) (((flags) >> RUBY_FL_USHIFT) & 0xf)
#define IMEMO_SVAR 2
#define IMEMO_MENT 6
#define IMEMO_ISEQ 7

// Not in Ruby's public headers, exported by libruby (extconf.rb checks it links): the
// line of an instruction, as Ruby's backtraces compute it.
unsigned int rb_iseq_line_no(const void *iseq, size_t position);

// Whether this Ruby's backtraces show a rescue or ensure clause's frame as the code around
// it (usually its method), and leave out the frame of that code beneath it, and name code
// run by eval as the code that called eval (Ruby 3.4 and later do all three, earlier Rubies
// none). Asked of the running Ruby at load time (clause_frames_merged_by_ruby).
static bool merges_clause_frames;

static const rb_data_type_t *thread_data_type;

static inline uintptr_t word_at(const void *base, ptrdiff_t offset) {
  return *(const uintptr_t *) ((const char *) base + offset);
}

static inline bool is_imemo(uintptr_t object, unsigned kind) {
  if (!object || RB_SPECIAL_CONST_P((VALUE) object) || RB_BUILTIN_TYPE((VALUE) object) != RUBY_T_IMEMO) return false;
  return IMEMO_KIND(RBASIC((VALUE) object)->flags) == kind;
}

static inline uintptr_t method_entry_in(uintptr_t me_cref, bool may_be_svar) {
  if (may_be_svar && is_imemo(me_cref, IMEMO_SVAR)) me_cref = word_at((void *) me_cref, SVAR_CREF_OR_ME);
  return is_imemo(me_cref, IMEMO_MENT) ? me_cref : 0;
}

// The method entry a frame runs in: for a block, the one of the method around it (Ruby's
// rb_vm_frame_method_entry).
static inline uintptr_t frame_method_entry(const char *cfp) {
  const VALUE *ep = (const VALUE *) word_at(cfp, CFP_EP);
  // (Bounded: blocks nest a few levels deep, never thousands.)
  for (int depth = 0; !(ep[EP_FLAGS] & ENV_FLAG_LOCAL); depth++) {
    uintptr_t method = method_entry_in(ep[EP_ME_CREF], false);
    if (method) return method;
    ep = (const VALUE *) (ep[EP_SPECVAL] & ~(VALUE) 3);
    if (!ep || depth > 4096) return 0;
  }
  return method_entry_in(ep[EP_ME_CREF], true);
}

// Whether a frame without an iseq is a C method's (not the VM's dummy frames).
static inline bool is_c_method_frame(const char *cfp) {
  const VALUE *ep = (const VALUE *) word_at(cfp, CFP_EP);
  return ep && (ep[EP_FLAGS] & FRAME_MAGIC_MASK) == FRAME_MAGIC_CFUNC;
}

static const void *iseq_body(uintptr_t iseq) { return (const void *) word_at((void *) iseq, ISEQ_BODY); }
static int iseq_type(uintptr_t iseq) { return *(const int *) ((const char *) iseq_body(iseq) + BODY_TYPE); }
static bool is_clause(uintptr_t iseq) {
  int type = iseq_type(iseq);
  return type == ISEQ_TYPE_RESCUE || type == ISEQ_TYPE_ENSURE;
}
static unsigned method_type(uintptr_t method) { return word_at((void *) word_at((void *) method, ME_DEF), 0) & DEF_TYPE_MASK; }

// A raw frame's words, as in the Ruby 3.1 backend: the iseq (for a C frame, its nearest
// Ruby caller's, or 0), the method entry, lowest bit set for a C frame, and the pc in the
// iseq. A Ruby frame and a C frame it calls share iseq and pc but never the method entry,
// so the words are a frame's key.
#define FRAME_ISEQ(frame) ((frame)->word[0])
#define FRAME_METHOD(frame) ((frame)->word[1] & ~(uintptr_t) 1)
#define FRAME_IS_CFUNC(frame) (((frame)->word[1] & 1) != 0)
#define FRAME_PC(frame) ((const VALUE *) (frame)->word[2])

// The walk: what Thread#backtrace_locations shows, newest first (with every frame of a
// rescue or ensure clause when `all_clauses`). Only reads, so it also serves signal
// handlers.
static long walk_frames(const void *ec, contprof_raw_frame *frames, long capacity, bool all_clauses) {
  const VALUE *vm_stack = (const VALUE *) word_at(ec, EC_VM_STACK);
  const char *cfp = (const char *) word_at(ec, EC_CFP);
  // Not started yet, or already finished: no stack.
  if (!vm_stack || !cfp) return 0;
  // The oldest frame is the VM's dummy frame, which backtraces skip.
  const char *end = (const char *) (vm_stack + word_at(ec, EC_VM_STACK_SIZE)) - CFP_SIZE;
  long count = 0;
  // C frames take the file and line of their nearest Ruby caller, which comes later in
  // this newest-to-oldest walk: they wait in [pending_from, count) until it is found.
  long pending_from = -1;
  bool below_clause = false;
  for (; cfp < end; cfp += CFP_SIZE) {
    uintptr_t iseq = word_at(cfp, CFP_ISEQ), pc = word_at(cfp, CFP_PC);
    if (iseq) {
      // C blocks (ifuncs) and frames that run no instruction have no pc: not shown. (As
      // in Ruby's backtraces, an iseq and a pc make a Ruby frame; the check at load time
      // sees that they do.)
      if (!pc) continue;
      if (merges_clause_frames && !all_clauses) {
        bool hidden = below_clause;
        below_clause = is_clause(iseq);
        if (hidden) continue;
      }
      for (long i = pending_from; pending_from >= 0 && i < count && i < capacity; i++) {
        frames[i].word[0] = iseq;
        frames[i].word[2] = pc;
      }
      pending_from = -1;
      if (count < capacity) frames[count] = (contprof_raw_frame) {{iseq, frame_method_entry(cfp), pc}};
      count++;
    } else {
      if (!is_c_method_frame(cfp)) continue;
      uintptr_t method = frame_method_entry(cfp);
      if (!method) continue;
      if (count < capacity) frames[count] = (contprof_raw_frame) {{0, method | 1, 0}};
      if (pending_from < 0) pending_from = count;
      count++;
    }
  }
  return count;
}

// Whether this Ruby's backtraces show a method written in Ruby inside Ruby itself (its path
// is "<internal:...>": Integer#times, Kernel#loop...) as if it were written in C: named by
// its method, at its caller's file and line; other frames of such code are left out (Ruby
// 4.0 does). Asked of the running Ruby at load time (internal_frames_hidden_by_ruby);
// CONTPROF_VM_HIDE_INTERNAL_FRAMES=1 asks for it on a Ruby that shows them, so that the
// tests there can check it.
static bool hides_internal_frames;

static bool is_internal_path(VALUE path) {
  return RB_TYPE_P(path, T_STRING) && RSTRING_LEN(path) >= 10 && memcmp(RSTRING_PTR(path), "<internal:", 10) == 0;
}

static bool is_internal(uintptr_t iseq) {
  // rb_profile_frame_path only reads the iseq (signal handlers call this too).
  return is_internal_path(rb_profile_frame_path((VALUE) iseq));
}

// Rewrites the `kept` frames read of a stack of `count` as hides_internal_frames says;
// returns the new count.
static long hide_internal_frames(contprof_raw_frame *frames, long kept, long count) {
  long out = 0, pending_from = -1;
  for (long i = 0; i < kept; i++) {
    contprof_raw_frame frame = frames[i];
    if (!FRAME_IS_CFUNC(&frame) && is_internal(FRAME_ISEQ(&frame))) {
      uintptr_t method = FRAME_METHOD(&frame);
      if (!method) continue;
      frame = (contprof_raw_frame) {{0, method | 1, 0}};
    }
    if (FRAME_IS_CFUNC(&frame)) {
      if (pending_from < 0) pending_from = out;
    } else {
      for (long j = pending_from; pending_from >= 0 && j < out; j++) {
        frames[j].word[0] = frame.word[0];
        frames[j].word[2] = frame.word[2];
      }
      pending_from = -1;
    }
    frames[out++] = frame;
  }
  // C frames whose caller was not kept keep what the walk found, unless it is hidden.
  for (long j = pending_from; pending_from >= 0 && j < out; j++) {
    if (FRAME_ISEQ(&frames[j]) && is_internal(FRAME_ISEQ(&frames[j]))) frames[j].word[0] = frames[j].word[2] = 0;
  }
  return count - (kept - out);
}

static long walk(const void *ec, contprof_raw_frame *frames, long capacity) {
  long count = walk_frames(ec, frames, capacity, false);
  if (!hides_internal_frames) return count;
  return hide_internal_frames(frames, count < capacity ? count : capacity, count);
}

static const void *thread_struct(VALUE thread) {
  if (!RB_TYPE_P(thread, T_DATA) || !RTYPEDDATA_P(thread) || RTYPEDDATA_TYPE(thread) != thread_data_type) return NULL;
  return RTYPEDDATA_GET_DATA(thread);
}

static const void *execution_context(VALUE thread) {
  const void *th = thread_struct(thread);
  return th ? (const void *) word_at(th, THREAD_EC) : NULL;
}

long contprof_layout_read_stack(VALUE thread, contprof_raw_frame *frames, long capacity) {
  const void *ec = execution_context(thread);
  return ec ? walk(ec, frames, capacity) : 0;
}

bool contprof_layout_in_c_method(VALUE thread) {
  const void *ec = execution_context(thread);
  const char *cfp = ec ? (const char *) word_at(ec, EC_CFP) : NULL;
  return cfp && !word_at(cfp, CFP_ISEQ) && is_c_method_frame(cfp);
}

static long walk_for_capture(void *ec, contprof_raw_frame *frames, long capacity, bool *all_old) {
  long count = walk(ec, frames, capacity);
  for (long i = 0; i < count && i < capacity && *all_old; i++) *all_old = contprof_layout_frame_key_rememberable(&frames[i]);
  return count;
}

long contprof_layout_capture_stack(VALUE thread, contprof_raw_frame *frames, long capacity,
                                   contprof_stack_capture_info *info) {
  const void *ec = execution_context(thread);
  if (!ec) return -1;
  return contprof_vm_walk_between_gcs(walk_for_capture, (void *) ec, frames, capacity, info);
}

// ---------------------------------------------------------------------------------------
// Naming (holding the GVL; may allocate)

int64_t contprof_layout_frame_line(const contprof_raw_frame *frame) {
  uintptr_t iseq = FRAME_ISEQ(frame);
  if (!iseq || !FRAME_PC(frame)) return 0;
  const VALUE *encoded = (const VALUE *) word_at(iseq_body(iseq), BODY_ISEQ_ENCODED);
  ptrdiff_t position = FRAME_PC(frame) - encoded;
  // The pc points at the next instruction; step back into the current one.
  if (position > 0) position--;
  // A JIT-compiled frame's pc may be stale or unset (Ruby's own rb_profile_frames gives
  // such frames line 0): a position outside the instructions is not looked up (nothing
  // says rb_iseq_line_no bounds it).
  unsigned int size = *(const unsigned int *) ((const char *) iseq_body(iseq) + BODY_ISEQ_SIZE);
  if (position < 0 || (size_t) position >= size) return 0;
  return (int64_t) rb_iseq_line_no((const void *) iseq, (size_t) position);
}

pprof_str contprof_layout_frame_file(const contprof_raw_frame *frame) {
  VALUE iseq = (VALUE) FRAME_ISEQ(frame);
  if (!iseq) return (pprof_str) {"", 0};
  VALUE path = rb_profile_frame_absolute_path(iseq);
  return contprof_vm_string(NIL_P(path) ? rb_profile_frame_path(iseq) : path);
}

static void write_string(contprof_name_writer *w, VALUE string) {
  pprof_str s = contprof_vm_string(string);
  contprof_name_write(w, s.ptr, s.len);
}

// "Owner#method" or "Owner.method" (singleton methods of classes and modules), or just
// "method" when the owner has no name (anonymous classes, singletons of plain objects):
// an address in a name would make every such object a new function.
static void write_qualified_method(contprof_name_writer *w, uintptr_t method) {
  VALUE owner = (VALUE) word_at((void *) method, ME_OWNER);
  const char *separator = "#";
  if (RB_TYPE_P(owner, T_ICLASS)) owner = RBASIC(owner)->klass;
  if (RB_TYPE_P(owner, T_CLASS) && RB_FL_TEST_RAW(owner, RUBY_FL_SINGLETON)) {
    VALUE attached = rb_class_attached_object(owner);
    owner = (RB_TYPE_P(attached, T_CLASS) || RB_TYPE_P(attached, T_MODULE)) ? attached : Qnil;
    separator = ".";
  }
  VALUE path = NIL_P(owner) ? Qnil : rb_class_path_cached(owner);
  if (RB_TYPE_P(path, T_STRING) && !(RSTRING_LEN(path) >= 2 && memcmp(RSTRING_PTR(path), "#<", 2) == 0)) {
    write_string(w, path);
    contprof_name_write(w, separator, 1);
  }
  VALUE name = rb_id2str((ID) word_at((void *) word_at((void *) method, ME_DEF), DEF_ORIGINAL_ID));
  if (name) {
    write_string(w, name);
  } else {
    contprof_name_write(w, "?", 1);
  }
}

// Whether `method` is the method whose body `iseq` belongs to (the iseq itself, or a
// block, rescue or ensure clause inside it).
static bool method_owns_iseq(uintptr_t method, uintptr_t iseq) {
  if (!method || method_type(method) != METHOD_TYPE_ISEQ) return false;
  uintptr_t method_iseq = word_at((void *) word_at((void *) method, ME_DEF), DEF_ISEQ);
  uintptr_t local_iseq = word_at(iseq_body(iseq), BODY_LOCAL_ISEQ);
  return method_iseq && local_iseq && iseq_body(method_iseq) == iseq_body(local_iseq);
}

// The iseq whose name a frame takes: itself, or on Ruby 3.4 for a clause or eval'd code
// the nearest enclosing iseq that is neither.
static uintptr_t named_iseq(uintptr_t iseq) {
  for (int depth = 0; merges_clause_frames && depth < 256; depth++) {
    int type = iseq_type(iseq);
    uintptr_t parent = word_at(iseq_body(iseq), BODY_PARENT_ISEQ);
    if ((type != ISEQ_TYPE_RESCUE && type != ISEQ_TYPE_ENSURE && type != ISEQ_TYPE_EVAL) || !parent) break;
    iseq = parent;
  }
  return iseq;
}

pprof_str contprof_layout_frame_name(const contprof_raw_frame *frame, char *buffer, size_t buffer_size) {
  contprof_name_writer w = {.buffer = buffer, .size = buffer_size, .len = 0};
  uintptr_t method = FRAME_METHOD(frame);
  if (FRAME_IS_CFUNC(frame)) {
    write_qualified_method(&w, method);
    return (pprof_str) {buffer, w.len};
  }
  uintptr_t iseq = named_iseq(FRAME_ISEQ(frame));
  pprof_str full = contprof_vm_string(rb_profile_frame_label((VALUE) iseq));
  if (!method_owns_iseq(method, iseq)) return full; // <main>, <class:Foo>, define_method bodies...
  if (iseq_type(iseq) == ISEQ_TYPE_METHOD) {
    write_qualified_method(&w, method);
    return (pprof_str) {buffer, w.len};
  }
  // A block, rescue or ensure inside a method: its label ends with the method's name
  // ("block (2 levels) in bar"), which becomes the qualified name.
  pprof_str base = contprof_vm_string(rb_profile_frame_base_label((VALUE) iseq));
  if (base.len > full.len || memcmp(full.ptr + full.len - base.len, base.ptr, base.len) != 0) return full;
  contprof_name_write(&w, full.ptr, full.len - base.len);
  write_qualified_method(&w, method);
  return (pprof_str) {buffer, w.len};
}

bool contprof_layout_frame_key_rememberable(const contprof_raw_frame *frame) {
  uintptr_t iseq = FRAME_ISEQ(frame), method = FRAME_METHOD(frame);
  if (!iseq && !method) return false;
  if (iseq && !RB_OBJ_PROMOTED_RAW((VALUE) iseq)) return false;
  return !method || RB_OBJ_PROMOTED_RAW((VALUE) method);
}

// ---------------------------------------------------------------------------------------
// The check

#define CHECK_FRAMES 512

static bool fail(char *why_not, size_t size, const char *what) {
  snprintf(why_not, size, "the VM's structures are not laid out as expected (%s)", what);
  return false;
}

// The calling thread's stack read both ways must agree.
static bool offsets_hold(char *why_not, size_t size) {
  VALUE current = rb_thread_current();
  if (!RB_TYPE_P(current, T_DATA) || !RTYPEDDATA_P(current)) return fail(why_not, size, "Thread is not typed data");
  thread_data_type = RTYPEDDATA_TYPE(current);
  const void *th = thread_struct(current);
  if (!th || word_at(th, THREAD_SELF) != current) return fail(why_not, size, "thread: self");
  const void *ec = (const void *) word_at(th, THREAD_EC);
  if (!ec || (const void *) word_at(ec, EC_THREAD) != th) return fail(why_not, size, "thread: execution context");
  const VALUE *vm_stack = (const VALUE *) word_at(ec, EC_VM_STACK);
  uintptr_t stack_size = word_at(ec, EC_VM_STACK_SIZE);
  const char *cfp = (const char *) word_at(ec, EC_CFP);
  if (!vm_stack || stack_size == 0 || stack_size > (1u << 28) || cfp < (const char *) vm_stack ||
      cfp >= (const char *) (vm_stack + stack_size) || ((const char *) (vm_stack + stack_size) - cfp) % CFP_SIZE != 0) {
    return fail(why_not, size, "execution context: stack");
  }

  // Both readers, on the same stack (this function's caller's): rb_profile_frames gives a
  // method frame's method entry, and any other frame's iseq (and hides no clause).
  static contprof_raw_frame frames[CHECK_FRAMES];
  static VALUE objects[CHECK_FRAMES];
  static int lines[CHECK_FRAMES];
  long count = walk_frames(ec, frames, CHECK_FRAMES, true);
  long expected = rb_profile_frames(0, CHECK_FRAMES, objects, lines);
  if (count != expected || count > CHECK_FRAMES) return fail(why_not, size, "control frames: frame count");
  long ruby_frames = 0;
  for (long i = 0; i < count; i++) {
    const contprof_raw_frame *frame = &frames[i];
    uintptr_t method = FRAME_METHOD(frame);
    if (FRAME_IS_CFUNC(frame)) {
      if (objects[i] != (VALUE) method) return fail(why_not, size, "control frames: C method entry");
      continue;
    }
    if (!is_imemo(FRAME_ISEQ(frame), IMEMO_ISEQ)) return fail(why_not, size, "control frames: iseq");
    bool method_frame = method && method_type(method) == METHOD_TYPE_ISEQ;
    if (objects[i] != (method_frame ? (VALUE) method : (VALUE) FRAME_ISEQ(frame))) {
      return fail(why_not, size, "control frames: iseq or method entry");
    }
    if (lines[i] > 0 && contprof_layout_frame_line(frame) != lines[i]) return fail(why_not, size, "iseq: line");
    uintptr_t iseq = FRAME_ISEQ(frame), parent = word_at(iseq_body(iseq), BODY_PARENT_ISEQ);
    if (parent && !is_imemo(parent, IMEMO_ISEQ)) return fail(why_not, size, "iseq: parent");
    if (method_frame) {
      uintptr_t method_iseq = word_at((void *) word_at((void *) method, ME_DEF), DEF_ISEQ);
      if (!method_owns_iseq(method, iseq)) return fail(why_not, size, "iseq: method body");
      if ((method_iseq == iseq) != (iseq_type(iseq) == ISEQ_TYPE_METHOD)) return fail(why_not, size, "iseq: type");
      VALUE name = rb_id2str((ID) word_at((void *) word_at((void *) method, ME_DEF), DEF_ORIGINAL_ID));
      if (!name || !RTEST(rb_str_equal(name, rb_profile_frame_method_name((VALUE) method)))) {
        return fail(why_not, size, "method entry: name");
      }
      VALUE owner = (VALUE) word_at((void *) method, ME_OWNER);
      if (!RB_TYPE_P(owner, T_CLASS) && !RB_TYPE_P(owner, T_MODULE)) return fail(why_not, size, "method entry: owner");
    }
    ruby_frames++;
  }
  if (ruby_frames == 0) return fail(why_not, size, "no Ruby frame to check them against");
  return true;
}

// A JIT that keeps a frame's iseq and pc elsewhere than in its control frame would have the
// walk read stale ones, and the offsets check above, run before anything is compiled,
// cannot see it. ZJIT's "lightweight frames" do, from Ruby 4.1; up to 4.0 ZJIT writes them
// in every frame, as the interpreter and YJIT do. No public header or symbol says which a
// JIT does, so the API version is the narrowest rule there is: a Ruby after 4.0 that has
// ZJIT (enabled now or enabled later by the program) is read through the public API.
static bool jit_may_leave_frames_stale(void) {
#if RUBY_API_VERSION_MAJOR > 4 || (RUBY_API_VERSION_MAJOR == 4 && RUBY_API_VERSION_MINOR >= 1)
  ID ruby_vm = rb_intern("RubyVM");
  if (!rb_const_defined(rb_cObject, ruby_vm)) return false;
  return rb_const_defined_at(rb_const_get(rb_cObject, ruby_vm), rb_intern("ZJIT"));
#else
  return false;
#endif
}

// ---------------------------------------------------------------------------------------
// How this Ruby's backtraces look, asked of it once its offsets are proven: the walk shows
// what Thread#backtrace_locations shows, and Rubies differ (see merges_clause_frames and
// hides_internal_frames).

static char backtrace_note[120];

const char *contprof_layout_note(void) { return backtrace_note; }

// From inside an ensure clause, whether the backtrace is as deep as outside it: a clause's
// frame merged with the code around it (or no clause frame at all) leaves it so. The clause
// runs because of a throw, not an exception, so nothing reaches TracePoint(:raise) or $DEBUG.
static const char clause_probe[] =
    "merged = nil\n"
    "catch(:contprof_probe) do\n"
    "  depth = caller_locations(0).size\n"
    "  begin\n"
    "    throw :contprof_probe\n"
    "  ensure\n"
    "    merged = caller_locations(0).size == depth\n"
    "  end\n"
    "end\n"
    "merged\n";

// What the walk and Thread#backtrace_locations see of Kernel#tap's frame from inside its
// block: tap is written in Ruby inside Ruby ("<internal:kernel>") on the Rubies this reader
// knows.
struct tap_frame_seen {
  bool internal_iseq; // the walk found tap's frame, and its iseq is <internal:...>
  bool shown; // the backtrace's frame beneath this block is tap's
  bool shown_internal; // and its path is <internal:...>
};

static VALUE look_at_tap_frame(RB_BLOCK_CALL_FUNC_ARGLIST(CONTPROF_UNUSED yielded, seen_address)) {
  struct tap_frame_seen *seen = (struct tap_frame_seen *) seen_address;
  // This C block has no frame of its own in either view; the one beneath it is tap's.
  contprof_raw_frame frame;
  long count = walk_frames(execution_context(rb_thread_current()), &frame, 1, true);
  seen->internal_iseq = count > 0 && !FRAME_IS_CFUNC(&frame) && is_internal(FRAME_ISEQ(&frame));
  // (Level 0 is Thread#backtrace_locations itself.)
  VALUE shown = rb_funcall(rb_thread_current(), rb_intern("backtrace_locations"), 2, INT2FIX(1), INT2FIX(1));
  if (!RB_TYPE_P(shown, T_ARRAY) || RARRAY_LEN(shown) != 1) return Qnil;
  VALUE location = RARRAY_AREF(shown, 0);
  VALUE name = rb_funcall(location, rb_intern("base_label"), 0);
  seen->shown = RB_TYPE_P(name, T_STRING) && RSTRING_LEN(name) == 3 && memcmp(RSTRING_PTR(name), "tap", 3) == 0;
  seen->shown_internal = is_internal_path(rb_funcall(location, rb_intern("path"), 0));
  return Qnil;
}

static VALUE call_tap(VALUE seen_address) {
  return rb_block_call(rb_cObject, rb_intern("tap"), 0, NULL, look_at_tap_frame, seen_address);
}

static bool cannot_tell(char *why_not, size_t size, const char *what) {
  snprintf(why_not, size, "could not tell how this Ruby's backtraces show %s", what);
  return false;
}

static bool ask_how_backtraces_look(char *why_not, size_t size) {
  int state = 0;
  VALUE merged = rb_eval_string_protect(clause_probe, &state);
  if (state || (merged != Qtrue && merged != Qfalse)) {
    rb_set_errinfo(Qnil);
    return cannot_tell(why_not, size, "rescue and ensure clauses");
  }
  merges_clause_frames = merged == Qtrue;

  struct tap_frame_seen seen = {false, false, false};
  rb_protect(call_tap, (VALUE) &seen, &state);
  if (state || !seen.shown) {
    rb_set_errinfo(Qnil);
    return cannot_tell(why_not, size, "methods written in Ruby inside Ruby");
  }
  // A tap written in C says nothing either way: then nothing is hidden.
  hides_internal_frames = seen.internal_iseq && !seen.shown_internal;
  return true;
}

// ---------------------------------------------------------------------------------------

bool contprof_layout_check(char *why_not, size_t size) {
  if (jit_may_leave_frames_stale()) {
    snprintf(why_not, size, "this Ruby's ZJIT may keep a frame's iseq and pc outside its control frame");
    return false;
  }
  if (!offsets_hold(why_not, size) || !ask_how_backtraces_look(why_not, size)) return false;
  const char *hide = getenv("CONTPROF_VM_HIDE_INTERNAL_FRAMES");
  if (hide && strcmp(hide, "1") == 0) hides_internal_frames = true;
  snprintf(backtrace_note, sizeof(backtrace_note), "backtraces: clause frames %s, <internal:> frames %s",
           merges_clause_frames ? "merged into their code" : "apart", hides_internal_frames ? "hidden" : "shown");
  return true;
}
