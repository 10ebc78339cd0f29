// gzip backends for the pprof core (see pprof_gzip.h): compression, and decompression
// for the pprof reader.
//
// Which backend is compiled is decided by extconf.rb from what the machine has, in the
// order of measured preference (`ruby bench/pprof_core.rb`):
//   PPROF_USE_LIBDEFLATE  libdeflate: one-shot compression of the whole encoded profile.
//   PPROF_USE_ZLIB        zlib: streaming deflate, lowest peak memory.
//   (neither)             "stored" deflate blocks: no compression, no dependency.
// PPROF_GZIP_LEVEL sets the compression level of the first two.
#include "pprof_gzip.h"

#include <stdlib.h>
#include <string.h>

#include "pprof_alloc.h"

#if defined(PPROF_USE_LIBDEFLATE)
#include <libdeflate.h>
#elif defined(PPROF_USE_ZLIB)
#include <zlib.h>
#endif

// Level 1 by measurement (bench/pprof_core.rb): with libdeflate it is twice as fast as
// level 6 for output 1-2% larger; with zlib, level 6 would be slower than Go's writer.
#ifndef PPROF_GZIP_LEVEL
#define PPROF_GZIP_LEVEL 1
#endif

struct pprof_gzip_stream {
  pprof_buffer *out;
#if defined(PPROF_USE_LIBDEFLATE)
  pprof_buffer pending; // libdeflate has no streaming API: collect everything, compress at close
#elif defined(PPROF_USE_ZLIB)
  z_stream z;
  bool z_initialized;
#else
  uint32_t crc;
  uint32_t total_len;
#endif
};

PPROF_MUST_CHECK
static pprof_status stream_new(pprof_gzip_stream **stream, pprof_buffer *out, pprof_error *error) {
  pprof_gzip_stream *s = pprof_malloc(sizeof(*s));
  if (!s) return pprof_fail(error, PPROF_ERR_NO_MEMORY, "out of memory starting gzip compression");
  memset(s, 0, sizeof(*s));
  s->out = out;
  *stream = s;
  return PPROF_OK;
}

// The gzip trailer's ISIZE (the member's uncompressed size modulo 2^32) as a first guess
// of the output's size, kept within what deflate can produce from `len` bytes (at most
// 1032 to 1) and within PPROF_GUNZIP_MAX_BYTES: a lying trailer costs a regrowth, never
// a huge allocation.
static size_t inflated_size_guess(const uint8_t *data, size_t len) {
  size_t claimed = 0;
  if (len >= 4) {
    const uint8_t *t = data + len - 4;
    claimed = (size_t) t[0] | (size_t) t[1] << 8 | (size_t) t[2] << 16 | (size_t) t[3] << 24;
  }
  size_t bound = len > (PPROF_GUNZIP_MAX_BYTES - 1024) / 1032 ? PPROF_GUNZIP_MAX_BYTES : len * 1032 + 1024;
  if (claimed > bound) claimed = bound;
  return claimed < 256 ? 256 : claimed;
}

PPROF_MUST_CHECK
static pprof_status too_big(pprof_error *error) {
  return pprof_fail(error, PPROF_ERR_INVALID, "gzip data decompresses to more than %zu MiB",
                    PPROF_GUNZIP_MAX_BYTES >> 20);
}

#if defined(PPROF_USE_LIBDEFLATE)

const char *pprof_compressor_name(void) { return "libdeflate"; }

pprof_status pprof_gzip_open(pprof_gzip_stream **stream, pprof_buffer *out, size_t input_size, pprof_error *error) {
  pprof_status status = stream_new(stream, out, error);
  if (status != PPROF_OK) return status;
  // Reserving the exact size up front keeps growth slack out of the peak memory.
  status = pprof_buffer_reserve(&(*stream)->pending, input_size, error);
  if (status != PPROF_OK) {
    pprof_gzip_abort(*stream);
    *stream = NULL;
  }
  return status;
}

pprof_status pprof_gzip_write(pprof_gzip_stream *stream, const uint8_t *data, size_t len, pprof_error *error) {
  return pprof_buffer_append(&stream->pending, data, len, error);
}

pprof_status pprof_gzip_close(pprof_gzip_stream *stream, pprof_error *error) {
  pprof_status status = PPROF_OK;
  struct libdeflate_compressor *compressor = libdeflate_alloc_compressor(PPROF_GZIP_LEVEL);
  if (!compressor) {
    status = pprof_fail(error, PPROF_ERR_NO_MEMORY, "out of memory creating the libdeflate compressor");
    goto done;
  }
  size_t bound = libdeflate_gzip_compress_bound(compressor, stream->pending.len);
  status = pprof_buffer_reserve(stream->out, bound, error);
  if (status != PPROF_OK) goto done;
  size_t written = libdeflate_gzip_compress(compressor, stream->pending.data, stream->pending.len,
                                            stream->out->data + stream->out->len, bound);
  if (written == 0) {
    status = pprof_fail(error, PPROF_ERR_COMPRESS, "libdeflate failed to compress %zu bytes", stream->pending.len);
    goto done;
  }
  stream->out->len += written;
done:
  if (compressor) libdeflate_free_compressor(compressor);
  pprof_gzip_abort(stream);
  return status;
}

void pprof_gzip_abort(pprof_gzip_stream *stream) {
  if (!stream) return;
  pprof_buffer_free(&stream->pending);
  pprof_free(stream, sizeof(*stream));
}

pprof_status pprof_gunzip(const uint8_t *data, size_t len, pprof_buffer *out, pprof_error *error) {
  out->len = 0;
  if (!pprof_is_gzip(data, len)) return pprof_fail(error, PPROF_ERR_INVALID, "not gzip data");
  struct libdeflate_decompressor *decompressor = libdeflate_alloc_decompressor();
  if (!decompressor) return pprof_fail(error, PPROF_ERR_NO_MEMORY, "out of memory creating the libdeflate decompressor");
  pprof_status status = pprof_buffer_reserve(out, inflated_size_guess(data, len), error);
  while (status == PPROF_OK) {
    size_t room = out->capacity < PPROF_GUNZIP_MAX_BYTES ? out->capacity : PPROF_GUNZIP_MAX_BYTES;
    size_t consumed = 0, produced = 0;
    enum libdeflate_result result =
      libdeflate_gzip_decompress_ex(decompressor, data, len, out->data, room, &consumed, &produced);
    if (result == LIBDEFLATE_SUCCESS) {
      out->len = produced;
      break;
    }
    if (result != LIBDEFLATE_INSUFFICIENT_SPACE) {
      status = pprof_fail(error, PPROF_ERR_INVALID, "invalid or truncated gzip data");
    } else if (room >= PPROF_GUNZIP_MAX_BYTES) {
      status = too_big(error);
    } else {
      status = pprof_buffer_reserve(out, room * 2 > PPROF_GUNZIP_MAX_BYTES ? PPROF_GUNZIP_MAX_BYTES : room * 2, error);
    }
  }
  libdeflate_free_decompressor(decompressor);
  return status;
}

#elif defined(PPROF_USE_ZLIB)

const char *pprof_compressor_name(void) { return "zlib"; }

// zlib's allocator hooks, routed through pprof_alloc so that its memory is counted.
// zlib frees without a size, so each block carries its size in a small header.
typedef union {
  size_t size;
  max_align_t align;
} zlib_block_header;

static voidpf zlib_alloc(voidpf opaque, uInt items, uInt size) {
  (void) opaque;
  size_t bytes = (size_t) items * size + sizeof(zlib_block_header);
  zlib_block_header *block = pprof_malloc(bytes);
  if (!block) return Z_NULL;
  block->size = bytes;
  return block + 1;
}

static void zlib_free(voidpf opaque, voidpf address) {
  (void) opaque;
  if (!address) return;
  zlib_block_header *block = (zlib_block_header *) address - 1;
  pprof_free(block, block->size);
}

pprof_status pprof_gzip_open(pprof_gzip_stream **stream, pprof_buffer *out, size_t input_size, pprof_error *error) {
  (void) input_size; // zlib streams: no need to know the total in advance
  pprof_status status = stream_new(stream, out, error);
  if (status != PPROF_OK) return status;
  pprof_gzip_stream *s = *stream;
  s->z.zalloc = zlib_alloc;
  s->z.zfree = zlib_free;
  // windowBits 15 + 16 asks zlib for a gzip header and trailer.
  int result = deflateInit2(&s->z, PPROF_GZIP_LEVEL, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY);
  if (result != Z_OK) {
    pprof_gzip_abort(s);
    *stream = NULL;
    return pprof_fail(error, result == Z_MEM_ERROR ? PPROF_ERR_NO_MEMORY : PPROF_ERR_COMPRESS,
                      "zlib deflateInit2 failed (%d)", result);
  }
  s->z_initialized = true;
  return PPROF_OK;
}

PPROF_MUST_CHECK
static pprof_status zlib_run(pprof_gzip_stream *s, const uint8_t *data, size_t len, int flush, pprof_error *error) {
  enum { OUTPUT_CHUNK = 64 * 1024, MAX_INPUT_CHUNK = 1 << 30 }; // avail_in is an unsigned int
  s->z.next_in = (Bytef *) data;
  s->z.avail_in = 0;
  size_t remaining = len;
  for (;;) {
    if (s->z.avail_in == 0 && remaining > 0) {
      size_t chunk = remaining > MAX_INPUT_CHUNK ? MAX_INPUT_CHUNK : remaining;
      s->z.avail_in = (uInt) chunk;
      remaining -= chunk;
    }
    int mode = remaining > 0 ? Z_NO_FLUSH : flush;
    pprof_status status = pprof_buffer_reserve(s->out, OUTPUT_CHUNK, error);
    if (status != PPROF_OK) return status;
    s->z.next_out = s->out->data + s->out->len;
    s->z.avail_out = OUTPUT_CHUNK;
    int result = deflate(&s->z, mode);
    s->out->len += OUTPUT_CHUNK - s->z.avail_out;
    if (result == Z_STREAM_END) return PPROF_OK;
    if (result != Z_OK && result != Z_BUF_ERROR) {
      return pprof_fail(error, PPROF_ERR_COMPRESS, "zlib deflate failed (%d)", result);
    }
    // Without Z_FINISH we are done once every input byte is consumed and zlib did not
    // stop for lack of output space.
    if (mode != Z_FINISH && s->z.avail_in == 0 && remaining == 0 && s->z.avail_out != 0) return PPROF_OK;
  }
}

pprof_status pprof_gzip_write(pprof_gzip_stream *stream, const uint8_t *data, size_t len, pprof_error *error) {
  if (len == 0) return PPROF_OK;
  return zlib_run(stream, data, len, Z_NO_FLUSH, error);
}

pprof_status pprof_gzip_close(pprof_gzip_stream *stream, pprof_error *error) {
  pprof_status status = zlib_run(stream, NULL, 0, Z_FINISH, error);
  pprof_gzip_abort(stream);
  return status;
}

void pprof_gzip_abort(pprof_gzip_stream *stream) {
  if (!stream) return;
  if (stream->z_initialized) deflateEnd(&stream->z);
  pprof_free(stream, sizeof(*stream));
}

pprof_status pprof_gunzip(const uint8_t *data, size_t len, pprof_buffer *out, pprof_error *error) {
  enum { MAX_INPUT_CHUNK = 1 << 30 }; // avail_in and avail_out are unsigned ints
  out->len = 0;
  if (!pprof_is_gzip(data, len)) return pprof_fail(error, PPROF_ERR_INVALID, "not gzip data");
  z_stream z = {.zalloc = zlib_alloc, .zfree = zlib_free};
  // windowBits 15 + 16: a gzip header and trailer, checked.
  int result = inflateInit2(&z, 15 + 16);
  if (result != Z_OK) {
    return pprof_fail(error, result == Z_MEM_ERROR ? PPROF_ERR_NO_MEMORY : PPROF_ERR_INVALID,
                      "zlib inflateInit2 failed (%d)", result);
  }
  pprof_status status = pprof_buffer_reserve(out, inflated_size_guess(data, len), error);
  size_t remaining = len;
  z.next_in = (Bytef *) data;
  while (status == PPROF_OK) {
    if (z.avail_in == 0 && remaining > 0) {
      z.avail_in = (uInt) (remaining > MAX_INPUT_CHUNK ? MAX_INPUT_CHUNK : remaining);
      remaining -= z.avail_in;
    }
    if (out->len == out->capacity) {
      if (out->len >= PPROF_GUNZIP_MAX_BYTES) {
        status = too_big(error);
        break;
      }
      if ((status = pprof_buffer_reserve(out, out->len, error)) != PPROF_OK) break;
    }
    size_t room = out->capacity - out->len;
    if (room > PPROF_GUNZIP_MAX_BYTES - out->len) room = PPROF_GUNZIP_MAX_BYTES - out->len;
    if (room > MAX_INPUT_CHUNK) room = MAX_INPUT_CHUNK;
    z.next_out = out->data + out->len;
    z.avail_out = (uInt) room;
    result = inflate(&z, Z_NO_FLUSH);
    out->len += room - z.avail_out;
    if (result == Z_STREAM_END) break;
    if (result == Z_MEM_ERROR) {
      status = pprof_fail(error, PPROF_ERR_NO_MEMORY, "out of memory decompressing gzip data");
    } else if (result == Z_BUF_ERROR && z.avail_in == 0 && remaining == 0) {
      status = pprof_fail(error, PPROF_ERR_INVALID, "truncated gzip data");
    } else if (result != Z_OK && result != Z_BUF_ERROR) {
      status = pprof_fail(error, PPROF_ERR_INVALID, "invalid gzip data (%s)", z.msg ? z.msg : "zlib error");
    } else if (out->len >= PPROF_GUNZIP_MAX_BYTES && z.avail_out == 0) {
      status = too_big(error);
    }
  }
  inflateEnd(&z);
  return status;
}

#else // stored blocks, no compression library

const char *pprof_compressor_name(void) { return "stored"; }

static uint32_t crc_table[256];
static bool crc_table_ready;

static void crc_table_init(void) {
  if (crc_table_ready) return;
  for (uint32_t n = 0; n < 256; n++) {
    uint32_t c = n;
    for (int k = 0; k < 8; k++) c = (c & 1) ? 0xedb88320u ^ (c >> 1) : c >> 1;
    crc_table[n] = c;
  }
  crc_table_ready = true;
}

static uint32_t crc_update(uint32_t crc, const uint8_t *data, size_t len) {
  crc = ~crc;
  for (size_t i = 0; i < len; i++) crc = crc_table[(crc ^ data[i]) & 0xff] ^ (crc >> 8);
  return ~crc;
}

static void put_le32(uint8_t *p, uint32_t v) {
  for (int i = 0; i < 4; i++) p[i] = (uint8_t) (v >> (8 * i));
}

pprof_status pprof_gzip_open(pprof_gzip_stream **stream, pprof_buffer *out, size_t input_size, pprof_error *error) {
  (void) input_size;
  crc_table_init();
  pprof_status status = stream_new(stream, out, error);
  if (status != PPROF_OK) return status;
  static const uint8_t header[10] = {0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 0, 0xff};
  status = pprof_buffer_append(out, header, sizeof(header), error);
  if (status != PPROF_OK) {
    pprof_gzip_abort(*stream);
    *stream = NULL;
  }
  return status;
}

pprof_status pprof_gzip_write(pprof_gzip_stream *stream, const uint8_t *data, size_t len, pprof_error *error) {
  while (len > 0) {
    size_t block = len > 65535 ? 65535 : len;
    pprof_status status = pprof_buffer_reserve(stream->out, block + 5, error);
    if (status != PPROF_OK) return status;
    uint8_t *p = stream->out->data + stream->out->len;
    p[0] = 0; // not the final block, type 00 = stored
    p[1] = (uint8_t) block;
    p[2] = (uint8_t) (block >> 8);
    p[3] = (uint8_t) ~block;
    p[4] = (uint8_t) (~block >> 8);
    memcpy(p + 5, data, block);
    stream->out->len += block + 5;
    stream->crc = crc_update(stream->crc, data, block);
    stream->total_len += (uint32_t) block; // ISIZE is the length modulo 2^32
    data += block;
    len -= block;
  }
  return PPROF_OK;
}

pprof_status pprof_gzip_close(pprof_gzip_stream *stream, pprof_error *error) {
  uint8_t trailer[13] = {1, 0, 0, 0xff, 0xff}; // empty final stored block
  put_le32(trailer + 5, stream->crc);
  put_le32(trailer + 9, stream->total_len);
  pprof_status status = pprof_buffer_append(stream->out, trailer, sizeof(trailer), error);
  pprof_gzip_abort(stream);
  return status;
}

void pprof_gzip_abort(pprof_gzip_stream *stream) {
  if (stream) pprof_free(stream, sizeof(*stream));
}

// Without a decompressor this build reads what it writes: gzip whose deflate blocks are
// all stored (each then starts on a byte boundary, its 3 header bits in the low bits).
PPROF_MUST_CHECK
static pprof_status truncated(pprof_error *error) {
  return pprof_fail(error, PPROF_ERR_INVALID, "truncated gzip data");
}

pprof_status pprof_gunzip(const uint8_t *data, size_t len, pprof_buffer *out, pprof_error *error) {
  enum { FHCRC = 2, FEXTRA = 4, FNAME = 8, FCOMMENT = 16 };
  out->len = 0;
  if (!pprof_is_gzip(data, len)) return pprof_fail(error, PPROF_ERR_INVALID, "not gzip data");
  if (len < 10) return truncated(error);
  if (data[2] != 8) return pprof_fail(error, PPROF_ERR_INVALID, "invalid gzip data (unknown method %d)", data[2]);
  uint8_t flags = data[3];
  size_t at = 10;
  if (flags & FEXTRA) {
    if (len - at < 2) return truncated(error);
    at += 2 + ((size_t) data[at] | (size_t) data[at + 1] << 8);
  }
  for (int text = FNAME; text <= FCOMMENT; text <<= 1) { // zero-terminated name, comment
    if (!(flags & text)) continue;
    while (at < len && data[at] != 0) at++;
    at++;
  }
  if (flags & FHCRC) at += 2;
  if (at > len) return truncated(error);
  crc_table_init();
  uint32_t crc = 0;
  pprof_status status = pprof_buffer_reserve(out, inflated_size_guess(data, len), error);
  if (status != PPROF_OK) return status;
  for (bool final = false; !final;) {
    if (len - at < 5) return truncated(error);
    final = data[at] & 1;
    if (((data[at] >> 1) & 3) != 0) {
      return pprof_fail(error, PPROF_ERR_INVALID,
                        "compressed gzip data: this build has no decompressor (neither libdeflate nor zlib)");
    }
    size_t block = (size_t) data[at + 1] | (size_t) data[at + 2] << 8;
    if ((block ^ ((size_t) data[at + 3] | (size_t) data[at + 4] << 8)) != 0xffff) {
      return pprof_fail(error, PPROF_ERR_INVALID, "invalid gzip data (bad stored block length)");
    }
    at += 5;
    if (len - at < block) return truncated(error);
    if (out->len + block > PPROF_GUNZIP_MAX_BYTES) return too_big(error);
    if ((status = pprof_buffer_append(out, data + at, block, error)) != PPROF_OK) return status;
    crc = crc_update(crc, data + at, block);
    at += block;
  }
  if (len - at < 8) return truncated(error);
  const uint8_t *t = data + at;
  uint32_t stored_crc = (uint32_t) t[0] | (uint32_t) t[1] << 8 | (uint32_t) t[2] << 16 | (uint32_t) t[3] << 24;
  uint32_t stored_size = (uint32_t) t[4] | (uint32_t) t[5] << 8 | (uint32_t) t[6] << 16 | (uint32_t) t[7] << 24;
  if (stored_crc != crc || stored_size != (uint32_t) out->len) {
    return pprof_fail(error, PPROF_ERR_INVALID, "invalid gzip data (checksum or size mismatch)");
  }
  return PPROF_OK;
}

#endif
