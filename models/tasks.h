/* Tasks: what a training run is about — the model, the input it takes, the
 * data sets it trains on, the loss and the metric — in one table that
 * `dtrain train`, `dtrain bench` and the data-parallel mode all read.
 * Adding a model is adding a row to the table in tasks.c (and its builder).
 *
 *   const dt_task *task;
 *   DT_CHECK(dt_task_find("lenet", &task));              // --model NAME
 *   dt_module *model;
 *   DT_CHECK(task->build(task, seed, &model));             // on the CPU
 *   const dt_task_data *data;
 *   DT_CHECK(dt_task_find_data(task, "fashion-mnist", &data));  // --data NAME
 *   dt_dataset *train;
 *   DT_CHECK(data->open(task, data, "data/fashion-mnist", "train", &train));
 *   cfg.step.loss = task->loss;                            // core/step.h
 *
 * Language models (gpt2-*) are tasks too: their input is a sequence of T
 * token ids, their targets the next token at every position, their
 * evaluation the loss on the validation split; `dt_task_with_context`
 * shortens T (--ctx). What the loop does differently for them (defaults,
 * tokens/s, MFU, samples) it reads from fields here, never from the name.
 */
#ifndef DT_MODELS_TASKS_H
#define DT_MODELS_TASKS_H

#include <stdbool.h>
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

typedef struct dt_task dt_task;

/* A data set a task trains on. */
typedef struct dt_task_data dt_task_data;
struct dt_task_data {
  const char *name; /* --data NAME, and its folder under --data-dir */
  int num_classes;
  float mean, std; /* input normalisation (x - mean) / std: the training split's statistics */
  /* Opens split "train" or the task's eval_split from `folder` (errors
   * name the file), in the task's input shape (a sequence task's context). */
  dt_status (*open)(const dt_task *task, const dt_task_data *data, const char *folder,
                    const char *split, dt_dataset **out);
};

/* The training settings a task starts from when the command line does not
 * say otherwise (NULL in the table: the loop's own defaults, those of the
 * image tasks). */
typedef enum dt_task_optimizer {
  DT_TASK_OPTIMIZER_DEFAULT = 0, /* the trainer's own (sgd) */
  DT_TASK_OPTIMIZER_SGD,
  DT_TASK_OPTIMIZER_ADAMW,
} dt_task_optimizer;

typedef struct dt_task_defaults {
  dt_task_optimizer optimizer;
  float lr, beta2, weight_decay;
  bool decay_matrices_only; /* weight decay on parameters of >= 2 dims only */
  int warmup;               /* optimizer steps */
  float min_lr;
  float clip;
  int batch, max_steps, eval_batch, log_interval;
  int val_every;   /* optimizer steps between evaluations during training, 0 = none */
  int val_batches; /* eval batches those evaluations take, 0 = the whole split */
} dt_task_defaults;

/* What the result of an evaluation is: the metric (test_accuracy=) or the
 * loss itself (val_loss=). */
typedef enum dt_task_result {
  DT_TASK_RESULT_METRIC = 0,
  DT_TASK_RESULT_LOSS,
} dt_task_result;

/* Counts `output`'s good predictions of `target`: adds to *sum the metric
 * summed over the batch's samples (the evaluation divides by the count). */
typedef dt_status (*dt_metric_fn)(dt_tensor *output, dt_tensor *target, double *sum);

struct dt_task {
  const char *name;    /* --model NAME */
  const char *summary; /* one line, for --help and errors */
  /* On the CPU, training mode; reads the task's input shape (the context). */
  dt_status (*build)(const dt_task *task, uint64_t seed, dt_module **out);
  /* One sample's input (the batch dim comes first, in front of these). */
  int input_ndim;
  int64_t input_shape[DT_TASK_MAX_DIMS];
  dt_dtype input_dtype;
  int64_t input_range; /* integer inputs (token ids): in [0, input_range); 0 for float */
  /* Targets: class ids (i32) in [0, num_classes): one per sample, output
   * (B, num_classes); with sequence_targets one per input position (the
   * next token), targets (B, T) and output (B, T, num_classes). */
  int num_classes;
  bool sequence_targets;
  /* > 0: the input is a sequence of input_shape[0] tokens, which
   * dt_task_with_context may set to anything in [1, max_context]. */
  int64_t max_context;
  const dt_task_data *data; /* the data sets it trains on; data[0] is the default */
  int n_data;
  dt_loss_fn loss;         /* core/step.h */
  const char *metric_name; /* "accuracy"; NULL with result DT_TASK_RESULT_LOSS */
  dt_metric_fn metric;     /* NULL = none (the evaluation gives the loss only) */
  const char *eval_split;  /* "test" or "val": the split evaluated, its name in the output */
  dt_task_result result;   /* the run's last line: <eval_split>_<metric_name or loss>= */
  const dt_task_defaults *defaults; /* NULL = the loop's */
  /* Training FLOPs of one sample (forward + backward), for MFU; NULL =
   * not known. */
  double (*flops_per_sample)(const dt_task *task);
  /* The same count where flops_per_sample is NULL (no MFU is reported),
   * for dtrain plan's roofline (train/plan.h); NULL = not known. */
  double (*plan_flops_per_sample)(const dt_task *task);
  /* The tokenizer the inputs are ids of ("gpt2": data_dir/gpt2's BPE): the
   * model generates text from a prompt. NULL = not text. */
  const char *tokenizer;
  /* ResNets: the small-image stem (the -small models, from the table) and
   * torchvision's zero_init_residual (false in the table; the trainer sets
   * it on its copy). residual_bn: the model's blocks end in a BatchNorm,
   * so zero_init_residual applies. */
  bool small_stem;
  bool zero_init_residual;
  bool residual_bn;
  /* ResNets: channels-last activations (dt_resnet_config's; the trainer
   * sets it on its copy). */
  bool channels_last;
  /* The model takes images of any channel count and size, and any number
   * of classes (adaptive pooling before its head: the ResNets): an image
   * folder sets input_shape and num_classes on the trainer's copy. */
  bool any_image_size;
};

/* The registered tasks, in table order. */
int dt_task_count(void);
const dt_task *dt_task_at(int i);

/* The task named `name` (a model name: "mlp", "lenet"). Unknown:
 * DT_ERR_INVALID_ARG "unknown model ...: known models are ...". */
dt_status dt_task_find(const char *name, const dt_task **out);

/* *out = *task with context T (input_shape[0]; the model is built for it).
 * DT_ERR_INVALID_ARG for a task whose input is no sequence, or T outside
 * [1, max_context]. */
dt_status dt_task_with_context(const dt_task *task, int64_t T, dt_task *out);

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
/* GPT-2's vocabulary: the token ids of data/gpt2's BPE. */
#define DT_GPT2_VOCAB 50257

/* A language model's loss: logits (B, T, Vp) whose first n_classes columns
 * are the tokens (the rest pad the vocabulary) and next-token ids (B, T)
 * -> the mean cross-entropy over the B*T tokens (dt_op_classifier_loss:
 * softmax, loss and dlogits in one pass); DT_REDUCTION_SUM gives it summed
 * over the B sequences (each sequence's loss is its mean over its tokens),
 * so the evaluation's sum / sequences is the mean token loss. */
dt_status dt_task_loss_next_token_of(dt_tensor *logits, dt_tensor *target, int64_t n_classes,
                                     dt_reduction reduction, dt_tensor **loss);
/* The same over GPT-2's DT_GPT2_VOCAB tokens: the gpt2-* tasks' loss. */
dt_status dt_task_loss_next_token(dt_tensor *logits, dt_tensor *target, dt_reduction reduction,
                                  dt_tensor **loss);

#ifdef __cplusplus
}
#endif
#endif
