/* The trainer's configuration: defaults, names and the one validation
 * (train/train_config.h). */
#include "train/train_config.h"

#include <stdio.h>
#include <string.h>

#include "core/cpu.h"
#include "dist/ddp.h"

const char *dt_train_optimizer_name(dt_train_optimizer o) {
  return o == DT_TRAIN_ADAMW ? "adamw" : o == DT_TRAIN_SGD ? "sgd" : "invalid";
}

const char *dt_train_mode_name(dt_train_mode m) {
  return m == DT_TRAIN_MODE_DP ? "dp" : m == DT_TRAIN_MODE_DDP ? "ddp" : "invalid";
}

const char *dt_train_schedule_name(dt_lr_decay d) {
  switch (d) {
    case DT_LR_DECAY_CONSTANT: return "constant";
    case DT_LR_DECAY_COSINE: return "cosine";
    case DT_LR_DECAY_STEP: return "step";
  }
  return "invalid";
}

char *dt_train_device_text(dt_device d, char *buf, size_t cap) {
  if (d.type == DT_DEVICE_CUDA && d.index == DT_TRAIN_RANK_DEVICE)
    snprintf(buf, cap, "cuda");
  else if (d.type == DT_DEVICE_CPU && d.index == 0)
    snprintf(buf, cap, "cpu");
  else
    dt_device_format(d, buf, cap);
  return buf;
}

char *dt_train_devices_text(const dt_device *devs, int n, char *buf, size_t cap) {
  size_t used = 0;
  buf[0] = '\0';
  for (int i = 0; i < n && used < cap; i++) {
    char one[32];
    used += (size_t)snprintf(buf + used, cap - used, "%s%s", i ? "," : "",
                             dt_device_format(devs[i], one, sizeof one));
  }
  return buf;
}

/* Fields not named are 0, false or NULL. */
dt_train_config dt_train_config_default(void) {
  const dt_task *lenet = NULL;
  if (dt_task_find("lenet", &lenet) != DT_OK)
    dt_clear_error(); /* a build without the zoo's LeNet: the caller names a task */
  return (dt_train_config){.task = lenet,
                           .data_dir = "data",
                           .image = {.skip_bad_images = 0, .augment = -1},
                           .workers = 1,
                           .device = DT_CPU,
                           .optimizer = DT_TRAIN_SGD,
                           .schedule = DT_LR_DECAY_COSINE,
                           .epochs = 1,
                           .batch = 64,
                           .lr = 0.05f,
                           .momentum = 0.9f,
                           .gamma = 0.1f,
                           .accum = 1,
                           .precision = DT_PRECISION_DEVICE_DEFAULT,
                           .debug_overflow_rank = -1,
                           .max_memory_rank = -1,
                           .threads_note = "",
                           .log_interval = 100,
                           .eval_batch = 1000,
                           .mode = DT_TRAIN_MODE_DDP,
                           .comm_backend = DT_COMM_BACKEND_AUTO,
                           .comm_timeout = 300.0,
                           .bucket_cap_mb = 25.0f,
                           .first_bucket_mb = 0.125f,
                           .update_per_bucket = true,
                           .grad_compress = DT_DTYPE_F32,
                           .log_prefix = "",
                           .beta2 = 0.999f,
                           .sample = DT_SAMPLE_CONFIG_DEFAULT};
}

void dt_train_apply_task_defaults(dt_train_config *c, const dt_task *task) {
  if (!task)
    return;
  c->task = task;
  c->data = NULL;
  const dt_task_defaults *d = task->defaults;
  if (!d)
    return;
  if (d->optimizer == DT_TASK_OPTIMIZER_ADAMW)
    c->optimizer = DT_TRAIN_ADAMW;
  else if (d->optimizer == DT_TASK_OPTIMIZER_SGD)
    c->optimizer = DT_TRAIN_SGD;
  c->lr = d->lr;
  c->beta2 = d->beta2;
  c->weight_decay = d->weight_decay;
  c->decay_matrices_only = d->decay_matrices_only;
  c->warmup = d->warmup;
  c->min_lr = d->min_lr;
  c->clip = d->clip;
  c->batch = d->batch;
  c->max_steps = d->max_steps;
  c->eval_batch = d->eval_batch;
  c->log_interval = d->log_interval;
  c->val_every = d->val_every;
  c->val_batches = d->val_batches;
}

static bool is_half(dt_precision p) { return p == DT_PRECISION_BF16 || p == DT_PRECISION_FP16; }

/* Whether the run's device(s) are on the CPU (tf32 needs CUDA). */
static const dt_device *first_device(const dt_train_config *c) {
  return c->mode == DT_TRAIN_MODE_DP && c->n_devices > 0 ? &c->devices[0] : &c->device;
}

static dt_status check_choices(const dt_train_config *c) {
  if (c->optimizer != DT_TRAIN_SGD && c->optimizer != DT_TRAIN_ADAMW)
    return DT_ERROR(DT_ERR_INVALID_ARG, "`optimizer` %d: expected sgd or adamw", (int)c->optimizer);
  if (c->schedule != DT_LR_DECAY_CONSTANT && c->schedule != DT_LR_DECAY_COSINE &&
      c->schedule != DT_LR_DECAY_STEP)
    return DT_ERROR(DT_ERR_INVALID_ARG, "`schedule` %d: expected constant, cosine or step",
                    (int)c->schedule);
  if (c->mode != DT_TRAIN_MODE_DDP && c->mode != DT_TRAIN_MODE_DP)
    return DT_ERROR(DT_ERR_INVALID_ARG, "`mode` %d: expected ddp or dp", (int)c->mode);
  if (c->precision != DT_PRECISION_DEVICE_DEFAULT &&
      ((int)c->precision < 0 || c->precision >= DT_PRECISION_COUNT))
    return DT_ERROR(DT_ERR_INVALID_ARG, "`precision` %d: expected fp32, tf32, bf16 or fp16",
                    (int)c->precision);
  if (c->grad_compress != DT_DTYPE_F32 && c->grad_compress != DT_DTYPE_BF16 &&
      c->grad_compress != DT_DTYPE_F16)
    return DT_ERROR(DT_ERR_INVALID_ARG, "`grad_compress` %s: expected f32 (none), bf16 or f16",
                    dt_dtype_name(c->grad_compress));
  if (c->comm_backend != DT_COMM_BACKEND_AUTO && c->comm_backend != DT_COMM_BACKEND_MPI &&
      c->comm_backend != DT_COMM_BACKEND_NCCL)
    return DT_ERROR(DT_ERR_INVALID_ARG, "`comm_backend` %d: expected auto, mpi or nccl",
                    (int)c->comm_backend);
  if (c->resume != DT_TRAIN_RESUME_NONE && c->resume != DT_TRAIN_RESUME_AUTO &&
      c->resume != DT_TRAIN_RESUME_PATH)
    return DT_ERROR(DT_ERR_INVALID_ARG, "`resume` %d: expected none, auto or a path",
                    (int)c->resume);
  return DT_OK;
}

static dt_status check_ranges(const dt_train_config *c) {
  if (c->global_batch != 0 && (!c->batch_auto || c->accum != 1 || c->global_batch < 0))
    return DT_ERROR(DT_ERR_INVALID_ARG,
                    "`global_batch` %lld: needs `batch` auto (which sets the accumulation), a "
                    "positive count and no `accum`",
                    (long long)c->global_batch);
  if (c->epochs < 1 || (c->batch < 1 && !c->batch_auto) || c->accum < 1 || c->eval_batch < 1)
    return DT_ERROR(DT_ERR_INVALID_ARG,
                    "`epochs` (%d), `batch` (%d), `accum` (%d) and `eval_batch` (%d) must be >= 1",
                    c->epochs, c->batch, c->accum, c->eval_batch);
  if (c->warmup < 0 || c->step_size < 0 || c->log_interval < 0 || c->max_steps < 0 ||
      c->threads < 0 || c->ctx < 0 || c->val_every < 0 || c->val_batches < 0 || c->save_every < 0 ||
      c->keep < 0)
    return DT_ERROR(DT_ERR_INVALID_ARG,
                    "`warmup`, `step_size`, `log_interval`, `max_steps`, `threads`, `ctx`, "
                    "`val_every`, `val_batches`, `save_every` and `keep` must be >= 0");
  if (c->max_memory_mib < 0 || c->max_memory_from_step < 0 || c->max_memory_rank < -1)
    return DT_ERROR(DT_ERR_INVALID_ARG,
                    "`max_memory` (%d MiB) must be >= 1, or 0 for none (and the step it applies "
                    "from, %lld, >= 0)",
                    c->max_memory_mib, (long long)c->max_memory_from_step);
  if (c->threads > DT_CPU_MAX_THREADS)
    return DT_ERROR(DT_ERR_INVALID_ARG, "`threads` %d: at most %d CPU threads (0 = all cores)",
                    c->threads, DT_CPU_MAX_THREADS);
  if (!(c->lr >= 0) || !(c->clip >= 0) || !(c->weight_decay >= 0))
    return DT_ERROR(DT_ERR_INVALID_ARG,
                    "`lr` (%g), `clip` (%g) and `weight_decay` (%g) must be >= 0", c->lr, c->clip,
                    c->weight_decay);
  if (c->zero < 0 || c->zero > 2)
    return DT_ERROR(DT_ERR_INVALID_ARG, "`zero` stage %d: expected 0, 1 or 2", c->zero);
  if (!(c->comm_timeout > 0) || !(c->bucket_cap_mb > 0) || !(c->first_bucket_mb > 0) ||
      !(c->split_bucket_mb >= 0))
    return DT_ERROR(DT_ERR_INVALID_ARG,
                    "`comm_timeout` (%g s), `bucket_cap_mb` (%g) and `first_bucket_mb` (%g) must "
                    "be > 0, `split_bucket_mb` (%g) >= 0",
                    c->comm_timeout, c->bucket_cap_mb, c->first_bucket_mb, c->split_bucket_mb);
  if (!(c->beta2 >= 0) || !(c->beta2 < 1))
    return DT_ERROR(DT_ERR_INVALID_ARG, "`beta2` %g: expected 0 <= beta2 < 1", c->beta2);
  return DT_OK;
}

static dt_status check_mode(const dt_train_config *c) {
  bool dp = c->mode == DT_TRAIN_MODE_DP;
  if (dp && c->n_devices < 1)
    return DT_ERROR(DT_ERR_INVALID_ARG,
                    "`mode` dp needs the replicas' devices: `devices` cpu:0,cpu:1 (or "
                    "cuda:0,cuda:1)");
  if (!dp && c->n_devices > 0) {
    char list[DT_TRAIN_MAX_DEVICES * 12];
    return DT_ERROR(DT_ERR_INVALID_ARG,
                    "`devices` '%s' is for `mode` dp (one process, one replica per device); for "
                    "DDP give one `device` per rank",
                    dt_train_devices_text(c->devices, c->n_devices, list, sizeof list));
  }
  if (c->n_devices < 0 || c->n_devices > DT_TRAIN_MAX_DEVICES)
    return DT_ERROR(DT_ERR_INVALID_ARG, "`devices`: %d devices, expected 1 to %d", c->n_devices,
                    DT_TRAIN_MAX_DEVICES);
  if (dp && c->batch < c->n_devices)
    return DT_ERROR(DT_ERR_INVALID_ARG,
                    "`mode` dp splits each micro-batch across the %d devices of `devices`: "
                    "`batch` %d is too small (use `batch` >= %d)",
                    c->n_devices, c->batch, c->n_devices);
  return DT_OK;
}

static dt_status check_precision(const dt_train_config *c) {
  if (c->stochastic_rounding && !is_half(c->precision))
    return DT_ERROR(DT_ERR_INVALID_ARG,
                    "`stochastic_rounding` rounds the 16-bit working copy of the weights: it "
                    "needs `precision` bf16 or fp16");
  if (c->precision == DT_PRECISION_TF32 && first_device(c)->type != DT_DEVICE_CUDA)
    return DT_ERROR(DT_ERR_INVALID_ARG,
                    "`precision` tf32 needs a CUDA device (TF32 is a tensor-core format), not "
                    "cpu: use `precision` fp32 on the CPU (or bf16, fp16)");
  if (c->debug_overflow_rank >= 0 && c->precision != DT_PRECISION_FP16)
    return DT_ERROR(DT_ERR_INVALID_ARG,
                    "`debug_overflow` tests the GradScaler: it needs `precision` fp16");
  if (c->debug_overflow_rank >= 0 && c->debug_overflow_step < 0)
    return DT_ERROR(DT_ERR_INVALID_ARG, "`debug_overflow` step %lld: expected >= 0",
                    (long long)c->debug_overflow_step);
  return DT_OK;
}

static dt_status check_task(const dt_train_config *c) {
  if (!c->task)
    return DT_ERROR(DT_ERR_INVALID_ARG,
                    "no `task`: set it to a model's task (dt_task_find) or a task of your own");
  const dt_task *t = c->task;
  if (!t->build || !t->loss || !t->name || !t->eval_split)
    return DT_ERROR(DT_ERR_INVALID_ARG,
                    "task '%s' lacks its build, loss, name or eval_split (models/tasks.h)",
                    t->name ? t->name : "(unnamed)");
  if (!c->data && (t->n_data < 1 || !t->data))
    return DT_ERROR(DT_ERR_INVALID_ARG, "task '%s' has no data set and `data` is not set", t->name);
  if (c->data && !c->data->open)
    return DT_ERROR(DT_ERR_INVALID_ARG, "data set '%s' has no open function",
                    c->data->name ? c->data->name : "(unnamed)");
  if (c->zero_init_residual && !t->residual_bn)
    return DT_ERROR(DT_ERR_INVALID_ARG,
                    "`zero_init_residual`: model %s has no residual blocks ending in a BatchNorm "
                    "(it is for the resnet* models)",
                    t->name);
  if (c->channels_last && !t->residual_bn)
    return DT_ERROR(DT_ERR_INVALID_ARG,
                    "`channels_last`: model %s has no convolutions in residual blocks to run "
                    "channels-last (it is for the resnet* models)",
                    t->name);
  if (c->sync_bn && !t->residual_bn)
    return DT_ERROR(DT_ERR_INVALID_ARG,
                    "`sync_bn`: model %s has no BatchNorm (it is for the resnet* models)", t->name);
  if (c->sync_bn && c->max_memory_mib > 0)
    return DT_ERROR(DT_ERR_INVALID_ARG,
                    "`sync_bn` with `max_memory`: a rank that runs out of memory mid-step would "
                    "leave its peers waiting in SyncBatchNorm's collectives; the recovery needs "
                    "ranks whose forward passes are independent");
  if (c->ctx == 0)
    return DT_OK;
  if (t->max_context > 0 && c->ctx > t->max_context)
    return DT_ERROR(DT_ERR_INVALID_ARG,
                    "invalid value '%d' for `ctx`: model %s's context is 1 to %lld", c->ctx,
                    t->name, (long long)t->max_context);
  if (t->max_context <= 0)
    return DT_ERROR(
        DT_ERR_INVALID_ARG,
        "`ctx` %d: model %s takes no sequence (`ctx` is for the gpt2-* and llama-* models)", c->ctx,
        t->name);
  return DT_OK;
}

/* An image folder feeds a model of (C, H, H) f32 images. */
static dt_status check_image_folder(const dt_train_config *c) {
  if (c->workers < 1 || c->workers > 64)
    return DT_ERROR(DT_ERR_INVALID_ARG, "`workers` %d: expected 1 to 64 loader threads",
                    c->workers);
  const dt_image_folder_config *im = &c->image;
  bool set = im->channels || im->size || im->skip_bad_images || im->std[0] != 0.0f ||
             im->recipe != DT_IMAGE_AUGMENT_RESIZED_CROP;
  if (!c->image_folder)
    return set ? DT_ERROR(DT_ERR_INVALID_ARG,
                          "`channels`, `image_size`, `image_std`, `augment` and "
                          "`skip_bad_images` are for "
                          "image folders: the data set must be a folder holding train/ and val/")
               : DT_OK;
  if (im->channels != 0 && im->channels != 1 && im->channels != 3)
    return DT_ERROR(DT_ERR_INVALID_ARG,
                    "`channels` %d: expected 1 (grey), 3 (RGB) or 0 (the "
                    "model's input)",
                    im->channels);
  for (int k = 0; k < 3 && set; k++)
    if (im->std[0] != 0.0f && !(im->std[k] > 0.0f))
      return DT_ERROR(DT_ERR_INVALID_ARG, "`image_std` %g of channel %d: must be > 0",
                      (double)im->std[k], k);
  const dt_task *t = c->task;
  if (t->input_dtype != DT_DTYPE_F32 || t->input_ndim != 3 ||
      t->input_shape[1] != t->input_shape[2])
    return DT_ERROR(DT_ERR_INVALID_ARG,
                    "`image_folder` %s: model %s does not take square images (C, H, H)",
                    c->image_folder, t->name);
  return DT_OK;
}

dt_status dt_train_config_validate(const dt_train_config *c) {
  if (!c)
    return DT_ERROR(DT_ERR_INVALID_ARG, "no configuration (start from dt_train_config_default())");
  DT_CHECK(check_task(c));
  DT_CHECK(check_image_folder(c));
  DT_CHECK(check_choices(c));
  DT_CHECK(check_ranges(c));
  DT_CHECK(check_mode(c));
  DT_CHECK(check_precision(c));
  if (c->resume == DT_TRAIN_RESUME_AUTO && !c->run_dir)
    return DT_ERROR(DT_ERR_INVALID_ARG,
                    "`resume` auto looks for checkpoints in the run directory: give it with "
                    "`run_dir` DIR");
  if (c->resume == DT_TRAIN_RESUME_PATH && (!c->resume_path || !c->resume_path[0]))
    return DT_ERROR(DT_ERR_INVALID_ARG, "`resume` from a path needs `resume_path`");
  /* resume auto with init_path: the run directory's newest checkpoint
   * when there is one (a restart under --max-restarts), else init_path */
  if (c->init_path && c->resume == DT_TRAIN_RESUME_PATH)
    return DT_ERROR(DT_ERR_INVALID_ARG,
                    "`init_path` %s and `resume` %s: a resumed run has its own weights, give one "
                    "of them",
                    c->init_path, c->resume_path ? c->resume_path : "");
  if (!c->run_dir && !c->run_dir_default && c->resume != DT_TRAIN_RESUME_NONE)
    return DT_ERROR(DT_ERR_INVALID_ARG,
                    "`resume` needs a run directory: give it with `run_dir` DIR");
  return DT_OK;
}
