/* The training loop behind `dtrain train`, as a library so that tests and
 * the distributed launcher reuse it.
 *
 *   dt_train_config cfg = dt_train_config_default();
 *   cfg.epochs = 2;
 *   dt_train_result r;
 *   dt_status st = dt_train_run(&cfg, stdout, &r);   // message in dt_last_error()
 *
 * One run: the task of `model` (models/tasks.h: the model, its input, its
 * data sets, loss and metric); a replica of the model on the device
 * (dist/replica.h: parameters in a flat arena, the optimizer, the LR
 * schedule), then per epoch: shuffled mini-batches from the background
 * loader through the training step (core/step.h: forward, the task's
 * loss, backward), and one optimizer update every `accum` micro-batches;
 * at the end of each epoch an evaluation on the test split in eval mode
 * without grad.
 *
 * Length: `epochs` passes over the training set, or `max_steps` optimizer
 * steps if that comes first (mid-epoch: the run stops there and evaluates);
 * the LR schedule (warm-up, then the decay) spans exactly the steps the run
 * takes, min(max_steps, epochs x steps per epoch).
 *
 * Distributed (DDP): with a process group of world W > 1 (cfg.pg), each rank
 * trains on its DistributedSampler shard with micro-batch `batch`, so the
 * global batch is W * batch; a DDP reducer (dist/ddp.h) averages the
 * gradients, overlapping backward, over the communicator that
 * dt_comm_create_for_device picks for the rank's device: mpi for cpu; for
 * cuda nccl, or the host-staged mpi backend (no NCCL, or ranks sharing a
 * GPU), as comm_backend / DT_COMM_BACKEND say. Device "cuda" without an
 * index is the rank's GPU from dt_comm_pick_device (local rank within
 * CUDA_VISIBLE_DEVICES; cuda:0 when one GPU is visible); "cuda:N" is
 * honoured as given. The first K-1
 * micro-batches of an accumulation group run in a no_sync scope. The test
 * accuracy is over the whole test set: each rank evaluates its shard (no
 * padding duplicates) and the sums are all-reduced. Every rank returns the
 * same result; the caller decides which rank logs.
 *
 * Data-parallel mode (mode "dp"): one process, one replica per device of
 * `devices` (dist/dp.h; cuda devices reduce over an NCCL clique, or host
 * memory with comm_backend mpi); each micro-batch of `batch` samples is
 * split across the replicas (with cuda devices the loader keeps batches in
 * host memory and each replica copies its own slice, so no GPU is special);
 * evaluation on replica 0.
 *
 * Gradient accumulation is PyTorch-style: `batch` is the micro-batch size;
 * each micro-batch's loss is scaled by 1/K, where K = `accum` (or the size
 * of the trailing group at the end of an epoch, which still steps), so a
 * step sees the mean gradient of its micro-batches.
 */
#ifndef DT_TRAIN_TRAIN_LOOP_H
#define DT_TRAIN_TRAIN_LOOP_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "core/data.h"
#include "core/module.h"
#include "core/optim.h"
#include "core/status.h"
#include "core/step.h"
#include "core/tensor.h"
#include "dist/comm.h"
#include "dist/process_group.h"
#include "dist/replica.h"
#include "launch/observe.h"
#include "train/sample.h"
#include "models/tasks.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct dt_train_config {
  const char *model;     /* the task: "lenet", "mlp" (models/tasks.h) */
  const char *data;      /* the task's data set ("fashion-mnist", "mnist"), a folder in data_dir */
  const char *data_dir;  /* folder holding the data sets ("data") */
  const char *device;    /* "cpu", "cpu:0", "cuda:0", or "cuda": this rank's GPU (below) */
  const char *optimizer; /* "sgd" or "adamw" */
  const char *schedule;  /* "constant", "cosine" or "step" (after the warm-up) */
  int epochs;
  int batch; /* micro-batch size */
  float lr;
  float momentum; /* SGD */
  float weight_decay;
  bool nesterov; /* SGD */
  int warmup;    /* optimizer steps of linear warm-up */
  int step_size; /* schedule "step": steps between decays (0 = one epoch) */
  float gamma;   /* schedule "step": decay factor */
  float min_lr;  /* schedule "cosine": floor */
  int accum;     /* micro-batches per optimizer step */
  float clip;    /* global gradient-norm cap, 0 = off */
  /* Mixed precision (core/amp.h): "fp32", "tf32", "bf16", "fp16"; NULL =
   * the device's default (tf32 on CUDA, fp32 on the CPU). */
  const char *precision;
  /* fp16's GradScaler test: "R:S" = rank R's gradients get an Inf at
   * optimizer step S (0-based); NULL = none. */
  const char *debug_overflow;
  /* bf16/fp16: round the optimizer's 16-bit working copy of the weights
   * stochastically (seeded by `seed`) instead of to nearest. */
  bool stochastic_rounding;
  uint64_t seed;    /* model initialisation and data order */
  int threads;      /* CPU threads, 0 = the backend's default */
  int log_interval; /* micro-batches between progress lines, 0 = none */
  int max_steps;    /* optimizer steps in the whole run, 0 = epochs decide */
  int eval_batch;   /* batch size for evaluation */

  /* Distributed. */
  dt_pg *pg;                /* borrowed; NULL or world 1 = one process */
  const char *mode;         /* "ddp" (one process per rank; the default) or "dp" */
  const char *devices;      /* mode dp: "cpu:0,cpu:1,..." or "cuda:0,cuda:1,..." */
  const char *comm_backend; /* "auto", "mpi", "nccl"; NULL = DT_COMM_BACKEND or auto */
  double comm_timeout;      /* seconds per collective before the watchdog aborts (300) */
  float bucket_cap_mb;      /* DDP bucket size after the first (25) */
  float first_bucket_mb;    /* DDP first bucket (1) */
  float split_bucket_mb;    /* DDP: split the last bucket's parameters above this (0 = off) */
  const char *bucket_update; /* DDP: "each" bucket as it arrives, or "last" (one update) */
  bool allow_unused;        /* DDP: zero-fill gradients of unused parameters */
  int zero;                 /* ZeRO stage 0-2 (dist/ddp.h); one process: none */
  const char *log_prefix;   /* prepended to every log line ("" or "rank 1: ") */
  /* --grad-compress "none", "bf16", "fp16": the reducer's 16-bit all-reduce (dist/ddp.h). */
  const char *grad_compress;
  /* Under DDP every rank must have been started with the same settings:
   * these lines ("--lr 0.05\n"..., dt_flags_format_values) and the data sets'
   * descriptions are compared across the ranks before the first step; a
   * difference fails every rank naming it. NULL = only the data sets. */
  const char *agreed_config;

  /* Checkpoints (train/train_checkpoint.h). */
  const char *run_dir;  /* NULL = runs/<model>-<data>-<time> if run_dir_default, else none */
  bool run_dir_default; /* `dtrain train`: always a run directory */
  int save_every;       /* optimizer steps between checkpoints, 0 = only at the end */
  int keep;             /* newest complete checkpoints kept, 0 = all */
  const char *resume;   /* NULL, "auto" (newest in run_dir, if any) or a checkpoint directory */

  /* Language models, evaluations during training (train/train_lm.c). */
  int ctx;                  /* a sequence task's context T, 0 = the task's own */
  float beta2;              /* adamw's second-moment decay (0.999) */
  bool decay_matrices_only; /* weight decay on parameters of >= 2 dims only */
  int val_every;            /* optimizer steps between evaluations of val_batches, 0 = none */
  int val_batches;          /* eval batches those take, 0 = the whole split */
  dt_sample_config sample;  /* text tasks: samples at the end (and every sample.every steps) */

  /* What the run shows of itself (launch/observe.h): --metrics, --trace,
   * --trace-steps, --quiet, --status-dir; log_interval comes from above. */
  dt_observe_config observe;
} dt_train_config;

#define DT_TRAIN_MAX_DEVICES 64

/* Parses a device list "cpu:0,cpu:1" (no spaces, no empty items, at most
 * DT_TRAIN_MAX_DEVICES) into devs; *n gets the count. DT_ERR_INVALID_ARG
 * naming the bad item. Duplicates and unavailable devices are left to
 * dt_dp_create. */
dt_status dt_train_parse_devices(const char *list, dt_device *devs, int cap, int *n);

/* This rank's device for --device `name`: as parsed, except "cuda" without
 * an index, which is dt_comm_pick_device(pg) (local rank within
 * CUDA_VISIBLE_DEVICES), or cuda:0 without a process group. Errors from
 * dt_device_parse / dt_comm_pick_device (no GPU, too few GPUs). */
dt_status dt_train_rank_device(const char *name, const dt_pg *pg, dt_device *out);

/* Applies DT_COMM_BACKEND to *cfg (dt_comm_config_from_env), then
 * `backend` ("auto", "mpi", "nccl"; NULL = keep), which wins: the
 * --comm-backend flag. DT_ERR_INVALID_ARG naming the bad value. */
dt_status dt_train_comm_config(const char *backend, dt_comm_config *cfg);

/* How train and bench connect a rank's replica to its peers. */
typedef struct dt_train_comm_options {
  const char *backend;    /* "auto", "mpi", "nccl"; NULL = DT_COMM_BACKEND or auto */
  double timeout;         /* seconds per collective before the watchdog aborts */
  float first_bucket_mb;  /* DDP first bucket */
  float bucket_cap_mb;    /* DDP buckets after the first */
  bool allow_unused;      /* DDP: zero-fill gradients of unused parameters */
  const char *agree_text; /* lines every rank must share (dt_dist_agree_text), NULL = none */
  int zero_stage;         /* ZeRO stage of the reducer (0, 1, 2) */
  dt_dtype grad_compress; /* f32 (none), bf16, f16 (dist/ddp.h) */
  float split_bucket_mb;  /* dt_ddp_config.split_bytes in MiB, 0 = off */
  bool update_per_bucket; /* dt_ddp_config.update_per_bucket */
} dt_train_comm_options;

/* --bucket-update: true for "each", false for "last" (and NULL). */
bool dt_train_update_per_bucket(const char *bucket_update);

/* DDP buckets of the given sizes in MiB (at least 4 bytes each), the
 * split and the update per bucket, the ZeRO stage and unused-parameter
 * tolerance. */
dt_ddp_config dt_train_ddp_config(const dt_train_comm_options *o);

/* One DDP rank (world of pg > 1): the communicator that
 * dt_comm_create_for_device picks for the replica's device (mpi for cpu;
 * nccl or host-staged mpi for cuda) and the DDP reducer over it
 * (dt_replica_connect). Collective. */
dt_status dt_train_connect(dt_replica *r, dt_pg *pg, const dt_train_comm_options *o);

/* --precision `precision` (NULL: tf32 on CUDA, fp32 on the CPU) for a
 * rank on dev: step->autocast, and for fp16 step->scaler = scaler
 * (initialised with PyTorch's defaults; `debug_overflow` "R:S" or NULL,
 * see dt_train_config); the CUDA backend's TF32 setting for fp32 (off) and
 * tf32 (on). tf32 on the CPU, a bad name or "R:S" is DT_ERR_INVALID_ARG. */
dt_status dt_train_precision_setup(const char *precision, const char *debug_overflow, dt_device dev,
                                   int rank, dt_step_config *step, dt_grad_scaler *scaler);
/* --stochastic-rounding after dt_train_precision_setup: the working copy's
 * rounding (seeded by `seed`); it needs step->autocast bf16 or f16
 * (DT_ERR_INVALID_ARG otherwise). */
dt_status dt_train_rounding_setup(bool stochastic, uint64_t seed, dt_step_config *step);
/* Parses --debug-overflow's "R:S" (R, S >= 0). */
dt_status dt_train_parse_debug_overflow(const char *s, int *rank, int64_t *step);

/* An optimizer by name: sgd (lr, momentum, weight_decay, nesterov) or
 * adamw (lr, weight_decay; betas and eps PyTorch's defaults). */
typedef struct dt_optimizer_spec {
  const char *name; /* "sgd" or "adamw" */
  float lr;
  float momentum;
  float weight_decay;
  bool nesterov;
  float beta2;              /* adamw */
  bool decay_matrices_only; /* dt_optim_decay_matrices_only */
} dt_optimizer_spec;

/* dt_replica_optim_fn over `spec` (a const dt_optimizer_spec *): an unknown
 * name is DT_ERR_INVALID_ARG. adamw's beta1 and eps are PyTorch's. */
dt_status dt_train_optimizer_create(void *spec, int replica, dt_param_arena *arena,
                                    dt_optimizer **out);

/* lenet on fashion-mnist under "data", cpu, sgd, cosine schedule (to 0 over the run),
 * 1 epoch, batch 64, lr 0.05, momentum 0.9, weight decay 0, no warm-up, accum 1, no
 * clipping, seed 0, log every 100 micro-batches, evaluation batch 1000; no process
 * group, mode ddp, comm backend from the environment (auto), comm timeout 300 s,
 * buckets 1 MiB then 25 MiB; adamw beta2 0.999, no evaluations during training,
 * samples DT_SAMPLE_CONFIG_DEFAULT. */
dt_train_config dt_train_config_default(void);

/* The task's training defaults (task->defaults; none: *cfg unchanged)
 * over *cfg: optimizer, lr, beta2, weight decay (and which parameters),
 * warm-up, min_lr, clip, batch, max_steps, eval_batch, log_interval,
 * val_every, val_batches. `dtrain train --model M` applies them before it
 * parses the flags, which then override them. */
void dt_train_apply_task_defaults(dt_train_config *cfg, const dt_task *task);

typedef struct dt_train_result {
  int epochs;              /* epochs run (the last one cut short by max_steps) */
  int64_t optimizer_steps; /* total optimizer steps taken */
  int64_t schedule_steps;  /* optimizer steps the LR schedule spans (= optimizer_steps) */
  double final_lr;         /* the schedule's learning rate after the last step */
  double train_loss;       /* mean micro-batch loss over the last epoch */
  double test_loss;        /* after the last epoch */
  double test_accuracy;    /* the task's metric (accuracy) after the last epoch, in [0, 1] */
  double result;  /* the value of the last line, <eval_split>_<metric or loss>= (test_accuracy=,
                     val_loss=) */
  double seconds; /* wall time of the whole run */
  int stopped_by_signal; /* SIGTERM/SIGUSR1 stopped the run after saving, 0 = ran to the end */
} dt_train_result;

/* Runs the configured job. Progress lines, one evaluation line per epoch and
 * a final `test_accuracy=0.XXXX` line go to `log` (NULL = silent). Errors:
 * bad config (DT_ERR_INVALID_ARG), unavailable device (from
 * dt_backend_get), missing or corrupt data (DT_ERR_IO / DT_ERR_FORMAT),
 * out of memory, a non-finite loss (DT_ERR_STATE), each with a message. */
dt_status dt_train_run(const dt_train_config *cfg, FILE *log, dt_train_result *out);

/* The task's mean loss and metric (accuracy; 0 for a task without one) of
 * `model` over all of `data`, in eval mode without grad (the training flag
 * is restored afterwards). */
dt_status dt_train_evaluate(const dt_task *task, dt_module *model, const dt_dataset *data,
                            int batch, dt_device dev, double *loss, double *metric);

/* Shard `rank` of `world` of `data` (samples rank, rank+world, ..., no
 * padding): sums of the task's loss and metric over the samples, and the
 * number of samples, for an all-reduce across ranks. */
dt_status dt_train_evaluate_shard(const dt_task *task, dt_module *model, const dt_dataset *data,
                                  int batch, dt_device dev, int rank, int world, double *loss_sum,
                                  double *metric_sum, int64_t *count);
/* The same over the first `first` samples of `data` only (all when
 * `first` is 0 or beyond its end): the fixed validation batches of
 * --val-batches. */
dt_status dt_train_evaluate_first(const dt_task *task, dt_module *model, const dt_dataset *data,
                                  int64_t first, int batch, dt_device dev, int rank, int world,
                                  double *loss_sum, double *metric_sum, int64_t *count);

#ifdef __cplusplus
}
#endif
#endif
