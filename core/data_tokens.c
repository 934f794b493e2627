/* Token windows as a dataset, and the token loader: that dataset with the
 * distributed sampler and the background loader of core/data.h (the same
 * prefetch thread, pinned buffers and asynchronous copy as images). */
#include <stdlib.h>
#include <string.h>

#include "core/text.h"

typedef struct token_windows {
  const uint16_t *tokens;
  int64_t seq_len;
  int64_t count; /* windows */
} token_windows;

static int64_t windows_length(void *impl) { return ((token_windows *)impl)->count; }

/* input (T) i32 = tokens[k*T, k*T + T), target (T) i32 = one further. */
static dt_status windows_get(void *impl, int64_t k, void *input, void *target) {
  const token_windows *w = impl;
  const uint16_t *src = w->tokens + k * w->seq_len;
  int32_t *x = input, *y = target;
  for (int64_t t = 0; t < w->seq_len; t++) {
    x[t] = src[t];
    y[t] = src[t + 1];
  }
  return DT_OK;
}

static void windows_destroy(void *impl) { free(impl); }

static const dt_dataset_vtable windows_vtable = {windows_length, NULL, windows_destroy,
                                                 windows_get};

dt_status dt_dataset_token_windows(const dt_shard *shard, int seq_len, int32_t vocab_size,
                                   dt_dataset **out) {
  DT_CHECK_OUT(out);
  if (!shard || (shard->num_tokens > 0 && !shard->tokens))
    return DT_ERROR(DT_ERR_INVALID_ARG, "shard is NULL or empty-handed");
  if (seq_len < 1)
    return DT_ERROR(DT_ERR_INVALID_ARG, "sequence length %d: must be >= 1", seq_len);
  if (vocab_size < 1)
    return DT_ERROR(DT_ERR_INVALID_ARG, "vocab_size %d: must be >= 1", vocab_size);
  int64_t count = shard->num_tokens > 0 ? (shard->num_tokens - 1) / seq_len : 0;
  if (count < 1)
    return DT_ERROR(DT_ERR_INVALID_ARG,
                    "a shard of %lld tokens holds no window of seq_len + 1 = %d tokens: use a "
                    "shorter context or more text",
                    (long long)shard->num_tokens, seq_len + 1);
  token_windows *w = malloc(sizeof *w);
  if (!w)
    return DT_ERROR(DT_ERR_OOM, "cannot allocate a token dataset");
  *w = (token_windows){shard->tokens, seq_len, count};
  dt_sample_layout layout = {DT_DTYPE_I32, 1, {seq_len}, DT_DTYPE_I32, 1, {seq_len}};
  return dt_dataset_create_with_layout(&windows_vtable, w, &layout, vocab_size, out);
}

struct dt_token_loader {
  dt_dataset *windows;
  dt_sampler *sampler;
  dt_loader *loader;
};

dt_status dt_token_loader_create(const dt_shard *shard, int32_t vocab_size,
                                 const dt_token_loader_config *cfg, dt_token_loader **out) {
  DT_CHECK_OUT(out);
  dt_token_loader_config c = cfg ? *cfg : DT_TOKEN_LOADER_CONFIG_DEFAULT;
  if (c.batch < 1)
    return DT_ERROR(DT_ERR_INVALID_ARG, "batch %d: must be >= 1", c.batch);
  dt_token_loader *l = calloc(1, sizeof *l);
  if (!l)
    return DT_ERROR(DT_ERR_OOM, "cannot allocate a token loader");
  dt_status st;
  DT_CHECK_GOTO(dt_dataset_token_windows(shard, c.seq_len, vocab_size, &l->windows), st, fail);
  /* Every rank takes floor(W / R) windows of the epoch's order (rank r the
   * positions r, r + R, ...) in batches of B, the tail dropped: global batch
   * g is positions [g*B*R, (g+1)*B*R), split among the ranks. */
  dt_sampler_config sc = DT_SAMPLER_CONFIG_DEFAULT;
  sc.shuffle = c.shuffle;
  sc.seed = c.seed;
  sc.num_replicas = c.num_replicas;
  sc.rank = c.rank;
  sc.drop_last = 1;
  DT_CHECK_GOTO(dt_sampler_create(dt_dataset_length(l->windows), &sc, &l->sampler), st, fail);
  dt_loader_config lc = DT_LOADER_CONFIG_DEFAULT;
  lc.batch_size = c.batch;
  lc.drop_last = 1;
  lc.prefetch = c.prefetch;
  lc.device = c.device;
  DT_CHECK_GOTO(dt_loader_create(l->windows, l->sampler, &lc, &l->loader), st, fail);
  if (dt_loader_num_batches(l->loader) < 1) {
    st = DT_ERROR(DT_ERR_INVALID_ARG,
                  "%lld windows of %d tokens make no global batch of %d x %d ranks: use a "
                  "smaller batch or context",
                  (long long)dt_dataset_length(l->windows), c.seq_len + 1, c.batch, c.num_replicas);
    goto fail;
  }
  *out = l;
  return DT_OK;
fail:
  dt_token_loader_destroy(l);
  return st;
}

void dt_token_loader_destroy(dt_token_loader *l) {
  if (!l)
    return;
  dt_loader_destroy(l->loader);
  dt_sampler_destroy(l->sampler);
  dt_dataset_destroy(l->windows);
  free(l);
}

dt_status dt_token_loader_start_epoch(dt_token_loader *l, int64_t epoch) {
  if (!l)
    return DT_ERROR(DT_ERR_INVALID_ARG, "loader is NULL");
  return dt_loader_start_epoch(l->loader, epoch);
}

int64_t dt_token_loader_num_batches(const dt_token_loader *l) {
  return l ? dt_loader_num_batches(l->loader) : 0;
}

dt_status dt_token_loader_next(dt_token_loader *l, dt_tensor **inputs, dt_tensor **targets) {
  if (!l)
    return DT_ERROR(DT_ERR_INVALID_ARG, "loader is NULL");
  return dt_loader_next(l->loader, inputs, targets);
}
