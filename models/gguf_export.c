/* The GGUF v3 file of a language model (see models/gguf_export.h). */
#include "models/gguf_export.h"

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/checkpoint.h"
#include "core/half.h"
#include "core/tensor.h"
#include "core/text.h"
#include "models/models.h"

enum { GGUF_ALIGN = 32, GGUF_EOT = 50256 };
/* gguf_type of the metadata values */
enum { KV_U32 = 4, KV_I32 = 5, KV_F32 = 6, KV_BOOL = 7, KV_STRING = 8, KV_ARRAY = 9 };

/* The header being built; the first failure sticks. */
typedef struct gguf_buf {
  dt_bytes b;
  dt_status st;
} gguf_buf;

static void put(gguf_buf *w, const void *p, size_t n) {
  if (w->st == DT_OK)
    w->st = dt_bytes_append(&w->b, p, (int64_t)n);
}
static void put_u32(gguf_buf *w, uint32_t v) { put(w, &v, 4); }
static void put_u64(gguf_buf *w, uint64_t v) { put(w, &v, 8); }
static void put_str(gguf_buf *w, const char *s, size_t n) {
  put_u64(w, n);
  put(w, s, n);
}
static void key(gguf_buf *w, const char *arch, const char *name, uint32_t type) {
  char k[160];
  snprintf(k, sizeof k, "%s%s%s", arch ? arch : "", arch ? "." : "", name);
  put_str(w, k, strlen(k));
  put_u32(w, type);
}
static void kv_u32(gguf_buf *w, const char *arch, const char *name, uint32_t v) {
  key(w, arch, name, KV_U32);
  put_u32(w, v);
}
static void kv_f32(gguf_buf *w, const char *arch, const char *name, float v) {
  key(w, arch, name, KV_F32);
  put(w, &v, 4);
}
static void kv_str(gguf_buf *w, const char *name, const char *v) {
  key(w, NULL, name, KV_STRING);
  put_str(w, v, strlen(v));
}

/* One tensor: llama.cpp's name, ggml's dims (dtrain's reversed), type, data */
typedef struct gguf_tensor {
  char name[96];
  uint32_t ndim, type;
  uint64_t ne[2];
  void *data;
  size_t bytes;
} gguf_tensor;

/* dtrain's names (transformers' names) -> llama.cpp's; block-level ones
 * follow "h.N." (GPT-2) or "layers.N." (Llama) */
static const char *const top_names[][2] = {
    {"wte.weight", "token_embd.weight"},          {"wpe.weight", "position_embd.weight"},
    {"ln_f.weight", "output_norm.weight"},        {"ln_f.bias", "output_norm.bias"},
    {"embed_tokens.weight", "token_embd.weight"}, {"norm.weight", "output_norm.weight"},
    {"lm_head.weight", "output.weight"},
};
static const char *const block_names[][2] = {
    {"ln_1.", "attn_norm."},
    {"attn.c_attn.", "attn_qkv."},
    {"attn.c_proj.", "attn_output."},
    {"ln_2.", "ffn_norm."},
    {"mlp.c_fc.", "ffn_up."},
    {"mlp.c_proj.", "ffn_down."},
    {"input_layernorm.", "attn_norm."},
    {"self_attn.q_proj.", "attn_q."},
    {"self_attn.k_proj.", "attn_k."},
    {"self_attn.v_proj.", "attn_v."},
    {"self_attn.o_proj.", "attn_output."},
    {"post_attention_layernorm.", "ffn_norm."},
    {"mlp.gate_proj.", "ffn_gate."},
    {"mlp.up_proj.", "ffn_up."},
    {"mlp.down_proj.", "ffn_down."},
};

dt_status dt_gguf_tensor_name(const char *name, char *out, size_t cap) {
  for (size_t i = 0; i < sizeof top_names / sizeof top_names[0]; i++)
    if (!strcmp(name, top_names[i][0])) {
      snprintf(out, cap, "%s", top_names[i][1]);
      return DT_OK;
    }
  const char *rest = !strncmp(name, "h.", 2)        ? name + 2
                     : !strncmp(name, "layers.", 7) ? name + 7
                                                    : NULL;
  char *end = NULL;
  const long blk = rest ? strtol(rest, &end, 10) : -1;
  if (rest && end != rest && *end == '.')
    for (size_t i = 0; i < sizeof block_names / sizeof block_names[0]; i++) {
      const size_t k = strlen(block_names[i][0]);
      if (!strncmp(end + 1, block_names[i][0], k)) {
        snprintf(out, cap, "blk.%ld.%s%s", blk, block_names[i][1], end + 1 + k);
        return DT_OK;
      }
    }
  return DT_ERROR(DT_ERR_INTERNAL, "export: parameter %s has no GGUF name", name);
}

dt_status dt_gguf_permute_heads(float *w, int64_t rows, int64_t cols, int heads, bool back) {
  const int64_t hd = rows / heads, half = hd / 2;
  float *tmp = malloc((size_t)(hd * cols) * sizeof(float));
  if (!tmp)
    return DT_ERROR(DT_ERR_OOM, "export: a head of %lld rows", (long long)hd);
  for (int h = 0; h < heads; h++) {
    float *head = w + (int64_t)h * hd * cols;
    memcpy(tmp, head, (size_t)(hd * cols) * sizeof(float));
    for (int64_t j = 0; j < half; j++)
      for (int s = 0; s < 2; s++)
        memcpy(head + (back ? s * half + j : 2 * j + s) * cols,
               tmp + (back ? 2 * j + s : s * half + j) * cols, (size_t)cols * sizeof(float));
  }
  free(tmp);
  return DT_OK;
}

typedef struct gguf_model {
  bool gpt2;
  int vocab, n_head, n_kv_head;
  uint32_t type; /* ggml type of the matrices */
} gguf_model;

/* dtrain's parameter `name` (t) as the GGUF tensor *e */
static dt_status gguf_tensor_of(const char *name, const dt_tensor *t, const gguf_model *m,
                                gguf_tensor *e) {
  DT_CHECK(dt_gguf_tensor_name(name, e->name, sizeof e->name));
  const int ndim = dt_tensor_ndim(t);
  if (ndim < 1 || ndim > 2)
    return DT_ERROR(DT_ERR_INTERNAL, "export: parameter %s has %d dims", name, ndim);
  int64_t rows = dt_tensor_dim(t, 0), cols = ndim == 2 ? dt_tensor_dim(t, 1) : 1;
  const size_t n = (size_t)(rows * cols);
  float *data = malloc(n * sizeof(float));
  if (!data)
    return DT_ERROR(DT_ERR_OOM, "export: %zu floats for %s", n, name);
  e->data = data;
  DT_CHECK(dt_tensor_to_host(t, data, n * sizeof(float)));
  if ((!strcmp(e->name, "token_embd.weight") || !strcmp(e->name, "output.weight")) &&
      rows > m->vocab)
    rows = m->vocab; /* the padding rows are the trailing ones */
  const char *tail = strrchr(e->name, '.') - 6;
  if (!m->gpt2 && ndim == 2 && (!strncmp(tail, "attn_q", 6) || !strncmp(tail, "attn_k", 6)))
    DT_CHECK(
        dt_gguf_permute_heads(data, rows, cols, tail[5] == 'q' ? m->n_head : m->n_kv_head, false));
  e->ndim = (uint32_t)ndim;
  e->ne[0] = (uint64_t)(ndim == 2 ? cols : rows);
  e->ne[1] = (uint64_t)rows;
  e->type = ndim == 2 ? m->type : 0;
  e->bytes = (size_t)(rows * cols) * (e->type == 0 ? 4 : 2);
  uint16_t *half = (uint16_t *)data; /* narrowed in place: value i lands on read ones */
  for (int64_t i = 0; e->type != 0 && i < rows * cols; i++)
    half[i] = e->type == 1 ? dt_f32_to_f16(data[i]) : dt_f32_to_bf16(data[i]);
  return DT_OK;
}

/* GPT-2's byte-to-unicode map (bytes that print stand for themselves, the
 * others for 256, 257, ... in order) applied to a token's bytes, as UTF-8 */
static void put_token(gguf_buf *w, const uint8_t *bytes, size_t n) {
  char s[1024];
  size_t len = 0;
  for (size_t i = 0; i < n && len + 2 < sizeof s; i++) {
    const unsigned b = bytes[i];
    unsigned cp = b;
    if (!((b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174)) {
      unsigned k = 0; /* the non-printing bytes below b */
      for (unsigned c = 0; c < b; c++)
        k += !((c >= 33 && c <= 126) || (c >= 161 && c <= 172) || c >= 174);
      cp = 256 + k;
    }
    if (cp < 0x80) {
      s[len++] = (char)cp;
    } else {
      s[len++] = (char)(0xC0 | (cp >> 6));
      s[len++] = (char)(0x80 | (cp & 0x3F));
    }
  }
  put_str(w, s, len);
}

/* tokenizer.ggml.*: the tokens of tokenizer_dir/encoder.json, their types,
 * the merges of vocab.bpe */
static dt_status put_tokenizer(gguf_buf *w, const char *tokenizer_dir, int vocab) {
  dt_bpe *bpe = NULL;
  DT_CHECK(dt_bpe_load_dir(tokenizer_dir, NULL, &bpe));
  dt_status st = DT_OK;
  if (dt_bpe_vocab_size(bpe) != vocab)
    st = DT_ERROR(DT_ERR_INVALID_ARG, "export: %s holds %d tokens, the model %d", tokenizer_dir,
                  (int)dt_bpe_vocab_size(bpe), vocab);
  kv_str(w, "tokenizer.ggml.model", "gpt2");
  kv_str(w, "tokenizer.ggml.pre", "gpt-2");
  key(w, NULL, "tokenizer.ggml.tokens", KV_ARRAY);
  put_u32(w, KV_STRING);
  put_u64(w, (uint64_t)vocab);
  for (int32_t id = 0; id < vocab && st == DT_OK; id++) {
    const uint8_t *bytes = NULL;
    size_t n = 0;
    st = dt_bpe_token_bytes(bpe, id, &bytes, &n);
    if (st == DT_OK)
      put_token(w, bytes, n);
  }
  dt_bpe_destroy(bpe);
  key(w, NULL, "tokenizer.ggml.token_type", KV_ARRAY);
  put_u32(w, KV_I32);
  put_u64(w, (uint64_t)vocab);
  for (int32_t id = 0; id < vocab; id++)
    put_u32(w, id == GGUF_EOT ? 3 : 1); /* control, normal */
  char path[4200];
  snprintf(path, sizeof path, "%s/vocab.bpe", tokenizer_dir);
  char *text = NULL;
  size_t size = 0;
  if (st == DT_OK)
    st = dt_ckpt_read_file(path, (void **)&text, &size);
  if (st != DT_OK)
    return st;
  uint64_t merges = 0;
  for (int pass = 0; pass < 2; pass++) { /* count, then write */
    if (pass)
      put_u64(w, merges);
    for (size_t at = 0; at < size;) {
      const char *nl = memchr(text + at, '\n', size - at);
      const size_t len = nl ? (size_t)(nl - (text + at)) : size - at;
      if (len > 0 && strncmp(text + at, "#version", 8)) {
        merges += !pass;
        if (pass)
          put_str(w, text + at, len);
      }
      at += len + 1;
    }
    if (!pass) {
      key(w, NULL, "tokenizer.ggml.merges", KV_ARRAY);
      put_u32(w, KV_STRING);
    }
  }
  free(text);
  kv_u32(w, NULL, "tokenizer.ggml.bos_token_id", GGUF_EOT);
  kv_u32(w, NULL, "tokenizer.ggml.eos_token_id", GGUF_EOT);
  key(w, NULL, "tokenizer.ggml.add_bos_token", KV_BOOL);
  put(w, &(uint8_t){0}, 1);
  return w->st;
}

/* general.* and the architecture's sizes; *m and the number of keys */
static dt_status put_model(gguf_buf *w, const dt_task *task, const char *dtype, gguf_model *m) {
  dt_gpt2_config g;
  dt_llama_config l;
  const uint32_t T = (uint32_t)task->input_shape[0];
  m->type = !strcmp(dtype, "f32")    ? 0
            : !strcmp(dtype, "f16")  ? 1
            : !strcmp(dtype, "bf16") ? 30
                                     : 99;
  if (m->type == 99)
    return DT_ERROR(DT_ERR_INVALID_ARG, "export: dtype %s: expected f32, f16 or bf16", dtype);
  m->gpt2 = task->max_context > 0 && dt_gpt2_config_named(task->name, &g) == DT_OK;
  dt_clear_error();
  if (!m->gpt2 && (task->max_context <= 0 || dt_llama_config_named(task->name, &l) != DT_OK)) {
    dt_clear_error();
    return DT_ERROR(DT_ERR_INVALID_ARG,
                    "model %s has no GGUF export: it takes GPT-2 (gpt2-*) and Llama (llama-*) "
                    "language models",
                    task->name);
  }
  const char *arch = m->gpt2 ? "gpt2" : "llama";
  kv_str(w, "general.architecture", arch);
  kv_str(w, "general.name", task->name);
  kv_u32(w, NULL, "general.file_type", m->type == 0 ? 0 : m->type == 1 ? 1 : 32);
  kv_u32(w, NULL, "general.alignment", GGUF_ALIGN);
  kv_u32(w, arch, "context_length", T);
  kv_u32(w, arch, "embedding_length", (uint32_t)(m->gpt2 ? g.n_embd : l.n_embd));
  kv_u32(w, arch, "block_count", (uint32_t)(m->gpt2 ? g.n_layer : l.n_layer));
  kv_u32(w, arch, "feed_forward_length", (uint32_t)(m->gpt2 ? 4 * g.n_embd : l.ffn));
  kv_u32(w, arch, "attention.head_count", (uint32_t)(m->gpt2 ? g.n_head : l.n_head));
  m->vocab = m->gpt2 ? g.vocab : l.vocab;
  m->n_head = m->gpt2 ? g.n_head : l.n_head;
  m->n_kv_head = m->gpt2 ? g.n_head : l.n_kv_head;
  if (m->gpt2) {
    kv_f32(w, arch, "attention.layer_norm_epsilon", 1e-5f);
    return w->st;
  }
  kv_u32(w, arch, "attention.head_count_kv", (uint32_t)l.n_kv_head);
  kv_f32(w, arch, "attention.layer_norm_rms_epsilon", l.norm_eps);
  kv_f32(w, arch, "rope.freq_base", l.rope_theta);
  kv_u32(w, arch, "rope.dimension_count", (uint32_t)(l.n_embd / l.n_head));
  return w->st;
}

/* The header (counts, metadata, tensor infos, padding), then each tensor's
 * data padded to GGUF_ALIGN, as `path` */
static dt_status write_gguf(const char *path, gguf_buf *meta, uint64_t n_kv, const gguf_tensor *ts,
                            int n) {
  static const uint8_t zeros[GGUF_ALIGN];
  gguf_buf w = {{0}, DT_OK};
  put(&w, "GGUF", 4);
  put_u32(&w, 3);
  put_u64(&w, (uint64_t)n);
  put_u64(&w, n_kv);
  put(&w, meta->b.data, (size_t)meta->b.len);
  uint64_t offset = 0;
  for (int i = 0; i < n; i++) {
    put_str(&w, ts[i].name, strlen(ts[i].name));
    put_u32(&w, ts[i].ndim);
    put(&w, ts[i].ne, 8 * ts[i].ndim);
    put_u32(&w, ts[i].type);
    put_u64(&w, offset);
    offset += (ts[i].bytes + GGUF_ALIGN - 1) / GGUF_ALIGN * GGUF_ALIGN;
  }
  put(&w, zeros, (size_t)(GGUF_ALIGN - w.b.len % GGUF_ALIGN) % GGUF_ALIGN);
  dt_ckpt_chunk *chunks = malloc((size_t)(1 + 2 * n) * sizeof *chunks);
  if (w.st == DT_OK && !chunks)
    w.st = DT_ERROR(DT_ERR_OOM, "export: %d chunks", 1 + 2 * n);
  if (w.st == DT_OK) {
    chunks[0] = (dt_ckpt_chunk){w.b.data, (size_t)w.b.len};
    for (int i = 0; i < n; i++) {
      chunks[1 + 2 * i] = (dt_ckpt_chunk){ts[i].data, ts[i].bytes};
      chunks[2 + 2 * i] =
          (dt_ckpt_chunk){zeros, (GGUF_ALIGN - ts[i].bytes % GGUF_ALIGN) % GGUF_ALIGN};
    }
    char dir[4200];
    snprintf(dir, sizeof dir, "%s", path);
    char *slash = strrchr(dir, '/');
    const char *name = slash ? slash + 1 : path;
    if (slash)
      *slash = 0;
    w.st =
        dt_ckpt_write_file(slash ? (dir[0] ? dir : "/") : ".", name, chunks, 1 + 2 * n, NULL, NULL);
  }
  free(chunks);
  dt_bytes_free(&w.b);
  return w.st;
}

dt_status dt_gguf_export(const dt_task *task, const dt_module *model, const char *tokenizer_dir,
                         const char *dtype, const char *path) {
  if (!task || !model || !tokenizer_dir || !dtype || !path)
    return DT_ERROR(DT_ERR_INVALID_ARG, "export: task, model, dtype and paths must not be NULL");
  gguf_buf meta = {{0}, DT_OK};
  gguf_model m = {0};
  dt_status st = put_model(&meta, task, dtype, &m);
  const uint64_t n_kv = m.gpt2 ? 10 : 13;
  if (st == DT_OK)
    st = put_tokenizer(&meta, tokenizer_dir, m.vocab);
  const int n = dt_module_num_parameters(model);
  gguf_tensor *ts = st == DT_OK ? calloc((size_t)(n > 0 ? n : 1), sizeof *ts) : NULL;
  if (st == DT_OK && !ts)
    st = DT_ERROR(DT_ERR_OOM, "export: %d tensors", n);
  for (int i = 0; i < n && st == DT_OK; i++) {
    const char *name = NULL;
    dt_tensor *t = dt_module_parameter_at(model, i, &name);
    st = gguf_tensor_of(name, t, &m, &ts[i]);
  }
  if (st == DT_OK)
    st = write_gguf(path, &meta, n_kv + 8, ts, n);
  for (int i = 0; ts && i < n; i++)
    free(ts[i].data);
  free(ts);
  dt_bytes_free(&meta.b);
  return st;
}
