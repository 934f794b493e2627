/* The trainer: the training loop behind `dtrain train`, for the command
 * line and for programs of their own (the configuration: train_config.h;
 * what a run shows of itself: train_hooks.h).
 *
 *   dt_train_config cfg = dt_train_config_default();
 *   cfg.epochs = 2;
 *   dt_train_result r;
 *   dt_status st = dt_train_run(&cfg, stdout, &r);   // message in dt_last_error()
 *
 * One run: the task `task` (models/tasks.h: the model, its input, its
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
 * GPU), as comm_backend says. A cuda device of index
 * DT_TRAIN_RANK_DEVICE is the rank's GPU from dt_comm_pick_device (local
 * rank within CUDA_VISIBLE_DEVICES; cuda:0 when one GPU is visible);
 * cuda:N is honoured as given. The first K-1
 * micro-batches of an accumulation group run in a no_sync scope. The test
 * accuracy is over the whole test set: each rank evaluates its shard (no
 * padding duplicates) and the sums are all-reduced. Every rank returns the
 * same result; the caller decides which rank logs.
 *
 * Data-parallel mode (mode DT_TRAIN_MODE_DP): one process, one replica per device of
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
#include "models/tasks.h"
#include "train/sample.h"
#include "train/train_config.h"
#include "train/train_hooks.h"

#ifdef __cplusplus
extern "C" {
#endif

/* This rank's device for `dev`: as given, except a cuda device of index
 * DT_TRAIN_RANK_DEVICE, which is dt_comm_pick_device(pg) (local rank within
 * CUDA_VISIBLE_DEVICES), or cuda:0 without a process group. Errors from
 * dt_comm_pick_device (no GPU, too few GPUs). */
dt_status dt_train_rank_device(dt_device dev, const dt_pg *pg, dt_device *out);

/* How train and bench connect a rank's replica to its peers. */
typedef struct dt_train_comm_options {
  dt_comm_backend_choice backend;
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

/* DDP buckets of the given sizes in MiB (at least 4 bytes each), the
 * split and the update per bucket, the ZeRO stage and unused-parameter
 * tolerance. */
dt_ddp_config dt_train_ddp_config(const dt_train_comm_options *o);

/* One DDP rank (world of pg > 1): the communicator that
 * dt_comm_create_for_device picks for the replica's device (mpi for cpu;
 * nccl or host-staged mpi for cuda) and the DDP reducer over it
 * (dt_replica_connect). Collective. */
dt_status dt_train_connect(dt_replica *r, dt_pg *pg, const dt_train_comm_options *o);

/* Sums vals[0..n) (1 <= n <= 8) over the ranks of `comm` in place, in f32
 * (counts up to 2^24 are exact), on the rank's device `dev` (an nccl
 * communicator reduces GPU memory only). Collective; NULL comm (one
 * process, dp's replicas): a no-op. */
dt_status dt_train_sum_over_ranks(dt_comm *comm, dt_device dev, double *vals, int n);

/* Caps what the tensors of dev may take at mib_cap MiB (0: a no-op): the
 * CPU allocator's cap (core/cpu.h), or what cuda:N's caching allocator may
 * reserve (cuda/cuda.h). `max_memory`; also for dtrain bench. */
dt_status dt_train_cap_device_memory(dt_device dev, int mib_cap);

/* Rank 0's `len` bytes of `text` to every rank of `comm` (the last byte
 * becomes NUL: a string). Collective; NULL comm: a no-op. */
dt_status dt_train_broadcast_text(dt_comm *comm, dt_device dev, char *text, size_t len);

/* `precision` (DT_PRECISION_DEVICE_DEFAULT: tf32 on CUDA, fp32 on the CPU)
 * for a rank on dev: step->autocast, and for fp16 step->scaler = scaler
 * (initialised with PyTorch's defaults; rank overflow_rank's gradients get
 * an Inf at optimizer step overflow_step, overflow_rank -1 = never); the
 * CUDA backend's TF32 setting for fp32 (off) and tf32 (on). tf32 on the
 * CPU, or an overflow test without fp16, is DT_ERR_INVALID_ARG. */
dt_status dt_train_precision_setup(dt_precision precision, int overflow_rank, int64_t overflow_step,
                                   dt_device dev, int rank, dt_step_config *step,
                                   dt_grad_scaler *scaler);
/* Stochastic rounding of the working copy after dt_train_precision_setup
 * (seeded by `seed`); it needs step->autocast bf16 or f16
 * (DT_ERR_INVALID_ARG otherwise). */
dt_status dt_train_rounding_setup(bool stochastic, uint64_t seed, dt_step_config *step);

/* The task's model from `seed`; with `recompute`, each transformer
 * block's activations recomputed in backward (dt_model_set_recompute: a
 * GPT-2 or Llama task, DT_ERR_INVALID_ARG naming `recompute` otherwise);
 * with `init_path`, the weights of that Hugging Face-layout folder
 * (dt_hf_import) or GGUF file (dt_gguf_import): errors name `init_path`
 * and the tensor at fault. */
dt_status dt_train_build_model(const dt_task *task, uint64_t seed, bool recompute,
                               const char *init_path, dt_module **out);

/* An optimizer: sgd (lr, momentum, weight_decay, nesterov) or adamw (lr,
 * weight_decay, beta2; beta1 and eps PyTorch's). */
typedef struct dt_optimizer_spec {
  dt_train_optimizer kind;
  float lr;
  float momentum;
  float weight_decay;
  bool nesterov;
  float beta2;              /* adamw */
  bool decay_matrices_only; /* dt_optim_decay_matrices_only */
} dt_optimizer_spec;

/* dt_replica_optim_fn over `spec` (a const dt_optimizer_spec *). */
dt_status dt_train_optimizer_create(void *spec, int replica, dt_param_arena *arena,
                                    dt_optimizer **out);

typedef struct dt_train_result {
  int epochs;              /* epochs run (the last one cut short by max_steps) */
  int64_t optimizer_steps; /* total optimizer steps taken */
  int64_t schedule_steps;  /* optimizer steps the LR schedule spans (= optimizer_steps) */
  int64_t last_step;       /* the run's position: optimizer steps done (skipped ones too) */
  double final_lr;         /* the schedule's learning rate after the last step */
  double train_loss;       /* mean micro-batch loss over the last epoch */
  double test_loss;        /* after the last epoch */
  double test_accuracy;    /* the task's metric (accuracy) after the last epoch, in [0, 1] */
  double result;  /* the value of the last line, <eval_split>_<metric or loss>= (test_accuracy=,
                     val_loss=) */
  double seconds; /* wall time of the whole run */
  /* should_stop's nonzero answer that stopped the run after saving: this
   * rank's own, else the one the ranks that asked agree on, else -1; 0 =
   * ran to the end. */
  int stop_code;
  char last_checkpoint[4096]; /* the last checkpoint saved, "" = none */
} dt_train_result;

/* Runs the configured job (dt_train_config_validate first). Header lines,
 * one evaluation line per epoch and a final `test_accuracy=0.XXXX` line go
 * to `log` (NULL = silent); progress goes to the hooks. Errors: a bad
 * configuration (DT_ERR_INVALID_ARG), an unavailable device (from
 * dt_backend_get), missing or corrupt data (DT_ERR_IO / DT_ERR_FORMAT), out
 * of memory, a non-finite loss (DT_ERR_STATE), each with a message. */
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
 * --val-batches; `workers` loader threads (>= 1) prepare the batches. */
dt_status dt_train_evaluate_first(const dt_task *task, dt_module *model, const dt_dataset *data,
                                  int64_t first, int batch, int workers, dt_device dev, int rank,
                                  int world, double *loss_sum, double *metric_sum, int64_t *count);

#ifdef __cplusplus
}
#endif
#endif
