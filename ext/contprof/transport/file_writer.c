// Contprof::Native.write_file_atomically: writes a profile file without ever releasing
// the GVL. Ruby's own file operations release the GVL around each system call; at exit,
// behind busy application threads, taking it back can cost a time slice per thread, so a
// few file operations could delay exit by seconds. Profiles are small and go to the page
// cache: holding the GVL for the write costs the application less than those handoffs.
//
// The file is first written under a temporary name created with O_EXCL | O_NOFOLLOW
// (never through an existing file or symlink), then renamed into place.
//
// Contprof::Native.profile_files lists an output directory's profiles for its retention
// limits (Exporters::File#enforce_retention): names, modification times and sizes, read in
// one call without the GVL. Ruby's Dir and File.lstat would release and retake it for every
// file: behind busy threads, a directory of thousands of files would keep the profiler's
// thread waiting for minutes.
#include "transport/transport.h"
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ruby.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ruby_helpers.h"

static int write_all(int fd, const char *data, size_t len) {
  while (len > 0) {
    ssize_t written = write(fd, data, len);
    if (written < 0) {
      if (errno == EINTR) continue;
      return -1;
    }
    data += written;
    len -= (size_t) written;
  }
  return 0;
}

// Native.write_file_atomically(temporary_path, final_path, data, mode)
static VALUE write_file_atomically(VALUE CONTPROF_UNUSED module, VALUE temporary, VALUE final, VALUE data, VALUE mode) {
  const char *temporary_path = StringValueCStr(temporary);
  const char *final_path = StringValueCStr(final);
  CONTPROF_ENFORCE_TYPE(data, T_STRING, "data", "a String");
  int fd = open(temporary_path, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, (mode_t) NUM2INT(mode));
  if (fd < 0) rb_syserr_fail_str(errno, temporary);
  int error = write_all(fd, RSTRING_PTR(data), (size_t) RSTRING_LEN(data)) == 0 ? 0 : errno;
  if (close(fd) != 0 && error == 0) error = errno;
  if (error == 0 && rename(temporary_path, final_path) != 0) error = errno;
  if (error != 0) {
    unlink(temporary_path);
    rb_syserr_fail_str(error, final);
  }
  RB_GC_GUARD(data);
  return final;
}

typedef struct {
  char *name;
  int64_t mtime_ns, size;
} listed_file;

typedef struct {
  const char *directory;
  listed_file *files;
  size_t count, capacity;
  int error; // errno of a failure, or 0
} directory_listing;

static bool profile_file_name(const char *name) {
  if (name[0] == '.') return false; // (temporary files being written, and . and ..)
  size_t length = strlen(name);
  return (length > 6 && strcmp(name + length - 6, ".pprof") == 0) ||
         (length > 5 && strcmp(name + length - 5, ".otlp") == 0);
}

static bool add_listed_file(directory_listing *listing, const char *name, const struct stat *status) {
  if (listing->count == listing->capacity) {
    size_t capacity = listing->capacity ? 2 * listing->capacity : 256;
    listed_file *grown = realloc(listing->files, capacity * sizeof(*grown));
    if (!grown) return false;
    listing->files = grown;
    listing->capacity = capacity;
  }
  char *copy = strdup(name);
  if (!copy) return false;
  listing->files[listing->count++] = (listed_file) {
    .name = copy,
    .mtime_ns = (int64_t) status->st_mtim.tv_sec * 1000000000 + status->st_mtim.tv_nsec,
    .size = (int64_t) status->st_size,
  };
  return true;
}

// (Without the GVL: touches no Ruby object.)
static void *list_profile_files(void *data) {
  directory_listing *listing = data;
  int directory_fd = open(listing->directory, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (directory_fd < 0) {
    listing->error = errno;
    return NULL;
  }
  DIR *directory = fdopendir(directory_fd);
  if (!directory) {
    listing->error = errno;
    close(directory_fd);
    return NULL;
  }
  struct dirent *entry;
  while ((entry = readdir(directory)) != NULL) {
    if (!profile_file_name(entry->d_name)) continue;
    struct stat status;
    // (Gone meanwhile, or not a regular file: not ours to count or delete.)
    if (fstatat(directory_fd, entry->d_name, &status, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISREG(status.st_mode)) continue;
    if (!add_listed_file(listing, entry->d_name, &status)) {
      listing->error = ENOMEM;
      break;
    }
  }
  closedir(directory);
  return NULL;
}

static VALUE listed_files_to_array(VALUE data) {
  const directory_listing *listing = (const directory_listing *) data;
  VALUE files = rb_ary_new_capa((long) listing->count);
  for (size_t i = 0; i < listing->count; i++) {
    const listed_file *file = &listing->files[i];
    rb_ary_push(files, rb_ary_new_from_args(3, rb_str_new_cstr(file->name), LL2NUM(file->mtime_ns), LL2NUM(file->size)));
  }
  return files;
}

static void free_listing(directory_listing *listing) {
  for (size_t i = 0; i < listing->count; i++) free(listing->files[i].name);
  free(listing->files);
}

// Native.profile_files(directory): [[name, mtime (ns since the epoch), size], ...] of the
// directory's regular *.pprof and *.otlp files, in no order (names starting with "." are
// left out: files still being written). Raises SystemCallError naming the directory.
static VALUE profile_files(VALUE CONTPROF_UNUSED module, VALUE directory) {
  directory_listing listing = {.directory = StringValueCStr(directory)};
  contprof_call_without_gvl(list_profile_files, &listing, NULL, NULL);
  int state = 0;
  VALUE files = listing.error ? Qnil : rb_protect(listed_files_to_array, (VALUE) &listing, &state);
  free_listing(&listing);
  RB_GC_GUARD(directory);
  if (state) rb_jump_tag(state);
  if (listing.error) rb_syserr_fail_str(listing.error, directory);
  return files;
}

void contprof_file_writer_init(VALUE contprof_module) {
  VALUE native = rb_define_module_under(contprof_module, "Native");
  rb_define_singleton_method(native, "write_file_atomically", write_file_atomically, 4);
  rb_define_singleton_method(native, "profile_files", profile_files, 1);
}
