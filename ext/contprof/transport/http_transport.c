// Contprof::HttpTransport: POSTs with libcurl, multipart/form-data (the Datadog and
// Pyroscope exporters) or a body as it is (OTLP).
//
// The request runs with the GVL released, so the application keeps running during an
// upload; Ruby can cancel it (Thread#kill, VM shutdown) through the unblocking function,
// which wakes the request's poll (curl_multi_wakeup) and makes it give up at once. (With
// curl_easy_perform, only the progress callback could abort it, and libcurl calls that
// once a second while it waits for a silent server: a stop at exit waited up to a second
// more per upload in flight.) Redirects are never followed (an API
// key must not travel to another host). Everything libcurl needs is built from arguments
// validated beforehand, and everything allocated is released before any Ruby exception
// can be raised.
#include "transport/transport.h"
#include <ruby.h>
#include <ruby/thread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "ruby_helpers.h"
#include "time_helpers.h"

#define MAX_RESPONSE_BYTES (16 * 1024)

static VALUE http_error_class = Qnil;

#ifdef CONTPROF_HAVE_LIBCURL
#include "transport/curl_library.h"

typedef struct {
  CURLM *multi;
  CURL *curl;
  curl_mime *mime;
  struct curl_slist *headers;
  atomic_bool cancelled;
  int64_t deadline_ns; // CLOCK_MONOTONIC: the request's whole time, restarts included
  CURLcode result;
  long status;
  char error[CURL_ERROR_SIZE];
  size_t response_len;
  char response[MAX_RESPONSE_BYTES]; // the first bytes of the response body
  VALUE url; // for error messages; kept alive by http_post's frame
} http_call;

static size_t collect_response(char *data, size_t size, size_t count, void *userdata) {
  http_call *call = userdata;
  size_t len = size * count;
  size_t room = sizeof(call->response) - call->response_len;
  memcpy(call->response + call->response_len, data, len < room ? len : room);
  call->response_len += len < room ? len : room;
  return len; // keep reading (and discarding) the rest
}

// Runs the transfer to its end, or until cancelled.
static CURLcode perform(http_call *call) {
  if (contprof_curl.multi_add_handle(call->multi, call->curl) != CURLM_OK) return CURLE_OUT_OF_MEMORY;
  CURLcode result = CURLE_OK;
  for (;;) {
    int running = 0;
    if (contprof_curl.multi_perform(call->multi, &running) != CURLM_OK) {
      result = CURLE_SEND_ERROR;
      break;
    }
    if (running == 0) {
      int left = 0;
      CURLMsg *message;
      while ((message = contprof_curl.multi_info_read(call->multi, &left))) {
        if (message->msg == CURLMSG_DONE) result = message->data.result;
      }
      break;
    }
    if (atomic_load(&call->cancelled)) {
      result = CURLE_ABORTED_BY_CALLBACK;
      break;
    }
    // (Returns at libcurl's next timeout, at activity, or when woken.)
    if (contprof_curl.multi_poll(call->multi, NULL, 0, 1000, NULL) != CURLM_OK) {
      result = CURLE_RECV_ERROR;
      break;
    }
  }
  contprof_curl.multi_remove_handle(call->multi, call->curl);
  return result;
}

static void *perform_without_gvl(void *data) {
  http_call *call = data;
  call->result = perform(call);
  if (call->result == CURLE_OK) contprof_curl.easy_getinfo(call->curl, CURLINFO_RESPONSE_CODE, &call->status);
  return NULL;
}

// The unblocking function: called by Ruby, from another thread, while the request runs.
static void cancel_request(void *data) {
  http_call *call = data;
  atomic_store(&call->cancelled, true);
  contprof_curl.multi_wakeup(call->multi); // (thread-safe, unlike the rest of the multi API)
}

static void release_call(http_call *call) {
  if (call->curl) contprof_curl.easy_cleanup(call->curl);
  if (call->multi) contprof_curl.multi_cleanup(call->multi);
  call->multi = NULL;
  if (call->mime) contprof_curl.mime_free(call->mime);
  if (call->headers) contprof_curl.slist_free_all(call->headers);
  call->curl = NULL;
  call->mime = NULL;
  call->headers = NULL;
}

// Runs the request with the GVL released and turns it into [status, body] or an exception.
// Runs under rb_ensure, so the call is released and freed however this ends (including an
// interrupt raised by rb_thread_check_ints).
//
// Ruby interrupts a thread for many reasons, and most are routine: the timer thread's
// time slice, a postponed job (our own sampler's) queued while this thread held the GVL,
// Thread#wakeup, a signal trap handled on the main thread. One pending when the request
// starts is handled by contprof_call_without_gvl; one arriving while the request runs
// calls cancel_request. Either way the interrupt is processed here: a real one
// (Thread#kill, Thread#raise, VM shutdown) raises out of rb_thread_check_ints and abandons
// the request; after a routine one the request runs (again, from the start: at most
// MAX_RESTARTS times, so that a thread woken over and over cannot upload for ever, and
// within the time left of the request's timeout).
#define MAX_RESTARTS 3
static VALUE run_call(VALUE data) {
  http_call *call = (http_call *) data;
  int restarts = 0;
  for (;;) {
    int64_t left_ms = (call->deadline_ns - contprof_clock_ns(CLOCK_MONOTONIC)) / 1000000;
    if (left_ms <= 0) {
      call->result = CURLE_OPERATION_TIMEDOUT;
      break;
    }
    contprof_curl.easy_setopt(call->curl, CURLOPT_TIMEOUT_MS, (long) left_ms);
    contprof_curl.easy_setopt(call->curl, CURLOPT_CONNECTTIMEOUT_MS, (long) left_ms);
    contprof_call_without_gvl(perform_without_gvl, call, cancel_request, call);
    bool interrupted = call->result != CURLE_OK && atomic_load(&call->cancelled);
    if (!interrupted) break;
    rb_thread_check_ints();
    if (++restarts > MAX_RESTARTS) break;
    atomic_store(&call->cancelled, false);
    call->response_len = 0;
    call->error[0] = '\0';
  }
  if (call->result != CURLE_OK) {
    if (atomic_load(&call->cancelled)) {
      rb_raise(http_error_class, "POST %" PRIsVALUE ": cancelled (interrupted %d times)", call->url, restarts);
    }
    call->error[sizeof(call->error) - 1] = '\0';
    rb_raise(http_error_class, "POST %" PRIsVALUE ": %s%s%s", call->url, contprof_curl.easy_strerror(call->result),
             call->error[0] ? ": " : "", call->error);
  }
  return rb_ary_new_from_args(2, LONG2NUM(call->status), rb_str_new(call->response, (long) call->response_len));
}

static VALUE free_call(VALUE data) {
  release_call((http_call *) data);
  free((http_call *) data);
  return Qnil;
}

// Checks that `value` is a String without NUL bytes and makes it NUL-terminated.
static const char *checked_cstring(VALUE value, const char *what) {
  CONTPROF_ENFORCE_TYPE(value, T_STRING, what, "a String");
  return StringValueCStr(value);
}

// HttpTransport._native_post(url, unix_socket_path, headers, parts, timeout_seconds)
//   headers: Array of [name, value]; parts: Array of [name, data, filename or nil,
//   content type or nil], a multipart/form-data body; or a String, the body as it is (its
//   Content-Type is in `headers`). Returns [status, response body (first 16 KiB)].
static VALUE http_post(VALUE CONTPROF_UNUSED module, VALUE url, VALUE unix_socket, VALUE headers, VALUE parts, VALUE timeout) {
  // Everything that can raise comes first, before anything is allocated.
  checked_cstring(url, "url");
  if (!NIL_P(unix_socket)) checked_cstring(unix_socket, "unix_socket");
  CONTPROF_ENFORCE_TYPE(headers, T_ARRAY, "headers", "an Array of [name, value] pairs");
  bool raw_body = RB_TYPE_P(parts, T_STRING);
  if (!raw_body) CONTPROF_ENFORCE_TYPE(parts, T_ARRAY, "parts", "an Array of [name, data, filename, content_type] or a String");
  double timeout_seconds = NUM2DBL(timeout);
  if (!(timeout_seconds > 0 && timeout_seconds <= 3600)) rb_raise(rb_eArgError, "timeout must be within (0, 3600]");
  VALUE header_lines = rb_ary_new_capa(RARRAY_LEN(headers));
  for (long i = 0; i < RARRAY_LEN(headers); i++) {
    VALUE header = RARRAY_AREF(headers, i);
    if (!RB_TYPE_P(header, T_ARRAY) || RARRAY_LEN(header) != 2) rb_raise(rb_eArgError, "headers[%ld] must be [name, value]", i);
    VALUE line = rb_sprintf("%s: %s", checked_cstring(RARRAY_AREF(header, 0), "header name"),
                            checked_cstring(RARRAY_AREF(header, 1), "header value"));
    StringValueCStr(line);
    rb_ary_push(header_lines, line);
  }
  for (long i = 0; !raw_body && i < RARRAY_LEN(parts); i++) {
    VALUE part = RARRAY_AREF(parts, i);
    if (!RB_TYPE_P(part, T_ARRAY) || RARRAY_LEN(part) != 4) {
      rb_raise(rb_eArgError, "parts[%ld] must be [name, data, filename, content_type]", i);
    }
    checked_cstring(RARRAY_AREF(part, 0), "part name");
    CONTPROF_ENFORCE_TYPE(RARRAY_AREF(part, 1), T_STRING, "part data", "a String");
    if (!NIL_P(RARRAY_AREF(part, 2))) checked_cstring(RARRAY_AREF(part, 2), "part filename");
    if (!NIL_P(RARRAY_AREF(part, 3))) checked_cstring(RARRAY_AREF(part, 3), "part content type");
  }

  char load_error[256];
  if (!contprof_curl_load(load_error, sizeof(load_error))) rb_raise(http_error_class, "%s", load_error);

  // The call lives on the heap: it is 17 KiB, and a frame left by a Ruby exception raised
  // from rb_thread_check_ints would otherwise leave its stale stack poisoned under ASan.
  http_call *call = calloc(1, sizeof(*call));
  if (!call) rb_raise(rb_eNoMemError, "Contprof could not allocate an HTTP request");
  call->curl = contprof_curl.easy_init();
  call->multi = contprof_curl.multi_init();
  if (!call->curl || !call->multi) {
    release_call(call);
    free(call);
    rb_raise(http_error_class, "libcurl could not create a request");
  }
  call->deadline_ns = contprof_clock_ns(CLOCK_MONOTONIC) + (int64_t) (timeout_seconds * 1e9);
  CURL *curl = call->curl;
  // libcurl copies every string option and mime field it is given.
  contprof_curl.easy_setopt(curl, CURLOPT_URL, RSTRING_PTR(url));
  if (!NIL_P(unix_socket)) contprof_curl.easy_setopt(curl, CURLOPT_UNIX_SOCKET_PATH, RSTRING_PTR(unix_socket));
  contprof_curl.easy_setopt(curl, CURLOPT_NOSIGNAL, 1L); // no SIGALRM: we are one thread among many
  contprof_curl.easy_setopt(curl, CURLOPT_FOLLOWLOCATION, 0L);
  contprof_curl.easy_setopt(curl, CURLOPT_ERRORBUFFER, call->error);
  contprof_curl.easy_setopt(curl, CURLOPT_WRITEFUNCTION, collect_response);
  contprof_curl.easy_setopt(curl, CURLOPT_WRITEDATA, call);
  for (long i = 0; i < RARRAY_LEN(header_lines); i++) {
    struct curl_slist *appended = contprof_curl.slist_append(call->headers, RSTRING_PTR(RARRAY_AREF(header_lines, i)));
    if (appended) call->headers = appended;
  }
  // Without this libcurl would send "Expect: 100-continue" and wait for the server.
  struct curl_slist *appended = contprof_curl.slist_append(call->headers, "Expect:");
  if (appended) call->headers = appended;
  contprof_curl.easy_setopt(curl, CURLOPT_HTTPHEADER, call->headers);

  if (raw_body) {
    // Copied by libcurl (the String may move or change once the GVL is released); the
    // size first, as the body may hold NUL bytes.
    contprof_curl.easy_setopt(curl, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t) RSTRING_LEN(parts));
    contprof_curl.easy_setopt(curl, CURLOPT_COPYPOSTFIELDS, RSTRING_PTR(parts));
  } else {
    call->mime = contprof_curl.mime_init(curl);
  }
  for (long i = 0; !raw_body && i < RARRAY_LEN(parts) && call->mime; i++) {
    VALUE part = RARRAY_AREF(parts, i);
    curl_mimepart *mime_part = contprof_curl.mime_addpart(call->mime);
    if (!mime_part) continue;
    VALUE data = RARRAY_AREF(part, 1);
    contprof_curl.mime_name(mime_part, RSTRING_PTR(RARRAY_AREF(part, 0)));
    contprof_curl.mime_data(mime_part, RSTRING_PTR(data), (size_t) RSTRING_LEN(data));
    if (!NIL_P(RARRAY_AREF(part, 2))) contprof_curl.mime_filename(mime_part, RSTRING_PTR(RARRAY_AREF(part, 2)));
    if (!NIL_P(RARRAY_AREF(part, 3))) contprof_curl.mime_type(mime_part, RSTRING_PTR(RARRAY_AREF(part, 3)));
  }
  if (!raw_body) contprof_curl.easy_setopt(curl, CURLOPT_MIMEPOST, call->mime);

  call->url = url;
  VALUE result = rb_ensure(run_call, (VALUE) call, free_call, (VALUE) call);
  RB_GC_GUARD(url);
  RB_GC_GUARD(unix_socket);
  RB_GC_GUARD(headers);
  RB_GC_GUARD(parts);
  RB_GC_GUARD(header_lines);
  return result;
}

static VALUE http_available(VALUE CONTPROF_UNUSED module) { return Qtrue; }

// Why libcurl cannot be used here (loading it now), or nil: `contprof doctor` asks, since
// an upload would find out only at its first flush.
static VALUE http_load_problem(VALUE CONTPROF_UNUSED module) {
  char load_error[256];
  return contprof_curl_load(load_error, sizeof(load_error)) ? Qnil : rb_str_new_cstr(load_error);
}

#else // built without libcurl

static VALUE http_post(VALUE CONTPROF_UNUSED module, VALUE CONTPROF_UNUSED url, VALUE CONTPROF_UNUSED unix_socket,
                       VALUE CONTPROF_UNUSED headers, VALUE CONTPROF_UNUSED parts, VALUE CONTPROF_UNUSED timeout) {
  rb_raise(http_error_class, "Contprof was built without libcurl: HTTP uploads are unavailable");
}

static VALUE http_available(VALUE CONTPROF_UNUSED module) { return Qfalse; }
static VALUE http_load_problem(VALUE CONTPROF_UNUSED module) { return rb_str_new_cstr("built without libcurl"); }

#endif

void contprof_http_transport_init(VALUE contprof_module) {
  VALUE transport = rb_define_module_under(contprof_module, "HttpTransport");
  http_error_class = rb_define_class_under(transport, "Error", contprof_error_class);
  rb_global_variable(&http_error_class);
  rb_define_singleton_method(transport, "_native_post", http_post, 5);
  rb_define_singleton_method(transport, "available?", http_available, 0);
  rb_define_singleton_method(transport, "load_problem", http_load_problem, 0);
}
