/* Sampling text from a language model (train/sample.h). */
#include "train/sample.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/autograd.h"
#include "core/rng.h"
#include "core/text.h"

/* The next-token logits (V, the real tokens: the model's further columns
 * pad the vocabulary) after ids[0..n) (the last T of them). */
static dt_status next_logits(dt_module *model, const int32_t *ids, int64_t n, int64_t T,
                             dt_device dev, float *logits, int64_t V) {
  int64_t t = n < T ? n : T;
  int64_t shape[2] = {1, t};
  dt_tensor *x = NULL, *out = NULL, *rows = NULL, *last = NULL;
  dt_status st = dt_tensor_from_host(ids + (n - t), shape, 2, DT_DTYPE_I32, dev, &x);
  if (st == DT_OK)
    st = dt_module_call(model, x, &out);
  int64_t width = st == DT_OK ? dt_tensor_dim(out, -1) : 0;
  if (st == DT_OK && (width < V || dt_tensor_numel(out) != t * width))
    st = DT_ERROR(DT_ERR_SHAPE,
                  "sampling: the model gave %lld logits for %lld tokens of a %lld-token "
                  "vocabulary",
                  (long long)dt_tensor_numel(out), (long long)t, (long long)V);
  int64_t flat[2] = {t, width};
  if (st == DT_OK)
    st = dt_tensor_reshape(out, flat, 2, &rows);
  if (st == DT_OK)
    st = dt_tensor_slice(rows, t - 1, t, &last);
  float *row = st == DT_OK ? malloc((size_t)width * sizeof *row) : NULL;
  if (st == DT_OK && !row)
    st = DT_ERROR(DT_ERR_OOM, "no host memory for %lld logits", (long long)width);
  if (st == DT_OK)
    st = dt_tensor_to_host(last, row, (size_t)width * sizeof *row);
  if (st == DT_OK)
    memcpy(logits, row, (size_t)V * sizeof *logits);
  free(row);
  dt_tensor_release(last);
  dt_tensor_release(rows);
  dt_tensor_release(out);
  dt_tensor_release(x);
  return st;
}

static int descending(const void *a, const void *b) {
  float x = *(const float *)a, y = *(const float *)b;
  return (x < y) - (x > y);
}

/* One token from logits (V): greedy at temperature 0, else a draw from
 * softmax(logits / temperature) over the top_k largest (scratch: V floats). */
static int32_t pick(const float *logits, int64_t V, const dt_sample_config *cfg, dt_generator *gen,
                    float *scratch) {
  int64_t best = 0;
  for (int64_t i = 1; i < V; i++)
    if (logits[i] > logits[best])
      best = i;
  if (cfg->temperature <= 0.0f)
    return (int32_t)best;
  float floor_value = -INFINITY;
  if (cfg->top_k > 0 && cfg->top_k < V) {
    memcpy(scratch, logits, (size_t)V * sizeof *scratch);
    qsort(scratch, (size_t)V, sizeof *scratch, descending);
    floor_value = scratch[cfg->top_k - 1];
  }
  double total = 0.0;
  for (int64_t i = 0; i < V; i++) {
    double p = logits[i] >= floor_value
                   ? exp((double)(logits[i] - logits[best]) / (double)cfg->temperature)
                   : 0.0;
    scratch[i] = (float)p;
    total += p;
  }
  double u = (double)dt_generator_uniform(gen) * total, acc = 0.0;
  for (int64_t i = 0; i < V; i++) {
    acc += scratch[i];
    if (u < acc && scratch[i] > 0.0f)
      return (int32_t)i;
  }
  return (int32_t)best; /* u at the very top of the rounding */
}

/* The bytes of tokens ids[0..n) to cfg->emit (or appended to *text). */
static dt_status emit_tokens(const dt_bpe *bpe, const int32_t *ids, int64_t n,
                             const dt_sample_config *cfg, dt_bytes *text) {
  for (int64_t i = 0; i < n; i++) {
    const uint8_t *bytes = NULL;
    size_t len = 0;
    DT_CHECK(dt_bpe_token_bytes(bpe, ids[i], &bytes, &len));
    DT_CHECK(cfg->emit ? cfg->emit(cfg->emit_ctx, (const char *)bytes, len)
                       : dt_bytes_append(text, bytes, (int64_t)len));
  }
  return DT_OK;
}

/* The prompt's tokens, then cfg->length more, each emitted as it is drawn.
 * Only the last T tokens condition the next one, so the window `ids` keeps
 * at most 2T: a long sample's memory stays the model's context. */
static dt_status generate(dt_module *model, const dt_task *task, dt_device dev, dt_bpe *bpe,
                          const dt_sample_config *cfg, dt_tokens *ids, dt_bytes *text) {
  int64_t V = task->num_classes, T = task->input_shape[0];
  const char *prompt = cfg->prompt ? cfg->prompt : "";
  DT_CHECK(dt_bpe_encode(bpe, prompt, strlen(prompt), ids));
  if (ids->len == 0) {
    int32_t eot = dt_bpe_eot(bpe);
    DT_CHECK(dt_tokens_append(ids, &eot, 1));
  }
  DT_CHECK(emit_tokens(bpe, ids->data, ids->len, cfg, text));
  float *logits = malloc((size_t)V * sizeof *logits);
  float *scratch = malloc((size_t)V * sizeof *scratch);
  dt_status st = DT_OK;
  if (!logits || !scratch)
    st = DT_ERROR(DT_ERR_OOM, "no host memory for %lld logits", (long long)V);
  dt_generator gen;
  dt_generator_init(&gen, cfg->seed);
  for (int i = 0; st == DT_OK && i < cfg->length; i++) {
    if (ids->len >= 2 * T) { /* keep the last T: the next token's context */
      memmove(ids->data, ids->data + ids->len - T, (size_t)T * sizeof *ids->data);
      ids->len = T;
    }
    st = next_logits(model, ids->data, ids->len, T, dev, logits, V);
    int32_t next = st == DT_OK ? pick(logits, V, cfg, &gen, scratch) : 0;
    if (st == DT_OK)
      st = dt_tokens_append(ids, &next, 1);
    if (st == DT_OK)
      st = emit_tokens(bpe, &next, 1, cfg, text);
  }
  free(scratch);
  free(logits);
  return st;
}

dt_status dt_sample_text(dt_module *model, const dt_task *task, dt_device dev, const char *data_dir,
                         const dt_sample_config *cfg, char **out) {
  if (out)
    *out = NULL;
  if (!task->tokenizer || task->max_context <= 0)
    return DT_ERROR(DT_ERR_INVALID_ARG, "model %s does not generate text", task->name);
  if (cfg->length < 0 || !(cfg->temperature >= 0.0f) || cfg->top_k < 0)
    return DT_ERROR(DT_ERR_INVALID_ARG,
                    "sampling %d tokens at temperature %g with top-k %d: none may be negative",
                    cfg->length, (double)cfg->temperature, cfg->top_k);
  if (!cfg->emit && !out)
    return DT_ERROR(DT_ERR_INVALID_ARG, "sampling: neither an emit callback nor out");
  char dir[4096];
  if (snprintf(dir, sizeof dir, "%s/%s", data_dir, task->tokenizer) >= (int)sizeof dir)
    return DT_ERROR(DT_ERR_INVALID_ARG, "data dir too long: %s", data_dir);
  dt_bpe *bpe = NULL;
  DT_CHECK(dt_bpe_load_dir(dir, NULL, &bpe));
  dt_tokens ids = {0};
  dt_bytes text = {0};
  int was_training = dt_module_is_training(model);
  dt_module_train(model, 0);
  dt_no_grad_begin();
  dt_status st = generate(model, task, dev, bpe, cfg, &ids, &text);
  dt_no_grad_end();
  dt_module_train(model, was_training);
  if (st == DT_OK && !cfg->emit) {
    *out = malloc((size_t)text.len + 1);
    if (*out) {
      memcpy(*out, text.data, (size_t)text.len);
      (*out)[text.len] = '\0';
    } else {
      st = DT_ERROR(DT_ERR_OOM, "no host memory for %lld bytes of text", (long long)text.len);
    }
  }
  dt_bytes_free(&text);
  dt_tokens_free(&ids);
  dt_bpe_destroy(bpe);
  return st;
}
