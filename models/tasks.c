/* The task table (models/tasks.h), and models by name on top of it. */
#include "models/tasks.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/ops.h"
#include "core/text.h"
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

dt_status dt_task_loss_next_token_of(dt_tensor *logits, dt_tensor *target, int64_t n_classes,
                                     dt_reduction reduction, dt_tensor **loss) {
  int64_t n = dt_tensor_numel(target);
  int64_t seqs = dt_tensor_ndim(target) > 0 ? dt_tensor_dim(target, 0) : 1;
  if (reduction != DT_REDUCTION_MEAN && reduction != DT_REDUCTION_SUM)
    return DT_ERROR(DT_ERR_INVALID_ARG, "the next-token loss reduces by mean or sum");
  dt_tensor *flat = NULL, *mean = NULL;
  DT_CHECK(dt_tensor_reshape(target, &n, 1, &flat));
  dt_status st = dt_op_classifier_loss(logits, flat, n_classes, IGNORE_INDEX, &mean);
  dt_tensor_release(flat);
  DT_CHECK(st);
  if (reduction == DT_REDUCTION_MEAN) {
    *loss = mean;
    return DT_OK;
  }
  st = dt_op_scale(mean, (float)seqs, loss);
  dt_tensor_release(mean);
  return st;
}

dt_status dt_task_loss_next_token(dt_tensor *logits, dt_tensor *target, dt_reduction reduction,
                                  dt_tensor **loss) {
  return dt_task_loss_next_token_of(logits, target, DT_GPT2_VOCAB, reduction, loss);
}

static dt_status open_idx_images(const dt_task *task, const dt_task_data *data, const char *folder,
                                 const char *split, dt_dataset **out) {
  (void)task;
  return dt_dataset_mnist_files(folder, split, data->num_classes, data->mean, data->std, out);
}

/* Token windows of a shard that the dataset owns. */
typedef struct owned_windows {
  dt_shard shard;
  dt_dataset *windows; /* over shard */
} owned_windows;

static int64_t owned_windows_length(void *impl) {
  return dt_dataset_length(((owned_windows *)impl)->windows);
}

static dt_status owned_windows_get(void *impl, int64_t i, void *input, void *target) {
  return dt_dataset_get_sample(((owned_windows *)impl)->windows, i, input, target);
}

static void owned_windows_destroy(void *impl) {
  owned_windows *w = impl;
  if (!w)
    return;
  dt_dataset_destroy(w->windows);
  dt_shard_free(&w->shard);
  free(w);
}

static const dt_dataset_vtable owned_windows_vtable = {owned_windows_length, NULL,
                                                       owned_windows_destroy, owned_windows_get};

/* data_dir/brown/{train,val}.bin (made from data_dir/brown/raw when
 * missing) as windows of the task's context. */
static dt_status open_brown(const dt_task *task, const dt_task_data *data, const char *folder,
                            const char *split, dt_dataset **out) {
  if (strcmp(split, "train") && strcmp(split, "val"))
    return DT_ERROR(DT_ERR_INVALID_ARG, "data set %s has splits train and val, not %s", data->name,
                    split);
  char parent[4096], path[4096];
  const char *slash = strrchr(folder, '/');
  size_t len = slash ? (size_t)(slash - folder) : 1;
  if (len >= sizeof parent ||
      snprintf(path, sizeof path, "%s/%s.bin", folder, split) >= (int)sizeof path)
    return DT_ERROR(DT_ERR_INVALID_ARG, "data folder path too long: %s", folder);
  memcpy(parent, slash ? folder : ".", len);
  parent[len] = '\0';
  DT_CHECK(dt_brown_shards_ensure(parent));
  owned_windows *w = calloc(1, sizeof *w);
  if (!w)
    return DT_ERROR(DT_ERR_OOM, "no host memory for the %s split of %s", split, data->name);
  dt_status st = dt_shard_read(path, data->num_classes, &w->shard);
  if (st == DT_OK && (st = dt_dataset_token_windows(&w->shard, (int)task->input_shape[0],
                                                    data->num_classes, &w->windows)) != DT_OK)
    st = dt_error_wrap(st, "%s", path); /* the shard too short for a window */
  if (st != DT_OK) {
    owned_windows_destroy(w);
    return st;
  }
  const dt_sample_layout *layout = dt_dataset_layout(w->windows);
  return dt_dataset_create_with_layout(&owned_windows_vtable, w, layout, data->num_classes, out);
}

/* 28x28 grey images of 10 classes, in the idx files of MNIST; normalised
 * with the training sets' per-pixel statistics (torchvision's examples). */
static const dt_task_data image28_data[] = {
    {"fashion-mnist", 10, 0.2860f, 0.3530f, open_idx_images},
    {"mnist", 10, 0.1307f, 0.3081f, open_idx_images},
};
#define NUM_IMAGE28_DATA ((int)(sizeof image28_data / sizeof image28_data[0]))

static dt_status build_mlp(const dt_task *task, uint64_t seed, dt_module **out) {
  (void)task;
  static const int sizes[] = {784, 512, 512, 10};
  return dt_model_mlp(sizes, 4, seed, out);
}

static dt_status build_lenet(const dt_task *task, uint64_t seed, dt_module **out) {
  (void)task;
  return dt_model_lenet5(10, seed, out);
}

/* The ResNet of the task's name (its "-small" suffix: the small-image
 * stem) for the task's input channels and classes. */
static dt_status resnet_config(const dt_task *task, dt_resnet_config *c) {
  char name[16];
  size_t len = strcspn(task->name, "-");
  if (len >= sizeof name)
    return DT_ERROR(DT_ERR_INVALID_ARG, "model %s: not a ResNet", task->name);
  memcpy(name, task->name, len);
  name[len] = '\0';
  DT_CHECK(dt_resnet_config_named(name, c));
  c->in_channels = (int)task->input_shape[0];
  c->num_classes = task->num_classes;
  c->small_stem = task->small_stem;
  c->zero_init_residual = task->zero_init_residual;
  c->channels_last = task->channels_last;
  return DT_OK;
}

static dt_status build_resnet(const dt_task *task, uint64_t seed, dt_module **out) {
  dt_resnet_config c;
  DT_CHECK(resnet_config(task, &c));
  return dt_model_resnet(&c, seed, out);
}

/* Training FLOPs per sample of the image models: per multiply-add of
 * their GEMMs and convolutions 2 forward and 4 backward (input and weight
 * gradients), 2 for the first layer's backward (its input, the image,
 * needs no gradient). The plan's roofline reads them (their MFU is not
 * reported: the CPU roof it needs costs a second of every run). MLP:
 * 784x512, then 512x512 + 512x10. LeNet-5: conv1 28x28 outputs x 6 x 25,
 * then conv2 10x10 x 16 x 150 and 400x120 + 120x84 + 84x10. ResNets:
 * dt_resnet_forward_macs at the task's image size, conv1 the first layer. */
static double mlp_flops_per_sample(const dt_task *task) {
  (void)task;
  return 4.0 * 784 * 512 + 6.0 * (512.0 * 512 + 512.0 * 10);
}

static double lenet_flops_per_sample(const dt_task *task) {
  (void)task;
  return 4.0 * 28 * 28 * 6 * 25 +
         6.0 * (10.0 * 10 * 16 * 150 + 400.0 * 120 + 120.0 * 84 + 84.0 * 10);
}

static double resnet_flops_per_sample(const dt_task *task) {
  dt_resnet_config c;
  double stem = 0.0;
  if (resnet_config(task, &c) != DT_OK)
    return 0.0;
  double macs = dt_resnet_forward_macs(&c, task->input_shape[1], task->input_shape[2], &stem);
  return 6.0 * macs - 2.0 * stem;
}

/* The task's GPT-2 configuration, its context the task's. */
static dt_status gpt2_config(const dt_task *task, dt_gpt2_config *cfg) {
  DT_CHECK(dt_gpt2_config_named(task->name, cfg));
  cfg->block_size = (int)task->input_shape[0];
  return DT_OK;
}

static dt_status build_gpt2(const dt_task *task, uint64_t seed, dt_module **out) {
  dt_gpt2_config cfg;
  DT_CHECK(gpt2_config(task, &cfg));
  return dt_model_gpt2(&cfg, seed, out);
}

static double gpt2_flops_per_sample(const dt_task *task) {
  dt_gpt2_config cfg;
  if (gpt2_config(task, &cfg) != DT_OK)
    return 0.0;
  return (double)cfg.block_size * dt_gpt2_flops_per_token(&cfg, cfg.block_size);
}

/* A Llama of the task's size at the task's context, and its training
 * FLOPs per sample. */
static dt_status build_llama(const dt_task *task, uint64_t seed, dt_module **out) {
  dt_llama_config c;
  DT_CHECK(dt_llama_config_named(task->name, &c));
  c.block_size = (int)task->input_shape[0];
  return dt_model_llama(&c, seed, out);
}

static double llama_flops_per_sample(const dt_task *task) {
  dt_llama_config c;
  const int64_t T = task->input_shape[0];
  return dt_llama_config_named(task->name, &c) == DT_OK
             ? (double)T * dt_llama_flops_per_token(&c, T)
             : 0.0;
}

/* GPT-2's tokens, in llm.c's shards (the Llama models read them too). */
static const dt_task_data text_data[] = {
    {"brown", DT_GPT2_VOCAB, 0.0f, 1.0f, open_brown},
};

/* gpt2-tiny on Brown: one epoch (1146 optimizer steps of 16 x 64 tokens)
 * on two cores; 300 steps reached only 0.5 nat below the unigram baseline
 * (README: "Language models"). */
static const dt_task_defaults lm_defaults = {
    .optimizer = DT_TASK_OPTIMIZER_ADAMW,
    .lr = 3e-3f,
    .beta2 = 0.95f,
    .weight_decay = 0.1f,
    .decay_matrices_only = true,
    .warmup = 30,
    .min_lr = 3e-4f,
    .clip = 1.0f,
    .batch = 16,
    .max_steps = 0, /* --epochs (1) decide */
    .eval_batch = 16,
    .log_interval = 50,
    .val_every = 200,
    .val_batches = 16,
};

/* What the models of 28x28 grey images share: the input, 10 classes, the
 * data sets, cross-entropy and accuracy. */
#define IMAGE28_CLASSIFICATION                                                                 \
  .input_ndim = 3, .input_shape = {1, 28, 28}, .input_dtype = DT_DTYPE_F32, .num_classes = 10, \
  .data = image28_data, .n_data = NUM_IMAGE28_DATA, .loss = dt_task_loss_cross_entropy,        \
  .metric_name = "accuracy", .metric = dt_task_metric_accuracy, .eval_split = "test",          \
  .result = DT_TASK_RESULT_METRIC

/* Language models over GPT-2's tokens (GPT-2's and the Llama family's,
 * built by `build`, `flops` their FLOPs per sample): context `ctx` (--ctx
 * shortens it), next-token targets, the validation loss as the result. */
#define LANGUAGE_MODEL(build_fn, flops, ctx)                                             \
  .build = build_fn, .input_ndim = 1, .input_shape = {ctx}, .input_dtype = DT_DTYPE_I32, \
  .input_range = DT_GPT2_VOCAB, .num_classes = DT_GPT2_VOCAB, .sequence_targets = true,  \
  .max_context = ctx, .data = text_data, .n_data = 1, .loss = dt_task_loss_next_token,   \
  .eval_split = "val", .result = DT_TASK_RESULT_LOSS, .defaults = &lm_defaults,          \
  .flops_per_sample = flops, .tokenizer = "gpt2"

static const dt_task tasks[] = {
    {.name = "mlp",
     .summary = "MLP 784-512-512-10 on 28x28 grey images, 10 classes",
     .build = build_mlp,
     .plan_flops_per_sample = mlp_flops_per_sample,
     IMAGE28_CLASSIFICATION},
    {.name = "lenet",
     .summary = "LeNet-5 on 28x28 grey images, 10 classes",
     .build = build_lenet,
     .plan_flops_per_sample = lenet_flops_per_sample,
     IMAGE28_CLASSIFICATION},
/* One task per GPT-2 size (models/gpt2_sizes.def). */
#define DT_GPT2_SIZE(name_, n_layer, n_head, n_embd, context, parameters)                \
  {.name = name_,                                                                        \
   .summary = "GPT-2 " parameters ": " #n_layer " layers, " #n_head " heads, C " #n_embd \
              ", context " #context,                                                     \
   LANGUAGE_MODEL(build_gpt2, gpt2_flops_per_sample, context)},
#include "models/gpt2_sizes.def"
#undef DT_GPT2_SIZE
/* One task per Llama size (models/llama_sizes.def). */
#define DT_LLAMA_SIZE(name_, n_layer, n_head, n_kv_head, n_embd, ffn, context, theta, parameters) \
  {.name = name_,                                                                                 \
   .summary = "Llama " parameters ": " #n_layer " layers, " #n_head " heads (" #n_kv_head         \
              " KV), C " #n_embd ", FFN " #ffn ", context " #context,                             \
   LANGUAGE_MODEL(build_llama, llama_flops_per_sample, context)},
#include "models/llama_sizes.def"
#undef DT_LLAMA_SIZE
/* ResNets (torchvision's layout) on the same images; -small: the 3x3
 * stride-1 stem without max-pool, for images of 28 to 64 px. */
#define RESNET(name_, summary_, small)                                                          \
  {                                                                                             \
    .name = name_, .summary = summary_, .build = build_resnet,                                  \
    .plan_flops_per_sample = resnet_flops_per_sample, .small_stem = small, .residual_bn = true, \
    .any_image_size = true, IMAGE28_CLASSIFICATION                                              \
  }
    RESNET("resnet18", "ResNet-18 (torchvision's layout)", false),
    RESNET("resnet34", "ResNet-34 (torchvision's layout)", false),
    RESNET("resnet50", "ResNet-50 (torchvision's layout)", false),
    RESNET("resnet18-small", "ResNet-18, small-image stem (3x3 conv, no max-pool)", true),
    RESNET("resnet34-small", "ResNet-34, small-image stem (3x3 conv, no max-pool)", true),
    RESNET("resnet50-small", "ResNet-50, small-image stem (3x3 conv, no max-pool)", true),
#undef RESNET
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

dt_status dt_task_with_context(const dt_task *task, int64_t T, dt_task *out) {
  if (task->max_context <= 0)
    return DT_ERROR(DT_ERR_INVALID_ARG, "model %s takes no sequence: it has no context to set",
                    task->name);
  if (T < 1 || T > task->max_context)
    return DT_ERROR(DT_ERR_INVALID_ARG, "context %lld for model %s: expected 1 to %lld",
                    (long long)T, task->name, (long long)task->max_context);
  *out = *task;
  out->input_shape[0] = T;
  return DT_OK;
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
  return task->build(task, seed, out);
}

const char *dt_model_name(int i) { return i >= 0 && i < NUM_TASKS ? tasks[i].name : NULL; }
