// gzip for pprof files: compression for serialized profiles, behind one small streaming
// interface so that the compressor is a build-time choice made by measurement (see
// pprof_gzip.c): libdeflate when available, else zlib, else a dependency-free "stored"
// gzip (valid gzip, no compression) so that a build without either library still produces
// files every pprof reader accepts; and decompression for the pprof reader, with the same
// backend (the stored build reads stored gzip only). Plain C: no Ruby headers.
#pragma once

#include "pprof_util.h"

typedef struct pprof_gzip_stream pprof_gzip_stream;

// Starts a gzip member that will be appended to `out`. `input_size` is the number of
// bytes that will be written (a hint: backends that buffer reserve exactly that).
PPROF_MUST_CHECK
pprof_status pprof_gzip_open(pprof_gzip_stream **stream, pprof_buffer *out, size_t input_size, pprof_error *error);
// Compresses `len` bytes (may buffer internally).
PPROF_MUST_CHECK
pprof_status pprof_gzip_write(pprof_gzip_stream *stream, const uint8_t *data, size_t len, pprof_error *error);
// Finishes the member (trailer included) and frees the stream, on success or failure.
PPROF_MUST_CHECK
pprof_status pprof_gzip_close(pprof_gzip_stream *stream, pprof_error *error);
// Frees the stream without finishing it (after an error elsewhere).
void pprof_gzip_abort(pprof_gzip_stream *stream);

// Decompressed pprof files larger than this are refused (a profile is megabytes at most;
// this keeps a hostile file from asking for the whole address space).
#define PPROF_GUNZIP_MAX_BYTES ((size_t) 1 << 30)

static inline bool pprof_is_gzip(const uint8_t *data, size_t len) { return len >= 2 && data[0] == 0x1f && data[1] == 0x8b; }

// Decompresses the first gzip member of `data` into `out` (cleared first). A stream that
// is corrupt, truncated or would inflate beyond PPROF_GUNZIP_MAX_BYTES gives
// PPROF_ERR_INVALID.
PPROF_MUST_CHECK
pprof_status pprof_gunzip(const uint8_t *data, size_t len, pprof_buffer *out, pprof_error *error);
