// libcurl, loaded when the first upload needs it rather than when Ruby loads Contprof.
//
// Linking libcurl made every `require "contprof"` load it and its 36 dependencies (TLS,
// GSSAPI, LDAP, IDN, ...): 5.7 ms of CPU per process, the larger part of Contprof's
// start-up cost (bench/startup.rb), paid by every Ruby process `contprof exec` starts,
// most of which never upload anything. So the extension is built against libcurl's
// header only, and http_transport.c calls libcurl through this table, filled by dlopen
// at the first upload.
#pragma once

#include <curl/curl.h>
#include <stdbool.h>
#include <stddef.h>

typedef struct {
  CURL *(*easy_init)(void);
  CURLcode (*easy_setopt)(CURL *curl, CURLoption option, ...);
  CURLcode (*easy_perform)(CURL *curl);
  CURLcode (*easy_getinfo)(CURL *curl, CURLINFO info, ...);
  const char *(*easy_strerror)(CURLcode code);
  void (*easy_cleanup)(CURL *curl);
  struct curl_slist *(*slist_append)(struct curl_slist *list, const char *text);
  void (*slist_free_all)(struct curl_slist *list);
  curl_mime *(*mime_init)(CURL *curl);
  curl_mimepart *(*mime_addpart)(curl_mime *mime);
  CURLcode (*mime_name)(curl_mimepart *part, const char *name);
  CURLcode (*mime_data)(curl_mimepart *part, const char *data, size_t size);
  CURLcode (*mime_filename)(curl_mimepart *part, const char *filename);
  CURLcode (*mime_type)(curl_mimepart *part, const char *type);
  void (*mime_free)(curl_mime *mime);
  // The multi interface, for a request another thread can wake (curl_multi_wakeup).
  CURLM *(*multi_init)(void);
  CURLMcode (*multi_add_handle)(CURLM *multi, CURL *curl);
  CURLMcode (*multi_remove_handle)(CURLM *multi, CURL *curl);
  CURLMcode (*multi_perform)(CURLM *multi, int *running);
  CURLMcode (*multi_poll)(CURLM *multi, struct curl_waitfd *extra, unsigned int extra_count, int timeout_ms, int *ready);
  CURLMcode (*multi_wakeup)(CURLM *multi);
  CURLMsg *(*multi_info_read)(CURLM *multi, int *left);
  CURLMcode (*multi_cleanup)(CURLM *multi);
} contprof_curl_functions;

// The functions, once contprof_curl_load has succeeded.
extern contprof_curl_functions contprof_curl;

// Loads libcurl and initializes it (once; call holding the GVL, which serializes it).
// False when it cannot be loaded: `error` then says why.
bool contprof_curl_load(char *error, size_t error_size);
