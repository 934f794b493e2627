/* Tasks: what a training run is about — the model, the input it takes, the
 * data sets it trains on, the loss and the metric — in one table that
 * `dtrain train`, `dtrain bench` and the data-parallel mode all read.
 * Adding a model is adding a row to the table in tasks.c (and its builder).
 *
 *   const dt_task *task;
 *   DT_CHECK(dt_task_find("lenet", &task));              // --model NAME
 *   dt_module *model;
 *   DT_CHECK(task->build(seed, &model));                   // on the CPU
 *   const dt_task_data *data;
 *   DT_CHECK(dt_task_find_data(task, "fashion-mnist", &data));  // --data NAME
 *   dt_dataset *train;
 *   DT_CHECK(data->open(data, "data/fashion-mnist", "train", &train));
 *   cfg.step.loss = task->loss;                            // core/step.h
 */
#ifndef DT_MODELS_TASKS_H
#define DT_MODELS_TASKS_H

#include <stddef.h>
#include <stdint.h>

#include "core/data.h"
#include "core/module.h"
#include "core/status.h"
#include "core/step.h"
#include "core/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

#define DT_TASK_MAX_DIMS 4 /* dims of one sample */

/* A data set a task trains on. */
typedef struct dt_task_data dt_task_data;
struct dt_task_data {
  const char *name; /* --data NAME, and its folder under --data-dir */
  int num_classes;
  float mean, std; /* input normalisation (x - mean) / std: the training split's statistics */
  /* Opens split "train" or "test" from `folder` (errors name the file). */
  dt_status (*open)(const dt_task_data *data, const char *folder, const char *split,
                    dt_dataset **out);
};

/* Counts `output`'s good predictions of `target`: adds to *sum the metric
 * summed over the batch's samples (the evaluation divides by the count). */
typedef dt_status (*dt_metric_fn)(dt_tensor *output, dt_tensor *target, double *sum);

typedef struct dt_task {
  const char *name;                                   /* --model NAME */
  const char *summary;                                /* one line, for --help and errors */
  dt_status (*build)(uint64_t seed, dt_module **out); /* on the CPU, training mode */
  /* One sample's input (the batch dim comes first, in front of these). */
  int input_ndim;
  int64_t input_shape[DT_TASK_MAX_DIMS];
  dt_dtype input_dtype;
  int64_t input_range; /* integer inputs (token ids): in [0, input_range); 0 for float */
  /* Targets: one class id (i32) per sample, in [0, num_classes); the
   * model's output is (B, num_classes). */
  int num_classes;
  const dt_task_data *data; /* the data sets it trains on; data[0] is the default */
  int n_data;
  dt_loss_fn loss;         /* core/step.h */
  const char *metric_name; /* "accuracy": the evaluation prints test_<name>= */
  dt_metric_fn metric;
} dt_task;

/* The registered tasks, in table order. */
int dt_task_count(void);
const dt_task *dt_task_at(int i);

/* The task named `name` (a model name: "mlp", "lenet"). Unknown:
 * DT_ERR_INVALID_ARG "unknown model ...: known models are ...". */
dt_status dt_task_find(const char *name, const dt_task **out);

/* The task's data set `name`; one it does not train on: DT_ERR_INVALID_ARG
 * naming the ones it does. */
dt_status dt_task_find_data(const dt_task *task, const char *name, const dt_task_data **out);

/* Writes the task names joined by `sep` ("mlp|lenet") into buf (always
 * terminated; truncated to cap). Returns buf. */
const char *dt_task_names(const char *sep, char *buf, size_t cap);

/* The losses and metrics the tasks use, for callers that train without a
 * task (tests). Cross-entropy over logits (B, C) and class ids (B),
 * ignoring target -100 as PyTorch; accuracy counts argmax == target. */
dt_status dt_task_loss_cross_entropy(dt_tensor *logits, dt_tensor *target, dt_reduction reduction,
                                     dt_tensor **loss);
dt_status dt_task_metric_accuracy(dt_tensor *logits, dt_tensor *target, double *sum);

#ifdef __cplusplus
}
#endif
#endif
