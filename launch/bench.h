/* `dtrain bench`: training-step throughput on synthetic data.
 *
 * Builds the model of the task `model` (models/tasks.h), one fixed batch
 * of random inputs of the task's input shape and dtype (N(0,1) for float
 * inputs) and random class ids on the device, runs `warmup` untimed
 * training steps, then times `steps` training steps (core/step.h: forward,
 * the task's loss, backward, optimizer update and zero_grad), the very
 * step `dtrain train` runs. The per-phase times come from device
 * synchronisations at the step's phase boundaries (free on the CPU).
 * tools/bench_torch.py runs the same benchmark in PyTorch.
 *
 * Under a launcher (cfg.pg of world W > 1) every rank runs the benchmark
 * with per-rank batch `batch` and a DDP reducer: the backward phase then
 * includes waiting for the gradient all-reduce (dt_ddp_finish_backward),
 * samples/s counts all ranks (W * batch per step), and the reducer's
 * timeline gives the communication figures: time in all-reduce per step,
 * the part of it that ran while backward was still computing (hidden by
 * the overlap), the part the step waited for (exposed), and the bytes
 * each step hands the all-reduces (halved by --grad-compress). Weak scaling:
 * compare W ranks x T threads with 1 rank x T threads at the same batch.
 */
#ifndef DT_LAUNCH_BENCH_H
#define DT_LAUNCH_BENCH_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "core/backend.h"
#include "core/status.h"
#include "dist/process_group.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct dt_bench_config {
  const char *model;     /* a task (models/tasks.h): "mlp", "lenet" */
  const char *optimizer; /* "sgd" (lr 0.01, momentum 0.9) or "adamw" (lr 1e-3) */
  const char *device;    /* "cpu", "cuda:0", "cuda" (the rank's GPU: dt_train_rank_device) */
  int batch;             /* per rank; 0 = auto (train/plan.h, dt_plan_auto_batch) */
  int steps;             /* timed steps */
  int warmup;            /* untimed steps before */
  int threads;           /* CPU threads, 0 = default */
  uint64_t seed;
  /* Distributed (world > 1): DDP over the communicator that
   * dt_comm_create_for_device picks for the device (mpi; nccl or
   * host-staged mpi for cuda). */
  dt_pg *pg;                /* borrowed; NULL or world 1 = one process */
  const char *comm_backend; /* "auto", "mpi", "nccl"; NULL = DT_COMM_BACKEND or auto */
  double comm_timeout;      /* seconds (300) */
  float bucket_cap_mb;      /* 25 */
  float first_bucket_mb;    /* 0.125 */
  int zero;                 /* ZeRO stage 0, 1, 2 (dist/ddp.h) */
  int ctx;                  /* sequence tasks: the context T, 0 = the task's */
  const char *precision;    /* "fp32", "tf32", "bf16", "fp16"; NULL = tf32 on CUDA, else fp32 */
  /* "none", "bf16", "fp16": the reducer's 16-bit all-reduce (dist/ddp.h) */
  const char *grad_compress;
  bool stochastic_rounding;  /* of the 16-bit working copy of the weights (bf16, fp16) */
  float split_bucket_mb;     /* DDP: split the last bucket's parameters above this (0 = off) */
  const char *bucket_update; /* DDP: "each" bucket as it arrives, or "last" (one update) */
  bool channels_last;        /* resnet*: NHWC activations */
  bool recompute;            /* each transformer block's activations recomputed in backward */
  int max_memory_mib; /* the device's memory cap in MiB (dt_train_cap_device_memory), 0 = none */
  int image_size, channels; /* the ResNets: the synthetic images' size, channels (0: the model's) */
} dt_bench_config;

/* mlp, sgd, cpu, batch 128, 100 steps, 10 warm-up, default threads, seed 0,
 * no process group; DDP: comm backend from the environment, timeout 300 s,
 * buckets 128 KiB then 25 MiB, zero stage 0; the task's context; the
 * device's default precision; no gradient compression, rounding to nearest;
 * no split buckets, the update per bucket (--bucket-update each); no
 * recomputation. */
#define DT_BENCH_CONFIG_DEFAULT                                                                 \
  ((dt_bench_config){"mlp", "sgd",  "cpu", 128, 100,  10,     0,     0,    NULL,   NULL, 300.0, \
                     25.0f, 0.125f, 0,     0,   NULL, "none", false, 0.0f, "each", false})

#define DT_BENCH_MAX_BUCKETS 32

typedef struct dt_bench_result {
  dt_device device; /* the device rank 0 ran on */
  int batch;        /* per rank: the config's, or auto's (train/plan.h, dt_plan_auto_batch) */
  int auto_rule, auto_halvings;
  double auto_per_sample_mib, auto_free_mib;
  int64_t parameters;
  int input_shape[3]; /* an image model's (channels, height, width), else zeros */
  double seconds;     /* timed steps only */
  double steps_per_s;
  double samples_per_s;
  double ms_per_step;
  double forward_ms;   /* per step: forward + loss */
  double backward_ms;  /* per step */
  double optimizer_ms; /* per step: zero_grad + update */
  double peak_mib;     /* peak device memory during the timed steps */
  double final_loss;
  /* Sequence tasks: samples_per_s x T. Tasks with flops_per_sample: the
   * model FLOPs utilisation against peak_flops per device (train/mfu.h;
   * -1 when the run beat the measured CPU roof, dt_mfu_of). */
  double tokens_per_s;
  double flops_per_sample, peak_flops, mfu;
  char peak_source[96];
  /* DDP (world > 1), per timed step, means over the timed steps. */
  int world;
  int buckets;
  double allreduce_ms;  /* all-reduce running on the communication thread */
  double overlapped_ms; /* of which while backward was still computing */
  double exposed_ms;    /* backward end to all buckets reduced: the step waited */
  double update_ms;     /* the optimizer's update per bucket inside the gradient sync */
  /* Per bucket b < DT_BENCH_MAX_BUCKETS (in launch order): its bytes, its
   * all-reduce's time and the part of it before backward ended. */
  size_t bucket_bytes[DT_BENCH_MAX_BUCKETS];
  double bucket_allreduce_ms[DT_BENCH_MAX_BUCKETS], bucket_hidden_ms[DT_BENCH_MAX_BUCKETS];
  double grad_mib; /* the model's f32 gradients, in MiB */
  /* Bytes handed to the all-reduces (ZeRO: reduce-scatters) per step: the
   * buckets' f32 bytes, halved by --grad-compress. */
  size_t allreduce_bytes;
  char comm[32]; /* "mpi", "nccl", "mpi (host-staged)" */
  /* Per rank (dt_replica_memory_use): ZeRO shards these; in flight:
   * stage 2's bucket buffers at their peak. */
  double optimizer_state_mib;
  double gradient_mem_mib;
  double in_flight_mib;
} dt_bench_result;

dt_status dt_bench_run(const dt_bench_config *cfg, dt_bench_result *out);

/* The `dtrain bench` subcommand: argv holds the arguments after "bench";
 * pg is the process group (world 1 without a launcher); flag errors go to
 * `err`. Rank 0 prints the results. Returns the process exit status (0; 1
 * on a runtime error, whose message is left in dt_last_error() for the
 * caller to print; 2 on bad flags). */
int dt_cli_bench(int argc, char **argv, dt_pg *pg, FILE *err);

/* `bench --loader`: whether argv asks for it (before any `--`), and the
 * loader benchmark itself (launch/bench_loader.c; same exit statuses). */
bool dt_cli_bench_wants_loader(int argc, char **argv);
int dt_cli_bench_loader(int argc, char **argv, FILE *err);

#ifdef __cplusplus
}
#endif
#endif
