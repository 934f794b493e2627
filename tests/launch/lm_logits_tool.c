/* For hf_export_numpy_test: dtrain's logits of a language model's
 * checkpoint (opened as dtrain eval and sample open it) on a batch of
 * tokens: TOKENS holds raw little-endian i32, B x T with T the checkpoint's
 * context; OUT gets the f32 logits, B x T x the model's padded vocabulary.
 *   lm_logits_tool CKPT_DIR TOKENS OUT */
#include <stdio.h>
#include <stdlib.h>

#include "core/autograd.h"
#include "core/checkpoint.h"
#include "core/tensor.h"
#include "launch/eval.h"

/* The model's logits on `tokens` (n i32) as the f32 file `out`. */
static dt_status write_logits(dt_cli_ckpt_model *m, const int32_t *tokens, size_t n,
                              const char *out) {
  const int64_t T = m->task.input_shape[0], B = (int64_t)n / T;
  int64_t shape[2] = {B, T};
  dt_tensor *in = NULL, *y = NULL;
  if (B < 1)
    return DT_ERROR(DT_ERR_INVALID_ARG, "fewer than %lld tokens", (long long)T);
  DT_CHECK(dt_tensor_from_host(tokens, shape, 2, DT_DTYPE_I32, DT_CPU, &in));
  dt_module_train(m->module, 0);
  dt_no_grad_begin();
  dt_status st = dt_module_call(m->module, in, &y);
  dt_no_grad_end();
  const size_t count = st == DT_OK ? (size_t)dt_tensor_numel(y) : 0;
  float *logits = malloc(count * sizeof(float) + 1);
  if (st == DT_OK && !logits)
    st = DT_ERROR(DT_ERR_OOM, "the logits");
  if (st == DT_OK)
    st = dt_tensor_to_host(y, logits, count * sizeof(float));
  FILE *f = st == DT_OK ? fopen(out, "wb") : NULL;
  if (st == DT_OK && (!f || fwrite(logits, sizeof(float), count, f) != count))
    st = DT_ERROR(DT_ERR_IO, "writing %s failed", out);
  if (f && fclose(f) && st == DT_OK)
    st = DT_ERROR(DT_ERR_IO, "writing %s failed", out);
  if (st == DT_OK)
    printf("lm_logits_tool: %s (%s), %lld x %lld tokens, logits (%lld, %lld, %lld)\n", m->dir,
           m->model, (long long)B, (long long)T, (long long)B, (long long)T,
           (long long)dt_tensor_dim(y, 2));
  free(logits);
  dt_tensor_release(y);
  dt_tensor_release(in);
  return st;
}

int main(int argc, char **argv) {
  if (argc != 4) {
    fprintf(stderr, "usage: lm_logits_tool CKPT_DIR TOKENS OUT\n");
    return 2;
  }
  dt_cli_ckpt_model m;
  void *tokens = NULL;
  size_t size = 0;
  dt_status st = dt_cli_ckpt_model_open(argv[1], "cpu", "lm_logits_tool", &m);
  if (st == DT_OK)
    st = dt_ckpt_read_file(argv[2], &tokens, &size);
  if (st == DT_OK)
    st = write_logits(&m, tokens, size / sizeof(int32_t), argv[3]);
  if (st != DT_OK)
    fprintf(stderr, "lm_logits_tool: %s\n", dt_last_error());
  dt_cli_ckpt_model_close(&m);
  free(tokens);
  return st == DT_OK ? 0 : 1;
}
