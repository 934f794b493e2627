/* The memory and speed plan of a run (DESIGN.md, Plan): per-rank memory,
 * the micro-batch that fits, the seed's batch rule and a step time from a
 * roofline, for the CPU or a GPU that is not here (docs/plan.md).
 *
 * Memory comes from the model's real graph: dt_plan_probe runs three
 * training steps of the model on the CPU at two micro-batches (a language
 * model at 1 and 2 and a context of at most DT_PLAN_PROBE_CTX tokens, other
 * models at DT_PLAN_PROBE_BATCH and twice that) and
 * reads the allocator's statistics per phase: what stays between steps
 * (weights, gradients, optimizer state, the 16-bit working copy), the
 * forward + backward peak above it (activations: a fixed part and a part
 * per sample, or per token) and the update's peak. dt_plan_compute scales
 * that to the plan's micro-batch, context, ZeRO stage and device.
 *
 *   dt_plan_probe_result probe;
 *   DT_CHECK(dt_plan_probe(task, precision, false, &spec, &probe));
 *   dt_plan_config cfg = DT_PLAN_CONFIG_DEFAULT;
 *   DT_CHECK(dt_plan_device_get(DT_PLAN_DEVICE_H100, NULL, &cfg.device));
 *   cfg.task = task; cfg.precision = precision; cfg.micro_batch = 16;
 *   dt_plan_result plan;
 *   DT_CHECK(dt_plan_compute(&cfg, &probe, &plan));
 */
#ifndef DT_TRAIN_PLAN_H
#define DT_TRAIN_PLAN_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "core/amp.h"
#include "core/status.h"
#include "core/step.h"
#include "dist/replica.h"
#include "models/tasks.h"
#include "train/mfu.h"
#include "train/train_loop.h"

#ifdef __cplusplus
extern "C" {
#endif

#define DT_PLAN_PROBE_CTX 64   /* the longest context the probe runs */
#define DT_PLAN_PROBE_BATCH 16 /* and its first micro-batch of a model without one */
#define DT_PLAN_PROBE_AGAIN 8  /* the most timing steps of each probe size */

/* A device kind and the links between devices of that kind. */
typedef struct dt_plan_device {
  char name[32];
  bool cpu;                      /* this machine: cap and roof measured */
  double memory;                 /* bytes per device */
  double f32_flops, tf32_flops;  /* dense peaks, FLOP/s */
  double bf16_flops;             /* and fp16 */
  double mem_bw;                 /* bytes/s */
  double nvlink_bw;              /* bytes/s per device, within a node (bus bandwidth) */
  double net_bw;                 /* bytes/s per device, between nodes */
  double latency;                /* seconds per hop of a collective */
  double matmul_eff, memory_eff; /* achievable fractions of the peaks */
  double workspace;              /* bytes: library workspaces (cuBLAS) */
  double alloc_overhead;         /* fraction of the activations: the caching allocator's rounding */
  const char *source;            /* where the figures come from */
  double act_bw;                 /* bytes/s of the activations' traffic, 0 = mem_bw */
  char peak_source[96];          /* the CPU's roof: which (train/mfu.h's dt_peak_flops) */
} dt_plan_device;

typedef enum dt_plan_device_kind {
  DT_PLAN_DEVICE_CPU = 0, /* this machine */
  DT_PLAN_DEVICE_A100,    /* the rows of the table in plan.c, in this order */
  DT_PLAN_DEVICE_H100,
  DT_PLAN_DEVICE_H200,
} dt_plan_device_kind;

/* cpu (this machine: the CPU allocator's cap, the sgemm roof of
 * train/mfu.h kept in *roof (NULL = measured anew) and a measured copy
 * bandwidth), a100, h100, h200 (data-sheet figures, docs/plan.md). */
dt_status dt_plan_device_get(dt_plan_device_kind kind, dt_mfu_cache *roof, dt_plan_device *out);

/* What dt_plan_probe measured, in bytes, for one rank without peers. */
#define DT_PLAN_Z2_LINES 16
typedef struct dt_plan_z2_line {
  double fixed, per_unit, comm;
} dt_plan_z2_line;

typedef struct dt_plan_probe_result {
  int64_t parameters;
  double resident;         /* allocated between steps (weights, grads, optimizer state, copies) */
  double gradients;        /* of which the flat gradients */
  double optimizer_state;  /* of which the optimizer's state */
  double act_fixed;        /* forward + backward peak above `resident`: fixed part */
  double act_per_unit;     /* and per sample (per token for a language model) */
  double traffic_per_unit; /* the activations written per unit (recompute: those it drops too) */
  double update_peak;      /* the update's peak above `resident` */
  double units_per_sample; /* 1, or the context for a language model */
  /* The probe's forward + backward at its two micro-batches: the wall
   * seconds on this thread count (the median of 3 to 9 steps each) and the
   * FLOPs (the task's count at the probe's context; 0 = no count), which
   * calibrate the CPU's compute (dt_plan_compute). */
  double fb_seconds[2], fb_flops[2];
  double update_seconds; /* the median of the probe's updates (the optimizer step) */
  /* the steps' spread about their median, relative (a normal's sigma from
   * the mean absolute deviation): a synchronous step of R ranks waits for
   * the slowest of R such draws (dt_plan_compute) */
  double step_cv;
  /* ZeRO 2 (DT_DDP_CONFIG_DEFAULT's buckets), [0] one micro-batch a step,
   * [1] accumulating: the forward + backward peak above `resident` at u
   * units is the highest of the lines fixed + per_unit x u + comm, comm
   * the gradient memory outside the shard at that moment (bucket buffers,
   * gradients made whole: a cut parameter's, or all while accumulating;
   * train/plan_zero2.c) */
  dt_plan_z2_line z2[2][DT_PLAN_Z2_LINES];
  int z2_lines[2];
} dt_plan_probe_result;

/* Measures `task` (its context as set, dt_task_with_context) at
 * `precision` (DT_PRECISION_DEVICE_DEFAULT and tf32 run as fp32) with the
 * optimizer `spec`, with `recompute` (dt_train_build_model), on the CPU. */
dt_status dt_plan_probe(const dt_task *task, dt_precision precision, bool recompute,
                        const dt_optimizer_spec *spec, dt_plan_probe_result *out);

typedef struct dt_plan_config {
  const dt_task *task;
  dt_precision precision;
  dt_plan_device device;
  int zero;             /* 0, 1, 2 */
  int gpus_per_node;    /* ranks per node */
  int nodes;            /* nodes */
  int micro_batch;      /* per rank; 0 = the largest that fits */
  int64_t global_batch; /* samples per optimizer step, 0 = micro_batch x ranks */
  int64_t data_samples; /* the training set's size for the seed's rule, 0 = unknown */
  float bucket_cap_mb;  /* DDP buckets */
  bool adamw;           /* else sgd with momentum (the optimizer traffic) */
  bool recompute;       /* a second forward per block in backward (the probe's model too) */
} dt_plan_config;

#define DT_PLAN_CONFIG_DEFAULT \
  ((dt_plan_config){           \
      NULL, DT_PRECISION_DEVICE_DEFAULT, {{0}}, 0, 1, 1, 0, 0, 0, 25.0f, false, false})

/* Per-rank memory, bytes. */
typedef struct dt_plan_memory {
  double weights;     /* f32 parameters (the master weights under bf16/fp16) */
  double copies;      /* 16-bit working copy and buffers */
  double gradients;   /* kept between steps (stage 2: this rank's shard) */
  double optimizer;   /* optimizer state (stage >= 1: this rank's shard) */
  double activations; /* forward + backward peak of one micro-batch */
  double workspace;   /* library workspaces */
  double comm;        /* communication buffers (stage 2's buckets in flight) */
  double overhead;    /* the allocator's rounding */
  double total;
} dt_plan_memory;

typedef struct dt_plan_result {
  dt_plan_memory memory;
  double per_sample;   /* activation bytes per sample */
  double fixed;        /* bytes at micro-batch 0 */
  int max_micro_batch; /* the largest that fits the device, 0 = none */
  int rule_batch;      /* min(free / per_sample x 0.9, samples / 10) */
  int micro_batch, accumulation, ranks;
  int64_t global_batch;
  double flops_per_step; /* training FLOPs of one optimizer step, all ranks */
  double peak_flops;     /* per device at the precision */
  double matmul_eff;     /* the fraction of the peak compute_s assumes: the device's, or on
                            the CPU the one the model's probe step reached (traffic in it) */
  double compute_s;      /* the FLOPs of one micro-batch at peak x matmul_eff */
  double memory_s;       /* activation traffic of one micro-batch at the bandwidth (the CPU's
                            calibrated compute holds it: 0 there) */
  double optimizer_s;    /* the update's traffic */
  double comm_s;         /* gradient collectives of one step */
  double comm_exposed_s; /* the part of them backward does not hide */
  double straggler_s;    /* CPU, R > 1 ranks: the wait for the slowest rank's forward + backward
                            (their spread, the probe's step_cv, as R normal draws) */
  double step_s;
  double samples_per_s, tokens_per_s, mfu;
} dt_plan_result;

/* The plan of `cfg` from `probe` (dt_plan_probe of cfg->task). Bad values
 * (a global batch the ranks do not divide, a micro-batch that does not
 * fit is not an error: max_micro_batch says so): DT_ERR_INVALID_ARG
 * naming the setting. */
dt_status dt_plan_compute(const dt_plan_config *cfg, const dt_plan_probe_result *probe,
                          dt_plan_result *out);

/* The CPU's figures that depend on the plan's shapes, set in
 * cfg->device after a first dt_plan_compute (r) on the probe p (then
 * compute again): under bf16/fp16, and for a language model at fp32, the
 * linear roof of train/mfu.h (dt_mfu_cpu_linear_roof, kept in *roof) at
 * the micro-batch's rows (its tokens or samples), and act_bw, the copy bandwidth at the size of the
 * micro-batch's activations (at most 64 MiB): traffic that fits the caches
 * moves at their speed. Nothing for a GPU. */
dt_status dt_plan_cpu_shapes(dt_plan_config *cfg, const dt_plan_probe_result *p,
                             const dt_plan_result *r, dt_mfu_cache *roof);

/* `batch auto`: the micro-batch from the seed's rule with the plan's
 * memory per sample against the memory of the run's device (the CPU
 * allocator's cap, a GPU's capacity), confirmed by a trial training step
 * on that device at that micro-batch (halved while it runs out of memory);
 * with a global batch, the largest micro-batch that divides a rank's
 * share and the accumulation that makes it up. */
typedef struct dt_plan_auto_config {
  const dt_task *task; /* with its context */
  dt_device device;    /* this rank's */
  dt_precision precision;
  bool recompute;
  dt_optimizer_spec optimizer;
  int zero, ranks;
  int64_t data_samples; /* the training set's size, 0 = unknown */
  int64_t global_batch; /* samples per optimizer step over the ranks, 0 = accumulation 1 */
  int overshoot;        /* tests: the first trial is this multiple of the rule (0, 1: the rule) */
} dt_plan_auto_config;

typedef struct dt_plan_auto {
  int micro_batch, accumulation;
  int rule_batch; /* the seed's rule, before the trial */
  int halvings;   /* trial steps that ran out of memory */
  double memory;  /* bytes the device offers */
  double fixed;   /* bytes at micro-batch 0 */
  double per_sample;
} dt_plan_auto;

/* Errors: a global batch the ranks do not divide (DT_ERR_INVALID_ARG
 * naming `global_batch`); micro-batch 1 out of memory (DT_ERR_OOM with the
 * plan's breakdown and the levers); the probe's and the trial's. */
dt_status dt_plan_auto_batch(const dt_plan_auto_config *a, dt_plan_auto *out);

/* The trainer's `batch_auto` (train/train_config.h): dt_plan_auto_batch
 * over the run's task, data set (its training split's size), device
 * (as capped: dt_train_run puts a `max_memory` in force from the start
 * before), precision, optimizer, ZeRO stage and ranks; sets c->batch (and
 * c->accum from c->global_batch) and logs one line to `log` (NULL = none).
 * Under DDP every rank takes the smallest of the ranks' micro-batches
 * (their memory may differ); collective over a host communicator of
 * c->pg, and a rank whose plan failed fails every rank
 * (DT_ERR_DIST_MISMATCH on the others). */
dt_status dt_train_resolve_batch_auto(dt_train_config *c, FILE *log);

/* The load of the other ranks of a CPU node while the probe measures
 * (dtrain plan starts this in a process per other rank): the probe's own
 * steps (its micro-batches, alternating) on a replica of the task's model,
 * for as long as go_on(user, steps done) says true. */
dt_status dt_plan_probe_load(const dt_task *task, dt_precision precision, bool recompute,
                             const dt_optimizer_spec *spec, bool (*go_on)(void *user, int steps),
                             void *user);

/* A replica of the task's model (seed 1) on `dev` with bench's and
 * train's step (the task's loss and clipping, `precision` through
 * dt_train_precision_setup with *scaler, the phase hook on_phase, NULL =
 * none) and the optimizer `spec` (borrowed for the replica's life). */
dt_status dt_plan_replica_create(const dt_task *task, dt_device dev, dt_precision precision,
                                 bool recompute, const dt_optimizer_spec *spec,
                                 dt_step_phase_fn on_phase, void *on_phase_user,
                                 dt_grad_scaler *scaler, dt_replica **out);
/* One training step of `rep` on a synthetic batch (`ctx` positions for a
 * sequence task, 0 = the task's). */
dt_status dt_plan_step(const dt_task *task, const dt_replica *rep, int batch, int64_t ctx);

/* A synthetic batch of the task's input: f32 N(0,1) or ids in [0,
 * input_range), and class (or next-token) targets, `ctx` positions for a
 * sequence task (0 = the task's). Used by bench and the probe. */
dt_status dt_train_synthetic_batch(const dt_task *task, int batch, int64_t ctx, uint64_t seed,
                                   dt_device dev, dt_tensor **x, dt_tensor **y);

/* The optimizer bench and the plan use: adamw (the task's AdamW settings
 * when it has training defaults, PyTorch's otherwise) or sgd (lr 0.01,
 * momentum 0.9). */
dt_optimizer_spec dt_train_bench_optimizer(const dt_task *task, bool adamw);

#ifdef __cplusplus
}
#endif
#endif
