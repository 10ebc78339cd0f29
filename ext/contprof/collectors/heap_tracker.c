// Live-heap profiling (see heap_tracker.h).
//
// ## Which objects are alive
//
// A tracked object is referenced by its record without being marked: the record must
// never keep it alive, and nothing that follows it may call Ruby (records are added inside
// a sampling round, which calls no Ruby method: see sampling/rounds.c). The GC itself says
// when one dies, through a tracepoint on its internal events, run inside each GC:
//
// - Ruby 3.3 (CONTPROF_HEAP_BY_MARKS): at RUBY_INTERNAL_EVENT_GC_END_MARK, marking is over
//   and nothing has been swept or moved yet: a record whose object is not marked
//   (rb_objspace_marked_object_p, exported for the objspace extension) is of an object
//   about to be freed, and goes. In a minor GC, old objects count as marked.
// - Ruby 3.4 and later (CONTPROF_HEAP_BY_SWEEP): no function tells marks any more, but
//   rb_objspace_garbage_object_p tells an object the sweep will free (unmarked on a page
//   not swept yet) or has freed (its slot empty), once rb_gc_pointer_to_heap_p says its
//   page is still in the heap (the sweep gives emptied pages back). They are asked at the
//   GC_EXIT that ends the step in which marking finished (GC_END_MARK says which): the
//   mutator has not run since, so no freed slot can hold a new object yet.
//
// Objects move when the GC compacts: the collector's compaction callback moves the records
// along (contprof_heap_tracker_update_references, called only when the GC compacts). On
// 3.4+, compaction may move a live object into the slot of a tracked object that died in
// the same GC, before the GC_EXIT check: after a compaction, a record whose object's class
// is not the one it was allocated with is taken for such a slot and dropped; one of the
// same class cannot be told apart (counted in its place until it dies). Compactions are
// rare (GC.compact, Process.warmup, GC.auto_compact).
//
// Should the GC ever not report a GC (another GC implementation, a Ruby whose events
// changed), records could outlive their objects: every GC that starts must end a marking
// the tracepoint saw. When more GCs ran than markings were seen, tracking stops for good,
// with the reason in the stats (the profiler logs it as a gap).
//
// ## Cost
//
// A check is a function call or two per record (Ruby 3.4's page lookup is the dearer: tens
// of nanoseconds). Old objects die in major GCs only, so a minor GC checks the records of
// young objects alone (a list of them; an object found promoted leaves it), and a major GC
// checks them all (10,000 at most: a fraction of a major GC's own time).
//
// ## Stacks
//
// A profile's strings and locations are its own and go with it at every serialization,
// and raw frames only stay valid until the next GC; a tracked object may live for hours.
// So each record keeps its stack as names: (function, file, line) per frame, the strings
// interned in a table of the tracker's (names of code: their number is bounded by the
// program's code, and capped here). Records are capped too (CONTPROF_HEAP_MAX_TRACKED):
// when the table is full of live objects, new samples are not tracked, and stats say how
// many. What a round or a GC does here allocates with plain malloc: nothing the GC counts,
// nothing that raises.
#include "collectors/heap_tracker.h"

#include <stdlib.h>
#include <string.h>

#include "pprof/pprof_util.h"
#include "recorder/stack_recorder.h"
#include "ruby_helpers.h"
#include "vm/vm.h"

#include <ruby/debug.h>

#define MAX_STRINGS 65536
#define MAX_STRING_BYTES (8 * 1024 * 1024)

#if defined(HAVE_RB_OBJSPACE_MARKED_OBJECT_P)
#define CONTPROF_HEAP_BY_MARKS
int rb_objspace_marked_object_p(VALUE object); // exported for ext/objspace, declared in Ruby's internal headers
#elif defined(HAVE_RB_OBJSPACE_GARBAGE_OBJECT_P) && defined(HAVE_RB_GC_POINTER_TO_HEAP_P)
#define CONTPROF_HEAP_BY_SWEEP
// Exported for ext/objspace and for GC implementations, declared in Ruby's internal headers.
int rb_objspace_garbage_object_p(VALUE object);
bool rb_gc_pointer_to_heap_p(VALUE object);
#endif

typedef struct {
  uint32_t function, file; // string ids
  int64_t line;
} heap_frame;

typedef struct {
  VALUE object; // not marked (see "Which objects are alive")
  VALUE klass; // class_of(object) when tracked (see compaction, above)
  heap_frame *frames;
  uint32_t frame_count;
  uint32_t class_name; // string id
  uint64_t weight;
  uint32_t samples; // the allocation samples it stands for (see contprof_allocation_sample)
  size_t gc_count; // rb_gc_count() when allocated
  uint32_t young_position; // in the young list, while its object is young
  bool in_use;
  bool old; // its object was promoted (old objects die in major GCs only)
} heap_record;

typedef struct {
  char *ptr;
  size_t len;
  uint64_t hash;
} heap_string;

struct contprof_heap_tracker {
  heap_record *records; // CONTPROF_HEAP_MAX_TRACKED
  uint32_t *free_slots; // indices of the records not in use (a stack)
  uint32_t free_count;
  // Indices of the records whose objects are young: a minor GC checks these only (see
  // "Cost"). Usually the objects sampled in the last few GCs.
  uint32_t *young;
  uint32_t young_count;
  bool major; // the GC being checked is a major one (told at its end of marking)
  uint64_t tracked, dropped, live_recorded, died, replaced;
  size_t frame_bytes;
  // What the GC reported: markings it finished since tracking began (and the GC count
  // then), a check due at the next GC_EXIT (3.4+), the compactions so far, and why
  // tracking stopped (NULL: it runs).
  size_t gcs_at_start, markings_seen;
  bool check_due;
  bool moved; // a compaction moved records' objects since the last check
  const char *stopped_because;
  contprof_heap_tracker *next; // in the list the GC hook walks
  // Interned strings: an array, and an open-addressing index into it (id + 1; 0: empty).
  heap_string *strings;
  uint32_t string_count, string_capacity;
  uint32_t *index;
  uint32_t index_capacity; // a power of two, at least twice string_count
  size_t string_bytes;
};

const char *contprof_heap_tracker_unsupported_reason(void) {
#if defined(CONTPROF_HEAP_BY_MARKS) || defined(CONTPROF_HEAP_BY_SWEEP)
  return NULL;
#else
  return "this Ruby exports neither rb_objspace_marked_object_p (Ruby 3.3) nor rb_objspace_garbage_object_p (Ruby "
         "3.4 and later), which live-heap tracking asks the GC with";
#endif
}

// The class an object was made as (its singleton class, should it get one, aside), or 0
// for the VM's internal objects, whose class word is something else.
static VALUE class_of(VALUE object) {
  int type = RB_BUILTIN_TYPE(object);
  VALUE klass = RBASIC(object)->klass;
  if (type == T_IMEMO || type == T_NODE || type == T_NONE || type == T_MOVED || type == T_ZOMBIE || !klass) return 0;
  return rb_class_real(klass);
}

// ---------------------------------------------------------------------------------------
// The GC's side: one tracepoint for the process, walking the live trackers (usually one)

static VALUE gc_hook = Qnil;
static contprof_heap_tracker *trackers; // those alive (linked by next); only touched holding the GVL

static void leave_young_list(contprof_heap_tracker *tracker, heap_record *record) {
  uint32_t last = tracker->young[--tracker->young_count];
  tracker->young[record->young_position] = last;
  tracker->records[last].young_position = record->young_position;
  record->old = true;
}

static void forget(contprof_heap_tracker *tracker, heap_record *record) {
  if (!record->old) leave_young_list(tracker, record);
  tracker->frame_bytes -= record->frame_count * sizeof(heap_frame);
  free(record->frames);
  memset(record, 0, sizeof(*record));
  tracker->tracked--;
  tracker->free_slots[tracker->free_count++] = (uint32_t) (record - tracker->records);
}

static void forget_all(contprof_heap_tracker *tracker) {
  for (long i = 0; i < CONTPROF_HEAP_MAX_TRACKED; i++) {
    if (tracker->records[i].in_use) forget(tracker, &tracker->records[i]);
  }
}

static void stop_tracking(contprof_heap_tracker *tracker, const char *reason) {
  if (tracker->stopped_because) return;
  tracker->stopped_because = reason;
  forget_all(tracker);
}

#if defined(CONTPROF_HEAP_BY_MARKS) || defined(CONTPROF_HEAP_BY_SWEEP)
static bool about_to_be_freed(VALUE object) {
#ifdef CONTPROF_HEAP_BY_MARKS
  return !rb_objspace_marked_object_p(object);
#else
  // (The sweep may have given an emptied page back: only a slot still in the heap is read.)
  return !rb_gc_pointer_to_heap_p(object) || rb_objspace_garbage_object_p(object);
#endif
}

// Drops the record if its object is dead (or replaced: see compaction, above); else
// notes it old once promoted.
static void check_record(contprof_heap_tracker *tracker, heap_record *record, bool compacted) {
  if (about_to_be_freed(record->object)) {
    forget(tracker, record);
    tracker->died++;
  } else if (compacted && class_of(record->object) != record->klass) {
    forget(tracker, record); // its slot holds an object compaction moved there
    tracker->replaced++;
  } else if (!record->old && RB_OBJ_PROMOTED_RAW(record->object)) {
    leave_young_list(tracker, record);
  }
}

// Drops the records of dead objects (inside a GC, where its events allow: see above).
static void check_records(contprof_heap_tracker *tracker) {
  bool compacted = tracker->moved;
  tracker->moved = false;
  if (tracker->major || compacted) {
    for (long i = 0; i < CONTPROF_HEAP_MAX_TRACKED && tracker->tracked > 0; i++) {
      if (tracker->records[i].in_use) check_record(tracker, &tracker->records[i], compacted);
    }
    return;
  }
  // (Backwards: a record leaving the list takes the last one's place, already checked.)
  for (uint32_t i = tracker->young_count; i > 0; i--) check_record(tracker, &tracker->records[tracker->young[i - 1]], false);
}

static void on_gc_event(VALUE tracepoint, CONTPROF_UNUSED void *data) {
  rb_event_flag_t event = rb_tracearg_event_flag(rb_tracearg_from_tracepoint(tracepoint));
  for (contprof_heap_tracker *tracker = trackers; tracker; tracker = tracker->next) {
    if (tracker->stopped_because) continue;
    if (event == RUBY_INTERNAL_EVENT_GC_END_MARK) {
      tracker->markings_seen++;
      tracker->major = contprof_vm_gc_major_reason(contprof_vm_gc_moment())[0] != '\0';
#ifdef CONTPROF_HEAP_BY_MARKS
      check_records(tracker);
#else
      tracker->check_due = true;
#endif
    } else if (tracker->check_due) { // GC_EXIT
      tracker->check_due = false;
      check_records(tracker);
    }
  }
}

static void start_gc_hook(void) {
  if (!NIL_P(gc_hook)) return;
  rb_event_flag_t events = RUBY_INTERNAL_EVENT_GC_END_MARK;
#ifdef CONTPROF_HEAP_BY_SWEEP
  events |= RUBY_INTERNAL_EVENT_GC_EXIT;
#endif
  gc_hook = rb_tracepoint_new(0, events, on_gc_event, NULL);
  rb_gc_register_address(&gc_hook); // (from the main Ractor: the hook lives as long as the process)
  rb_tracepoint_enable(gc_hook);
}
#else
static void start_gc_hook(void) {}
#endif

// Every GC that started must have ended a marking the hook saw (one may be in progress).
static bool gcs_all_seen(contprof_heap_tracker *tracker) {
  if (tracker->stopped_because) return false;
  size_t gcs = rb_gc_count() - tracker->gcs_at_start;
  if (gcs <= tracker->markings_seen + 1) return true;
  stop_tracking(tracker, "the GC ran collections its hooks did not report, so tracked objects could not be "
                         "followed: live-heap tracking stopped");
  return false;
}

// ---------------------------------------------------------------------------------------
// The tracker

contprof_heap_tracker *contprof_heap_tracker_new(void) {
  if (contprof_heap_tracker_unsupported_reason()) return NULL;
  contprof_heap_tracker *tracker = ruby_xcalloc(1, sizeof(*tracker));
  tracker->records = ruby_xcalloc(CONTPROF_HEAP_MAX_TRACKED, sizeof(heap_record));
  tracker->free_slots = ruby_xcalloc(CONTPROF_HEAP_MAX_TRACKED, sizeof(uint32_t));
  tracker->young = ruby_xcalloc(CONTPROF_HEAP_MAX_TRACKED, sizeof(uint32_t));
  for (uint32_t i = 0; i < CONTPROF_HEAP_MAX_TRACKED; i++) tracker->free_slots[i] = CONTPROF_HEAP_MAX_TRACKED - 1 - i;
  tracker->free_count = CONTPROF_HEAP_MAX_TRACKED;
  start_gc_hook();
  tracker->gcs_at_start = rb_gc_count();
  tracker->next = trackers;
  trackers = tracker;
  return tracker;
}

void contprof_heap_tracker_free(contprof_heap_tracker *tracker) {
  if (!tracker) return;
  for (contprof_heap_tracker **link = &trackers; *link; link = &(*link)->next) {
    if (*link == tracker) {
      *link = tracker->next;
      break;
    }
  }
  for (long i = 0; i < CONTPROF_HEAP_MAX_TRACKED; i++) free(tracker->records[i].frames);
  for (uint32_t i = 0; i < tracker->string_count; i++) free(tracker->strings[i].ptr);
  free(tracker->strings);
  free(tracker->index);
  ruby_xfree(tracker->records);
  ruby_xfree(tracker->free_slots);
  ruby_xfree(tracker->young);
  ruby_xfree(tracker);
}

void contprof_heap_tracker_update_references(contprof_heap_tracker *tracker) {
  if (!tracker) return;
  tracker->moved = true;
  for (long i = 0; i < CONTPROF_HEAP_MAX_TRACKED; i++) {
    heap_record *record = &tracker->records[i];
    if (!record->in_use) continue;
    record->object = rb_gc_location(record->object);
    record->klass = rb_gc_location(record->klass);
  }
}

contprof_heap_tracker_stats contprof_heap_tracker_stats_of(const contprof_heap_tracker *tracker) {
  if (!tracker) return (contprof_heap_tracker_stats) {0};
  size_t bytes = sizeof(*tracker) + CONTPROF_HEAP_MAX_TRACKED * (sizeof(heap_record) + 2 * sizeof(uint32_t)) +
                 tracker->frame_bytes +
                 tracker->string_bytes + tracker->string_capacity * sizeof(heap_string) +
                 tracker->index_capacity * sizeof(uint32_t);
  return (contprof_heap_tracker_stats) {.tracked = tracker->tracked, .dropped = tracker->dropped,
                                        .live_recorded = tracker->live_recorded, .died = tracker->died,
                                        .replaced = tracker->replaced, .bytes = bytes,
                                        .stopped_because = tracker->stopped_because};
}

// ---------------------------------------------------------------------------------------
// Strings

static uint64_t hash_bytes(const char *ptr, size_t len) {
  uint64_t hash = 1469598103934665603ULL; // FNV-1a
  for (size_t i = 0; i < len; i++) hash = (hash ^ (unsigned char) ptr[i]) * 1099511628211ULL;
  return hash;
}

static bool grow_index(contprof_heap_tracker *tracker) {
  uint32_t capacity = tracker->index_capacity ? tracker->index_capacity * 2 : 1024;
  uint32_t *index = calloc(capacity, sizeof(uint32_t));
  if (!index) return false;
  for (uint32_t id = 0; id < tracker->string_count; id++) {
    uint32_t slot = (uint32_t) tracker->strings[id].hash & (capacity - 1);
    while (index[slot]) slot = (slot + 1) & (capacity - 1);
    index[slot] = id + 1;
  }
  free(tracker->index);
  tracker->index = index;
  tracker->index_capacity = capacity;
  return true;
}

// The id of the string, interned; UINT32_MAX when the table is full or memory ran out.
static uint32_t intern(contprof_heap_tracker *tracker, pprof_str string) {
  uint64_t hash = hash_bytes(string.ptr, string.len);
  if (tracker->index_capacity) {
    for (uint32_t slot = (uint32_t) hash & (tracker->index_capacity - 1);; slot = (slot + 1) & (tracker->index_capacity - 1)) {
      uint32_t entry = tracker->index[slot];
      if (!entry) break;
      const heap_string *known = &tracker->strings[entry - 1];
      if (known->hash == hash && known->len == string.len && memcmp(known->ptr, string.ptr, string.len) == 0) {
        return entry - 1;
      }
    }
  }
  if (tracker->string_count >= MAX_STRINGS || tracker->string_bytes + string.len > MAX_STRING_BYTES) return UINT32_MAX;
  if ((tracker->string_count + 1) * 2 > tracker->index_capacity && !grow_index(tracker)) return UINT32_MAX;
  if (tracker->string_count == tracker->string_capacity) {
    uint32_t capacity = tracker->string_capacity ? tracker->string_capacity * 2 : 256;
    heap_string *grown = realloc(tracker->strings, capacity * sizeof(heap_string));
    if (!grown) return UINT32_MAX;
    tracker->strings = grown;
    tracker->string_capacity = capacity;
  }
  char *copy = malloc(string.len + 1);
  if (!copy) return UINT32_MAX;
  if (string.len) memcpy(copy, string.ptr, string.len);
  copy[string.len] = '\0';
  uint32_t id = tracker->string_count++;
  tracker->strings[id] = (heap_string) {.ptr = copy, .len = string.len, .hash = hash};
  tracker->string_bytes += string.len + 1;
  uint32_t slot = (uint32_t) hash & (tracker->index_capacity - 1);
  while (tracker->index[slot]) slot = (slot + 1) & (tracker->index_capacity - 1);
  tracker->index[slot] = id + 1;
  return id;
}

static pprof_str string_of(const contprof_heap_tracker *tracker, uint32_t id) {
  return (pprof_str) {tracker->strings[id].ptr, tracker->strings[id].len};
}

// ---------------------------------------------------------------------------------------
// Tracking (in a sampling round) and recording (at a flush)

typedef struct {
  contprof_heap_tracker *tracker;
  heap_frame *frames;
  uint32_t count, capacity;
  bool full;
} frame_copy;

PPROF_MUST_CHECK
static pprof_status copy_frame(void *context, const pprof_frame *frame, CONTPROF_UNUSED pprof_error *error) {
  frame_copy *copy = context;
  if (copy->full || copy->count == copy->capacity) return PPROF_OK;
  uint32_t function = intern(copy->tracker, frame->function_name);
  uint32_t file = intern(copy->tracker, frame->file_name);
  if (function == UINT32_MAX || file == UINT32_MAX) {
    copy->full = true;
    return PPROF_OK;
  }
  copy->frames[copy->count++] = (heap_frame) {.function = function, .file = file, .line = frame->line};
  return PPROF_OK;
}

pprof_status contprof_heap_tracker_track(contprof_heap_tracker *tracker, contprof_stack_sampler *sampler, VALUE object,
                                         const char *class_name, size_t class_name_len, uint64_t weight,
                                         uint32_t samples, pprof_error *error) {
  if (!gcs_all_seen(tracker) || tracker->free_count == 0) { // (dead objects' records go at each GC)
    tracker->dropped++;
    return PPROF_OK;
  }
  uint32_t class_id = intern(tracker, (pprof_str) {class_name, class_name_len});
  long depth = contprof_stack_frame_count(sampler);
  frame_copy copy = {.tracker = tracker, .capacity = (uint32_t) (depth > 0 ? depth : 1)};
  copy.frames = malloc(copy.capacity * sizeof(heap_frame));
  if (!copy.frames || class_id == UINT32_MAX) {
    free(copy.frames);
    tracker->dropped++;
    return PPROF_OK;
  }
  pprof_status status = contprof_stack_each_frame(sampler, copy_frame, &copy, error);
  if (status != PPROF_OK || copy.full) {
    free(copy.frames);
    tracker->dropped++;
    return status;
  }
  // The record is complete before it is in use: a GC (and its hook) may run at any
  // allocation of the round's.
  uint32_t index = tracker->free_slots[tracker->free_count - 1];
  heap_record *record = &tracker->records[index];
  *record = (heap_record) {.object = object, .klass = class_of(object), .frames = copy.frames,
                           .frame_count = copy.count, .class_name = class_id, .weight = weight, .samples = samples,
                           .gc_count = rb_gc_count(), .young_position = tracker->young_count, .in_use = true};
  tracker->young[tracker->young_count++] = index;
  tracker->free_count--;
  tracker->frame_bytes += copy.count * sizeof(heap_frame);
  tracker->tracked++;
  return PPROF_OK;
}

pprof_status contprof_heap_tracker_record_live(contprof_heap_tracker *tracker, VALUE recorder, int samples_index,
                                               int size_index, int unscaled_index, size_t value_count,
                                               pprof_error *error) {
  tracker->live_recorded = 0;
  if (!gcs_all_seen(tracker)) return PPROF_OK;
  pprof_frame *frames = NULL;
  size_t frames_capacity = 0;
  pprof_status status = PPROF_OK;
  size_t gc_now = rb_gc_count();
  for (long i = 0; i < CONTPROF_HEAP_MAX_TRACKED && status == PPROF_OK; i++) {
    heap_record *record = &tracker->records[i];
    if (!record->in_use) continue;
    if (record->frame_count > frames_capacity) {
      pprof_frame *grown = realloc(frames, record->frame_count * sizeof(pprof_frame));
      if (!grown) {
        status = pprof_fail(error, PPROF_ERR_NO_MEMORY, "out of memory recording the live heap");
        break;
      }
      frames = grown;
      frames_capacity = record->frame_count;
    }
    for (uint32_t f = 0; f < record->frame_count; f++) {
      frames[f] = (pprof_frame) {.function_name = string_of(tracker, record->frames[f].function),
                                 .file_name = string_of(tracker, record->frames[f].file),
                                 .line = record->frames[f].line};
    }
    int64_t values[PPROF_MAX_SAMPLE_TYPES] = {0};
    int64_t weight = pprof_saturated_int64(record->weight);
    if (samples_index >= 0) values[samples_index] = weight;
    if (size_index >= 0) values[size_index] = pprof_saturated_product(weight, (int64_t) contprof_vm_object_size(record->object));
    if (unscaled_index >= 0) values[unscaled_index] = record->samples;
    pprof_label labels[2] = {
      {.key = PPROF_STR("allocation class"), .str = string_of(tracker, record->class_name)},
      {.key = PPROF_STR("gc age"), .num = (int64_t) (gc_now - record->gc_count)},
    };
    pprof_sample sample = {.frames = frames, .frame_count = record->frame_count, .values = values,
                           .value_count = value_count, .labels = labels, .label_count = 2};
    status = contprof_recorder_record(recorder, &sample, error);
    if (status == PPROF_OK) tracker->live_recorded++;
  }
  free(frames);
  return status;
}
