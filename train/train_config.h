/* The trainer's configuration: a typed dt_train_config (enums, numbers,
 * devices, paths; no strings standing for choices), its defaults, and the
 * one validation that the library and the command line both call.
 *
 *   dt_train_config cfg = dt_train_config_default();
 *   DT_CHECK(dt_task_find("lenet", &cfg.task));    // or a dt_task of your own
 *   cfg.epochs = 2;
 *   cfg.optimizer = DT_TRAIN_ADAMW;
 *   DT_CHECK(dt_train_config_validate(&cfg));      // dt_train_run validates too
 *
 * Messages name configuration fields between backquotes ("`min_lr` 0.1 is
 * above `lr` 0.05"); the command line rewrites each to its flag (--min-lr)
 * through its flag table, once. */
#ifndef DT_TRAIN_TRAIN_CONFIG_H
#define DT_TRAIN_TRAIN_CONFIG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/amp.h"
#include "core/device.h"
#include "core/image.h"
#include "core/optim.h"
#include "core/status.h"
#include "dist/comm.h"
#include "dist/process_group.h"
#include "models/tasks.h"
#include "train/sample.h"
#include "train/train_hooks.h"

#ifdef __cplusplus
extern "C" {
#endif

#define DT_TRAIN_MAX_DEVICES 64

typedef enum dt_train_optimizer {
  DT_TRAIN_SGD = 0, /* momentum, nesterov, weight decay (PyTorch's SGD) */
  DT_TRAIN_ADAMW,   /* decoupled weight decay; beta1 and eps PyTorch's */
} dt_train_optimizer;
const char *dt_train_optimizer_name(dt_train_optimizer o); /* "sgd", "adamw" */

typedef enum dt_train_mode {
  DT_TRAIN_MODE_DDP = 0, /* one process per rank (one process without a process group) */
  DT_TRAIN_MODE_DP,      /* one process, one replica thread per device of `devices` */
} dt_train_mode;
const char *dt_train_mode_name(dt_train_mode m); /* "ddp", "dp" */

typedef enum dt_train_resume {
  DT_TRAIN_RESUME_NONE = 0, /* start from scratch */
  DT_TRAIN_RESUME_AUTO,     /* the newest complete checkpoint of run_dir, if any */
  DT_TRAIN_RESUME_PATH,     /* the checkpoint directory resume_path */
} dt_train_resume;

/* "constant", "cosine", "step". */
const char *dt_train_schedule_name(dt_lr_decay d);

/* Device index meaning "this rank's own GPU" (cuda without an index):
 * dt_comm_pick_device (the local rank within CUDA_VISIBLE_DEVICES), cuda:0
 * without a process group. */
#define DT_TRAIN_RANK_DEVICE (-1)

/* A device as a user names it: "cpu" for cpu:0, "cuda" for this rank's
 * GPU, else dt_device_format's "cuda:1". Returns buf. */
char *dt_train_device_text(dt_device d, char *buf, size_t cap);
/* Devices joined by commas ("cpu:0,cpu:1"). Returns buf. */
char *dt_train_devices_text(const dt_device *devs, int n, char *buf, size_t cap);

typedef struct dt_train_config {
  /* What to train: the model, its input, data sets, loss and metric
   * (models/tasks.h: dt_task_find for the zoo's, or a task of the
   * caller's own, borrowed for the run). */
  const dt_task *task;
  const dt_task_data *data; /* one of task->data; NULL = task->data[0] */
  /* The folder holding the data set's folder (data->name); NULL: the data
   * set's open() gets a NULL folder (a data set in memory). */
  const char *data_dir;
  /* An image folder (core/image.h): image_folder/train and image_folder/val
   * (evaluated as the task's eval split) instead of `data`; NULL = `data`.
   * `image` says how it is read: channels and size 0 = the task's input
   * (channels, size, size); the std 0 = the defaults (ImageNet's mean and
   * std for 3 channels, the task's first data set's for 1); its seed is
   * `seed`. */
  const char *image_folder;
  dt_image_folder_config image;
  int workers;      /* loader threads decoding ahead (1) */
  dt_device device; /* DDP: this rank's; index DT_TRAIN_RANK_DEVICE for cuda = its own GPU */
  dt_train_optimizer optimizer;
  dt_lr_decay schedule; /* after the warm-up */
  int epochs;
  int batch; /* micro-batch size (per rank) */
  /* The micro-batch from the plan (train/plan.h, dt_plan_auto_batch):
   * `batch` is then 0; with global_batch > 0 the accumulation is
   * global_batch / (ranks x micro-batch) (`accum` stays 1). The plan
   * sees `max_memory` when it is in force from the start; under DDP the
   * ranks take the smallest of their micro-batches. */
  bool batch_auto;
  int64_t global_batch;
  int batch_auto_overshoot; /* tests: batch_auto's first trial is this multiple of the rule */
  float lr;
  float momentum; /* SGD */
  float weight_decay;
  bool nesterov; /* SGD */
  int warmup;    /* optimizer steps of linear warm-up */
  int step_size; /* schedule step: steps between decays (0 = one epoch) */
  float gamma;   /* schedule step: decay factor */
  float min_lr;  /* schedule cosine: floor */
  int accum;     /* micro-batches per optimizer step */
  float clip;    /* global gradient-norm cap, 0 = off */
  /* Mixed precision (core/amp.h); DT_PRECISION_DEVICE_DEFAULT = tf32 on
   * CUDA, fp32 on the CPU. */
  dt_precision precision;
  /* fp16's GradScaler test: rank debug_overflow_rank's gradients get an
   * Inf at optimizer step debug_overflow_step (0-based); rank -1 = none. */
  int debug_overflow_rank;
  int64_t debug_overflow_step;
  /* bf16/fp16: round the optimizer's 16-bit working copy of the weights
   * stochastically (seeded by `seed`) instead of to nearest. */
  bool stochastic_rounding;
  /* Recompute each transformer block's activations in backward instead of
   * keeping them (GPT-2 and Llama tasks; models/models.h): less memory,
   * the same gradients bit for bit, one more forward of the blocks. */
  bool recompute;
  /* ResNets (the task's residual_bn): the last BatchNorm of each residual
   * block starts at weight 0, so each block starts as the identity
   * (torchvision's zero_init_residual; Goyal et al. 2017). */
  bool zero_init_residual;
  /* ResNets (the task's residual_bn): channels-last activations, (N, H, W,
   * C), through every convolution, batch norm and pooling (cuDNN's NHWC
   * kernels on a GPU; transposes around the NCHW kernels on the CPU). */
  bool channels_last;
  /* SyncBatchNorm: BatchNorm's training statistics over every DDP rank's
   * micro-batch (the process group's allreduce, forward and backward), as
   * PyTorch's SyncBatchNorm; models with BatchNorm (the resnet* tasks).
   * One process: nothing to synchronise (a no-op); `mode` dp: refused. */
  bool sync_bn;
  /* A cap in MiB on the memory of the device (each of dp's devices) the
   * run's tensors may take: the CPU allocator's, or what the CUDA caching
   * allocator may reserve; 0 = none beyond the device's default. With a
   * cap, an out-of-memory error inside a step is recovered from: every
   * rank agrees, the step's gradients are dropped and the step is redone
   * from its start with each micro-batch run as two halves (half the
   * micro-batch, twice the accumulation: the same global batch and data
   * order), down to a micro-batch of 1 (train/train_oom.c). */
  int max_memory_mib;
  /* Testing the recovery: the cap applies only after this many optimizer
   * steps of the run (0 = from the start), and only on rank
   * max_memory_rank (-1 = every rank; the others still recover). */
  int64_t max_memory_from_step;
  int max_memory_rank;
  uint64_t seed;            /* model initialisation and data order */
  int threads;              /* CPU threads, 0 = the backend's current count */
  const char *threads_note; /* after the thread count in the header ("" = none) */
  int log_interval;         /* micro-batches between progress records (hooks), 0 = none */
  int max_steps;            /* optimizer steps in the whole run, 0 = epochs decide */
  int eval_batch;           /* batch size for evaluation */

  /* Distributed. */
  dt_pg *pg;                               /* borrowed; NULL or world 1 = one process */
  dt_train_mode mode;                      /* DDP (default) or DP */
  dt_device devices[DT_TRAIN_MAX_DEVICES]; /* mode DP: the replicas' devices */
  int n_devices;
  dt_comm_backend_choice comm_backend; /* how gradients are reduced (auto) */
  double comm_timeout;                 /* seconds per collective before the watchdog aborts (300) */
  float bucket_cap_mb;                 /* DDP bucket size after the first (25) */
  float first_bucket_mb;               /* DDP first bucket (0.125) */
  float split_bucket_mb;  /* DDP: split the last bucket's parameters above this (0 = off) */
  bool update_per_bucket; /* DDP: update each bucket as its reduction arrives (true) */
  bool allow_unused;      /* DDP: zero-fill gradients of unused parameters */
  int zero;               /* ZeRO stage 0-2 (dist/ddp.h); one process: none */
  dt_dtype grad_compress; /* the reducer's all-reduce in f32 (none), bf16 or f16 */
  const char *log_prefix; /* prepended to every log line ("" or "rank 1: ") */
  /* Under DDP every rank must have been started with the same settings:
   * this text and the data sets' descriptions are compared across the
   * ranks before the first step; a difference fails every rank naming it.
   * NULL = only the data sets. */
  const char *agreed_config;

  /* Checkpoints (train/train_checkpoint.h). */
  const char *run_dir;  /* NULL = runs/<model>-<data>-<time> if run_dir_default, else none */
  bool run_dir_default; /* always a run directory */
  int save_every;       /* optimizer steps between checkpoints, 0 = only at the end */
  int keep;             /* newest complete checkpoints kept, 0 = all */
  dt_train_resume resume;
  const char *resume_path; /* DT_TRAIN_RESUME_PATH: a checkpoint directory */
  /* Fine-tuning: a Hugging Face-layout folder (models/hf_export.h) or a
   * GGUF file (models/gguf_export.h) of the task's language model, loaded by every rank into the
   * model it builds, before the optimizer's first step. NULL = the task's initialisation. Not with
   * `resume` from a path, which has its own weights; with `resume` auto, a checkpoint of the run
   * directory wins when there is one. */
  const char *init_path;

  /* Language models, evaluations during training (train/train_lm.c). */
  int ctx;                  /* a sequence task's context T, 0 = the task's own */
  float beta2;              /* adamw's second-moment decay (0.999) */
  bool decay_matrices_only; /* weight decay on parameters of >= 2 dims only */
  int val_every;            /* optimizer steps between evaluations of val_batches, 0 = none */
  int val_batches;          /* eval batches those take, 0 = the whole split */
  dt_sample_config sample;  /* text tasks: samples at the end (and every sample.every steps) */

  bool quiet;           /* no header lines */
  dt_train_hooks hooks; /* what the run shows of itself, when to stop (train_hooks.h) */
} dt_train_config;

/* LeNet-5 on fashion-mnist under "data" (the task is looked up here), cpu,
 * sgd, cosine schedule (to 0 over the run), 1 epoch, batch 64, lr 0.05,
 * momentum 0.9, weight decay 0, no warm-up, accum 1, no clipping, the
 * device's default precision, seed 0, progress every 100 micro-batches,
 * evaluation batch 1000; no process group, mode DDP, comm backend auto,
 * comm timeout 300 s, buckets 0.125 MiB then 25 MiB updated as each
 * arrives, no compression; adamw beta2 0.999, no evaluations during
 * training, samples DT_SAMPLE_CONFIG_DEFAULT, no hooks. */
dt_train_config dt_train_config_default(void);

/* The task's training defaults (task->defaults; none: *cfg unchanged)
 * over *cfg: optimizer, lr, beta2, weight decay (and which parameters),
 * warm-up, min_lr, clip, batch, max_steps, eval_batch, log_interval,
 * val_every, val_batches. */
void dt_train_apply_task_defaults(dt_train_config *cfg, const dt_task *task);

/* Every check of a configuration that needs no device, data or peer:
 * ranges, combinations (dp needs devices, fp16's overflow test needs fp16, stochastic rounding a
 * 16-bit precision, tf32 a CUDA device, resume auto a run directory, a context only for sequence
 * tasks and within the task's). DT_ERR_INVALID_ARG naming the fields (`field`). dt_train_run calls
 * it first, and refuses at run time what depends on the process group (dp on more than one rank).
 */
dt_status dt_train_config_validate(const dt_train_config *cfg);

#ifdef __cplusplus
}
#endif
#endif
