/* For safetensors_numpy_test: the MLP of a checkpoint (model.safetensors)
 * on the first N test images of Fashion-MNIST, its logits written as raw
 * little-endian f32 (N x 10) to OUT.
 *   ckpt_logits_tool CKPT_DIR DATA_DIR N OUT */
#include <stdio.h>
#include <stdlib.h>

#include "core/autograd.h"
#include "core/checkpoint.h"
#include "core/tensor.h"
#include "models/tasks.h"

static int fail(const char *what) {
  fprintf(stderr, "ckpt_logits_tool: %s: %s\n", what, dt_last_error());
  return 1;
}

int main(int argc, char **argv) {
  if (argc != 5) {
    fprintf(stderr, "usage: ckpt_logits_tool CKPT_DIR DATA_DIR N OUT\n");
    return 2;
  }
  int n = atoi(argv[3]);
  const dt_task *task = NULL;
  const dt_task_data *data = NULL;
  dt_module *m = NULL;
  dt_dataset *test = NULL;
  char path[4096];
  if (dt_task_find("mlp", &task) != DT_OK || dt_task_find_data(task, "fashion-mnist", &data))
    return fail("the mlp task");
  if (task->build(task, 0, &m) != DT_OK)
    return fail("building the MLP");
  snprintf(path, sizeof path, "%s/model.safetensors", argv[1]);
  if (dt_safetensors_load_module(path, m) != DT_OK)
    return fail("loading the weights");
  snprintf(path, sizeof path, "%s/fashion-mnist", argv[2]);
  if (data->open(task, data, path, "test", &test) != DT_OK)
    return fail("the test set");
  float *x = malloc((size_t)n * 784 * sizeof(float));
  int32_t label;
  for (int i = 0; i < n; i++)
    if (dt_dataset_get_sample(test, i, x + (size_t)i * 784, &label) != DT_OK)
      return fail("a test sample");
  int64_t shape[4] = {n, 1, 28, 28};
  dt_tensor *in = NULL, *out = NULL;
  if (dt_tensor_from_host(x, shape, 4, DT_DTYPE_F32, DT_CPU, &in) != DT_OK)
    return fail("the input");
  dt_module_train(m, 0);
  dt_no_grad_begin();
  dt_status st = dt_module_call(m, in, &out);
  dt_no_grad_end();
  if (st != DT_OK)
    return fail("the forward");
  float *logits = malloc((size_t)n * 10 * sizeof(float));
  if (dt_tensor_to_host(out, logits, (size_t)n * 10 * sizeof(float)) != DT_OK)
    return fail("the logits");
  FILE *f = fopen(argv[4], "wb");
  if (!f || fwrite(logits, sizeof(float), (size_t)n * 10, f) != (size_t)n * 10 || fclose(f))
    return fprintf(stderr, "ckpt_logits_tool: writing %s failed\n", argv[4]), 1;
  dt_tensor_release(out);
  dt_tensor_release(in);
  dt_dataset_destroy(test);
  dt_module_destroy(m);
  free(x);
  free(logits);
  return 0;
}
