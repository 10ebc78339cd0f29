// Live-heap profiling (see heap_tracker.h).
//
// ## Which objects are alive
//
// A tracked object is held in an ObjectSpace::WeakMap, under a key of its own (an
// Integer): the VM clears the entry when the object is collected, keeps it right when
// compaction moves the object, and never keeps the object alive for it. Asking the map is
// the only way Contprof ever gets back to a tracked object: not ObjectSpace._id2ref
// (deprecated in Ruby 4.0, gone in 4.1, and it may answer with an unrelated object that
// took the slot), not object_id (unsafe to take inside an allocation on newer Rubies), not
// an address kept aside (the slot may hold another object by then).
//
// ## Stacks
//
// A profile's strings and locations are its own and go with it at every serialization,
// and raw frames only stay valid until the next GC; a tracked object may live for hours.
// So each record keeps its stack as names: (function, file, line) per frame, the strings
// interned in a table of the tracker's (names of code: their number is bounded by the
// program's code, and capped here). Records are capped too (CONTPROF_HEAP_MAX_TRACKED):
// when the table is full of live objects, new samples are not tracked, and stats say how
// many.
#include "collectors/heap_tracker.h"

#include <stdlib.h>
#include <string.h>

#include "pprof/pprof_util.h"
#include "recorder/stack_recorder.h"
#include "ruby_helpers.h"

#define MAX_STRINGS 65536
#define MAX_STRING_BYTES (8 * 1024 * 1024)

typedef struct {
  uint32_t function, file; // string ids
  int64_t line;
} heap_frame;

typedef struct {
  bool in_use;
  long key;
  heap_frame *frames;
  uint32_t frame_count;
  uint32_t class_name; // string id
  uint64_t weight;
  size_t gc_count; // rb_gc_count() when allocated
} heap_record;

typedef struct {
  char *ptr;
  size_t len;
  uint64_t hash;
} heap_string;

struct contprof_heap_tracker {
  VALUE weak; // ObjectSpace::WeakMap: key => object
  long next_key;
  heap_record *records; // CONTPROF_HEAP_MAX_TRACKED
  uint32_t *free_slots; // indices of the records not in use (a stack)
  uint32_t free_count;
  uint64_t tracked, dropped, live_recorded;
  size_t frame_bytes;
  // Interned strings: an array, and an open-addressing index into it (id + 1; 0: empty).
  heap_string *strings;
  uint32_t string_count, string_capacity;
  uint32_t *index;
  uint32_t index_capacity; // a power of two, at least twice string_count
  size_t string_bytes;
};

static ID id_aset, id_aref;

contprof_heap_tracker *contprof_heap_tracker_new(void) {
  if (!id_aset) {
    id_aset = rb_intern("[]=");
    id_aref = rb_intern("[]");
  }
  contprof_heap_tracker *tracker = ruby_xcalloc(1, sizeof(*tracker));
  tracker->weak = Qnil;
  tracker->records = ruby_xcalloc(CONTPROF_HEAP_MAX_TRACKED, sizeof(heap_record));
  tracker->free_slots = ruby_xcalloc(CONTPROF_HEAP_MAX_TRACKED, sizeof(uint32_t));
  for (uint32_t i = 0; i < CONTPROF_HEAP_MAX_TRACKED; i++) tracker->free_slots[i] = CONTPROF_HEAP_MAX_TRACKED - 1 - i;
  tracker->free_count = CONTPROF_HEAP_MAX_TRACKED;
  VALUE weak_map_class = rb_path2class("ObjectSpace::WeakMap");
  tracker->weak = rb_class_new_instance(0, NULL, weak_map_class);
  return tracker;
}

static void forget(contprof_heap_tracker *tracker, heap_record *record) {
  tracker->frame_bytes -= record->frame_count * sizeof(heap_frame);
  free(record->frames);
  memset(record, 0, sizeof(*record));
  tracker->tracked--;
  tracker->free_slots[tracker->free_count++] = (uint32_t) (record - tracker->records);
}

void contprof_heap_tracker_free(contprof_heap_tracker *tracker) {
  if (!tracker) return;
  for (long i = 0; i < CONTPROF_HEAP_MAX_TRACKED; i++) free(tracker->records[i].frames);
  for (uint32_t i = 0; i < tracker->string_count; i++) free(tracker->strings[i].ptr);
  free(tracker->strings);
  free(tracker->index);
  ruby_xfree(tracker->records);
  ruby_xfree(tracker->free_slots);
  ruby_xfree(tracker);
}

void contprof_heap_tracker_mark(contprof_heap_tracker *tracker) {
  if (tracker) rb_gc_mark(tracker->weak); // the map itself; what it holds stays weak
}

contprof_heap_tracker_stats contprof_heap_tracker_stats_of(const contprof_heap_tracker *tracker) {
  if (!tracker) return (contprof_heap_tracker_stats) {0};
  size_t bytes = sizeof(*tracker) + CONTPROF_HEAP_MAX_TRACKED * (sizeof(heap_record) + sizeof(uint32_t)) +
                 tracker->frame_bytes +
                 tracker->string_bytes + tracker->string_capacity * sizeof(heap_string) +
                 tracker->index_capacity * sizeof(uint32_t);
  return (contprof_heap_tracker_stats) {.tracked = tracker->tracked, .dropped = tracker->dropped,
                                        .live_recorded = tracker->live_recorded, .bytes = bytes};
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
// Tracking

typedef struct {
  contprof_heap_tracker *tracker;
  heap_frame *frames;
  uint32_t count, capacity;
  bool full;
} frame_copy;

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

// Whether a record is free: else (the table full) the records of dead objects are freed.
// Looking for the dead asks the map about every record: at most once per SWEEP_EVERY refusals.
#define SWEEP_EVERY 64
static bool has_free_record(contprof_heap_tracker *tracker) {
  if (tracker->free_count == 0 && tracker->dropped % SWEEP_EVERY == 0) {
    for (long i = 0; i < CONTPROF_HEAP_MAX_TRACKED; i++) {
      heap_record *record = &tracker->records[i];
      if (record->in_use && NIL_P(rb_funcall(tracker->weak, id_aref, 1, LONG2FIX(record->key)))) forget(tracker, record);
    }
  }
  return tracker->free_count > 0;
}

pprof_status contprof_heap_tracker_track(contprof_heap_tracker *tracker, contprof_stack_sampler *sampler, VALUE object,
                                         const char *class_name, size_t class_name_len, uint64_t weight,
                                         pprof_error *error) {
  if (!has_free_record(tracker)) {
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
  long key = ++tracker->next_key;
  rb_funcall(tracker->weak, id_aset, 2, LONG2FIX(key), object);
  heap_record *record = &tracker->records[tracker->free_slots[--tracker->free_count]];
  *record = (heap_record) {.in_use = true, .key = key, .frames = copy.frames, .frame_count = copy.count,
                           .class_name = class_id, .weight = weight, .gc_count = rb_gc_count()};
  tracker->frame_bytes += copy.count * sizeof(heap_frame);
  tracker->tracked++;
  return PPROF_OK;
}

pprof_status contprof_heap_tracker_record_live(contprof_heap_tracker *tracker, VALUE recorder, int samples_index,
                                               int size_index, size_t value_count, pprof_error *error) {
  tracker->live_recorded = 0;
  pprof_frame *frames = NULL;
  size_t frames_capacity = 0;
  pprof_status status = PPROF_OK;
  size_t gc_now = rb_gc_count();
  for (long i = 0; i < CONTPROF_HEAP_MAX_TRACKED && status == PPROF_OK; i++) {
    heap_record *record = &tracker->records[i];
    if (!record->in_use) continue;
    VALUE object = rb_funcall(tracker->weak, id_aref, 1, LONG2FIX(record->key));
    if (NIL_P(object)) {
      forget(tracker, record);
      continue;
    }
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
    if (samples_index >= 0) values[samples_index] = (int64_t) record->weight;
    if (size_index >= 0) values[size_index] = (int64_t) record->weight * (int64_t) contprof_vm_object_size(object);
    RB_GC_GUARD(object);
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
