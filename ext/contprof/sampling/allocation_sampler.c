// Allocation sampling (see allocation_sampler.h).
//
// ## Which allocations
//
// Every allocation is sampled with probability 1/interval (geometric gaps, see
// allocation_gaps.h), counted on the VM's own allocation counter
// (GC.stat(:total_allocated_objects)), so that no site can hide between fixed strides. A
// sample stands for `interval` allocations, the inverse of its chance (Horvitz-Thompson),
// not for its gap since the previous sample: gaps are geometric, their variance their mean
// squared, and weighing samples by them doubled the variance of every share (the gap ends
// at one site and mostly covers others). A site's estimate is then interval x its samples,
// a Poisson count, whose error `contprof report` prints from the samples behind it. When a
// target is missed (the hook came on after it passed), the allocations from it to the
// sample no draw could reach are added to that sample's weight (late_armings).
//
// ## Cost
//
// Sampling needs to see the chosen allocation, and the only way to see an allocation is a
// RUBY_INTERNAL_EVENT_NEWOBJ hook. While any such hook is on, every allocation leaves the
// allocator's fast path (and on Ruby 3.1 any object-space hook at all does): an always-on
// hook costs allocation-heavy code 10% or more, which is why nobody leaves one on. This
// hook is therefore armed only shortly before the next sample is due, judged from the
// VM's counter and the allocation rate:
// - every check measures the rate (allocations per unit of time over windows of at least
//   RATE_WINDOW_NS; the fastest lately, see RATE_HALF_LIFE_NS);
// - the hook must be on from `margin` allocations before the target, what the program may
//   allocate in ARMING_LEAD_NS at that rate (the time a check may come late);
// - so a check that finds the target further away asks for the next check at the moment
//   the margin would be reached at that rate (ALARM_PACE; the worker's wall clock wakes
//   for it, and the thread holding the GVL runs it at its next safe point, usually within
//   microseconds, after the GC when one runs); the sampling rounds (a few per 10 ms of a
//   busy thread) check too;
// - a check within the margin enables the hook with a countdown of exactly that distance;
//   it takes the sample when it reaches zero and is disabled again by the job that
//   records the sample, unless the next target is near too.
// - once a check finds the program allocating slowly (under QUIET_RATE, over a window of
//   at least QUIET_WINDOW_NS or by the rate kept), the hook simply
//   stays on: it then costs next to nothing, and a burst that follows a quiet phase is
//   sampled from its first allocation (a check would come too late for a burst shorter
//   than a round, whose whole weight would land on whatever allocated next). Only the hook
//   itself ends this quiet state: it times every QUIET_PROBE_CALLS of the program's
//   allocations, and when two such windows in a row came faster than the quiet rate, it
//   asks the job for a check with the rate of the second, which turns it off unless the
//   target is near. A burst thus pays the hook for a few hundred allocations, not for a
//   whole request. (A rate measured across the start of a burst, by a check or by a window
//   that began before it, is far below the burst's: a hook turned off on it would be
//   checked again too late, and the burst's weight would land on whatever allocated next.
//   The second fast window lies wholly within the burst.) So that a program resting
//   between requests is seen resting, checks come at least every RECHECK_NS.
// The hook thus sees about margin / interval of the allocations. With the automatic
// interval (the default), the interval is kept at least ARMED_SHARE_INVERSE times the
// margin, so that share stays at or below 1 / ARMED_SHARE_INVERSE even for a program that
// allocates millions of objects a second (it then gets fewer samples, never a much slower
// allocator: on a loop that does nothing but allocate, the hook on for every allocation
// costs 35%, see bench/README.md). A fixed interval is kept as asked, whatever the hook
// costs (below the margin, the hook stays on). A check that finds the target already
// passed (held back by a GC, or a burst faster than the rate measured) is counted in
// stats (late_armings); the next sample, drawn afresh, carries the one missed and the
// allocations since.
//
// ## Late armings
//
// A program that allocates in bursts between phases that allocate nothing (a few hundred
// objects, then milliseconds of CPU) defeats a short lead: the rate kept, over windows of
// a millisecond, is far below a burst's; a check in the quiet phase finds a target deep in
// the next burst beyond the margin, and the burst passes it before the next check. Only
// targets near a burst's start are taken in time, and the missed ones' weight goes to
// them: at a 0.25 ms lead the first site of each burst was over-estimated (91-99% for a
// 75% site; bench/README.md, "Density against cost"). At the 3 ms lead the margin covers
// such bursts. A lead doubled by each late arming was tried: one late first sample (before
// the rate is known) sent a steady program from 3 samples a second to 0.3 (fewer samples,
// fewer armings in time to bring it back).
//
// ## In the hook
//
// The hook runs inside the allocation, where nothing may allocate or raise: it reads the
// thread's raw frames and the class's name (both without allocating), and queues the
// sampling job, which records the sample at the thread's next safe point. The object
// stays readable until the next GC (its size is read then, when it is built).
#include "sampling/allocation_sampler.h"

#include <math.h>
#include <ruby/debug.h>
#include <stdlib.h>
#include <string.h>

#include "profiler_threads.h"
#include "ruby_helpers.h"
#include "sampling/allocation_gaps.h"

// The choices below set the density against the cost: at a high allocation rate the
// automatic interval gives at most 1 / (ARMED_SHARE_INVERSE x ARMING_LEAD_NS) samples a
// second (3.3 here), and the hook sees under 1 / ARMED_SHARE_INVERSE of the allocations.
// bench/allocation_density.rb builds other values (-DCONTPROF_...); bench/README.md has
// the curve, and why a denser choice waits.
#ifndef CONTPROF_ARMED_SHARE_INVERSE
#define CONTPROF_ARMED_SHARE_INVERSE 100
#endif
#define ARMED_SHARE_INVERSE CONTPROF_ARMED_SHARE_INVERSE
#define MIN_MARGIN 64
// How late a check asked for may come: the clock's wakeup (late by a millisecond now and
// then on a busy virtual machine), the holder's next safe point, a GC (a check later
// still arms late, counted in late_armings).
#ifndef CONTPROF_ARMING_LEAD_NS
#define CONTPROF_ARMING_LEAD_NS (3 * 1000 * 1000)
#endif
#define ARMING_LEAD_NS CONTPROF_ARMING_LEAD_NS
// A check asked for comes when the program, at the rate measured, would be 1 / PACE of the
// way to the margin, or (when set) ALARM_SLACK_NS before it, whichever is later: above 1 a
// rate that rose meanwhile makes fewer armings late, at the price of more checks (each a
// wakeup of the clock). Pace alone never ends a chain (each check leaves a fraction of the
// way; it stops when a check comes late into the margin: about 4.5 checks a sample at
// 1.25); with the slack a check that leaves ALARM_SLACK_NS or less asks for the next one
// at the margin itself. And a check closer than ALARM_ARM_NOW_NS (when set) arms at once:
// the rate kept is the fastest lately, so checks tend to come early, and a wakeup of the
// clock costs more CPU than the hook on for that long (bench/wakeup_floor.c measures a
// wakeup's cost on the machine at hand; bench/allocation_density.rb, the wakeups a sample).
#ifndef CONTPROF_ALARM_PACE
#define CONTPROF_ALARM_PACE 1.0
#endif
#ifndef CONTPROF_ALARM_SLACK_NS
#define CONTPROF_ALARM_SLACK_NS 0
#endif
#ifndef CONTPROF_ALARM_ARM_NOW_NS
#define CONTPROF_ALARM_ARM_NOW_NS 0
#endif
// The allocation rate is measured over at least this long (rounds can come back to back).
#define RATE_WINDOW_NS (1000 * 1000)
// The rate kept is the fastest seen lately: it halves every RATE_HALF_LIFE_NS that windows
// measure slower, however many checks those windows are cut into (a program that sleeps
// is checked seldom, and its rate must still fall to QUIET_RATE within its quiet phase).
#define RATE_HALF_LIFE_NS (20.0 * 1000 * 1000)
// Allocations per nanosecond under which the hook stays on: 10,000 a second, which an
// always-on hook slows by about 1.2 ms a second (120 ns an allocation: it makes a loop
// allocating 2.9 million objects a second 35% slower, see bench/README.md).
#define QUIET_RATE (10000.0 / 1e9)
#define QUIET_PROBE_CALLS 64
// A window this long that was quiet makes the program quiet, whatever the rate kept (a
// request's burst would otherwise keep it from resting for RATE_HALF_LIFE_NS times the
// log of its rate); and no check waits longer, so that a rest is seen while it lasts.
#define QUIET_WINDOW_NS (10 * 1000 * 1000)
#define RECHECK_NS (50 * 1000 * 1000)

void contprof_allocation_sampler_init(contprof_allocation_sampler *sampler, uint64_t mean_interval, bool automatic,
                                      long max_frames) {
  memset(sampler, 0, sizeof(*sampler));
  sampler->automatic = automatic;
  sampler->tracepoint = Qnil;
  sampler->sample.thread = sampler->sample.object = Qnil;
  sampler->mean_interval = sampler->interval = mean_interval;
  sampler->capacity = max_frames;
  if (mean_interval > 0) sampler->frames = ruby_xcalloc((size_t) max_frames, sizeof(contprof_raw_frame));
}

void contprof_allocation_sampler_free(contprof_allocation_sampler *sampler) {
  ruby_xfree(sampler->frames);
  sampler->frames = NULL;
}

void contprof_allocation_sampler_mark(contprof_allocation_sampler *sampler) {
  rb_gc_mark(sampler->tracepoint);
  rb_gc_mark(sampler->sample.thread);
  // sample.object is not marked: a sample must never keep its object alive (the job reads
  // it only when no GC ran since).
}

// ---------------------------------------------------------------------------------------
// Class names, without allocating

static size_t copy_name(char *buffer, size_t capacity, const char *name, size_t length) {
  if (length >= capacity) length = capacity - 1;
  memcpy(buffer, name, length);
  buffer[length] = '\0';
  return length;
}

static const char *internal_type_name(int type) {
  switch (type) {
  case T_STRING: return "(hidden String)";
  case T_ARRAY: return "(hidden Array)";
  case T_HASH: return "(hidden Hash)";
  case T_DATA: return "(internal data)";
  case T_OBJECT: return "(hidden Object)";
  case T_CLASS: return "(internal class)";
  case T_IMEMO: return "(VM internal)";
  case T_NODE: return "(parser node)";
  default: return "(internal object)";
  }
}

// A class's path when it has one; for an anonymous class, its nearest named ancestor
// ("(anonymous < Foo)"): class names are labels, so they must be bounded and stable
// (never an address, which Class#inspect would give).
size_t contprof_allocation_class_name(VALUE object, char *buffer, size_t capacity) {
  int type = RB_BUILTIN_TYPE(object);
  VALUE klass = RBASIC(object)->klass;
  if (type == T_IMEMO || type == T_NODE || !klass) return copy_name(buffer, capacity, internal_type_name(type), strlen(internal_type_name(type)));
  klass = rb_class_real(klass);
  bool anonymous = false;
  for (int depth = 0; klass && depth < 32; depth++) {
    VALUE name = rb_mod_name(klass);
    if (RB_TYPE_P(name, T_STRING)) {
      if (!anonymous) return copy_name(buffer, capacity, RSTRING_PTR(name), (size_t) RSTRING_LEN(name));
      size_t used = copy_name(buffer, capacity, "(anonymous < ", 13);
      used += copy_name(buffer + used, capacity - used, RSTRING_PTR(name), (size_t) RSTRING_LEN(name));
      return used + copy_name(buffer + used, capacity - used, ")", 1);
    }
    anonymous = true;
    klass = rb_class_real(rb_class_get_superclass(klass));
  }
  return copy_name(buffer, capacity, "(anonymous)", 11);
}

// ---------------------------------------------------------------------------------------
// The hook (inside an allocation: nothing here allocates or raises)

static void arm(contprof_allocation_sampler *sampler, uint64_t now) {
  sampler->armed_at = now;
  sampler->calls_since_armed = 0;
  if (!sampler->armed) {
    sampler->armed = true;
    sampler->armings++;
    rb_tracepoint_enable(sampler->tracepoint);
  }
}

static void disarm(contprof_allocation_sampler *sampler) {
  sampler->quiet = false;
  if (!sampler->armed) return;
  sampler->armed = false;
  rb_tracepoint_disable(sampler->tracepoint);
}

static uint64_t saturated_sum(uint64_t a, uint64_t b) {
  return a + b < a ? UINT64_MAX : a + b;
}

static void draw_target(contprof_allocation_sampler *sampler, uint64_t from) {
  sampler->target = from + contprof_allocation_gap(&sampler->random_state, sampler->interval);
  sampler->target_interval = sampler->interval;
}

static void take_sample(contprof_allocation_sampler *sampler, VALUE object, uint64_t position) {
  uint64_t missed = position > sampler->target ? position - sampler->target : 0;
  uint64_t weight = saturated_sum(saturated_sum(sampler->target_interval, missed), sampler->unseen);
  sampler->unseen = 0;
  sampler->samples++;
  if (sampler->pending) { // the job has not recorded the previous one yet: it carries this gap too
    sampler->sample.weight = saturated_sum(sampler->sample.weight, weight);
    if (sampler->sample.samples < UINT32_MAX) sampler->sample.samples++;
    sampler->merged++;
    return;
  }
  contprof_allocation_sample *sample = &sampler->sample;
  sample->thread = rb_thread_current();
  sample->object = object;
  sample->gc_count = rb_gc_count();
  sample->weight = weight;
  sample->samples = 1;
  long total = contprof_vm_read_stack(sample->thread, sampler->frames, sampler->capacity);
  sample->total = total > 0 ? total : 0;
  sample->frame_count = sample->total < sampler->capacity ? sample->total : sampler->capacity;
  sample->class_name_len = contprof_allocation_class_name(object, sample->class_name, sizeof(sample->class_name));
  sampler->pending = true;
  contprof_vm_job_trigger_here();
}

// (In the hook, while quiet: see "Cost".)
static void probe_for_burst(contprof_allocation_sampler *sampler) {
  int64_t now = contprof_monotonic_ns();
  double rate = (double) QUIET_PROBE_CALLS / (double) (now > sampler->probe_ns ? now - sampler->probe_ns : 1);
  sampler->probe_ns = now;
  if (rate <= QUIET_RATE) {
    sampler->fast_windows = 0;
    return;
  }
  if (++sampler->fast_windows < 2) return;
  sampler->burst_rate = rate;
  sampler->quiet = false; // (probed once: the check decides)
  sampler->bursts++;
  contprof_vm_job_trigger_here();
}

static void on_newobj(VALUE tracepoint, void *data) {
  contprof_allocation_sampler *sampler = data;
  sampler->hook_calls++;
  sampler->calls_since_armed++;
  if (!sampler->running || !sampler->armed) return;
  // The profiler's own allocation (in a round, or on one of its threads, as a flush) is
  // not the program's: neither sampled nor in any sample's weight. (Its threads are never
  // sampled; and while the program allocates slowly the hook stays on, where a flush would
  // otherwise show as a site of its own.) Unseen, with the hook off, it moves the counter on
// as the program's would.
  if (sampler->busy || contprof_profiler_thread(rb_thread_current())) {
    sampler->target++;
    return;
  }
  if (sampler->quiet && ++sampler->probe_calls % QUIET_PROBE_CALLS == 0) probe_for_burst(sampler);
  uint64_t position = sampler->armed_at + sampler->calls_since_armed;
  if (position < sampler->target) return;
  VALUE object = rb_tracearg_object(rb_tracearg_from_tracepoint(tracepoint));
  take_sample(sampler, object, position);
  draw_target(sampler, position);
}

// ---------------------------------------------------------------------------------------
// Holding the GVL, outside allocations

// When the window the rate is being measured over may close.
static int64_t rate_window_end(const contprof_allocation_sampler *sampler) {
  return sampler->checked_at_ns + RATE_WINDOW_NS;
}

int64_t contprof_allocation_sampler_start(contprof_allocation_sampler *sampler) {
  if (!sampler->mean_interval) return 0;
  if (NIL_P(sampler->tracepoint)) {
    sampler->tracepoint = rb_tracepoint_new(Qnil, RUBY_INTERNAL_EVENT_NEWOBJ, on_newobj, sampler);
  }
  uint64_t now = contprof_vm_allocated_objects();
  sampler->checked_at_ns = contprof_monotonic_ns();
  sampler->random_state = contprof_jitter_seed((uint64_t) sampler->checked_at_ns, (uint64_t) (uintptr_t) sampler);
  sampler->interval = sampler->mean_interval;
  sampler->checked_count = now;
  sampler->unseen = 0;
  draw_target(sampler, now);
  sampler->rate = sampler->burst_rate = 0;
  sampler->rate_known = sampler->quiet = false;
  sampler->pending = false;
  sampler->running = true;
  // Until a check has measured how fast the program allocates, the distance to the target
  // cannot be judged: with a fixed interval the hook is on meanwhile; with the automatic
  // one it stays off, and the first check comes after RATE_WINDOW_NS (a profiler started
  // often, as in Contprof.profile blocks, would otherwise pay the hook at every start; a
  // program that reaches its first target sooner gets that sample late).
  if (!sampler->automatic) {
    arm(sampler, now);
    return 0;
  }
  return rate_window_end(sampler);
}

void contprof_allocation_sampler_stop(contprof_allocation_sampler *sampler) {
  sampler->running = false;
  if (!NIL_P(sampler->tracepoint)) disarm(sampler);
  sampler->pending = false;
  sampler->sample.thread = Qnil;
}

// The distance to the target within which the hook must be on: what ARMING_LEAD_NS may
// allocate at the rate measured.
static uint64_t margin_of(const contprof_allocation_sampler *sampler) {
  return (uint64_t) (sampler->rate * (double) ARMING_LEAD_NS) + MIN_MARGIN;
}

// Whether the hook should be on, the target `distance` allocations away: within the margin,
// or while quiet (see "Cost").
static bool hook_wanted(const contprof_allocation_sampler *sampler, uint64_t distance) {
  return sampler->quiet || distance <= margin_of(sampler);
}

// A check found the program allocating slowly: the hook stays on until it times a burst.
static void enter_quiet(contprof_allocation_sampler *sampler) {
  if (sampler->quiet) return;
  sampler->quiet = true;
  sampler->probe_calls = 0;
  sampler->fast_windows = 0;
  sampler->probe_ns = contprof_monotonic_ns();
}

// After a sample was recorded: off again unless the next target is near.
static void after_sample(contprof_allocation_sampler *sampler) {
  if (!sampler->running || !sampler->armed || sampler->pending || !sampler->rate_known) return;
  uint64_t position = sampler->armed_at + sampler->calls_since_armed;
  if (sampler->target > position && !hook_wanted(sampler, sampler->target - position)) disarm(sampler);
}

// Updates the rate from the allocations since the previous window (a quiet window of
// QUIET_WINDOW_NS sets it: see "Cost").
static void measure_rate(contprof_allocation_sampler *sampler, uint64_t now, int64_t now_ns) {
  int64_t elapsed = now_ns - sampler->checked_at_ns;
  if (elapsed < RATE_WINDOW_NS) return; // too short to tell (the window goes on)
  double rate = (double) (now > sampler->checked_count ? now - sampler->checked_count : 0) / (double) elapsed;
  double decayed = sampler->rate * exp2(-(double) elapsed / RATE_HALF_LIFE_NS);
  bool quiet_window = elapsed >= QUIET_WINDOW_NS && rate <= QUIET_RATE;
  sampler->rate = rate > decayed || quiet_window ? rate : decayed;
  sampler->checked_count = now;
  sampler->checked_at_ns = now_ns;
  sampler->rate_known = true;
}

int64_t contprof_allocation_sampler_check(contprof_allocation_sampler *sampler, int64_t now_ns) {
  if (!sampler->running) return 0;
  // A collected Ractor turns every tracepoint off on Ruby 3.x (bug #19112): noticed here.
  if (sampler->armed && !RTEST(rb_tracepoint_enabled_p(sampler->tracepoint))) {
    sampler->hook_lost++;
    sampler->armed = false;
  }
  uint64_t now = sampler->armed ? sampler->armed_at + sampler->calls_since_armed : contprof_vm_allocated_objects();
  measure_rate(sampler, now, now_ns);
  if (sampler->burst_rate > 0) { // (the hook timed a burst: its rate is the one now)
    if (sampler->burst_rate > sampler->rate) sampler->rate = sampler->burst_rate;
    sampler->burst_rate = 0;
    sampler->rate_known = true;
  } else if (sampler->rate_known && sampler->rate <= QUIET_RATE) {
    enter_quiet(sampler);
  }
  if (!sampler->rate_known) return sampler->armed ? 0 : rate_window_end(sampler);
  uint64_t margin = margin_of(sampler);
  if (sampler->automatic) {
    uint64_t floor_interval = ARMED_SHARE_INVERSE * margin;
    uint64_t previous = sampler->interval;
    sampler->interval = sampler->mean_interval > floor_interval ? sampler->mean_interval : floor_interval;
    // A target drawn at a much smaller interval (before a burst) would keep the hook on
    // until it is reached: the next sample is drawn again at the interval now (the draw has
    // no memory, so no allocation is likelier to be sampled for it).
    if (sampler->interval > 2 * previous && sampler->target > now) {
      draw_target(sampler, now);
    }
  }
  if (sampler->armed) {
    after_sample(sampler);
    if (sampler->armed) return 0;
  }
  if (sampler->target <= now) {
    sampler->late_armings++;
    // The sample the target stood for, and the allocations since, are carried by the next
    // one, drawn afresh from here. Not by the first allocations after this check: they are
    // no random ones (a check is late mostly because a GC held it back, or because the
    // program allocated in a burst between phases that do not, and what allocates first
    // after either is always the same site).
    sampler->unseen = saturated_sum(sampler->unseen, saturated_sum(now - sampler->target, sampler->target_interval));
    draw_target(sampler, now);
  }
  uint64_t distance = sampler->target - now;
  double to_margin_ns = distance > margin ? (double) (distance - margin) / sampler->rate : 0;
  if (hook_wanted(sampler, distance) || to_margin_ns < CONTPROF_ALARM_ARM_NOW_NS) {
    arm(sampler, now);
    return 0;
  }
  double wait_ns = to_margin_ns / CONTPROF_ALARM_PACE;
  if (CONTPROF_ALARM_SLACK_NS > 0) {
    wait_ns = to_margin_ns <= CONTPROF_ALARM_SLACK_NS ? to_margin_ns : fmax(wait_ns, to_margin_ns - CONTPROF_ALARM_SLACK_NS);
  }
  return now_ns + (wait_ns < RECHECK_NS ? (int64_t) wait_ns : RECHECK_NS);
}

const contprof_allocation_sample *contprof_allocation_sampler_pending(contprof_allocation_sampler *sampler,
                                                                      const contprof_raw_frame **frames) {
  if (!sampler->pending) return NULL;
  *frames = sampler->frames;
  if (sampler->sample.gc_count != rb_gc_count()) {
    sampler->stale++; // the frames and the object may have moved or gone
    sampler->sample.object = Qnil;
  }
  return &sampler->sample;
}

void contprof_allocation_sampler_done(contprof_allocation_sampler *sampler) {
  sampler->pending = false;
  sampler->sample.thread = Qnil;
  sampler->sample.object = Qnil;
  sampler->recorded++;
  after_sample(sampler);
}

void contprof_allocation_sampler_stats(const contprof_allocation_sampler *sampler, VALUE stats) {
#define ALLOCATION_STAT(key, value) rb_hash_aset(stats, ID2SYM(rb_intern(key)), ULL2NUM(value))
  ALLOCATION_STAT("allocation_interval", sampler->interval);
  ALLOCATION_STAT("allocation_samples", sampler->samples);
  ALLOCATION_STAT("allocation_samples_merged", sampler->merged);
  ALLOCATION_STAT("allocation_samples_stale", sampler->stale);
  ALLOCATION_STAT("allocation_hook_calls", sampler->hook_calls);
  ALLOCATION_STAT("allocation_armings", sampler->armings);
  ALLOCATION_STAT("allocation_late_armings", sampler->late_armings);
  ALLOCATION_STAT("allocation_hook_lost", sampler->hook_lost);
  ALLOCATION_STAT("allocation_checks_asked", sampler->checks_asked);
  ALLOCATION_STAT("allocation_bursts", sampler->bursts);
#undef ALLOCATION_STAT
}
