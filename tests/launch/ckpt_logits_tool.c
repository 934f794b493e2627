/* For safetensors_numpy_test and torchvision_resnet_test: the model of a
 * checkpoint (model.safetensors; MODEL, default mlp) in evaluation mode on
 * the first N test images of Fashion-MNIST, its logits written as raw
 * little-endian f32 (N x classes) to OUT, and with INPUTS the images as the
 * model took them (N x 1 x 28 x 28 f32, normalised).
 *   ckpt_logits_tool CKPT_DIR DATA_DIR N OUT [MODEL [INPUTS]] */
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

static int write_floats(const char *path, const float *v, size_t n) {
  FILE *f = fopen(path, "wb");
  if (!f || fwrite(v, sizeof(float), n, f) != n || fclose(f))
    return fprintf(stderr, "ckpt_logits_tool: writing %s failed\n", path), 1;
  return 0;
}

int main(int argc, char **argv) {
  if (argc < 5 || argc > 7) {
    fprintf(stderr, "usage: ckpt_logits_tool CKPT_DIR DATA_DIR N OUT [MODEL [INPUTS]]\n");
    return 2;
  }
  int n = atoi(argv[3]);
  const char *model = argc > 5 ? argv[5] : "mlp";
  const dt_task *task = NULL;
  const dt_task_data *data = NULL;
  dt_module *m = NULL;
  dt_dataset *test = NULL;
  char path[4096];
  if (dt_task_find(model, &task) != DT_OK || dt_task_find_data(task, "fashion-mnist", &data))
    return fail(model);
  if (task->build(task, 0, &m) != DT_OK)
    return fail("building the model");
  const int classes = task->num_classes;
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
  float *logits = malloc((size_t)n * classes * sizeof(float));
  if (dt_tensor_to_host(out, logits, (size_t)n * classes * sizeof(float)) != DT_OK)
    return fail("the logits");
  if (write_floats(argv[4], logits, (size_t)n * classes) ||
      (argc > 6 && write_floats(argv[6], x, (size_t)n * 784)))
    return 1;
  dt_tensor_release(out);
  dt_tensor_release(in);
  dt_dataset_destroy(test);
  dt_module_destroy(m);
  free(x);
  free(logits);
  return 0;
}
