/* One training step: forward, the task's loss, backward, then clipping, the
 * learning rate and the optimizer update. `dtrain train`, `dtrain bench` and
 * every replica of the data-parallel mode (dist/dp.h) run this code and no
 * other; what differs between them is a parameter here, never a copy.
 *
 *   dt_step s = {model, arena, opt, DT_GRAD_SYNC_NONE, cfg};
 *   for (;;) {                                  // one optimizer step
 *     for (int k = 0; k < K; k++)               // K accumulated micro-batches
 *       DT_CHECK(dt_step_forward_backward(&s, x[k], y[k], 1.0f / K, k == K - 1, NULL));
 *     DT_CHECK(dt_step_update(&s));             // clip, lr, step, zero_grad
 *   }
 *
 * The loss comes from the caller (the task, models/tasks.h). Gradient
 * reduction enters through `sync` hooks: the step never names the DDP
 * reducer and the reducer never sees the loss (dist/ddp.h gives the hooks:
 * dt_ddp_grad_sync).
 */
#ifndef DT_CORE_STEP_H
#define DT_CORE_STEP_H

#include <stdbool.h>

#include "core/amp.h"
#include "core/module.h"
#include "core/ops.h"
#include "core/optim.h"
#include "core/status.h"
#include "core/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* A task's loss: the model's output and the targets -> *loss, a new 0-dim
 * tensor for DT_REDUCTION_MEAN (mean over the samples; the step uses it) and
 * DT_REDUCTION_SUM (the evaluation sums it). Called from the replica
 * threads of the data-parallel mode at once: no mutable state. */
typedef dt_status (*dt_loss_fn)(dt_tensor *output, dt_tensor *target, dt_reduction reduction,
                                dt_tensor **loss);

/* Gradient reduction hooks (DDP: dist/ddp.h, dt_ddp_grad_sync). ctx NULL =
 * no reduction, and no hook is called. */
typedef struct dt_grad_sync {
  void *ctx;
  dt_status (*no_sync_begin)(void *ctx); /* backward only accumulates locally */
  dt_status (*no_sync_end)(void *ctx);
  dt_status (*finish_backward)(void *ctx); /* waits for the reduced gradients */
  /* Sums values[0..n) over the ranks in place (collective): the
   * GradScaler's found-inf flag, so that every rank skips a step when any
   * rank's gradients overflowed, whatever each rank holds. */
  dt_status (*sum_over_ranks)(void *ctx, double *values, int n);
  /* Optional (NULL = not offered): finish_backward that also updates each
   * piece of the gradients with `opt` as soon as it is reduced, beginning
   * a step of `opt` that dt_step_update ends (dt_ddp_finish_backward_update:
   * the optimizer fused with the buckets' arrival). */
  dt_status (*finish_backward_update)(void *ctx, dt_optimizer *opt);
} dt_grad_sync;
#define DT_GRAD_SYNC_NONE ((dt_grad_sync){NULL, NULL, NULL, NULL, NULL, NULL})

/* The phase a step has just ended, for timing (dtrain bench). */
typedef enum dt_step_phase {
  DT_STEP_PHASE_FORWARD = 0, /* forward and loss */
  DT_STEP_PHASE_BACKWARD,    /* backward and the gradient reduction */
  DT_STEP_PHASE_UPDATE,      /* clipping, optimizer step, zero_grad */
} dt_step_phase;
typedef dt_status (*dt_step_phase_fn)(void *user, dt_step_phase ended);

/* What the caller may ask the update to measure (dtrain's metrics). */
typedef struct dt_step_stats {
  bool want_grad_norm; /* set before dt_step_update: measure the gradient norm */
  double grad_norm;    /* the global norm before clipping, of the last update that measured it
                          (with clip > 0 every update measures it) */
} dt_step_stats;

typedef struct dt_step_config {
  dt_loss_fn loss;                /* required */
  float clip;                     /* global gradient-norm cap, 0 = off */
  const dt_lr_schedule *schedule; /* borrowed; NULL = the optimizer's lr is left alone */
  dt_step_phase_fn on_phase;      /* NULL = none; a timer synchronises the device here */
  void *on_phase_user;
  dt_step_stats *stats; /* borrowed; NULL = nothing measured beyond what clipping needs */
  /* Mixed precision (core/amp.h): the forward and the loss run under
   * autocast to this dtype (bf16, f16; f32 = off). */
  dt_dtype autocast;
  /* Borrowed; NULL = none. fp16's loss scaling: the backward runs on loss x
   * scale, the update unscales, and skips a step with Inf/NaN gradients
   * (the optimizer's step count and so the LR schedule stay). One scaler
   * per step: the replicas of the data-parallel mode cannot share one. */
  dt_grad_scaler *scaler;
  /* Under autocast the optimizer keeps a 16-bit working copy of the weights
   * for the LOW ops (dt_optim_use_working_copy), rounded to nearest even,
   * or stochastically from this seed (the same on every rank). */
  bool stochastic_rounding;
  uint64_t rounding_seed;
} dt_step_config;
#define DT_STEP_CONFIG_DEFAULT \
  ((dt_step_config){NULL, 0.0f, NULL, NULL, NULL, NULL, DT_DTYPE_F32, NULL, false, 0})

/* What a step runs on: borrowed pointers, a value (nothing to free). The
 * arena is the model's (dt_param_arena_create), the optimizer over it. */
typedef struct dt_step {
  dt_module *model;
  dt_param_arena *arena;
  dt_optimizer *opt;
  dt_grad_sync sync;
  dt_step_config cfg;
} dt_step;

/* One micro-batch: output = dt_module_call(model, input), loss =
 * cfg.loss(output, target, mean), backward of loss * loss_scale (1/K for K
 * accumulated micro-batches; no scaling op when 1). With gradient sync
 * hooks: sync false runs in a no_sync scope (gradients accumulate
 * locally); sync true finishes the reduction, also after an error, so that
 * the peers are never left waiting for this replica's buckets, and must be
 * followed by dt_step_update (it is the last micro-batch of the step):
 * when the sync offers finish_backward_update and the update needs no
 * global view of the gradients (no clip, no scaler, an unsharded
 * optimizer), the optimizer's update runs there, piece by piece as the
 * gradients are reduced, with this step's learning rate, and
 * dt_step_update only ends it. *loss (NULL
 * = not wanted) receives the unscaled loss, detached (new reference; read
 * it when convenient: reading waits for the device). */
dt_status dt_step_forward_backward(const dt_step *s, dt_tensor *input, dt_tensor *target,
                                   float loss_scale, bool sync, dt_tensor **loss);

/* The update, after the last micro-batch of an optimizer step: with a
 * scaler, the unscale and the Inf/NaN check (a skipped step ends here,
 * after zero_grad); clipping
 * (cfg.clip, on the reduced gradients), the learning rate of this step from
 * cfg.schedule, dt_optim_step, dt_optim_zero_grad; then, with a schedule,
 * the learning rate of the next step (as PyTorch's scheduler.step(): after
 * the last step of a schedule that spans the run the optimizer's lr is the
 * schedule's final value). */
dt_status dt_step_update(const dt_step *s);

#ifdef __cplusplus
}
#endif
#endif
