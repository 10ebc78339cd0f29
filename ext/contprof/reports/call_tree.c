// Contprof::Native.call_tree: the call trees behind the HTML flame graph, built in C with
// exactly the result of Report::CallTree's Ruby code (lib/contprof/reports/call_tree.rb,
// which documents the tree, its visibility rule and its flat encoding).
//
// Three steps: the Ruby arrays are checked and copied into C arrays (with the GVL); the
// tree is built on those alone, without the GVL (other threads, the viewer's requests, run
// meanwhile); then the result is copied into Ruby arrays. C memory is freed by rb_ensure
// whatever raises.
//
// The tree is built depth first from an explicit stack of nodes to make, each a range of
// one array of sample indices: a node's range is regrouped by the samples' next function
// with a counting pass over an array indexed by function (no hashing, nothing allocated
// per node), which leaves each child's samples a range of their own.
//
// The cutoff is taken as a double: each view's threshold is cutoff * total computed as
// Ruby computes a Float times an Integer, and sums are compared with it exactly, as Ruby
// compares an Integer with a Float. (An Integer or Rational cutoff would be exact in Ruby:
// 0 gives the same thresholds; others could differ on totals beyond 2^53.)
//
// Values are summed as int64. Before building, the absolute values of the samples kept are
// added up per type: when that or any value does not fit int64, no sum the tree takes could
// be trusted to, and call_tree returns nil so that the caller uses the Ruby code, whose
// Integers do not overflow (nanoseconds would need 292 years of samples for that).
#include "reports/reports.h"

#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "ruby_helpers.h"

// A node waiting to be made: its parent, name (a rank: see tree_build), its samples
// (order[begin, end)) and depth. Its slice sums sit in tree_build.pending_sums at the
// same index.
typedef struct {
  int32_t parent, name, begin, end, depth;
} pending_node;

// A child found while splitting a node's samples, with its sums and type-0 width.
typedef struct {
  int32_t name, begin, end;
  int64_t width;
  int64_t *sums;
} child_group;

// A growable list of int64 (value triples).
typedef struct {
  int64_t *items;
  size_t size, capacity;
} int64_list;

typedef struct {
  // Inputs. Function names are ranks: name ids in increasing order of id, so that ranks
  // compare as ids do, and a rank indexes per-function arrays (rank_names gives the id).
  int32_t sample_count, type_count, slice_count, rank_count;
  bool callers, track_samples;
  double cutoff;
  int32_t *frames;       // per sample, its stack's function ranks, leaf first, one after another
  int64_t *stack_starts; // sample i's frames are frames[stack_starts[i], stack_starts[i + 1])
  int64_t *values;       // [sample * type_count + type]
  int32_t *slices;
  int64_t *rank_names;
  int32_t *frame_ranks; // per frame id, its function's rank (-1: its name id is nil)

  // Building.
  int32_t *order;       // sample indices, grouped by node
  int32_t *scratch;     // the same, while regrouping
  int32_t *rank_counts; // per rank, samples of the current node's child of that name (0 between nodes)
  int32_t *ranks_seen;
  child_group *children;
  int64_t *children_sums;
  size_t children_capacity, children_sums_capacity;
  pending_node *pending;
  int64_t *pending_sums;
  size_t pending_size, pending_capacity;
  int64_t *self_sums;
  double *thresholds; // [type * (2 + slice_count) + view]
  bool out_of_memory;

  // The tree.
  int32_t *parents, *names;
  size_t node_count, node_capacity;
  int64_list *totals, *selfs; // per type
  int32_t *sample_nodes;
  bool *sample_ends;
} tree_build;

static size_t sums_size(const tree_build *build) { return (size_t) build->type_count * (size_t) build->slice_count; }

// realloc of count * size bytes (at least 1), NULL when that overflows or memory is out.
static void *resize(void *items, size_t count, size_t size) {
  size_t bytes;
  if (__builtin_mul_overflow(count, size, &bytes)) return NULL;
  return realloc(items, bytes ? bytes : 1);
}

// Grows *items (of item_size bytes) to hold at least `needed`, doubling; false when out of memory.
static bool reserve(void **items, size_t *capacity, size_t needed, size_t item_size) {
  if (needed <= *capacity) return true;
  size_t wanted = *capacity ? *capacity : 16;
  while (wanted < needed) wanted *= 2;
  void *grown = resize(*items, wanted, item_size);
  if (!grown) return false;
  *items = grown;
  *capacity = wanted;
  return true;
}

static void *allocate_zeroed(size_t count, size_t size) { return calloc(count ? count : 1, size); }

static VALUE free_build(VALUE data) {
  tree_build *build = (tree_build *) data;
  free(build->frames);
  free(build->stack_starts);
  free(build->values);
  free(build->slices);
  free(build->rank_names);
  free(build->frame_ranks);
  free(build->order);
  free(build->scratch);
  free(build->rank_counts);
  free(build->ranks_seen);
  free(build->children);
  free(build->children_sums);
  free(build->pending);
  free(build->pending_sums);
  free(build->self_sums);
  free(build->thresholds);
  free(build->parents);
  free(build->names);
  for (int32_t type = 0; build->totals && type < build->type_count; type++) free(build->totals[type].items);
  for (int32_t type = 0; build->selfs && type < build->type_count; type++) free(build->selfs[type].items);
  free(build->totals);
  free(build->selfs);
  free(build->sample_nodes);
  free(build->sample_ends);
  return Qnil;
}

// ---- Building (no GVL: C memory only) ----

static const int64_t *row_of(const tree_build *build, int32_t sample) {
  return build->values + (size_t) sample * (size_t) build->type_count;
}

static void add_sample(const tree_build *build, int64_t *sums, int32_t sample) {
  const int64_t *row = row_of(build, sample);
  int32_t slice = build->slices[sample];
  for (int32_t type = 0; type < build->type_count; type++) sums[(size_t) type * build->slice_count + slice] += row[type];
}

static void sum_group(const tree_build *build, int64_t *sums, int32_t begin, int32_t end) {
  memset(sums, 0, sums_size(build) * sizeof(*sums));
  for (int32_t j = begin; j < end; j++) add_sample(build, sums, build->order[j]);
}

static int64_t width_of(const tree_build *build, const int64_t *sums) {
  int64_t width = 0;
  for (int32_t slice = 0; slice < build->slice_count; slice++) width += sums[slice];
  return width;
}

// value >= threshold, exactly (as Ruby compares an Integer with a Float), for any double.
static bool reaches(int64_t value, double threshold) {
  if (isnan(threshold) || threshold >= 0x1p63) return false;
  if (threshold < -0x1p63) return true;
  return value >= (int64_t) ceil(threshold);
}

// Per type, the smallest visible value in each view: all threads with and without idle
// waits, then each thread with and without (at 2 + slice and 3 + slice).
static void compute_thresholds(tree_build *build, const int64_t *root_sums) {
  size_t views = 2 + (size_t) build->slice_count;
  for (int32_t type = 0; type < build->type_count; type++) {
    const int64_t *by_slice = root_sums + (size_t) type * build->slice_count;
    double *thresholds = build->thresholds + type * views;
    int64_t all = 0, busy_all = 0;
    for (int32_t slice = 0; slice < build->slice_count; slice += 2) {
      int64_t busy = by_slice[slice], both = busy + by_slice[slice + 1];
      thresholds[2 + slice] = build->cutoff * (double) both;
      thresholds[3 + slice] = build->cutoff * (double) busy;
      all += both;
      busy_all += busy;
    }
    thresholds[0] = build->cutoff * (double) all;
    thresholds[1] = build->cutoff * (double) busy_all;
  }
}

// True when the sums reach the threshold of some view of some type.
static bool visible(const tree_build *build, const int64_t *sums) {
  size_t views = 2 + (size_t) build->slice_count;
  for (int32_t type = 0; type < build->type_count; type++) {
    const int64_t *by_slice = sums + (size_t) type * build->slice_count;
    const double *thresholds = build->thresholds + type * views;
    int64_t all = 0, busy_all = 0;
    for (int32_t slice = 0; slice < build->slice_count; slice += 2) {
      int64_t busy = by_slice[slice], both = busy + by_slice[slice + 1];
      if ((both > 0 && reaches(both, thresholds[2 + slice])) || (busy > 0 && reaches(busy, thresholds[3 + slice]))) {
        return true;
      }
      all += both;
      busy_all += busy;
    }
    if ((all > 0 && reaches(all, thresholds[0])) || (busy_all > 0 && reaches(busy_all, thresholds[1]))) return true;
  }
  return false;
}

// Appends the node's nonzero sums to the per-type triple lists.
static bool record(tree_build *build, int32_t node, const int64_t *sums, int64_list *into) {
  for (int32_t type = 0; type < build->type_count; type++) {
    int64_list *list = &into[type];
    const int64_t *by_slice = sums + (size_t) type * build->slice_count;
    for (int32_t slice = 0; slice < build->slice_count; slice++) {
      if (by_slice[slice] == 0) continue;
      if (!reserve((void **) &list->items, &list->capacity, list->size + 3, sizeof(int64_t))) return false;
      list->items[list->size++] = node;
      list->items[list->size++] = slice;
      list->items[list->size++] = by_slice[slice];
    }
  }
  return true;
}

// The function of `sample` at `depth` from the root (callees) or from the leaf (callers),
// or -1 when its stack ends above.
static int32_t frame_at(const tree_build *build, int32_t sample, int32_t depth) {
  int64_t start = build->stack_starts[sample], size = build->stack_starts[sample + 1] - start;
  if (depth >= size) return -1;
  return build->frames[start + (build->callers ? depth : size - 1 - depth)];
}

// Widest first, ties by name (the Ruby code's sort_by [-width, name]).
static int compare_children(const void *a, const void *b) {
  const child_group *left = a, *right = b;
  if (left->width != right->width) return left->width > right->width ? -1 : 1;
  return (left->name > right->name) - (left->name < right->name);
}

// Groups the node's samples by their function at `depth` (order[begin, end) regrouped:
// each child's samples together, those ending at the node dropped), fills build->children
// and the node's self sums; returns the number of children, or -1 when out of memory.
static int32_t split(tree_build *build, const pending_node *node, int32_t node_index) {
  int32_t seen = 0;
  memset(build->self_sums, 0, sums_size(build) * sizeof(int64_t));
  for (int32_t j = node->begin; j < node->end; j++) {
    int32_t sample = build->order[j], rank = frame_at(build, sample, node->depth);
    if (build->track_samples) build->sample_nodes[sample] = node_index;
    if (rank < 0) {
      add_sample(build, build->self_sums, sample);
      if (build->track_samples) build->sample_ends[sample] = true;
    } else if (build->rank_counts[rank]++ == 0) {
      build->ranks_seen[seen++] = rank;
    }
  }
  size_t sums = sums_size(build);
  if (!reserve((void **) &build->children, &build->children_capacity, (size_t) seen, sizeof(child_group))) return -1;
  if (build->children_sums_capacity != build->children_capacity) {
    int64_t *grown = resize(build->children_sums, build->children_capacity, sums * sizeof(int64_t));
    if (!grown) return -1;
    build->children_sums = grown;
    build->children_sums_capacity = build->children_capacity;
  }
  int32_t cursor = node->begin;
  for (int32_t c = 0; c < seen; c++) {
    int32_t rank = build->ranks_seen[c];
    build->children[c] = (child_group){.name = rank, .begin = cursor, .end = cursor + build->rank_counts[rank]};
    build->rank_counts[rank] = cursor; // from here on: where its next sample goes
    cursor = build->children[c].end;
  }
  for (int32_t j = node->begin; j < node->end; j++) {
    int32_t sample = build->order[j], rank = frame_at(build, sample, node->depth);
    if (rank >= 0) build->scratch[build->rank_counts[rank]++] = sample;
  }
  memcpy(build->order + node->begin, build->scratch + node->begin, (size_t) (cursor - node->begin) * sizeof(int32_t));
  for (int32_t c = 0; c < seen; c++) build->rank_counts[build->ranks_seen[c]] = 0;
  return seen;
}

static bool push_pending(tree_build *build, pending_node node, const int64_t *sums) {
  size_t capacity = build->pending_capacity;
  if (!reserve((void **) &build->pending, &capacity, build->pending_size + 1, sizeof(pending_node))) return false;
  if (capacity != build->pending_capacity) {
    int64_t *grown = resize(build->pending_sums, capacity, sums_size(build) * sizeof(int64_t));
    if (!grown) return false;
    build->pending_sums = grown;
    build->pending_capacity = capacity;
  }
  build->pending[build->pending_size] = node;
  memcpy(build->pending_sums + build->pending_size * sums_size(build), sums, sums_size(build) * sizeof(int64_t));
  build->pending_size++;
  return true;
}

static bool add_node(tree_build *build, const pending_node *node, const int64_t *sums) {
  if (build->node_count >= INT32_MAX) return false;
  if (!reserve((void **) &build->parents, &build->node_capacity, build->node_count + 1, sizeof(int32_t))) return false;
  int32_t *names = resize(build->names, build->node_capacity, sizeof(int32_t));
  if (!names) return false;
  build->names = names;
  int32_t index = (int32_t) build->node_count++;
  build->parents[index] = node->parent;
  build->names[index] = node->name;
  return record(build, index, sums, build->totals);
}

// Pre-order, depth first: a node is made when popped, then its visible children are
// pushed in reverse display order (so the widest is popped, and drawn, first).
static bool build_tree(tree_build *build, int32_t kept_count) {
  size_t sums = sums_size(build);
  int64_t *root_sums = resize(NULL, sums, sizeof(int64_t));
  if (!root_sums) return false;
  sum_group(build, root_sums, 0, kept_count);
  compute_thresholds(build, root_sums);
  bool pushed = push_pending(build, (pending_node){.parent = -1, .name = -1, .begin = 0, .end = kept_count}, root_sums);
  free(root_sums);
  if (!pushed) return false;
  while (build->pending_size > 0) {
    pending_node node = build->pending[--build->pending_size];
    int32_t index = (int32_t) build->node_count;
    if (!add_node(build, &node, build->pending_sums + build->pending_size * sums)) return false;
    int32_t seen = split(build, &node, index);
    if (seen < 0 || !record(build, index, build->self_sums, build->selfs)) return false;
    int32_t kept = 0;
    for (int32_t c = 0; c < seen; c++) {
      child_group child = build->children[c];
      child.sums = build->children_sums + (size_t) kept * sums;
      sum_group(build, child.sums, child.begin, child.end);
      if (!visible(build, child.sums)) continue;
      child.width = width_of(build, child.sums);
      build->children[kept++] = child;
    }
    qsort(build->children, (size_t) kept, sizeof(child_group), compare_children);
    for (int32_t c = kept - 1; c >= 0; c--) {
      const child_group *child = &build->children[c];
      pending_node next = {.parent = index, .name = child->name, .begin = child->begin, .end = child->end, .depth = node.depth + 1};
      if (!push_pending(build, next, child->sums)) return false;
    }
  }
  return true;
}

static void *build_without_gvl(void *data) {
  tree_build *build = data;
  int32_t kept = 0;
  for (int32_t sample = 0; sample < build->sample_count; sample++) {
    const int64_t *row = row_of(build, sample);
    bool nonzero = false;
    for (int32_t type = 0; type < build->type_count && !nonzero; type++) nonzero = row[type] != 0;
    if (nonzero) build->order[kept++] = sample;
  }
  if (kept > 0) build->out_of_memory = !build_tree(build, kept);
  return NULL;
}

// ---- Ruby arrays in (with the GVL: anything may raise, free_build runs then) ----

static int32_t array_length(VALUE array, const char *argument) {
  CONTPROF_ENFORCE_TYPE(array, T_ARRAY, argument, "an Array");
  if (RARRAY_LEN(array) > INT32_MAX) rb_raise(rb_eArgError, "%s has too many elements", argument);
  return (int32_t) RARRAY_LEN(array);
}

static int64_t integer_at(VALUE array, long index, const char *argument) {
  VALUE value = RARRAY_AREF(array, index);
  if (!RB_INTEGER_TYPE_P(value)) contprof_raise_type_error(value, argument, "an Integer");
  return NUM2LL(value);
}

static void *allocate_or_raise(size_t count, size_t size) {
  void *memory = allocate_zeroed(count, size);
  if (!memory) rb_raise(rb_eNoMemError, "out of memory building a call tree");
  return memory;
}

static int compare_int64(const void *a, const void *b) {
  int64_t left = *(const int64_t *) a, right = *(const int64_t *) b;
  return (left > right) - (left < right);
}

// Ranks the name ids (rank_names: the distinct ids in increasing order) and gives each
// frame id its rank.
static void rank_frames(tree_build *build, VALUE name_ids, int32_t frame_count) {
  build->rank_names = allocate_or_raise((size_t) frame_count, sizeof(int64_t));
  build->frame_ranks = allocate_or_raise((size_t) frame_count, sizeof(int32_t));
  int32_t named = 0;
  for (int32_t frame = 0; frame < frame_count; frame++) {
    if (!NIL_P(RARRAY_AREF(name_ids, frame))) build->rank_names[named++] = integer_at(name_ids, frame, "name_ids[]");
  }
  qsort(build->rank_names, (size_t) named, sizeof(int64_t), compare_int64);
  int32_t distinct = 0;
  for (int32_t i = 0; i < named; i++) {
    if (distinct == 0 || build->rank_names[distinct - 1] != build->rank_names[i]) build->rank_names[distinct++] = build->rank_names[i];
  }
  build->rank_count = distinct;
  for (int32_t frame = 0; frame < frame_count; frame++) {
    VALUE id = RARRAY_AREF(name_ids, frame);
    if (NIL_P(id)) {
      build->frame_ranks[frame] = -1;
      continue;
    }
    int64_t name = NUM2LL(id);
    const int64_t *found = bsearch(&name, build->rank_names, (size_t) distinct, sizeof(int64_t), compare_int64);
    build->frame_ranks[frame] = (int32_t) (found - build->rank_names);
  }
}

static void copy_stacks(tree_build *build, VALUE stacks, int32_t frame_count) {
  build->stack_starts = allocate_or_raise((size_t) build->sample_count + 1, sizeof(int64_t));
  int64_t total = 0;
  for (int32_t sample = 0; sample < build->sample_count; sample++) {
    VALUE stack = RARRAY_AREF(stacks, sample);
    total += array_length(stack, "stacks[]");
    build->stack_starts[sample + 1] = total;
  }
  build->frames = allocate_or_raise((size_t) total, sizeof(int32_t));
  for (int32_t sample = 0; sample < build->sample_count; sample++) {
    VALUE stack = RARRAY_AREF(stacks, sample);
    int32_t *frames = build->frames + build->stack_starts[sample];
    for (long depth = 0; depth < RARRAY_LEN(stack); depth++) {
      int64_t frame = integer_at(stack, depth, "stacks[][]");
      if (frame < 0 || frame >= frame_count) rb_raise(rb_eArgError, "frame id %lld is not an index of name_ids", (long long) frame);
      if (build->frame_ranks[frame] < 0) rb_raise(rb_eTypeError, "name_ids[%lld] is nil but a stack has that frame", (long long) frame);
      frames[depth] = build->frame_ranks[frame];
    }
  }
}

// False when a value or the sum of the absolute values of a type does not fit int64.
static bool copy_values(tree_build *build, VALUE values) {
  build->values = allocate_or_raise((size_t) build->sample_count * (size_t) build->type_count + 1, sizeof(int64_t));
  int64_t *magnitudes = build->self_sums; // free for now, and type_count long at least
  memset(magnitudes, 0, (size_t) build->type_count * sizeof(int64_t));
  bool fits = true;
  for (int32_t sample = 0; sample < build->sample_count; sample++) {
    VALUE row = RARRAY_AREF(values, sample);
    if (array_length(row, "values[]") != build->type_count) {
      rb_raise(rb_eArgError, "values[%d] has %ld values for %d sample types", sample, RARRAY_LEN(row), build->type_count);
    }
    for (int32_t type = 0; type < build->type_count; type++) {
      VALUE value = RARRAY_AREF(row, type);
      if (!RB_INTEGER_TYPE_P(value)) contprof_raise_type_error(value, "values[][]", "an Integer");
      int64_t number = 0;
      bool overflow = false;
      if (RB_FIXNUM_P(value)) {
        number = FIX2LONG(value);
      } else { // a Bignum: ±2 when it does not fit
        int sign = rb_integer_pack(value, &number, 1, sizeof(number), 0, INTEGER_PACK_LSWORD_FIRST | INTEGER_PACK_NATIVE_BYTE_ORDER | INTEGER_PACK_2COMP);
        overflow = sign == 2 || sign == -2;
      }
      int64_t magnitude = number < 0 && number != INT64_MIN ? -number : number;
      if (overflow || number == INT64_MIN || __builtin_add_overflow(magnitudes[type], magnitude, &magnitudes[type])) fits = false;
      build->values[(size_t) sample * build->type_count + type] = number;
    }
  }
  return fits;
}

// ---- Ruby arrays out ----

static VALUE triples_array(const int64_list *lists, int32_t type_count) {
  VALUE per_type = rb_ary_new_capa(type_count);
  for (int32_t type = 0; type < type_count; type++) {
    const int64_list *list = &lists[type];
    VALUE triples = rb_ary_new_capa((long) list->size);
    for (size_t i = 0; i < list->size; i++) rb_ary_push(triples, LL2NUM(list->items[i]));
    rb_ary_push(per_type, triples);
  }
  return per_type;
}

// [parents, names, totals, selfs, sample_nodes, sample_ends] (the last two nil without
// track_samples).
static VALUE tree_arrays(const tree_build *build) {
  VALUE parents = rb_ary_new_capa((long) build->node_count), names = rb_ary_new_capa((long) build->node_count);
  for (size_t node = 0; node < build->node_count; node++) {
    rb_ary_push(parents, INT2FIX(build->parents[node]));
    rb_ary_push(names, build->names[node] < 0 ? INT2FIX(-1) : LL2NUM(build->rank_names[build->names[node]]));
  }
  VALUE sample_nodes = Qnil, sample_ends = Qnil;
  if (build->track_samples) {
    sample_nodes = rb_ary_new_capa(build->sample_count);
    sample_ends = rb_ary_new_capa(build->sample_count);
    for (int32_t sample = 0; sample < build->sample_count; sample++) {
      rb_ary_push(sample_nodes, INT2FIX(build->sample_nodes[sample]));
      rb_ary_push(sample_ends, build->sample_ends[sample] ? Qtrue : Qfalse);
    }
  }
  return rb_ary_new_from_args(6, parents, names, triples_array(build->totals, build->type_count),
                              triples_array(build->selfs, build->type_count), sample_nodes, sample_ends);
}

typedef struct {
  tree_build build;
  VALUE stacks, values, slices, name_ids;
} call_tree_call;

static VALUE run_call_tree(VALUE data) {
  call_tree_call *call = (call_tree_call *) data;
  tree_build *build = &call->build;
  int32_t samples = build->sample_count, frame_count = array_length(call->name_ids, "name_ids");
  if (array_length(call->values, "values") != samples || array_length(call->slices, "slices") != samples) {
    rb_raise(rb_eArgError, "stacks, values and slices differ in size");
  }
  size_t sums = sums_size(build) > (size_t) build->type_count ? sums_size(build) : (size_t) build->type_count;
  build->self_sums = allocate_or_raise(sums, sizeof(int64_t));
  build->slices = allocate_or_raise((size_t) samples, sizeof(int32_t));
  for (int32_t sample = 0; sample < samples; sample++) {
    int64_t slice = integer_at(call->slices, sample, "slices[]");
    if (slice < 0 || slice >= build->slice_count) rb_raise(rb_eArgError, "slice %lld is not below slice_count", (long long) slice);
    build->slices[sample] = (int32_t) slice;
  }
  rank_frames(build, call->name_ids, frame_count);
  copy_stacks(build, call->stacks, frame_count);
  if (!copy_values(build, call->values)) return Qnil;

  build->order = allocate_or_raise((size_t) samples, sizeof(int32_t));
  build->scratch = allocate_or_raise((size_t) samples, sizeof(int32_t));
  build->rank_counts = allocate_or_raise((size_t) build->rank_count, sizeof(int32_t));
  build->ranks_seen = allocate_or_raise((size_t) build->rank_count, sizeof(int32_t));
  build->thresholds = allocate_or_raise((size_t) build->type_count * (2 + (size_t) build->slice_count), sizeof(double));
  build->totals = allocate_or_raise((size_t) build->type_count, sizeof(int64_list));
  build->selfs = allocate_or_raise((size_t) build->type_count, sizeof(int64_list));
  if (build->track_samples) {
    build->sample_nodes = allocate_or_raise((size_t) samples, sizeof(int32_t));
    for (int32_t sample = 0; sample < samples; sample++) build->sample_nodes[sample] = -1;
    build->sample_ends = allocate_or_raise((size_t) samples, sizeof(bool));
  }
  contprof_call_without_gvl(build_without_gvl, build, NULL, NULL);
  if (build->out_of_memory) rb_raise(rb_eNoMemError, "out of memory building a call tree");
  return tree_arrays(build);
}

static int32_t count_argument(VALUE value, const char *argument) {
  if (!RB_INTEGER_TYPE_P(value)) contprof_raise_type_error(value, argument, "an Integer");
  long long count = NUM2LL(value);
  if (count < 0 || count > INT32_MAX / 4) rb_raise(rb_eArgError, "%s must be from 0 to %d, got %lld", argument, INT32_MAX / 4, count);
  return (int32_t) count;
}

// Native.call_tree(stacks, values, slices, slice_count, name_ids, type_count, direction,
// cutoff, track_samples) => [parents, names, totals, selfs, sample_nodes, sample_ends]
// (Report::CallTree's attributes; the last two nil without track_samples), or nil when
// the values or their sums do not fit int64. `stacks`: per sample, its frame ids, leaf
// first; `values`: per sample, type_count Integers; `slices`: per sample, an Integer below
// slice_count (an even count: a busy and an idle slice per thread); `name_ids`: per frame
// id, its function's Integer id (nil for a frame no stack has); `direction`: :callees or
// :callers; `cutoff`: a Numeric.
static VALUE native_call_tree(VALUE CONTPROF_UNUSED module, VALUE stacks, VALUE values, VALUE slices, VALUE slice_count,
                              VALUE name_ids, VALUE type_count, VALUE direction, VALUE cutoff, VALUE track_samples) {
  ID callers = rb_intern("callers"), callees = rb_intern("callees");
  if (!SYMBOL_P(direction) || (SYM2ID(direction) != callers && SYM2ID(direction) != callees)) {
    rb_raise(rb_eArgError, "direction must be :callees or :callers, got %" PRIsVALUE, rb_inspect(direction));
  }
  call_tree_call call = {.stacks = stacks, .values = values, .slices = slices, .name_ids = name_ids};
  call.build.sample_count = array_length(stacks, "stacks");
  call.build.slice_count = count_argument(slice_count, "slice_count");
  if (call.build.slice_count % 2) rb_raise(rb_eArgError, "slice_count must be even (a busy and an idle slice per thread)");
  call.build.type_count = count_argument(type_count, "type_count");
  call.build.callers = SYM2ID(direction) == callers;
  call.build.cutoff = NUM2DBL(cutoff);
  call.build.track_samples = RTEST(track_samples);
  VALUE result = rb_ensure(run_call_tree, (VALUE) &call, free_build, (VALUE) &call.build);
  RB_GC_GUARD(stacks);
  RB_GC_GUARD(values);
  RB_GC_GUARD(slices);
  RB_GC_GUARD(name_ids);
  return result;
}

void contprof_call_tree_init(VALUE contprof_module) {
  VALUE native = rb_define_module_under(contprof_module, "Native");
  rb_define_singleton_method(native, "call_tree", native_call_tree, 9);
}
