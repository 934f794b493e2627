/* safetensors (huggingface/safetensors): u64 LE header length N, N bytes of
 * JSON {"__metadata__": {...}, "<name>": {"dtype": "F32", "shape": [...],
 * "data_offsets": [begin, end]}, ...} padded with spaces to a multiple of 8,
 * then the data (offsets relative to its start). dtrain writes f32 tensors
 * and i64 buffers (BatchNorm's num_batches_tracked, as PyTorch) and puts
 * each tensor's CRC32 in the metadata ("crc32.<name>"). */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/checkpoint.h"
#include "core/ckpt_internal.h"
#include "core/tensor_internal.h"

typedef struct snap_tensor {
  char *name;
  int ndim;
  int64_t shape[DT_MAX_DIMS];
  int64_t numel;
  size_t bytes;
  const char *dtype; /* safetensors' name: "F32", "I64" */
  void *data;
} snap_tensor;

struct dt_tensor_snapshot {
  int n;
  snap_tensor *t;
};

void dt_tensor_snapshot_destroy(dt_tensor_snapshot *s) {
  if (!s)
    return;
  for (int i = 0; i < s->n; i++) {
    free(s->t[i].name);
    free(s->t[i].data);
  }
  free(s->t);
  free(s);
}

/* safetensors' name of the dtypes a checkpoint holds, NULL for others. */
static const char *safetensors_dtype(dt_dtype d) {
  return d == DT_DTYPE_F32 ? "F32" : d == DT_DTYPE_I64 ? "I64" : NULL;
}

static dt_status snapshot_one(snap_tensor *e, const char *name, const dt_tensor *t) {
  e->dtype = safetensors_dtype(dt_tensor_dtype(t));
  if (e->dtype == NULL)
    return DT_ERROR(DT_ERR_DTYPE, "tensor %s is %s: checkpoints hold f32 and i64 tensors", name,
                    dt_dtype_name(dt_tensor_dtype(t)));
  e->ndim = dt_tensor_ndim(t);
  memcpy(e->shape, dt_tensor_shape(t), (size_t)e->ndim * sizeof(int64_t));
  e->numel = dt_tensor_numel(t);
  e->bytes = (size_t)e->numel * dt_dtype_size(dt_tensor_dtype(t));
  e->name = strdup(name);
  e->data = malloc(e->bytes > 0 ? e->bytes : 1);
  if (!e->name || !e->data)
    return DT_ERROR(DT_ERR_OOM, "snapshot of %s: out of host memory", name);
  return dt_tensor_to_host(t, e->data, e->bytes);
}

dt_status dt_tensor_snapshot_of_module(const dt_module *m, dt_tensor_snapshot **out) {
  *out = NULL;
  int np = dt_module_num_parameters(m), nb = dt_module_num_buffers(m);
  dt_tensor_snapshot *s = calloc(1, sizeof *s);
  if (s)
    s->t = calloc((size_t)(np + nb > 0 ? np + nb : 1), sizeof *s->t);
  if (!s || !s->t) {
    dt_tensor_snapshot_destroy(s);
    return DT_ERROR(DT_ERR_OOM, "snapshot of the model: out of host memory");
  }
  for (int i = 0; i < np + nb; i++) {
    const char *name = NULL;
    dt_tensor *t =
        i < np ? dt_module_parameter_at(m, i, &name) : dt_module_buffer_at(m, i - np, &name);
    s->n = i + 1;
    dt_status st = snapshot_one(&s->t[i], name, t);
    if (st != DT_OK) {
      dt_tensor_snapshot_destroy(s);
      return st;
    }
  }
  *out = s;
  return DT_OK;
}

/* Appends to a growing string. */
typedef struct strbuf {
  char *p;
  size_t len, cap;
  int oom;
} strbuf;

static void sb_printf(strbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void sb_printf(strbuf *b, const char *fmt, ...) {
  for (;;) {
    va_list ap;
    va_start(ap, fmt);
    int k = vsnprintf(b->p ? b->p + b->len : NULL, b->p ? b->cap - b->len : 0, fmt, ap);
    va_end(ap);
    if (k < 0) {
      b->oom = 1;
      return;
    }
    if (b->p && b->len + (size_t)k < b->cap) {
      b->len += (size_t)k;
      return;
    }
    size_t cap = (b->cap + (size_t)k + 1) * 2;
    char *p = realloc(b->p, cap);
    if (!p) {
      b->oom = 1;
      return;
    }
    b->p = p;
    b->cap = cap;
  }
}

dt_status dt_tensor_snapshot_write_safetensors(const dt_tensor_snapshot *s, const char *dir,
                                               const char *name, uint32_t *crc, uint64_t *size) {
  strbuf h = {0};
  sb_printf(&h, "{\"__metadata__\":{\"format\":\"pt\",\"writer\":\"dtrain\"");
  for (int i = 0; i < s->n; i++)
    sb_printf(&h, ",\"crc32.%s\":\"%08x\"", s->t[i].name, dt_crc32(0, s->t[i].data, s->t[i].bytes));
  sb_printf(&h, "}");
  uint64_t off = 0;
  for (int i = 0; i < s->n; i++) {
    const snap_tensor *e = &s->t[i];
    sb_printf(&h, ",\"%s\":{\"dtype\":\"%s\",\"shape\":[", e->name, e->dtype);
    for (int d = 0; d < e->ndim; d++)
      sb_printf(&h, "%s%lld", d ? "," : "", (long long)e->shape[d]);
    uint64_t bytes = e->bytes;
    sb_printf(&h, "],\"data_offsets\":[%llu,%llu]}", (unsigned long long)off,
              (unsigned long long)(off + bytes));
    off += bytes;
  }
  sb_printf(&h, "}");
  while (!h.oom && h.len % 8 != 0)
    sb_printf(&h, " ");
  if (h.oom) {
    free(h.p);
    return DT_ERROR(DT_ERR_OOM, "safetensors header for %s/%s: out of host memory", dir, name);
  }
  unsigned char len8[8];
  for (int i = 0; i < 8; i++)
    len8[i] = (unsigned char)((uint64_t)h.len >> (8 * i));
  int n_chunks = 2 + s->n;
  dt_ckpt_chunk *chunks = calloc((size_t)n_chunks, sizeof *chunks);
  if (!chunks) {
    free(h.p);
    return DT_ERROR(DT_ERR_OOM, "writing %s/%s: out of host memory", dir, name);
  }
  chunks[0] = (dt_ckpt_chunk){len8, 8};
  chunks[1] = (dt_ckpt_chunk){h.p, h.len};
  for (int i = 0; i < s->n; i++)
    chunks[2 + i] = (dt_ckpt_chunk){s->t[i].data, s->t[i].bytes};
  dt_status st = dt_ckpt_write_file(dir, name, chunks, n_chunks, crc, size);
  free(chunks);
  free(h.p);
  return st;
}

dt_status dt_safetensors_save_module(const dt_module *m, const char *dir, const char *name,
                                     uint32_t *crc, uint64_t *size) {
  dt_tensor_snapshot *s = NULL;
  DT_CHECK(dt_tensor_snapshot_of_module(m, &s));
  dt_status st = dt_tensor_snapshot_write_safetensors(s, dir, name, crc, size);
  dt_tensor_snapshot_destroy(s);
  return st;
}

/* ---- reading ---- */
typedef struct st_entry {
  char name[256];
  char dtype[16];
  int ndim;
  int64_t shape[DT_MAX_DIMS];
  int64_t begin, end;
  int has_crc, used;
  uint32_t crc;
} st_entry;

typedef struct st_header {
  st_entry *e;
  int n, cap;
} st_header;

static st_entry *find_entry(st_header *h, const char *name) {
  for (int i = 0; i < h->n; i++)
    if (!strcmp(h->e[i].name, name))
      return &h->e[i];
  return NULL;
}

static dt_status add_entry(st_header *h, const char *name, st_entry **out) {
  if ((*out = find_entry(h, name)) != NULL)
    return DT_OK;
  if (h->n == h->cap) {
    int cap = h->cap ? 2 * h->cap : 16;
    st_entry *e = realloc(h->e, (size_t)cap * sizeof *e);
    if (!e)
      return DT_ERROR(DT_ERR_OOM, "reading a safetensors header: out of host memory");
    h->e = e;
    h->cap = cap;
  }
  *out = &h->e[h->n++];
  memset(*out, 0, sizeof **out);
  snprintf((*out)->name, sizeof(*out)->name, "%s", name);
  (*out)->ndim = -1;
  return DT_OK;
}

static dt_status parse_metadata(ckpt_json *j, st_header *h) {
  DT_CHECK(ckpt_json_expect(j, '{'));
  if (ckpt_json_peek(j) == '}') {
    j->pos++;
    return DT_OK;
  }
  for (bool more = true; more;) {
    char key[300], val[64];
    DT_CHECK(ckpt_json_string(j, key, sizeof key));
    DT_CHECK(ckpt_json_expect(j, ':'));
    DT_CHECK(ckpt_json_string(j, val, sizeof val));
    if (!strncmp(key, "crc32.", 6)) {
      st_entry *e = NULL;
      DT_CHECK(add_entry(h, key + 6, &e));
      if (!ckpt_parse_hex32(val, &e->crc))
        return DT_ERROR(DT_ERR_FORMAT, "%s: metadata %s is '%s', not 8 hex digits", j->what, key,
                        val);
      e->has_crc = 1;
    }
    DT_CHECK(ckpt_json_next(j, '}', &more));
  }
  return DT_OK;
}

static dt_status parse_tensor(ckpt_json *j, st_entry *e) {
  DT_CHECK(ckpt_json_expect(j, '{'));
  int64_t offs[2];
  int n_offs = -1;
  bool more = ckpt_json_peek(j) != '}';
  if (!more)
    j->pos++;
  while (more) {
    char key[32];
    DT_CHECK(ckpt_json_string(j, key, sizeof key));
    DT_CHECK(ckpt_json_expect(j, ':'));
    if (!strcmp(key, "dtype"))
      DT_CHECK(ckpt_json_string(j, e->dtype, sizeof e->dtype));
    else if (!strcmp(key, "shape"))
      DT_CHECK(ckpt_json_int_array(j, e->shape, DT_MAX_DIMS, &e->ndim));
    else if (!strcmp(key, "data_offsets"))
      DT_CHECK(ckpt_json_int_array(j, offs, 2, &n_offs));
    else
      DT_CHECK(ckpt_json_skip(j));
    DT_CHECK(ckpt_json_next(j, '}', &more));
  }
  if (e->ndim < 0 || n_offs != 2 || !e->dtype[0])
    return DT_ERROR(DT_ERR_FORMAT, "%s: tensor %s lacks its dtype, shape or data_offsets", j->what,
                    e->name);
  e->begin = offs[0];
  e->end = offs[1];
  return DT_OK;
}

static dt_status parse_header(const char *text, size_t n, const char *what, st_header *h) {
  ckpt_json j = {text, n, 0, what};
  DT_CHECK(ckpt_json_expect(&j, '{'));
  bool more = ckpt_json_peek(&j) != '}';
  if (!more)
    j.pos++;
  while (more) {
    char key[300];
    DT_CHECK(ckpt_json_string(&j, key, sizeof key));
    DT_CHECK(ckpt_json_expect(&j, ':'));
    if (!strcmp(key, "__metadata__")) {
      DT_CHECK(parse_metadata(&j, h));
    } else {
      st_entry *e = NULL;
      DT_CHECK(add_entry(h, key, &e));
      DT_CHECK(parse_tensor(&j, e));
    }
    DT_CHECK(ckpt_json_next(&j, '}', &more));
  }
  return DT_OK;
}

static dt_status load_tensor(const char *path, const st_entry *e, const char *data,
                             uint64_t data_size, dt_tensor *t) {
  const char *want_dtype = safetensors_dtype(dt_tensor_dtype(t));
  if (want_dtype == NULL || strcmp(e->dtype, want_dtype) != 0)
    return DT_ERROR(DT_ERR_DTYPE, "%s: tensor %s: dtype %s, the model's is %s", path, e->name,
                    e->dtype, want_dtype ? want_dtype : dt_dtype_name(dt_tensor_dtype(t)));
  int same = e->ndim == dt_tensor_ndim(t);
  for (int d = 0; same && d < e->ndim; d++)
    same = e->shape[d] == dt_tensor_shape(t)[d];
  if (!same) {
    char have[96] = "", want[96] = "";
    for (int d = 0; d < e->ndim; d++)
      snprintf(have + strlen(have), sizeof have - strlen(have), "%s%lld", d ? ", " : "",
               (long long)e->shape[d]);
    for (int d = 0; d < dt_tensor_ndim(t); d++)
      snprintf(want + strlen(want), sizeof want - strlen(want), "%s%lld", d ? ", " : "",
               (long long)dt_tensor_shape(t)[d]);
    return DT_ERROR(DT_ERR_SHAPE,
                    "%s: tensor %s has shape (%s), the model's is (%s): the checkpoint is of "
                    "another model",
                    path, e->name, have, want);
  }
  uint64_t bytes = (uint64_t)dt_tensor_numel(t) * dt_dtype_size(dt_tensor_dtype(t));
  if (e->begin < 0 || e->end < e->begin || (uint64_t)(e->end - e->begin) != bytes ||
      (uint64_t)e->end > data_size)
    return DT_ERROR(DT_ERR_FORMAT,
                    "%s: tensor %s: data_offsets [%lld, %lld] do not fit its %llu bytes within "
                    "the %llu bytes of data (a truncated file?)",
                    path, e->name, (long long)e->begin, (long long)e->end,
                    (unsigned long long)bytes, (unsigned long long)data_size);
  const char *src = data + e->begin;
  if (!e->has_crc)
    return DT_ERROR(DT_ERR_FORMAT,
                    "%s: tensor %s has no CRC32 in the metadata (crc32.%s): dtrain writes one for "
                    "every tensor, so the file was not written by dtrain or its metadata was "
                    "stripped",
                    path, e->name, e->name);
  uint32_t c = dt_crc32(0, src, bytes);
  if (c != e->crc)
    return DT_ERROR(DT_ERR_FORMAT,
                    "%s: tensor %s: CRC32 mismatch (stored %08x, computed %08x): the file is "
                    "corrupt",
                    path, e->name, e->crc, c);
  if (!dt_tensor_is_contiguous(t))
    return DT_ERROR(DT_ERR_INTERNAL, "%s: tensor %s of the model is not contiguous", path, e->name);
  const dt_backend_ops *be = dt_tensor_backend(t);
  return be->copy(dt_tensor_data(t), dt_tensor_device(t), src, DT_CPU, (size_t)bytes, NULL);
}

/* Checks the file's framing and parses its header into h; *data and
 * *data_size the data section within buf. */
static dt_status open_safetensors(const char *path, const char *buf, size_t size, st_header *h,
                                  const char **data, uint64_t *data_size) {
  if (size < 8)
    return DT_ERROR(DT_ERR_FORMAT, "%s: header: truncated (%zu bytes; the length field is 8)", path,
                    size);
  uint64_t n = 0;
  for (int i = 0; i < 8; i++)
    n |= (uint64_t)(unsigned char)buf[i] << (8 * i);
  if (n > size - 8)
    return DT_ERROR(DT_ERR_FORMAT,
                    "%s: header: truncated (the header is %llu bytes, the file has %zu after the "
                    "length)",
                    path, (unsigned long long)n, size - 8);
  char what[4200];
  snprintf(what, sizeof what, "%s: header", path);
  DT_CHECK(parse_header(buf + 8, (size_t)n, what, h));
  *data = buf + 8 + n;
  *data_size = size - 8 - n;
  return DT_OK;
}

dt_status ckpt_safetensors_check(const char *path, const void *buf, size_t size) {
  st_header h = {0};
  const char *data = NULL;
  uint64_t data_size = 0;
  dt_status st = open_safetensors(path, buf, size, &h, &data, &data_size);
  for (int i = 0; st == DT_OK && i < h.n; i++) {
    const st_entry *e = &h.e[i];
    if (e->ndim < 0)
      continue; /* a crc for a tensor not in the file: ignored */
    if (e->begin < 0 || e->end < e->begin || (uint64_t)e->end > data_size)
      st = DT_ERROR(DT_ERR_FORMAT, "%s: tensor %s: data_offsets beyond the data (truncated?)", path,
                    e->name);
    else if (e->has_crc && dt_crc32(0, data + e->begin, (size_t)(e->end - e->begin)) != e->crc)
      st = DT_ERROR(DT_ERR_FORMAT, "%s: tensor %s: CRC32 mismatch: the file is corrupt", path,
                    e->name);
  }
  free(h.e);
  return st;
}

dt_status dt_safetensors_load_module(const char *path, dt_module *m) {
  void *buf = NULL;
  size_t size = 0;
  DT_CHECK(dt_ckpt_read_file(path, &buf, &size));
  st_header h = {0};
  const char *data = NULL;
  uint64_t data_size = 0;
  dt_status st = open_safetensors(path, buf, size, &h, &data, &data_size);
  int np = dt_module_num_parameters(m), nb = dt_module_num_buffers(m);
  for (int i = 0; st == DT_OK && i < np + nb; i++) {
    const char *name = NULL;
    dt_tensor *t =
        i < np ? dt_module_parameter_at(m, i, &name) : dt_module_buffer_at(m, i - np, &name);
    st_entry *e = find_entry(&h, name);
    if (!e || e->ndim < 0) {
      st = DT_ERROR(DT_ERR_FORMAT,
                    "%s: the model's tensor %s is not in the file: the checkpoint is of another "
                    "model",
                    path, name);
      break;
    }
    e->used = 1;
    st = load_tensor(path, e, data, data_size, t);
  }
  for (int i = 0; st == DT_OK && i < h.n; i++)
    if (h.e[i].ndim >= 0 && !h.e[i].used)
      st = DT_ERROR(DT_ERR_FORMAT,
                    "%s: tensor %s of the file is not in the model: the checkpoint is of another "
                    "model",
                    path, h.e[i].name);
  free(h.e);
  free(buf);
  return st;
}
