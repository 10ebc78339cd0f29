// Where serialized profiles go from C: the HTTP transport (http_transport.c, libcurl with
// the GVL released) and the file writer (file_writer.c).
#pragma once

#include <ruby.h>

void contprof_http_transport_init(VALUE contprof_module);
void contprof_file_writer_init(VALUE contprof_module);
