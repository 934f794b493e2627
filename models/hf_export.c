/* The Hugging Face layout of a language model (see models/hf_export.h). */
#include "models/hf_export.h"

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/checkpoint.h"
#include "core/tensor.h"
#include "models/models.h"

/* GPT-2's <|endoftext|>: BOS and EOS of both families */
enum { HF_EOT = 50256 };

/* One tensor of model.safetensors: its name, shape and f32 data (owned). */
typedef struct hf_tensor {
  char name[160];
  int ndim;
  int64_t shape[2];
  float *data;
} hf_tensor;

static bool ends_with(const char *s, const char *suffix) {
  size_t n = strlen(s), k = strlen(suffix);
  return n >= k && !strcmp(s + n - k, suffix);
}

/* GPT-2's Conv1D layers, whose weights transformers stores as (in, out) */
static bool is_conv1d(const char *name) {
  return ends_with(name, "c_attn.weight") || ends_with(name, "c_proj.weight") ||
         ends_with(name, "c_fc.weight");
}

/* dtrain's parameter `name` (t) as transformers' tensor *e: renamed under
 * `prefix` (the head excepted), the token tables cut to `vocab` rows, GPT-2's
 * Conv1D weights transposed. */
static dt_status hf_tensor_of(const char *name, const dt_tensor *t, bool gpt2, int vocab,
                              hf_tensor *e) {
  const bool head = !strcmp(name, "lm_head.weight");
  snprintf(e->name, sizeof e->name, "%s%s", head ? "" : gpt2 ? "transformer." : "model.", name);
  e->ndim = dt_tensor_ndim(t);
  if (e->ndim < 1 || e->ndim > 2)
    return DT_ERROR(DT_ERR_INTERNAL, "export: parameter %s has %d dims", name, e->ndim);
  for (int i = 0; i < e->ndim; i++)
    e->shape[i] = dt_tensor_dim(t, i);
  const size_t n = (size_t)dt_tensor_numel(t);
  float *data = malloc(n * sizeof(float));
  if (!data)
    return DT_ERROR(DT_ERR_OOM, "export: %zu floats for %s", n, name);
  dt_status st = dt_tensor_to_host(t, data, n * sizeof(float));
  if (st != DT_OK) {
    free(data);
    return st;
  }
  e->data = data;
  if ((head || ends_with(name, "wte.weight") || ends_with(name, "embed_tokens.weight")) &&
      e->shape[0] > vocab)
    e->shape[0] = vocab; /* the padding rows are the trailing ones */
  if (gpt2 && e->ndim == 2 && is_conv1d(name)) {
    const int64_t rows = e->shape[0], cols = e->shape[1];
    e->data = malloc(n * sizeof(float));
    if (!e->data) {
      e->data = data;
      return DT_ERROR(DT_ERR_OOM, "export: %zu floats for %s", n, name);
    }
    for (int64_t r = 0; r < rows; r++)
      for (int64_t c = 0; c < cols; c++)
        e->data[c * rows + r] = data[r * cols + c];
    e->shape[0] = cols;
    e->shape[1] = rows;
    free(data);
  }
  return DT_OK;
}

static size_t hf_tensor_bytes(const hf_tensor *e) {
  return (size_t)e->shape[0] * (size_t)(e->ndim == 2 ? e->shape[1] : 1) * sizeof(float);
}

/* The tensors as dir/model.safetensors: u64 header length, the JSON header
 * (padded with spaces to 8 bytes), the data in order. */
static dt_status write_safetensors(const char *dir, const hf_tensor *ts, int n) {
  const size_t cap = 64 + (size_t)n * 256;
  char *header = malloc(cap + 8);
  dt_ckpt_chunk *chunks = malloc((size_t)(n + 2) * sizeof *chunks);
  if (!header || !chunks) {
    free(header);
    free(chunks);
    return DT_ERROR(DT_ERR_OOM, "export: the safetensors header of %d tensors", n);
  }
  size_t len = (size_t)snprintf(header, cap, "{\"__metadata__\":{\"format\":\"pt\"}");
  uint64_t offset = 0;
  for (int i = 0; i < n; i++) {
    const size_t bytes = hf_tensor_bytes(&ts[i]);
    char shape[64];
    if (ts[i].ndim == 2)
      snprintf(shape, sizeof shape, "%lld,%lld", (long long)ts[i].shape[0],
               (long long)ts[i].shape[1]);
    else
      snprintf(shape, sizeof shape, "%lld", (long long)ts[i].shape[0]);
    len += (size_t)snprintf(
        header + len, cap - len,
        ",\"%s\":{\"dtype\":\"F32\",\"shape\":[%s],\"data_offsets\":[%llu,%llu]}", ts[i].name,
        shape, (unsigned long long)offset, (unsigned long long)(offset + bytes));
    offset += bytes;
    chunks[i + 2] = (dt_ckpt_chunk){ts[i].data, bytes};
  }
  header[len++] = '}';
  while (len % 8)
    header[len++] = ' ';
  uint64_t hlen = len; /* little-endian on every host dtrain builds for */
  chunks[0] = (dt_ckpt_chunk){&hlen, sizeof hlen};
  chunks[1] = (dt_ckpt_chunk){header, len};
  dt_status st = dt_ckpt_write_file(dir, "model.safetensors", chunks, n + 2, NULL, NULL);
  free(chunks);
  free(header);
  return st;
}

static dt_status write_text(const char *dir, const char *name, const char *text) {
  dt_ckpt_chunk c = {text, strlen(text)};
  return dt_ckpt_write_file(dir, name, &c, 1, NULL, NULL);
}

/* tokenizer_dir/from copied as dir/to */
static dt_status copy_file(const char *tokenizer_dir, const char *from, const char *dir,
                           const char *to) {
  char path[4200];
  void *data = NULL;
  size_t size = 0;
  snprintf(path, sizeof path, "%s/%s", tokenizer_dir, from);
  DT_CHECK(dt_ckpt_read_file(path, &data, &size));
  dt_ckpt_chunk c = {data, size};
  dt_status st = dt_ckpt_write_file(dir, to, &c, 1, NULL, NULL);
  free(data);
  return st;
}

/* config.json of GPT2LMHeadModel (dropouts 0: an inference export) */
static void gpt2_json(const dt_gpt2_config *c, char *buf, size_t cap) {
  snprintf(buf, cap,
           "{\n  \"architectures\": [\"GPT2LMHeadModel\"],\n  \"model_type\": \"gpt2\",\n"
           "  \"vocab_size\": %d,\n  \"n_positions\": %d,\n  \"n_ctx\": %d,\n"
           "  \"n_embd\": %d,\n  \"n_layer\": %d,\n  \"n_head\": %d,\n  \"n_inner\": null,\n"
           "  \"activation_function\": \"gelu_new\",\n  \"layer_norm_epsilon\": 1e-05,\n"
           "  \"resid_pdrop\": 0.0,\n  \"embd_pdrop\": 0.0,\n  \"attn_pdrop\": 0.0,\n"
           "  \"initializer_range\": 0.02,\n  \"scale_attn_weights\": true,\n"
           "  \"tie_word_embeddings\": true,\n  \"bos_token_id\": %d,\n  \"eos_token_id\": %d,\n"
           "  \"torch_dtype\": \"float32\"\n}\n",
           c->vocab, c->block_size, c->block_size, c->n_embd, c->n_layer, c->n_head, HF_EOT,
           HF_EOT);
}

/* config.json of LlamaForCausalLM */
static void llama_json(const dt_llama_config *c, char *buf, size_t cap) {
  snprintf(buf, cap,
           "{\n  \"architectures\": [\"LlamaForCausalLM\"],\n  \"model_type\": \"llama\",\n"
           "  \"vocab_size\": %d,\n  \"hidden_size\": %d,\n  \"intermediate_size\": %d,\n"
           "  \"num_hidden_layers\": %d,\n  \"num_attention_heads\": %d,\n"
           "  \"num_key_value_heads\": %d,\n  \"head_dim\": %d,\n  \"hidden_act\": \"silu\",\n"
           "  \"max_position_embeddings\": %d,\n  \"rms_norm_eps\": %.9g,\n"
           "  \"rope_theta\": %.9g,\n  \"rope_scaling\": null,\n  \"attention_bias\": false,\n"
           "  \"mlp_bias\": false,\n  \"tie_word_embeddings\": %s,\n  \"bos_token_id\": %d,\n"
           "  \"eos_token_id\": %d,\n  \"initializer_range\": 0.02,\n"
           "  \"torch_dtype\": \"float32\"\n}\n",
           c->vocab, c->n_embd, c->ffn, c->n_layer, c->n_head, c->n_kv_head, c->n_embd / c->n_head,
           c->block_size, (double)c->norm_eps, (double)c->rope_theta, c->tied ? "true" : "false",
           HF_EOT, HF_EOT);
}

/* config.json of the task's model at its context; *gpt2 and *vocab */
static dt_status model_json(const dt_task *task, char *buf, size_t cap, bool *gpt2, int *vocab) {
  dt_gpt2_config g;
  dt_llama_config l;
  const int T = (int)task->input_shape[0];
  *gpt2 = task->max_context > 0 && dt_gpt2_config_named(task->name, &g) == DT_OK;
  dt_clear_error();
  if (*gpt2) {
    g.block_size = T;
    gpt2_json(&g, buf, cap);
    *vocab = g.vocab;
    return DT_OK;
  }
  if (task->max_context <= 0 || dt_llama_config_named(task->name, &l) != DT_OK) {
    dt_clear_error();
    return DT_ERROR(DT_ERR_INVALID_ARG,
                    "model %s has no Hugging Face layout: the export takes GPT-2 (gpt2-*) and "
                    "Llama (llama-*) language models",
                    task->name);
  }
  l.block_size = T;
  llama_json(&l, buf, cap);
  *vocab = l.vocab;
  return DT_OK;
}

dt_status dt_hf_export(const dt_task *task, const dt_module *model, const char *tokenizer_dir,
                       const char *dir) {
  if (!task || !model || !tokenizer_dir || !dir)
    return DT_ERROR(DT_ERR_INVALID_ARG, "export: task, model and folders must not be NULL");
  char json[2048];
  bool gpt2 = false;
  int vocab = 0;
  DT_CHECK(model_json(task, json, sizeof json, &gpt2, &vocab));
  DT_CHECK(dt_ckpt_make_dirs(dir));
  const int n = dt_module_num_parameters(model);
  hf_tensor *ts = calloc((size_t)(n > 0 ? n : 1), sizeof *ts);
  if (!ts)
    return DT_ERROR(DT_ERR_OOM, "export: %d tensors", n);
  dt_status st = DT_OK;
  for (int i = 0; i < n && st == DT_OK; i++) {
    const char *name = NULL;
    dt_tensor *t = dt_module_parameter_at(model, i, &name);
    st = hf_tensor_of(name, t, gpt2, vocab, &ts[i]);
  }
  if (st == DT_OK)
    st = write_safetensors(dir, ts, n);
  for (int i = 0; i < n; i++)
    free(ts[i].data);
  free(ts);
  char tok[512];
  snprintf(tok, sizeof tok,
           "{\n  \"tokenizer_class\": \"GPT2Tokenizer\",\n  \"model_max_length\": %lld,\n"
           "  \"bos_token\": \"<|endoftext|>\",\n  \"eos_token\": \"<|endoftext|>\",\n"
           "  \"unk_token\": \"<|endoftext|>\",\n  \"add_prefix_space\": false\n}\n",
           (long long)task->input_shape[0]);
  char gen[128];
  snprintf(gen, sizeof gen, "{\n  \"bos_token_id\": %d,\n  \"eos_token_id\": %d\n}\n", HF_EOT,
           HF_EOT);
  if (st == DT_OK)
    st = write_text(dir, "config.json", json);
  if (st == DT_OK)
    st = write_text(dir, "generation_config.json", gen);
  if (st == DT_OK)
    st = write_text(dir, "tokenizer_config.json", tok);
  if (st == DT_OK)
    st = copy_file(tokenizer_dir, "encoder.json", dir, "vocab.json");
  if (st == DT_OK)
    st = copy_file(tokenizer_dir, "vocab.bpe", dir, "merges.txt");
  return st;
}

/* ---- import ---- */

/* One entry of a safetensors header. */
typedef struct st_entry {
  char name[160];
  char dtype[16];
  int ndim;
  int64_t shape[4];
  uint64_t begin, end;
  bool used;
} st_entry;

/* The header's entries (the __metadata__ skipped), at most cap. */
static dt_status parse_header(const char *path, const char *h, size_t len, st_entry *es, int cap,
                              int *n) {
  *n = 0;
  const char *end = h + len;
  const char *p = memchr(h, '{', len);
  while (p && p < end) {
    const char *q = memchr(p, '"', (size_t)(end - p));
    if (!q)
      break;
    const char *qe = memchr(q + 1, '"', (size_t)(end - q - 1));
    const char *obj = qe ? memchr(qe, '{', (size_t)(end - qe)) : NULL;
    const char *close = obj ? memchr(obj, '}', (size_t)(end - obj)) : NULL;
    if (!close)
      return DT_ERROR(DT_ERR_INVALID_ARG, "%s: a malformed safetensors header", path);
    p = close + 1;
    if ((size_t)(qe - q - 1) == 12 && !memcmp(q + 1, "__metadata__", 12))
      continue;
    if (*n == cap)
      return DT_ERROR(DT_ERR_INVALID_ARG, "%s: more than %d tensors", path, cap);
    st_entry *e = &es[(*n)++];
    memset(e, 0, sizeof *e);
    snprintf(e->name, sizeof e->name, "%.*s", (int)(qe - q - 1), q + 1);
    char body[512];
    snprintf(body, sizeof body, "%.*s", (int)(close - obj), obj);
    const char *d = strstr(body, "\"dtype\""), *s = strstr(body, "\"shape\""),
               *o = strstr(body, "\"data_offsets\"");
    unsigned long long b = 0, f = 0;
    if (!d || !s || !o || sscanf(d, "\"dtype\" : \"%15[^\"]\"", e->dtype) != 1 ||
        sscanf(o, "\"data_offsets\" : [ %llu , %llu ]", &b, &f) != 2)
      return DT_ERROR(DT_ERR_INVALID_ARG, "%s: tensor %s: a malformed header entry", path, e->name);
    e->begin = b;
    e->end = f;
    for (s = strchr(s, '[') + 1; e->ndim < 4;) {
      char *next = NULL;
      const long long v = strtoll(s, &next, 10);
      if (next == s)
        break;
      e->shape[e->ndim++] = v;
      s = next + strspn(next, " ,");
    }
  }
  return DT_OK;
}

static st_entry *find_entry(st_entry *es, int n, const char *name) {
  for (int i = 0; i < n; i++)
    if (!strcmp(es[i].name, name))
      return &es[i];
  return NULL;
}

static void shape_text(const int64_t *shape, int ndim, char *buf, size_t cap) {
  size_t len = (size_t)snprintf(buf, cap, "(");
  for (int i = 0; i < ndim && len < cap; i++)
    len += (size_t)snprintf(buf + len, cap - len, "%s%lld", i ? ", " : "", (long long)shape[i]);
  if (len < cap)
    snprintf(buf + len, cap - len, ")");
}

/* Parameter `name` (t) of the model from the file's entry: checked, the
 * Conv1D weights transposed back, the first `vocab` rows of a token table. */
static dt_status load_parameter(const char *path, const char *task, const char *name, dt_tensor *t,
                                bool gpt2, int vocab, st_entry *es, int n,
                                const unsigned char *data, size_t size) {
  hf_tensor want;
  DT_CHECK(hf_tensor_of(name, t, gpt2, vocab, &want));
  float *host = want.data; /* the model's values, HF's layout */
  st_entry *e = find_entry(es, n, want.name);
  if (!e && strchr(want.name, '.') && strncmp(want.name, "lm_head", 7))
    e = find_entry(es, n, strchr(want.name, '.') + 1); /* no transformer./model. prefix */
  dt_status st = DT_OK;
  char a[64], b[64];
  shape_text(want.shape, want.ndim, a, sizeof a);
  if (!e) {
    st = DT_ERROR(DT_ERR_INVALID_ARG, "%s: no tensor %s %s, which model %s has", path, want.name, a,
                  task);
    goto done;
  }
  e->used = true;
  shape_text(e->shape, e->ndim, b, sizeof b);
  if (e->ndim != want.ndim || e->shape[0] != want.shape[0] ||
      (want.ndim == 2 && e->shape[1] != want.shape[1])) {
    st = DT_ERROR(DT_ERR_INVALID_ARG, "%s: tensor %s is %s, model %s's is %s", path, e->name, b,
                  task, a);
    goto done;
  }
  const size_t bytes = hf_tensor_bytes(&want);
  if (strcmp(e->dtype, "F32") || e->end - e->begin != bytes || e->end > size) {
    st = DT_ERROR(DT_ERR_INVALID_ARG,
                  "%s: tensor %s: dtype %s, bytes [%llu, %llu) of %zu: expected F32, %zu bytes",
                  path, e->name, e->dtype, (unsigned long long)e->begin, (unsigned long long)e->end,
                  size, bytes);
    goto done;
  }
  const float *src = (const float *)(const void *)(data + e->begin);
  const int64_t rows = want.shape[0], cols = want.ndim == 2 ? want.shape[1] : 1;
  if (gpt2 && want.ndim == 2 && is_conv1d(name)) { /* (in, out) back to (out, in) */
    for (int64_t r = 0; r < rows; r++)
      for (int64_t c = 0; c < cols; c++)
        host[c * rows + r] = src[r * cols + c];
  } else {
    memcpy(host, src, bytes); /* host holds every row: the padding past vocab stays the model's */
  }
  int64_t shape[2];
  for (int i = 0; i < dt_tensor_ndim(t); i++)
    shape[i] = dt_tensor_dim(t, i);
  dt_tensor *tmp = NULL;
  DT_CHECK_GOTO(
      dt_tensor_from_host(host, shape, dt_tensor_ndim(t), DT_DTYPE_F32, dt_tensor_device(t), &tmp),
      st, done);
  st = dt_tensor_copy_(t, tmp);
  dt_tensor_release(tmp);
done:
  free(host);
  return st;
}

dt_status dt_hf_import(const dt_task *task, dt_module *model, const char *dir) {
  if (!task || !model || !dir)
    return DT_ERROR(DT_ERR_INVALID_ARG, "init: task, model and folder must not be NULL");
  char json[2048], path[4200];
  bool gpt2 = false;
  int vocab = 0;
  DT_CHECK(model_json(task, json, sizeof json, &gpt2, &vocab));
  snprintf(path, sizeof path, "%s/model.safetensors", dir);
  void *file = NULL;
  size_t size = 0;
  DT_CHECK(dt_ckpt_read_file(path, &file, &size));
  uint64_t hlen = 0;
  if (size >= 8)
    memcpy(&hlen, file, 8);
  const int cap = 4096;
  st_entry *es = malloc((size_t)cap * sizeof *es);
  dt_status st = DT_OK;
  int n = 0;
  if (!es)
    st = DT_ERROR(DT_ERR_OOM, "init: %d header entries", cap);
  else if (size < 8 || hlen > size - 8)
    st = DT_ERROR(DT_ERR_INVALID_ARG, "%s: not a safetensors file (%zu bytes)", path, size);
  else
    st = parse_header(path, (const char *)file + 8, (size_t)hlen, es, cap, &n);
  const unsigned char *data = (const unsigned char *)file + 8 + hlen;
  const size_t dsize = size >= 8 + hlen ? size - 8 - hlen : 0;
  const int np = dt_module_num_parameters(model);
  for (int i = 0; i < np && st == DT_OK; i++) {
    const char *name = NULL;
    dt_tensor *t = dt_module_parameter_at(model, i, &name);
    st = load_parameter(path, task->name, name, t, gpt2, vocab, es, n, data, dsize);
  }
  for (int i = 0; i < n && st == DT_OK; i++)
    if (!es[i].used)
      st = DT_ERROR(DT_ERR_INVALID_ARG, "%s: tensor %s, which model %s does not have", path,
                    es[i].name, task->name);
  free(es);
  free(file);
  return st;
}
