// The "thread state" label (see thread_states.h).
//
// The VM backend tells running (or waiting for the GVL) from not running; what a thread
// that is not running waits for is read from the method it waits in, its leaf frame: a
// thread blocked in IO#read waits for I/O whatever the backend calls it (Ruby 3.1 marks
// it as in native code, 3.3's hooks as having released the GVL). The names are matched
// by owner and method, as Ruby backtraces print them ("Thread::Queue#pop", "IO.select").
#include "collectors/thread_states.h"

#include <string.h>

static const pprof_str names[CONTPROF_STATE_COUNT] = {
  [CONTPROF_STATE_RUNNING] = PPROF_STR("running"),   [CONTPROF_STATE_NATIVE] = PPROF_STR("native"),
  [CONTPROF_STATE_GVL] = PPROF_STR("waiting for gvl"), [CONTPROF_STATE_SLEEPING] = PPROF_STR("sleeping"),
  [CONTPROF_STATE_WAITING] = PPROF_STR("waiting"),   [CONTPROF_STATE_IO] = PPROF_STR("io"),
};

pprof_str contprof_state_name(contprof_state state) {
  return state < CONTPROF_STATE_COUNT ? names[state] : names[CONTPROF_STATE_RUNNING];
}

typedef struct {
  const char *name; // an owner ("IO"), or a method of one ("Kernel#sleep")
  contprof_state state;
} waiting_place;

// Owners all of whose blocking methods wait for the same thing, then single methods.
static const waiting_place owners[] = {
  {"Thread::Queue", CONTPROF_STATE_WAITING},
  {"Thread::SizedQueue", CONTPROF_STATE_WAITING},
  {"Thread::Mutex", CONTPROF_STATE_WAITING},
  {"Thread::ConditionVariable", CONTPROF_STATE_WAITING},
  {"Monitor", CONTPROF_STATE_WAITING},
  {"MonitorMixin::ConditionVariable", CONTPROF_STATE_WAITING},
  {"Process", CONTPROF_STATE_WAITING},
  {"Process::Status", CONTPROF_STATE_WAITING},
  {"Ractor", CONTPROF_STATE_WAITING},
  {"IO", CONTPROF_STATE_IO},
  {"File", CONTPROF_STATE_IO},
  {"BasicSocket", CONTPROF_STATE_IO},
  {"Socket", CONTPROF_STATE_IO},
  {"IPSocket", CONTPROF_STATE_IO},
  {"TCPSocket", CONTPROF_STATE_IO},
  {"TCPServer", CONTPROF_STATE_IO},
  {"UDPSocket", CONTPROF_STATE_IO},
  {"UNIXSocket", CONTPROF_STATE_IO},
  {"UNIXServer", CONTPROF_STATE_IO},
  {"Addrinfo", CONTPROF_STATE_IO},
  {"OpenSSL::SSL::SSLSocket", CONTPROF_STATE_IO},
  {"OpenSSL::SSL::SSLServer", CONTPROF_STATE_IO},
};

static const waiting_place methods[] = {
  {"Kernel#sleep", CONTPROF_STATE_SLEEPING},
  {"Thread.stop", CONTPROF_STATE_SLEEPING},
  {"Thread#join", CONTPROF_STATE_WAITING},
  {"Thread#value", CONTPROF_STATE_WAITING},
  {"Kernel#system", CONTPROF_STATE_WAITING},
  {"Kernel#select", CONTPROF_STATE_IO},
  {"Kernel#gets", CONTPROF_STATE_IO},
  {"Kernel#readline", CONTPROF_STATE_IO},
  {"Kernel#readlines", CONTPROF_STATE_IO},
  {"Kernel#`", CONTPROF_STATE_IO},
};

contprof_state contprof_state_of_waiting_place(const char *name, size_t len) {
  for (size_t i = 0; i < sizeof(methods) / sizeof(methods[0]); i++) {
    if (strlen(methods[i].name) == len && memcmp(methods[i].name, name, len) == 0) return methods[i].state;
  }
  // The owner: what comes before the last '#' or '.' ("IO.select", "Thread::Queue#pop").
  size_t owner_len = len;
  while (owner_len > 0 && name[owner_len - 1] != '#' && name[owner_len - 1] != '.') owner_len--;
  if (owner_len == 0) return CONTPROF_STATE_COUNT;
  owner_len--;
  for (size_t i = 0; i < sizeof(owners) / sizeof(owners[0]); i++) {
    if (strlen(owners[i].name) == owner_len && memcmp(owners[i].name, name, owner_len) == 0) return owners[i].state;
  }
  return CONTPROF_STATE_COUNT;
}

static size_t cache_position(pprof_frame_key key) {
  uint64_t mixed = (key.a ^ (key.b * 0x9E3779B97F4A7C15ull) ^ (key.c * 0xC2B2AE3D27D4EB4Full)) * 0x9E3779B97F4A7C15ull;
  return (size_t) (mixed >> 56) & (CONTPROF_STATE_CACHE_SIZE - 1);
}

// The waiting place `leaf` is (CONTPROF_STATE_COUNT: none known).
static contprof_state waiting_place_of(contprof_state_cache *cache, const contprof_raw_frame *leaf) {
  pprof_frame_key key = contprof_vm_frame_key(leaf);
  uint64_t epoch = 0;
  bool cacheable = contprof_vm_key_epoch(&epoch) && contprof_vm_frame_key_rememberable(leaf);
  size_t position = cache_position(key);
  if (cacheable && cache->epochs[position] == epoch + 1 && memcmp(&cache->keys[position], &key, sizeof(key)) == 0) {
    return (contprof_state) cache->states[position];
  }
  char buffer[256];
  pprof_str name = contprof_vm_frame_name(leaf, buffer, sizeof(buffer));
  cache->names_read++;
  contprof_state state = contprof_state_of_waiting_place(name.ptr, name.len);
  if (cacheable) {
    cache->keys[position] = key;
    cache->epochs[position] = epoch + 1; // (0: an empty entry)
    cache->states[position] = (uint8_t) state;
  }
  return state;
}

contprof_state contprof_state_of(contprof_state_cache *cache, contprof_thread_state vm_state,
                                 const contprof_raw_frame *leaf) {
  switch (vm_state) {
  case CONTPROF_THREAD_RUNNING:
    return CONTPROF_STATE_RUNNING;
  case CONTPROF_THREAD_GVL_WAIT:
    return CONTPROF_STATE_GVL;
  case CONTPROF_THREAD_NATIVE:
  case CONTPROF_THREAD_WAITING:
  default: {
    contprof_state place = leaf ? waiting_place_of(cache, leaf) : CONTPROF_STATE_COUNT;
    if (place != CONTPROF_STATE_COUNT) return place;
    return vm_state == CONTPROF_THREAD_WAITING ? CONTPROF_STATE_WAITING : CONTPROF_STATE_NATIVE;
  }
  }
}

contprof_thread_state contprof_thread_state_at_tick(const contprof_round *round, VALUE thread) {
  contprof_thread_state state = contprof_vm_thread_state(thread);
  VALUE holder = round->holder_at_tick;
  if (round->kind != CONTPROF_ROUND_WALL || NIL_P(holder) ||
      contprof_vm_thread_gvl_waited_ns(thread, 0) >= 0) {
    return state;
  }
  if (state == CONTPROF_THREAD_GVL_WAIT && thread == holder) return CONTPROF_THREAD_RUNNING;
  if (state == CONTPROF_THREAD_RUNNING && thread != holder) return CONTPROF_THREAD_GVL_WAIT;
  return state;
}
