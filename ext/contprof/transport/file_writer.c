// Contprof::Native.write_file_atomically: writes a profile file without ever releasing
// the GVL. Ruby's own file operations release the GVL around each system call; at exit,
// behind busy application threads, taking it back can cost a time slice per thread, so a
// few file operations could delay exit by seconds. Profiles are small and go to the page
// cache: holding the GVL for the write costs the application less than those handoffs.
//
// The file is first written under a temporary name created with O_EXCL | O_NOFOLLOW
// (never through an existing file or symlink), then renamed into place.
#include "transport/transport.h"
#include <errno.h>
#include <fcntl.h>
#include <ruby.h>
#include <stdio.h>
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

void contprof_file_writer_init(VALUE contprof_module) {
  VALUE native = rb_define_module_under(contprof_module, "Native");
  rb_define_singleton_method(native, "write_file_atomically", write_file_atomically, 4);
}
