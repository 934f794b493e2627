/* The task table (models/tasks.h), and models by name on top of it. */
#include "models/tasks.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/ops.h"
#include "models/models.h"

/* Cross-entropy's "no label" target, as PyTorch's ignore_index. */
#define IGNORE_INDEX (-100)

dt_status dt_task_loss_cross_entropy(dt_tensor *logits, dt_tensor *target, dt_reduction reduction,
                                     dt_tensor **loss) {
  return dt_op_cross_entropy(logits, target, reduction, IGNORE_INDEX, loss);
}

/* logits (B, C), target (B) i32 class ids: adds the number of rows whose
 * argmax is the target. */
dt_status dt_task_metric_accuracy(dt_tensor *logits, dt_tensor *target, double *sum) {
  dt_status st = DT_OK;
  dt_tensor *pred = NULL;
  int64_t n = dt_tensor_dim(target, 0);
  int64_t *p = malloc((size_t)n * sizeof *p);
  int32_t *l = malloc((size_t)n * sizeof *l);
  if (!p || !l) {
    st = DT_ERROR(DT_ERR_OOM, "no host memory for %lld predictions", (long long)n);
    goto done;
  }
  DT_CHECK_GOTO(dt_op_argmax(logits, &pred), st, done);
  if (dt_tensor_dtype(target) != DT_DTYPE_I32 || dt_tensor_dtype(pred) != DT_DTYPE_I64 ||
      dt_tensor_numel(pred) != n) {
    st = DT_ERROR(DT_ERR_DTYPE, "expected i32 labels (%s) and i64 predictions (%s) of %lld rows",
                  dt_dtype_name(dt_tensor_dtype(target)), dt_dtype_name(dt_tensor_dtype(pred)),
                  (long long)n);
    goto done;
  }
  DT_CHECK_GOTO(dt_tensor_to_host(pred, p, (size_t)n * sizeof *p), st, done);
  DT_CHECK_GOTO(dt_tensor_to_host(target, l, (size_t)n * sizeof *l), st, done);
  int64_t correct = 0;
  for (int64_t i = 0; i < n; i++)
    correct += (p[i] == (int64_t)l[i]);
  *sum += (double)correct;
done:
  dt_tensor_release(pred);
  free(l);
  free(p);
  return st;
}

static dt_status open_idx_images(const dt_task_data *data, const char *folder, const char *split,
                                 dt_dataset **out) {
  return dt_dataset_mnist_files(folder, split, data->num_classes, data->mean, data->std, out);
}

/* 28x28 grey images of 10 classes, in the idx files of MNIST; normalised
 * with the training sets' per-pixel statistics (torchvision's examples). */
static const dt_task_data image28_data[] = {
    {"fashion-mnist", 10, 0.2860f, 0.3530f, open_idx_images},
    {"mnist", 10, 0.1307f, 0.3081f, open_idx_images},
};
#define NUM_IMAGE28_DATA ((int)(sizeof image28_data / sizeof image28_data[0]))

static dt_status build_mlp(uint64_t seed, dt_module **out) {
  static const int sizes[] = {784, 512, 512, 10};
  return dt_model_mlp(sizes, 4, seed, out);
}

static dt_status build_lenet(uint64_t seed, dt_module **out) {
  return dt_model_lenet5(10, seed, out);
}

/* What the models of 28x28 grey images share: the input, 10 classes, the
 * data sets, cross-entropy and accuracy. */
#define IMAGE28_CLASSIFICATION                                                                 \
  .input_ndim = 3, .input_shape = {1, 28, 28}, .input_dtype = DT_DTYPE_F32, .num_classes = 10, \
  .data = image28_data, .n_data = NUM_IMAGE28_DATA, .loss = dt_task_loss_cross_entropy,        \
  .metric_name = "accuracy", .metric = dt_task_metric_accuracy

static const dt_task tasks[] = {
    {.name = "mlp",
     .summary = "MLP 784-512-512-10 on 28x28 grey images, 10 classes",
     .build = build_mlp,
     IMAGE28_CLASSIFICATION},
    {.name = "lenet",
     .summary = "LeNet-5 on 28x28 grey images, 10 classes",
     .build = build_lenet,
     IMAGE28_CLASSIFICATION},
};
#define NUM_TASKS ((int)(sizeof tasks / sizeof tasks[0]))

int dt_task_count(void) { return NUM_TASKS; }

const dt_task *dt_task_at(int i) { return i >= 0 && i < NUM_TASKS ? &tasks[i] : NULL; }

const char *dt_task_names(const char *sep, char *buf, size_t cap) {
  size_t used = 0;
  if (cap == 0)
    return buf;
  buf[0] = '\0';
  for (int i = 0; i < NUM_TASKS && used < cap; i++)
    used += (size_t)snprintf(buf + used, cap - used, "%s%s", i ? sep : "", tasks[i].name);
  return buf;
}

dt_status dt_task_find(const char *name, const dt_task **out) {
  for (int i = 0; name != NULL && i < NUM_TASKS; i++) {
    if (strcmp(name, tasks[i].name) == 0) {
      *out = &tasks[i];
      return DT_OK;
    }
  }
  char names[256];
  return DT_ERROR(DT_ERR_INVALID_ARG, "unknown model \"%s\": known models are %s",
                  name ? name : "(null)", dt_task_names(", ", names, sizeof names));
}

dt_status dt_task_find_data(const dt_task *task, const char *name, const dt_task_data **out) {
  char list[256] = "";
  size_t used = 0;
  for (int i = 0; i < task->n_data; i++) {
    if (name != NULL && strcmp(name, task->data[i].name) == 0) {
      *out = &task->data[i];
      return DT_OK;
    }
    if (used < sizeof list)
      used += (size_t)snprintf(list + used, sizeof list - used, "%s%s", i ? ", " : "",
                               task->data[i].name);
  }
  return DT_ERROR(DT_ERR_INVALID_ARG, "model %s does not train on data set \"%s\": it takes %s",
                  task->name, name ? name : "(null)", list);
}

dt_status dt_model_create(const char *name, uint64_t seed, dt_module **out) {
  if (out == NULL)
    return DT_ERROR(DT_ERR_INVALID_ARG, "creating model \"%s\": out is NULL",
                    name ? name : "(null)");
  const dt_task *task = NULL;
  DT_CHECK(dt_task_find(name, &task));
  return task->build(seed, out);
}

const char *dt_model_name(int i) { return i >= 0 && i < NUM_TASKS ? tasks[i].name : NULL; }
