/* The trainer-state file (layout in core/checkpoint.h): named sections,
 * each with its CRC32, behind a versioned header with its own CRC32. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/checkpoint.h"
#include "core/ckpt_internal.h"

#define STATE_MAGIC "DTSTATE"                     /* 8 bytes with its NUL */
#define STATE_ENTRY_SIZE (DT_STATE_NAME_MAX + 24) /* name, offset, size, crc, 0 */
#define STATE_MAX_SECTIONS 4096

typedef struct section {
  char name[DT_STATE_NAME_MAX];
  void *data;
  uint64_t offset, size;
  uint32_t crc;
} section;

struct dt_state_writer {
  section *s;
  int n, cap;
};

struct dt_state_file {
  char path[4096];
  void *buf;
  size_t size;
  section *s; /* data points into buf */
  int n;
};

static void put_u32(unsigned char *p, uint32_t v) {
  for (int i = 0; i < 4; i++)
    p[i] = (unsigned char)(v >> (8 * i));
}
static void put_u64(unsigned char *p, uint64_t v) {
  for (int i = 0; i < 8; i++)
    p[i] = (unsigned char)(v >> (8 * i));
}
static uint32_t get_u32(const unsigned char *p) {
  uint32_t v = 0;
  for (int i = 0; i < 4; i++)
    v |= (uint32_t)p[i] << (8 * i);
  return v;
}
static uint64_t get_u64(const unsigned char *p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; i++)
    v |= (uint64_t)p[i] << (8 * i);
  return v;
}

dt_status dt_state_writer_create(dt_state_writer **out) {
  *out = calloc(1, sizeof **out);
  return *out ? DT_OK : DT_ERROR(DT_ERR_OOM, "cannot allocate a trainer-state writer");
}

void dt_state_writer_destroy(dt_state_writer *w) {
  if (!w)
    return;
  for (int i = 0; i < w->n; i++)
    free(w->s[i].data);
  free(w->s);
  free(w);
}

dt_status dt_state_writer_add(dt_state_writer *w, const char *name, const void *data, size_t size) {
  size_t len = name ? strlen(name) : 0;
  if (len == 0 || len >= DT_STATE_NAME_MAX)
    return DT_ERROR(DT_ERR_INVALID_ARG, "trainer-state section name '%s': 1..%d characters",
                    name ? name : "", DT_STATE_NAME_MAX - 1);
  for (int i = 0; i < w->n; i++)
    if (!strcmp(w->s[i].name, name))
      return DT_ERROR(DT_ERR_INVALID_ARG, "trainer-state section '%s' added twice", name);
  if (w->n == w->cap) {
    int cap = w->cap ? 2 * w->cap : 8;
    section *s = realloc(w->s, (size_t)cap * sizeof *s);
    if (!s)
      return DT_ERROR(DT_ERR_OOM, "trainer-state section '%s': out of host memory", name);
    w->s = s;
    w->cap = cap;
  }
  section *e = &w->s[w->n];
  memset(e, 0, sizeof *e);
  e->data = malloc(size ? size : 1);
  if (!e->data)
    return DT_ERROR(DT_ERR_OOM, "trainer-state section '%s' of %zu bytes: out of host memory", name,
                    size);
  if (size)
    memcpy(e->data, data, size);
  memcpy(e->name, name, len + 1);
  e->size = size;
  e->crc = dt_crc32(0, data, size);
  w->n++;
  return DT_OK;
}

static size_t header_size(int n) { return 16 + (size_t)n * STATE_ENTRY_SIZE + 4; }

dt_status dt_state_writer_write(const dt_state_writer *w, const char *dir, const char *name,
                                uint32_t *crc, uint64_t *size) {
  size_t hs = header_size(w->n);
  unsigned char *h = calloc(1, hs);
  /* Each section starts at a multiple of 8 (its floats are aligned). */
  static const unsigned char zeros[8];
  dt_ckpt_chunk *chunks = calloc(2 * (size_t)w->n + 1, sizeof *chunks);
  if (!h || !chunks) {
    free(h);
    free(chunks);
    return DT_ERROR(DT_ERR_OOM, "writing %s/%s: out of host memory", dir, name);
  }
  memcpy(h, STATE_MAGIC, 8);
  put_u32(h + 8, DT_STATE_VERSION);
  put_u32(h + 12, (uint32_t)w->n);
  uint64_t off = hs;
  int nc = 1;
  for (int i = 0; i < w->n; i++) {
    size_t pad = (size_t)((8 - off % 8) % 8);
    if (pad)
      chunks[nc++] = (dt_ckpt_chunk){zeros, pad};
    off += pad;
    unsigned char *e = h + 16 + (size_t)i * STATE_ENTRY_SIZE;
    memcpy(e, w->s[i].name, strlen(w->s[i].name));
    put_u64(e + DT_STATE_NAME_MAX, off);
    put_u64(e + DT_STATE_NAME_MAX + 8, w->s[i].size);
    put_u32(e + DT_STATE_NAME_MAX + 16, w->s[i].crc);
    chunks[nc++] = (dt_ckpt_chunk){w->s[i].data, (size_t)w->s[i].size};
    off += w->s[i].size;
  }
  put_u32(h + hs - 4, dt_crc32(0, h, hs - 4));
  chunks[0] = (dt_ckpt_chunk){h, hs};
  dt_status st = dt_ckpt_write_file(dir, name, chunks, nc, crc, size);
  free(chunks);
  free(h);
  return st;
}

/* Parses and checks buf (path for messages); sections into f->s. */
static dt_status parse_state(const char *path, const unsigned char *buf, size_t size, section **out,
                             int *n_out) {
  *out = NULL;
  *n_out = 0;
  if (size < 16)
    return DT_ERROR(DT_ERR_FORMAT, "%s: header: truncated (%zu bytes, the header needs 16+)", path,
                    size);
  if (memcmp(buf, STATE_MAGIC, 8) != 0)
    return DT_ERROR(DT_ERR_FORMAT, "%s: header: not a dtrain trainer-state file (bad magic)", path);
  uint32_t version = get_u32(buf + 8), n = get_u32(buf + 12);
  if (version > DT_STATE_VERSION)
    return DT_ERROR(DT_ERR_VERSION,
                    "%s: header: format version %u, this dtrain reads up to %d: use a newer "
                    "dtrain",
                    path, version, DT_STATE_VERSION);
  if (version == 0 || n > STATE_MAX_SECTIONS)
    return DT_ERROR(DT_ERR_FORMAT, "%s: header: version %u with %u sections: corrupt", path,
                    version, n);
  size_t hs = header_size((int)n);
  if (size < hs)
    return DT_ERROR(DT_ERR_FORMAT, "%s: header: truncated (%zu bytes, the section table needs %zu)",
                    path, size, hs);
  uint32_t stored = get_u32(buf + hs - 4), computed = dt_crc32(0, buf, hs - 4);
  if (stored != computed)
    return DT_ERROR(DT_ERR_FORMAT,
                    "%s: header: CRC32 mismatch (stored %08x, computed %08x): the file is "
                    "corrupt",
                    path, stored, computed);
  section *s = calloc(n ? n : 1, sizeof *s);
  if (!s)
    return DT_ERROR(DT_ERR_OOM, "%s: out of host memory", path);
  for (uint32_t i = 0; i < n; i++) {
    const unsigned char *e = buf + 16 + (size_t)i * STATE_ENTRY_SIZE;
    memcpy(s[i].name, e, DT_STATE_NAME_MAX);
    s[i].name[DT_STATE_NAME_MAX - 1] = '\0';
    s[i].offset = get_u64(e + DT_STATE_NAME_MAX);
    s[i].size = get_u64(e + DT_STATE_NAME_MAX + 8);
    s[i].crc = get_u32(e + DT_STATE_NAME_MAX + 16);
    if (s[i].offset > size || s[i].size > size - s[i].offset) {
      dt_status st = DT_ERROR(DT_ERR_FORMAT,
                              "%s: section '%s': truncated (bytes %llu..%llu, the file has %zu)",
                              path, s[i].name, (unsigned long long)s[i].offset,
                              (unsigned long long)(s[i].offset + s[i].size), size);
      free(s);
      return st;
    }
    s[i].data = (void *)(buf + s[i].offset);
    uint32_t c = dt_crc32(0, s[i].data, (size_t)s[i].size);
    if (c != s[i].crc) {
      dt_status st = DT_ERROR(DT_ERR_FORMAT,
                              "%s: section '%s': CRC32 mismatch (stored %08x, computed %08x): "
                              "the file is corrupt",
                              path, s[i].name, s[i].crc, c);
      free(s);
      return st;
    }
  }
  *out = s;
  *n_out = (int)n;
  return DT_OK;
}

dt_status ckpt_state_check(const char *path, const void *buf, size_t size) {
  section *s = NULL;
  int n = 0;
  dt_status st = parse_state(path, buf, size, &s, &n);
  free(s);
  return st;
}

dt_status dt_state_file_open(const char *path, dt_state_file **out) {
  *out = NULL;
  dt_state_file *f = calloc(1, sizeof *f);
  if (!f)
    return DT_ERROR(DT_ERR_OOM, "%s: out of host memory", path);
  snprintf(f->path, sizeof f->path, "%s", path);
  dt_status st = dt_ckpt_read_file(path, &f->buf, &f->size);
  if (st == DT_OK)
    st = parse_state(path, f->buf, f->size, &f->s, &f->n);
  if (st == DT_OK)
    *out = f;
  else
    dt_state_file_close(f);
  return st;
}

void dt_state_file_close(dt_state_file *f) {
  if (!f)
    return;
  free(f->s);
  free(f->buf);
  free(f);
}

int dt_state_file_has_section(const dt_state_file *f, const char *name) {
  for (int i = 0; i < f->n; i++)
    if (!strcmp(f->s[i].name, name))
      return 1;
  return 0;
}

dt_status dt_state_file_section(const dt_state_file *f, const char *name, const void **data,
                                size_t *size) {
  for (int i = 0; i < f->n; i++)
    if (!strcmp(f->s[i].name, name)) {
      *data = f->s[i].data;
      *size = (size_t)f->s[i].size;
      return DT_OK;
    }
  return DT_ERROR(DT_ERR_FORMAT, "%s: section '%s' is missing", f->path, name);
}

dt_status dt_state_meta_get(const char *text, size_t size, const char *key, const char *what,
                            char *buf, size_t cap) {
  size_t klen = strlen(key);
  for (size_t pos = 0; pos < size;) {
    const char *line = text + pos;
    const char *nl = memchr(line, '\n', size - pos);
    size_t len = nl ? (size_t)(nl - line) : size - pos;
    if (len > klen && !memcmp(line, key, klen) && line[klen] == ' ') {
      size_t vlen = len - klen - 1;
      if (vlen >= cap)
        return DT_ERROR(DT_ERR_FORMAT, "%s: value of '%s' too long", what, key);
      memcpy(buf, line + klen + 1, vlen);
      buf[vlen] = '\0';
      return DT_OK;
    }
    pos += len + 1;
  }
  return DT_ERROR(DT_ERR_FORMAT, "%s: the entry '%s' is missing", what, key);
}

#define OPTIM_HEADER 24

static uint64_t shard_elements(const dt_ckpt_optim_shard *sh) {
  uint64_t n = 0;
  for (uint32_t i = 0; i < sh->n_segments; i++)
    n += sh->segments[2 * i + 1];
  return n;
}

dt_status dt_ckpt_optim_section_encode(const dt_ckpt_optim_shard *shard, void **out, size_t *size) {
  size_t floats = (size_t)shard->n_buffers * (size_t)shard_elements(shard);
  size_t segs = 16 * (size_t)shard->n_segments;
  size_t n = OPTIM_HEADER + segs + floats * sizeof(float);
  unsigned char *p = malloc(n);
  if (!p)
    return DT_ERROR(DT_ERR_OOM, "optimizer section of %zu bytes: out of host memory", n);
  put_u64(p, shard->total);
  put_u32(p + 8, shard->n_buffers);
  put_u32(p + 12, shard->n_segments);
  put_u64(p + 16, 0);
  for (uint32_t i = 0; i < 2 * shard->n_segments; i++)
    put_u64(p + OPTIM_HEADER + 8 * i, shard->segments[i]);
  if (floats) /* little-endian hosts */
    memcpy(p + OPTIM_HEADER + segs, shard->data, floats * sizeof(float));
  *out = p;
  *size = n;
  return DT_OK;
}

dt_status dt_ckpt_optim_section_decode(const void *bytes, size_t size, const char *what,
                                       dt_ckpt_optim_shard *out) {
  const unsigned char *p = bytes;
  if (size < OPTIM_HEADER)
    return DT_ERROR(DT_ERR_FORMAT, "%s: %zu bytes, shorter than its header", what, size);
  out->total = get_u64(p);
  out->n_buffers = get_u32(p + 8);
  out->n_segments = get_u32(p + 12);
  size_t segs = 16 * (size_t)out->n_segments;
  if (out->n_buffers > 16 || out->n_segments > (1u << 24) || size < OPTIM_HEADER + segs)
    return DT_ERROR(DT_ERR_FORMAT, "%s: %u buffers, %u segments in %zu bytes: corrupt", what,
                    out->n_buffers, out->n_segments, size);
  out->segments = (const uint64_t *)(p + OPTIM_HEADER);
  uint64_t elements = 0;
  for (uint32_t i = 0; i < out->n_segments; i++) {
    uint64_t off = out->segments[2 * i], n = out->segments[2 * i + 1];
    if (off > out->total || n > out->total - off)
      return DT_ERROR(DT_ERR_FORMAT, "%s: segment %u [%llu, +%llu) lies outside the %llu elements",
                      what, i, (unsigned long long)off, (unsigned long long)n,
                      (unsigned long long)out->total);
    elements += n;
  }
  if (size != OPTIM_HEADER + segs + (uint64_t)out->n_buffers * elements * sizeof(float))
    return DT_ERROR(DT_ERR_FORMAT, "%s: %u buffers of %llu elements do not add up to its %zu bytes",
                    what, out->n_buffers, (unsigned long long)elements, size);
  out->data = (const float *)(p + OPTIM_HEADER + segs);
  return DT_OK;
}
