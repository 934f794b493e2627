/* A GGUF file as the start of a training run (see dt_gguf_import in
 * models/gguf_export.h): the reader of what dt_gguf_export writes. */
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/checkpoint.h"
#include "core/half.h"
#include "core/tensor.h"
#include "models/gguf_export.h"
#include "models/models.h"

enum { KV_U32 = 4, KV_STRING = 8, KV_ARRAY = 9 };
/* ggml types the import reads: f32, f16, bf16 */
enum { GGML_F32 = 0, GGML_F16 = 1, GGML_BF16 = 30 };

/* A cursor over the file; the first failure sticks (reads past the end
 * return zeros). */
typedef struct gguf_reader {
  const unsigned char *p;
  size_t size, at;
  bool short_read;
} gguf_reader;

static const void *take(gguf_reader *r, size_t n) {
  if (r->short_read || n > r->size - r->at) {
    r->short_read = true;
    return NULL;
  }
  r->at += n;
  return r->p + r->at - n;
}
static uint64_t get_uint(gguf_reader *r, size_t n) {
  uint64_t v = 0;
  const void *p = take(r, n);
  if (p)
    memcpy(&v, p, n);
  return v;
}
/* A string: *s and *len (not terminated) */
static void get_str(gguf_reader *r, const char **s, uint64_t *len) {
  *len = get_uint(r, 8);
  *s = take(r, (size_t)*len);
  if (!*s)
    *len = 0;
}

/* Bytes of one value of a scalar type (0 for strings and arrays) */
static size_t scalar_size(uint32_t type) {
  static const size_t sizes[] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};
  return type < sizeof sizes / sizeof sizes[0] ? sizes[type] : 0;
}

/* Skips a value of `type`; false for a type GGUF does not have. */
static bool skip_value(gguf_reader *r, uint32_t type) {
  const char *s;
  uint64_t len;
  if (type == KV_STRING) {
    get_str(r, &s, &len);
  } else if (type == KV_ARRAY) {
    const uint32_t et = (uint32_t)get_uint(r, 4);
    const uint64_t n = get_uint(r, 8);
    if (et == KV_ARRAY || (et != KV_STRING && !scalar_size(et)))
      return false;
    if (n > r->size)
      r->short_read = true;
    else if (et != KV_STRING)
      take(r, scalar_size(et) * n);
    for (uint64_t i = 0; et == KV_STRING && i < n && !r->short_read; i++)
      get_str(r, &s, &len);
  } else if (scalar_size(type)) {
    take(r, scalar_size(type));
  } else {
    return false;
  }
  return true;
}

typedef struct gguf_entry {
  char name[96];
  uint32_t ndim, type;
  uint64_t ne[4], offset;
  bool used;
} gguf_entry;

typedef struct gguf_file {
  const char *path;
  char arch[32];
  uint64_t n;
  gguf_entry *es;
  const unsigned char *data; /* the tensors' data */
  size_t data_size;
} gguf_file;

/* The header: the architecture, the alignment, the tensor infos */
static dt_status parse(gguf_reader *r, gguf_file *f) {
  const void *magic = take(r, 4);
  const uint32_t version = (uint32_t)get_uint(r, 4);
  if (!magic || memcmp(magic, "GGUF", 4) || (version != 2 && version != 3))
    return DT_ERROR(DT_ERR_INVALID_ARG, "%s: not a GGUF file of version 2 or 3", f->path);
  f->n = get_uint(r, 8);
  const uint64_t n_kv = get_uint(r, 8);
  uint64_t align = 32;
  for (uint64_t i = 0; i < n_kv && !r->short_read; i++) {
    const char *k;
    uint64_t klen;
    get_str(r, &k, &klen);
    const uint32_t type = (uint32_t)get_uint(r, 4);
    if (klen == 20 && !memcmp(k, "general.architecture", 20) && type == KV_STRING) {
      const char *v;
      uint64_t vlen;
      get_str(r, &v, &vlen);
      snprintf(f->arch, sizeof f->arch, "%.*s", (int)(vlen < 31 ? vlen : 31), v);
    } else if (klen == 17 && !memcmp(k, "general.alignment", 17) && type == KV_U32) {
      align = get_uint(r, 4);
    } else if (!skip_value(r, type)) {
      return DT_ERROR(DT_ERR_INVALID_ARG, "%s: key %.*s has the unknown type %u", f->path,
                      (int)(klen < 64 ? klen : 64), k, type);
    }
  }
  /* Each tensor info takes at least 24 bytes of what follows (an empty
   * name, no dims), and sizeof(gguf_entry) in memory. */
  if (r->short_read || f->n > (r->size - r->at) / 24 || align == 0)
    return DT_ERROR(DT_ERR_INVALID_ARG, "%s: a truncated or malformed GGUF header", f->path);
  f->es = calloc((size_t)(f->n ? f->n : 1), sizeof *f->es);
  if (!f->es)
    return DT_ERROR(DT_ERR_OOM, "%s: no memory for %llu tensor infos", f->path,
                    (unsigned long long)f->n);
  for (uint64_t i = 0; i < f->n && !r->short_read; i++) {
    gguf_entry *e = &f->es[i];
    const char *s;
    uint64_t len;
    get_str(r, &s, &len);
    snprintf(e->name, sizeof e->name, "%.*s", (int)(len < 95 ? len : 95), s);
    e->ndim = (uint32_t)get_uint(r, 4);
    if (e->ndim > 4)
      return DT_ERROR(DT_ERR_INVALID_ARG, "%s: tensor %s has %u dims", f->path, e->name, e->ndim);
    for (uint32_t d = 0; d < e->ndim; d++)
      e->ne[d] = get_uint(r, 8);
    e->type = (uint32_t)get_uint(r, 4);
    e->offset = get_uint(r, 8);
  }
  const size_t start = (r->at + align - 1) / align * align;
  if (r->short_read || start > r->size)
    return DT_ERROR(DT_ERR_INVALID_ARG, "%s: a truncated GGUF header", f->path);
  f->data = r->p + start;
  f->data_size = r->size - start;
  return DT_OK;
}

static void dims_text(const uint64_t *ne, uint32_t ndim, char *buf, size_t cap) {
  size_t len = (size_t)snprintf(buf, cap, "[");
  for (uint32_t i = 0; i < ndim && len < cap; i++)
    len +=
        (size_t)snprintf(buf + len, cap - len, "%s%llu", i ? ", " : "", (unsigned long long)ne[i]);
  if (len < cap)
    snprintf(buf + len, cap - len, "]");
}

/* Parameter `name` (t) of the model from the file: checked, converted to
 * f32, q and k permuted back, the first `vocab` rows of a token table. */
static dt_status load_parameter(gguf_file *f, const char *task, const char *name, dt_tensor *t,
                                bool llama, int vocab, int n_head, int n_kv_head) {
  char want[96];
  DT_CHECK(dt_gguf_tensor_name(name, want, sizeof want));
  const int ndim = dt_tensor_ndim(t);
  const int64_t all_rows = dt_tensor_dim(t, 0), cols = ndim == 2 ? dt_tensor_dim(t, 1) : 1;
  const bool table = !strcmp(want, "token_embd.weight") || !strcmp(want, "output.weight");
  const int64_t rows = table && all_rows > vocab ? vocab : all_rows;
  const uint64_t ne[2] = {(uint64_t)(ndim == 2 ? cols : rows), (uint64_t)rows};
  char a[64], b[64];
  dims_text(ne, (uint32_t)ndim, a, sizeof a);
  gguf_entry *e = NULL;
  for (uint64_t i = 0; i < f->n && !e; i++)
    if (!strcmp(f->es[i].name, want))
      e = &f->es[i];
  if (!e)
    return DT_ERROR(DT_ERR_INVALID_ARG, "%s: no tensor %s %s, which model %s has", f->path, want, a,
                    task);
  e->used = true;
  dims_text(e->ne, e->ndim, b, sizeof b);
  if (e->ndim != (uint32_t)ndim || e->ne[0] != ne[0] || (ndim == 2 && e->ne[1] != ne[1]))
    return DT_ERROR(DT_ERR_INVALID_ARG, "%s: tensor %s is %s, model %s's is %s (ggml's dims)",
                    f->path, e->name, b, task, a);
  const size_t n = (size_t)(rows * cols), width = e->type == GGML_F32 ? 4 : 2;
  if (e->type != GGML_F32 && e->type != GGML_F16 && e->type != GGML_BF16)
    return DT_ERROR(DT_ERR_INVALID_ARG,
                    "%s: tensor %s has ggml type %u: expected f32 (0), f16 (1) "
                    "or bf16 (30)",
                    f->path, e->name, e->type);
  if (e->offset > f->data_size || n * width > f->data_size - e->offset)
    return DT_ERROR(DT_ERR_INVALID_ARG,
                    "%s: tensor %s: %zu bytes at offset %llu, past the end "
                    "of the file's %zu bytes of data",
                    f->path, e->name, n * width, (unsigned long long)e->offset, f->data_size);
  float *host = malloc((size_t)(all_rows * cols) * sizeof(float));
  if (!host)
    return DT_ERROR(DT_ERR_OOM, "%s: no memory for %lld floats of %s", f->path,
                    (long long)(all_rows * cols), name);
  dt_status st = dt_tensor_to_host(t, host, (size_t)(all_rows * cols) * sizeof(float));
  const unsigned char *src = f->data + e->offset;
  for (size_t i = 0; i < n && st == DT_OK; i++) { /* the padding rows past n stay the model's */
    uint16_t h;
    if (e->type == GGML_F32) {
      memcpy(&host[i], src + 4 * i, 4);
      continue;
    }
    memcpy(&h, src + 2 * i, 2);
    host[i] = e->type == GGML_F16 ? dt_f16_to_f32(h) : dt_bf16_to_f32(h);
  }
  const char *kind = strrchr(want, '.') - 6;
  if (st == DT_OK && llama && ndim == 2 &&
      (!strncmp(kind, "attn_q", 6) || !strncmp(kind, "attn_k", 6)))
    st = dt_gguf_permute_heads(host, rows, cols, kind[5] == 'q' ? n_head : n_kv_head, true);
  int64_t shape[2] = {all_rows, cols};
  dt_tensor *tmp = NULL;
  if (st == DT_OK)
    st = dt_tensor_from_host(host, shape, ndim, DT_DTYPE_F32, dt_tensor_device(t), &tmp);
  if (st == DT_OK)
    st = dt_tensor_copy_(t, tmp);
  dt_tensor_release(tmp);
  free(host);
  return st;
}

dt_status dt_gguf_import(const dt_task *task, dt_module *model, const char *path) {
  if (!task || !model || !path)
    return DT_ERROR(DT_ERR_INVALID_ARG, "init: task, model and file must not be NULL");
  dt_gpt2_config g;
  dt_llama_config l;
  const bool gpt2 = task->max_context > 0 && dt_gpt2_config_named(task->name, &g) == DT_OK;
  dt_clear_error();
  const bool llama =
      !gpt2 && task->max_context > 0 && dt_llama_config_named(task->name, &l) == DT_OK;
  dt_clear_error();
  if (!gpt2 && !llama)
    return DT_ERROR(DT_ERR_INVALID_ARG,
                    "model %s has no GGUF import: it takes GPT-2 (gpt2-*) and Llama (llama-*) "
                    "language models",
                    task->name);
  const char *arch = gpt2 ? "gpt2" : "llama";
  void *bytes = NULL;
  size_t size = 0;
  DT_CHECK(dt_ckpt_read_file(path, &bytes, &size));
  gguf_reader r = {bytes, size, 0, false};
  gguf_file f = {.path = path};
  dt_status st = parse(&r, &f);
  if (st == DT_OK && strcmp(f.arch, arch))
    st = DT_ERROR(DT_ERR_INVALID_ARG, "%s: architecture \"%s\", model %s's is \"%s\"", path, f.arch,
                  task->name, arch);
  const int np = dt_module_num_parameters(model);
  for (int i = 0; i < np && st == DT_OK; i++) {
    const char *name = NULL;
    dt_tensor *t = dt_module_parameter_at(model, i, &name);
    st = load_parameter(&f, task->name, name, t, llama, gpt2 ? g.vocab : l.vocab,
                        gpt2 ? g.n_head : l.n_head, gpt2 ? g.n_head : l.n_kv_head);
  }
  for (uint64_t i = 0; i < f.n && st == DT_OK; i++)
    if (!f.es[i].used)
      st = DT_ERROR(DT_ERR_INVALID_ARG, "%s: tensor %s, which model %s does not have", path,
                    f.es[i].name, task->name);
  free(f.es);
  free(bytes);
  return st;
}
