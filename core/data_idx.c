/* idx file reader (LeCun's MNIST format), raw or gzip.
 *
 * Layout: magic 0x00 0x00 <type> <ndim>, ndim big-endian u32 dims, then the
 * elements. Everything a header claims is checked before memory is committed
 * to it: raw files must be exactly header + numel bytes long, and a gzip
 * stream's buffer grows only as decompressed bytes actually arrive, so a tiny
 * corrupt file claiming 4 GB costs nothing.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include "core/data.h"

#define IDX_TYPE_U8 0x08
#define IDX_MAX_DIM (INT64_C(1) << 31)     /* each dim < 2^31 */
#define IDX_MAX_TOTAL (INT64_C(1) << 32)   /* numel <= 2^32 */
#define IDX_FIRST_ALLOC (INT64_C(1) << 20) /* gzip: first buffer size */

static const char *idx_type_name(int type) {
  switch (type) {
    case 0x08: return "unsigned byte";
    case 0x09: return "signed byte";
    case 0x0B: return "short";
    case 0x0C: return "int";
    case 0x0D: return "float";
    case 0x0E: return "double";
  }
  return "unknown";
}

/* The file as a byte stream: raw, or gzip decoded with zlib's inflate so
 * that every member's trailer (CRC-32 and length) is required and checked,
 * concatenated members are read in turn, and bytes after the last member
 * are refused (gzread accepts a missing trailer and ignores trailing junk). */
typedef struct idx_stream {
  int fd;
  const char *path;
  int gzip;        /* 1: gzip members; 0: raw bytes */
  int member_done; /* inflate reached the end of the current member */
  z_stream z;
  uint8_t in[1 << 16];
  size_t in_len; /* raw: bytes buffered at in[in_pos..in_len) */
  size_t in_pos;
  int eof;          /* the file has no more bytes */
  int64_t in_total; /* compressed bytes consumed, for messages */
} idx_stream;

/* Refills the input buffer (keeps unconsumed bytes). */
static dt_status stream_fill(idx_stream *st) {
  size_t keep = st->gzip ? st->z.avail_in : st->in_len - st->in_pos;
  const uint8_t *from = st->gzip ? st->z.next_in : st->in + st->in_pos;
  memmove(st->in, from, keep);
  size_t len = keep;
  while (len < sizeof st->in && !st->eof) {
    ssize_t n = read(st->fd, st->in + len, sizeof st->in - len);
    if (n < 0 && errno == EINTR)
      continue;
    if (n < 0)
      return DT_ERROR(DT_ERR_IO, "%s: read failed: %s", st->path, strerror(errno));
    if (n == 0)
      st->eof = 1;
    len += (size_t)n;
    if (n > 0)
      break;
  }
  if (st->gzip) {
    st->z.next_in = st->in;
    st->z.avail_in = (uInt)len;
  } else {
    st->in_pos = 0;
    st->in_len = len;
  }
  return DT_OK;
}

static dt_status stream_open(idx_stream *st, int fd, const char *path) {
  memset(st, 0, sizeof *st);
  st->fd = fd;
  st->path = path;
  DT_CHECK(stream_fill(st));
  st->gzip = st->in_len >= 2 && st->in[0] == 0x1f && st->in[1] == 0x8b;
  if (!st->gzip)
    return DT_OK;
  /* 16 + MAX_WBITS: a gzip wrapper, whose trailer inflate verifies. */
  if (inflateInit2(&st->z, 16 + MAX_WBITS) != Z_OK)
    return DT_ERROR(DT_ERR_OOM, "%s: cannot set up the gzip decoder", path);
  st->z.next_in = st->in;
  st->z.avail_in = (uInt)st->in_len;
  return DT_OK;
}

static void stream_close(idx_stream *st) {
  if (st->gzip)
    inflateEnd(&st->z);
}

/* At the end of a member: the next member, or the end of the file; any
 * other byte is trailing garbage. Sets *more when another member starts. */
static dt_status stream_next_member(idx_stream *st, int *more) {
  *more = 0;
  if (st->z.avail_in < 2 && !st->eof)
    DT_CHECK(stream_fill(st));
  if (st->z.avail_in == 0)
    return DT_OK;
  if (st->z.avail_in >= 2 && st->z.next_in[0] == 0x1f && st->z.next_in[1] == 0x8b) {
    inflateReset(&st->z);
    st->member_done = 0;
    *more = 1;
    return DT_OK;
  }
  return DT_ERROR(DT_ERR_FORMAT,
                  "%s: trailing garbage: %u or more bytes that are not gzip follow the "
                  "compressed data: re-download the file",
                  st->path, st->z.avail_in);
}

/* Reads up to `len` bytes; *got receives the count (short only at the end
 * of the data). Corrupt or truncated gzip is an error here. */
static dt_status stream_read(idx_stream *st, void *buf, size_t len, size_t *got) {
  size_t done = 0;
  uint8_t *out = buf;
  if (!st->gzip) {
    while (done < len) {
      if (st->in_pos == st->in_len) {
        if (st->eof)
          break;
        DT_CHECK(stream_fill(st));
        continue;
      }
      size_t n = st->in_len - st->in_pos;
      if (n > len - done)
        n = len - done;
      memcpy(out + done, st->in + st->in_pos, n);
      st->in_pos += n;
      done += n;
    }
    *got = done;
    return DT_OK;
  }
  while (done < len) {
    if (st->member_done) {
      int more = 0;
      DT_CHECK(stream_next_member(st, &more));
      if (!more)
        break;
    }
    if (st->z.avail_in == 0) {
      if (st->eof) {
        *got = done;
        return DT_ERROR(DT_ERR_FORMAT,
                        "%s: truncated gzip stream after %zu bytes of idx data: the compressed "
                        "data or its trailer (CRC-32, length) is missing: re-download the file",
                        st->path, done);
      }
      DT_CHECK(stream_fill(st));
      continue;
    }
    size_t want = len - done;
    st->z.next_out = out + done;
    st->z.avail_out = want > (1u << 30) ? (1u << 30) : (uInt)want;
    uInt before_out = st->z.avail_out;
    int rc = inflate(&st->z, Z_NO_FLUSH);
    done += before_out - st->z.avail_out;
    if (rc == Z_STREAM_END) {
      st->member_done = 1;
    } else if (rc == Z_BUF_ERROR && st->z.avail_in == 0) {
      continue; /* needs input */
    } else if (rc != Z_OK) {
      *got = done;
      return DT_ERROR(DT_ERR_FORMAT,
                      "%s: corrupt gzip stream after %zu bytes of idx data: %s: re-download the "
                      "file",
                      st->path, done,
                      rc == Z_DATA_ERROR && st->z.msg ? st->z.msg
                      : rc == Z_MEM_ERROR             ? "out of memory"
                                                      : "inflate failed");
    }
  }
  *got = done;
  return DT_OK;
}

/* Checks magic, type and dims; fills out->type/ndim/dims/numel. */
static dt_status idx_parse_header(idx_stream *gz, const char *path, int expect_ndim, dt_idx *out,
                                  int64_t *header_bytes) {
  uint8_t magic[4];
  size_t got = 0;
  DT_CHECK(stream_read(gz, magic, sizeof magic, &got));
  if (got < sizeof magic)
    return DT_ERROR(DT_ERR_FORMAT,
                    "%s: truncated header: expected 4 magic bytes, found %zu: not an idx file",
                    path, got);
  if (magic[0] != 0 || magic[1] != 0)
    return DT_ERROR(DT_ERR_FORMAT,
                    "%s: bad magic 0x%02x 0x%02x 0x%02x 0x%02x: an idx file starts with "
                    "0x00 0x00 <type> <ndim>",
                    path, magic[0], magic[1], magic[2], magic[3]);
  if (magic[2] != IDX_TYPE_U8)
    return DT_ERROR(DT_ERR_FORMAT,
                    "%s: unsupported element type 0x%02x (%s): only 0x08 (unsigned byte) is "
                    "supported",
                    path, magic[2], idx_type_name(magic[2]));
  int ndim = magic[3];
  if (ndim < 1 || ndim > 4)
    return DT_ERROR(DT_ERR_FORMAT, "%s: unsupported number of dimensions %d: expected 1 to 4", path,
                    ndim);
  if (expect_ndim > 0 && ndim != expect_ndim)
    return DT_ERROR(DT_ERR_FORMAT,
                    "%s: wrong number of dimensions: expected %d, the header says %d (images "
                    "are idx3, labels idx1)",
                    path, expect_ndim, ndim);

  uint8_t raw_dims[16];
  DT_CHECK(stream_read(gz, raw_dims, (size_t)(4 * ndim), &got));
  if (got < (size_t)(4 * ndim))
    return DT_ERROR(DT_ERR_FORMAT,
                    "%s: truncated header: expected %d bytes of dimensions, found %zu", path,
                    4 * ndim, got);
  int64_t numel = 1;
  for (int i = 0; i < ndim; i++) {
    const uint8_t *b = raw_dims + 4 * i;
    int64_t d = ((int64_t)b[0] << 24) | ((int64_t)b[1] << 16) | ((int64_t)b[2] << 8) | b[3];
    if (d < 1 || d >= IDX_MAX_DIM)
      return DT_ERROR(DT_ERR_FORMAT,
                      "%s: dimension %d is %lld: each dimension must be in [1, 2^31)", path, i,
                      (long long)d);
    /* Both factors are < 2^32 here, so the product fits in int64. */
    if (numel * d > IDX_MAX_TOTAL)
      return DT_ERROR(DT_ERR_FORMAT,
                      "%s: absurd dimensions: the first %d dims already hold more than 2^32 "
                      "elements (dimension %d is %lld): the header is corrupt",
                      path, i + 1, i, (long long)d);
    numel *= d;
    out->dims[i] = d;
  }
  out->type = magic[2];
  out->ndim = ndim;
  out->numel = numel;
  *header_bytes = 4 + 4 * (int64_t)ndim;
  return DT_OK;
}

/* Raw file: its size is known, so the body is validated before allocating. */
static dt_status idx_read_raw(idx_stream *in, const char *path, int64_t file_size,
                              int64_t header_bytes, dt_idx *out) {
  int64_t found = file_size - header_bytes;
  if (found < out->numel)
    return DT_ERROR(DT_ERR_FORMAT,
                    "%s: truncated: expected %lld bytes of data, found %lld: re-download the "
                    "file",
                    path, (long long)out->numel, (long long)found);
  if (found > out->numel)
    return DT_ERROR(DT_ERR_FORMAT,
                    "%s: trailing garbage: expected %lld bytes of data, found %lld: the header "
                    "does not match the file",
                    path, (long long)out->numel, (long long)found);
  uint8_t *data = malloc((size_t)out->numel);
  if (!data)
    return DT_ERROR(DT_ERR_OOM, "%s: cannot allocate %lld bytes for the idx data", path,
                    (long long)out->numel);
  size_t got = 0;
  dt_status st = stream_read(in, data, (size_t)out->numel, &got);
  if (st == DT_OK && (int64_t)got != out->numel)
    st = DT_ERROR(DT_ERR_IO,
                  "%s: short read: expected %lld bytes of data, read %zu (was the "
                  "file modified while reading?)",
                  path, (long long)out->numel, got);
  if (st != DT_OK) {
    free(data);
    return st;
  }
  out->data = data;
  return DT_OK;
}

/* gzip: grow the buffer as decompressed data arrives; afterwards the
 * stream must end exactly (trailer checked, no more data, no garbage). */
static dt_status idx_read_gzip(idx_stream *in, const char *path, dt_idx *out) {
  int64_t want = out->numel;
  int64_t cap = want < IDX_FIRST_ALLOC ? want : IDX_FIRST_ALLOC;
  int64_t have = 0;
  uint8_t *data = malloc((size_t)cap);
  if (!data)
    return DT_ERROR(DT_ERR_OOM, "%s: cannot allocate %lld bytes for the idx data", path,
                    (long long)cap);
  dt_status st = DT_OK;
  while (have < want) {
    if (have == cap) {
      int64_t next = cap * 2 < want ? cap * 2 : want;
      uint8_t *grown = realloc(data, (size_t)next);
      if (!grown) {
        st = DT_ERROR(DT_ERR_OOM, "%s: cannot grow the idx buffer to %lld bytes", path,
                      (long long)next);
        goto fail;
      }
      data = grown;
      cap = next;
    }
    int64_t room = cap - have;
    size_t got = 0;
    st = stream_read(in, data + have, (size_t)room, &got);
    have += (int64_t)got;
    if (st != DT_OK && have < want) {
      dt_clear_error();
      break; /* ended early: reported as truncated below */
    }
    if (st != DT_OK)
      goto fail;
    if ((int64_t)got < room)
      break; /* end of stream */
  }
  if (have < want) {
    st = DT_ERROR(DT_ERR_FORMAT,
                  "%s: truncated: expected %lld bytes of data, found %lld (the gzip stream "
                  "ended early): re-download the file",
                  path, (long long)want, (long long)have);
    goto fail;
  }
  uint8_t extra[64];
  size_t more = 0;
  DT_CHECK_GOTO(stream_read(in, extra, sizeof extra, &more), st, fail);
  if (more > 0) {
    st = DT_ERROR(DT_ERR_FORMAT,
                  "%s: trailing garbage: expected %lld bytes of data, found more after them: "
                  "the header does not match the file",
                  path, (long long)want);
    goto fail;
  }
  out->data = data;
  return DT_OK;
fail:
  free(data);
  return st;
}

dt_status dt_idx_read(const char *path, int expect_ndim, dt_idx *out) {
  if (!out)
    return DT_ERROR(DT_ERR_INVALID_ARG, "out is NULL");
  memset(out, 0, sizeof *out);
  if (!path)
    return DT_ERROR(DT_ERR_INVALID_ARG, "path is NULL");
  if (expect_ndim < 0 || expect_ndim > 4)
    return DT_ERROR(DT_ERR_INVALID_ARG, "%s: expect_ndim %d: must be 0 (any) or 1 to 4", path,
                    expect_ndim);

  /* O_NONBLOCK: opening a FIFO for reading would wait for a writer. */
  int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0)
    return DT_ERROR(DT_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
  struct stat sb;
  if (fstat(fd, &sb) != 0) {
    int e = errno;
    close(fd);
    return DT_ERROR(DT_ERR_IO, "%s: cannot stat: %s", path, strerror(e));
  }
  if (S_ISDIR(sb.st_mode)) {
    close(fd);
    return DT_ERROR(DT_ERR_IO, "%s: is a directory, expected an idx file", path);
  }
  if (!S_ISREG(sb.st_mode)) {
    close(fd);
    return DT_ERROR(DT_ERR_IO,
                    "%s: is not a regular file (a FIFO, socket or device): expected an idx file",
                    path);
  }
  fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK);
  idx_stream *in = malloc(sizeof *in);
  if (!in) {
    close(fd);
    return DT_ERROR(DT_ERR_OOM, "%s: cannot allocate the reader", path);
  }
  dt_idx hdr;
  memset(&hdr, 0, sizeof hdr);
  int64_t header_bytes = 0;
  dt_status st = stream_open(in, fd, path);
  if (st == DT_OK)
    st = idx_parse_header(in, path, expect_ndim, &hdr, &header_bytes);
  if (st == DT_OK)
    st = in->gzip ? idx_read_gzip(in, path, &hdr)
                  : idx_read_raw(in, path, (int64_t)sb.st_size, header_bytes, &hdr);
  stream_close(in);
  free(in);
  close(fd);
  if (st != DT_OK)
    return st;
  *out = hdr;
  return DT_OK;
}

void dt_idx_free(dt_idx *idx) {
  if (!idx)
    return;
  free(idx->data);
  memset(idx, 0, sizeof *idx);
}
