// The names of the ThreadContext collector's state types (defined in thread_context_state.h),
// for the headers of its concerns (GC time, GVL waits, allocations...): each declares its
// own part of that state, which thread_context_state.h composes, and its functions take
// the whole, so those headers cannot include thread_context_state.h.
#pragma once

typedef struct collector_state collector_state;
typedef struct per_thread_context per_thread_context;
typedef struct label_set label_set;
