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
#define IDX_CHUNK (1u << 24)               /* gzread granularity (16 MiB) */
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

/* The text of a zlib stream error, or the C library's for an I/O error. */
static const char *gz_error_text(gzFile gz, int *is_io) {
  int code = Z_OK;
  const char *msg = gzerror(gz, &code);
  *is_io = (code == Z_ERRNO);
  if (code == Z_ERRNO)
    return strerror(errno);
  return msg && msg[0] ? msg : "unexpected end of stream";
}

/* Reads exactly `len` bytes; *got receives the count read. A stream or I/O
 * error is reported (status set); a short read is not (the caller words it). */
static dt_status gz_read_fully(gzFile gz, const char *path, void *buf, size_t len, size_t *got) {
  size_t done = 0;
  while (done < len) {
    size_t want = len - done;
    if (want > IDX_CHUNK)
      want = IDX_CHUNK;
    int n = gzread(gz, (char *)buf + done, (unsigned)want);
    if (n < 0) {
      int is_io = 0;
      const char *why = gz_error_text(gz, &is_io);
      *got = done;
      if (is_io)
        return DT_ERROR(DT_ERR_IO, "%s: read failed: %s", path, why);
      return DT_ERROR(DT_ERR_FORMAT,
                      "%s: corrupt gzip stream after %zu bytes of idx data: %s: re-download the "
                      "file",
                      path, done, why);
    }
    if (n == 0)
      break;
    done += (size_t)n;
  }
  *got = done;
  return DT_OK;
}

/* Checks magic, type and dims; fills out->type/ndim/dims/numel. */
static dt_status idx_parse_header(gzFile gz, const char *path, int expect_ndim, dt_idx *out,
                                  int64_t *header_bytes) {
  uint8_t magic[4];
  size_t got = 0;
  DT_CHECK(gz_read_fully(gz, path, magic, sizeof magic, &got));
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
  DT_CHECK(gz_read_fully(gz, path, raw_dims, (size_t)(4 * ndim), &got));
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
static dt_status idx_read_raw(gzFile gz, const char *path, int64_t file_size, int64_t header_bytes,
                              dt_idx *out) {
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
  dt_status st = gz_read_fully(gz, path, data, (size_t)out->numel, &got);
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

/* gzip: grow the buffer as decompressed data arrives. */
static dt_status idx_read_gzip(gzFile gz, const char *path, int64_t header_bytes, dt_idx *out) {
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
    DT_CHECK_GOTO(gz_read_fully(gz, path, data + have, (size_t)room, &got), st, fail);
    have += (int64_t)got;
    if ((int64_t)got < room)
      break; /* end of stream */
  }
  if (have < want) {
    /* gzread may drop the count of a call that hit the end of a truncated
     * stream; the stream position is exact. */
    int64_t pos = (int64_t)gztell(gz) - header_bytes;
    if (pos > have && pos < want)
      have = pos;
    st = DT_ERROR(DT_ERR_FORMAT,
                  "%s: truncated: expected %lld bytes of data, found %lld (the gzip stream "
                  "ended early): re-download the file",
                  path, (long long)want, (long long)have);
    goto fail;
  }
  uint8_t extra[64];
  size_t more = 0;
  DT_CHECK_GOTO(gz_read_fully(gz, path, extra, sizeof extra, &more), st, fail);
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

  int fd = open(path, O_RDONLY | O_CLOEXEC);
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
  gzFile gz = gzdopen(fd, "rb");
  if (!gz) {
    close(fd);
    return DT_ERROR(DT_ERR_OOM, "%s: cannot set up the gzip reader", path);
  }
  gzbuffer(gz, 1u << 17);

  dt_idx hdr;
  memset(&hdr, 0, sizeof hdr);
  int64_t header_bytes = 0;
  dt_status st = idx_parse_header(gz, path, expect_ndim, &hdr, &header_bytes);
  if (st == DT_OK) {
    /* gzdirect is reliable once something was read: 1 = not gzip. */
    if (gzdirect(gz) && S_ISREG(sb.st_mode))
      st = idx_read_raw(gz, path, (int64_t)sb.st_size, header_bytes, &hdr);
    else
      st = idx_read_gzip(gz, path, header_bytes, &hdr);
  }
  gzclose_r(gz); /* closes fd */
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
