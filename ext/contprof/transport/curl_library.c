// Loads libcurl at the first upload (see curl_library.h for why).
#ifdef CONTPROF_HAVE_LIBCURL
#include "transport/curl_library.h"

#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

contprof_curl_functions contprof_curl;

static bool loaded;

// The names distributions give libcurl's ABI 4 (OpenSSL, GnuTLS and NSS flavours), then
// the development symlink.
static const char *const library_names[] = {"libcurl.so.4", "libcurl-gnutls.so.4", "libcurl-nss.so.4", "libcurl.so"};

// Stores `symbol`'s address in the function pointer at `field` (dlsym returns a data
// pointer; POSIX guarantees it converts to a function pointer).
static bool resolve(void *library, const char *symbol, void *field, char *error, size_t error_size) {
  void *address = dlsym(library, symbol);
  if (!address) {
    snprintf(error, error_size, "the libcurl found has no %s (libcurl 7.68 or later is needed)", symbol);
    return false;
  }
  memcpy(field, &address, sizeof(address));
  return true;
}

bool contprof_curl_load(char *error, size_t error_size) {
  if (loaded) return true;
  void *library = NULL;
  for (size_t i = 0; i < sizeof(library_names) / sizeof(library_names[0]) && !library; i++) {
    library = dlopen(library_names[i], RTLD_NOW | RTLD_LOCAL);
  }
  if (!library) {
    snprintf(error, error_size, "libcurl could not be loaded (%s); install libcurl4 (Debian) or your system's libcurl",
             dlerror());
    return false;
  }
  contprof_curl_functions functions;
  CURLcode (*global_init)(long flags);
  bool found = resolve(library, "curl_global_init", &global_init, error, error_size) &&
               resolve(library, "curl_easy_init", &functions.easy_init, error, error_size) &&
               resolve(library, "curl_easy_setopt", &functions.easy_setopt, error, error_size) &&
               resolve(library, "curl_easy_perform", &functions.easy_perform, error, error_size) &&
               resolve(library, "curl_easy_getinfo", &functions.easy_getinfo, error, error_size) &&
               resolve(library, "curl_easy_strerror", &functions.easy_strerror, error, error_size) &&
               resolve(library, "curl_easy_cleanup", &functions.easy_cleanup, error, error_size) &&
               resolve(library, "curl_slist_append", &functions.slist_append, error, error_size) &&
               resolve(library, "curl_slist_free_all", &functions.slist_free_all, error, error_size) &&
               resolve(library, "curl_mime_init", &functions.mime_init, error, error_size) &&
               resolve(library, "curl_mime_addpart", &functions.mime_addpart, error, error_size) &&
               resolve(library, "curl_mime_name", &functions.mime_name, error, error_size) &&
               resolve(library, "curl_mime_data", &functions.mime_data, error, error_size) &&
               resolve(library, "curl_mime_filename", &functions.mime_filename, error, error_size) &&
               resolve(library, "curl_mime_type", &functions.mime_type, error, error_size) &&
               resolve(library, "curl_mime_free", &functions.mime_free, error, error_size) &&
               resolve(library, "curl_multi_init", &functions.multi_init, error, error_size) &&
               resolve(library, "curl_multi_add_handle", &functions.multi_add_handle, error, error_size) &&
               resolve(library, "curl_multi_remove_handle", &functions.multi_remove_handle, error, error_size) &&
               resolve(library, "curl_multi_perform", &functions.multi_perform, error, error_size) &&
               resolve(library, "curl_multi_poll", &functions.multi_poll, error, error_size) &&
               resolve(library, "curl_multi_wakeup", &functions.multi_wakeup, error, error_size) &&
               resolve(library, "curl_multi_info_read", &functions.multi_info_read, error, error_size) &&
               resolve(library, "curl_multi_cleanup", &functions.multi_cleanup, error, error_size);
  if (!found) {
    dlclose(library);
    return false;
  }
  CURLcode initialized = global_init(CURL_GLOBAL_DEFAULT);
  if (initialized != CURLE_OK) {
    snprintf(error, error_size, "libcurl could not be initialized (%s)", functions.easy_strerror(initialized));
    dlclose(library);
    return false;
  }
  contprof_curl = functions;
  loaded = true; // the library stays loaded for the process's life
  return true;
}

#endif
