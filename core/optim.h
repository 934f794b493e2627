/* Optimizers over a flat parameter arena (core/module.h), LR schedules and
 * global-norm gradient clipping. One fused backend kernel per step. */
#ifndef DT_CORE_OPTIM_H
#define DT_CORE_OPTIM_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "core/module.h"
#include "core/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct dt_optimizer dt_optimizer;

typedef struct dt_sgd_config {
  float lr;
  float momentum;
  float dampening;
  float weight_decay;
  int nesterov;
} dt_sgd_config;
#define DT_SGD_CONFIG_DEFAULT ((dt_sgd_config){0.01f, 0.0f, 0.0f, 0.0f, 0})

typedef struct dt_adamw_config {
  float lr;
  float beta1, beta2;
  float eps;
  float weight_decay;
} dt_adamw_config;
#define DT_ADAMW_CONFIG_DEFAULT ((dt_adamw_config){1e-3f, 0.9f, 0.999f, 1e-8f, 0.01f})

/* The optimizer keeps a pointer to the arena (which must outlive it).
 * Invalid hyper-parameters (lr < 0, momentum < 0, nesterov without
 * momentum or with dampening, betas outside [0,1), eps or weight_decay < 0,
 * any non-finite value) are DT_ERR_INVALID_ARG. State buffers live on the
 * arena's device and are allocated (zeroed) at the first step or
 * dt_optim_state_set, so that sharding (dt_optim_set_shard) never holds the
 * whole state, not even at start-up. */
dt_status dt_optim_sgd_create(dt_param_arena *arena, const dt_sgd_config *cfg, dt_optimizer **out);
dt_status dt_optim_adamw_create(dt_param_arena *arena, const dt_adamw_config *cfg,
                                dt_optimizer **out);
void dt_optim_destroy(dt_optimizer *o);

/* One update with the gradients in the arena's flat gradient buffer: one
 * fused backend kernel, following torch.optim.SGD / torch.optim.AdamW
 * (AdamW's bias correction uses t = step count + 1); sharded, one per
 * segment with the shard's gradients, and its hooks (below). An lr set
 * through dt_optim_set_lr that is negative or non-finite fails here with
 * DT_ERR_INVALID_ARG. */
dt_status dt_optim_step(dt_optimizer *o);
dt_status dt_optim_zero_grad(dt_optimizer *o);

/* The same update in pieces, each run as soon as its gradients are final
 * (the DDP reducer updates each bucket as its all-reduce completes,
 * dist/ddp.h): dt_optim_step_begin (the checks dt_optim_step makes, and
 * the state buffers), then dt_optim_step_range over ranges of the arena's
 * flat space that together cover it once (any order, no overlap), then
 * dt_optim_step_end. The kernels are elementwise, so the parameters, the
 * state and the working copy end bit for bit as after dt_optim_step; the
 * learning rate must not change in between. Unsharded optimizers only
 * (begin: DT_ERR_STATE when sharded or already begun); a range outside
 * the arena or beyond its size in all is DT_ERR_INVALID_ARG. _end with
 * st != DT_OK (or with ranges that did not cover the arena: DT_ERR_STATE)
 * abandons the step: the step count stays, the working copy is rebuilt
 * from the masters at its next use, and it returns the error. */
dt_status dt_optim_step_begin(dt_optimizer *o);
dt_status dt_optim_step_range(dt_optimizer *o, int64_t offset, int64_t numel);
dt_status dt_optim_step_end(dt_optimizer *o, dt_status st);
/* Between dt_optim_step_begin and _end. */
bool dt_optim_step_begun(const dt_optimizer *o);
/* Weight decay per parameter (parameter groups, as PyTorch's): only the
 * arena's parameters i with decay[i] != 0 are decayed, by the configured
 * weight_decay; the others get none (GPT-2 decays its 2-D weights only:
 * dt_optim_decay_matrices_only). n must be dt_param_arena_count
 * (DT_ERR_INVALID_ARG otherwise); NULL restores decay for all. The update
 * stays the fused kernel, run once per run of consecutive parameters that
 * are alike within each segment (one run when all are). */
dt_status dt_optim_set_decay_mask(dt_optimizer *o, const uint8_t *decay, int n);
/* The mask of the parameters with at least 2 dims (weights, embeddings;
 * not biases or norm gains). */
dt_status dt_optim_decay_matrices_only(dt_optimizer *o);

void dt_optim_set_lr(dt_optimizer *o, float lr);
float dt_optim_lr(const dt_optimizer *o);
int64_t dt_optim_step_count(const dt_optimizer *o);
const char *dt_optim_name(const dt_optimizer *o); /* "sgd", "adamw" */

/* State for checkpoints: the buffers as one flat f32 array (SGD: the
 * momentum buffer, none when momentum is 0; AdamW: exp_avg then exp_avg_sq),
 * each of dt_optim_local_numel elements: the size of the arena, or of the
 * shard (element k of a buffer belongs to the segment whose local range
 * holds k; see "Shards"). Zeros before the first step. The step count
 * travels separately (dt_optim_step_count / the step_count argument). A
 * size mismatch is DT_ERR_SHAPE. */
int64_t dt_optim_state_numel(const dt_optimizer *o);
/* The state's bytes on the device once allocated: 4 x dt_optim_state_numel. */
size_t dt_optim_state_bytes(const dt_optimizer *o);
dt_status dt_optim_state_get(const dt_optimizer *o, float *host, int64_t numel);
dt_status dt_optim_state_set(dt_optimizer *o, const float *host, int64_t numel, int64_t step_count);

/* ---- shards (ZeRO; dist/ddp.h sets them up) ----
 * A sharded optimizer updates only some pieces ("segments") of the arena's
 * flat space, with gradients and state for those only. Segment i updates
 * arena elements [offset, offset + numel) with the shard's gradients and
 * state elements [local_offset, local_offset + numel); local ranges do not
 * overlap and may leave gaps (padding, never updated). Without a shard the
 * optimizer has one segment {0, arena numel, 0}.
 *
 * For checkpoints (each rank saves its shard, a load may re-shard): a
 * rank's state is dt_optim_state_get (n buffers of local_numel, see above)
 * and the segments say which arena elements each local element belongs
 * to (sections of offset + length); dt_optim_state_tensor gives the device
 * buffers themselves, and dt_optim_state_to_flat / _from_flat translate
 * to and from the arena's coordinates, where shards of any world size
 * meet.
 *
 * Mixed precision plugs in here: the GradScaler's found-inf check is the
 * global gradient norm, summed by sum_over_shards (dt_grad_scaler_unscale);
 * the master weights are the arena's f32 parameters. */
typedef struct dt_optim_segment {
  int64_t offset;       /* first arena element */
  int64_t numel;        /* elements (0 allowed: a rank whose piece is all padding) */
  int64_t local_offset; /* where it starts in the shard's gradients and state */
} dt_optim_segment;

typedef struct dt_optim_shard {
  const dt_optim_segment *segments; /* copied */
  int n_segments;
  int64_t local_numel; /* elements of `grads` and of each state buffer */
  /* (local_numel) f32, contiguous, on the arena's device: the reduced
   * gradients of the shard, which the update and clipping read. Retained. */
  dt_tensor *grads;
  void *ctx; /* for the hooks; must outlive the optimizer or the next set_shard */
  /* Sums values[0..n) over every shard in place (an all-reduce), the same
   * on every rank: clipping's partial sum of squares. NULL: one shard. */
  dt_status (*sum_over_shards)(void *ctx, double *values, int n);
  /* After segment i's update has been issued (on the device's compute
   * stream): ZeRO starts gathering that piece of the parameters. */
  dt_status (*segment_updated)(void *ctx, int segment);
  /* After the last segment, also after an error (`st`, which it returns
   * unless it fails itself): makes the updated parameters complete
   * everywhere (gathers what is not gathered yet, waits). */
  dt_status (*step_done)(void *ctx, dt_status st);
} dt_optim_shard;

/* ---- the 16-bit working copy of the weights (mixed precision) ----
 *
 * Under bf16/fp16 the optimizer keeps, beside the arena's f32 masters, a
 * 16-bit copy of every parameter, written by the fused update kernel in
 * the same pass that updates the master; the LOW ops (core/amp.h) use a
 * parameter's copy instead of rounding the parameter each time they use
 * it. Rounded to nearest even, the copy holds exactly what that rounding
 * gave; stochastic rounding (llm.c) draws element i's rounding after s
 * updates from (seed, s, i), so runs are reproducible, DDP and ZeRO ranks
 * hold identical copies and a resumed run rebuilds the copy it left. The
 * copy is rebuilt from the masters when it is not fresh: at its first use,
 * after dt_optim_state_set (a checkpoint load) and after
 * dt_optim_working_copy_invalidate, which whoever writes the parameters by
 * other means than this optimizer must call. Checkpoints hold only the
 * masters. */
typedef struct dt_working_copy_config {
  dt_dtype dtype; /* DT_DTYPE_BF16 or DT_DTYPE_F16 */
  bool stochastic;
  uint64_t seed; /* for stochastic rounding */
} dt_working_copy_config;

/* Makes `o` keep the working copy `cfg` describes (replacing one of
 * another configuration) and makes it fresh: after this the LOW ops use
 * it. The training step (core/step.h) calls it before each forward under
 * autocast. DT_ERR_DTYPE for a dtype other than bf16/f16; OOM. */
dt_status dt_optim_use_working_copy(dt_optimizer *o, const dt_working_copy_config *cfg);
/* Drops the working copy: the LOW ops round the parameters again. */
void dt_optim_drop_working_copy(dt_optimizer *o);
/* The parameters changed behind the optimizer's back: the copy is rebuilt
 * at its next use (until then the LOW ops round the parameters). */
void dt_optim_working_copy_invalidate(dt_optimizer *o);
/* The flat copy (arena numel elements, borrowed), NULL without one. */
dt_tensor *dt_optim_working_copy(const dt_optimizer *o);
/* Whether it holds the masters' current values. */
bool dt_optim_working_copy_is_fresh(const dt_optimizer *o);

/* Makes `o` update only `shard` (before its first step: DT_ERR_STATE
 * after). Drops any state buffer allocated so far (state_set afterwards
 * loads a shard's state). DT_ERR_INVALID_ARG for segments outside the
 * arena or the local range, or gradients of the wrong size, dtype or
 * device. */
dt_status dt_optim_set_shard(dt_optimizer *o, const dt_optim_shard *shard);
int dt_optim_is_sharded(const dt_optimizer *o);
int dt_optim_num_segments(const dt_optimizer *o);
dt_optim_segment dt_optim_segment_at(const dt_optimizer *o, int i); /* i in [0, num) */
int64_t dt_optim_local_numel(const dt_optimizer *o);
/* State buffer i (borrowed; NULL before the first step or for i out of range). */
dt_tensor *dt_optim_state_tensor(const dt_optimizer *o, int i);
/* The state in the arena's coordinates, for saving a shard and re-sharding
 * on load: `flat` holds the state buffers one after the other, each of
 * arena numel floats (flat_numel = buffers x arena numel). _to_flat writes
 * the elements of this optimizer's segments and leaves the rest of `flat`
 * alone (so the shards of every rank fill one array); _from_flat loads its
 * segments from a complete one (the padding gets zeros) and sets the step
 * count, whatever world size saved it. DT_ERR_SHAPE for another size. */
dt_status dt_optim_state_to_flat(const dt_optimizer *o, float *flat, int64_t flat_numel);
dt_status dt_optim_state_from_flat(dt_optimizer *o, const float *flat, int64_t flat_numel,
                                   int64_t step_count);

/* ---- learning-rate schedule ---- */
typedef enum dt_lr_decay {
  DT_LR_DECAY_CONSTANT = 0,
  DT_LR_DECAY_COSINE,
  DT_LR_DECAY_STEP,
} dt_lr_decay;

typedef struct dt_lr_schedule {
  float base_lr;
  int64_t warmup_steps; /* linear from base_lr/warmup_steps up to base_lr */
  int64_t total_steps;  /* cosine: decays to min_lr at total_steps */
  dt_lr_decay decay;
  float min_lr;      /* cosine floor */
  int64_t step_size; /* step decay: multiply by gamma every step_size steps */
  float gamma;
} dt_lr_schedule;
#define DT_LR_SCHEDULE_DEFAULT ((dt_lr_schedule){0.01f, 0, 0, DT_LR_DECAY_CONSTANT, 0.0f, 1, 0.1f})

/* DT_ERR_INVALID_ARG for a schedule dt_lr_at cannot honour: base_lr < 0 or
 * non-finite, warmup_steps < 0; cosine: total_steps <= warmup_steps or
 * min_lr outside [0, base_lr]; step: step_size < 1 or gamma <= 0. */
dt_status dt_lr_schedule_check(const dt_lr_schedule *s);

/* Learning rate for 0-based optimizer step `step`:
 *   step < warmup_steps:  base_lr * (step + 1) / warmup_steps;
 *   then, with t = step - warmup_steps,
 *   constant:  base_lr;
 *   cosine:    min_lr + (base_lr - min_lr) * (1 + cos(pi * t / (total_steps -
 *              warmup_steps))) / 2, and min_lr from total_steps on;
 *   step:      base_lr * gamma^floor(t / step_size).
 * Pure function; a negative step counts as 0. Validate with
 * dt_lr_schedule_check first. */
float dt_lr_at(const dt_lr_schedule *s, int64_t step);

/* ---- clipping ---- */
/* Scales the arena's gradients so that their global L2 norm is at most
 * max_norm (PyTorch's clip_grad_norm_, eps 1e-6): when the norm exceeds
 * max_norm the gradients are multiplied by max_norm / (norm + 1e-6), else
 * left untouched (also when the norm is NaN). *total_norm (may be NULL)
 * receives the norm before clipping. max_norm must be finite and > 0. Call
 * it after the gradient all-reduce so every rank scales identically. */
dt_status dt_clip_grad_norm(dt_param_arena *arena, float max_norm, double *total_norm);
/* The same over the gradients `o` updates: the arena's, or its shard's,
 * whose partial sum of squares is summed over the shards
 * (sum_over_shards), so that *total_norm is the norm of the whole
 * gradient on every rank. The training step clips through this. */
dt_status dt_optim_clip_grad_norm(dt_optimizer *o, float max_norm, double *total_norm);
/* *norm = that global norm, without clipping (collective when sharded, as
 * clipping is). */
dt_status dt_optim_grad_norm(dt_optimizer *o, double *norm);

/* Multiplies the gradients `o` updates (the arena's, or its shard's) by
 * factor, in place: the GradScaler's unscale. */
dt_status dt_optim_scale_grads(dt_optimizer *o, float factor);
/* Debugging the GradScaler: sets the first gradient element `o` updates on
 * this rank (after the reduction: its shard under ZeRO) to +Inf. */
dt_status dt_optim_poison_grads(dt_optimizer *o);

/* ---- GradScaler (mixed precision, fp16; core/amp.h) ----
 * PyTorch's torch.amp.GradScaler: the loss is multiplied by `scale` before
 * the backward, so that small f16 gradients do not flush to zero; before
 * clipping and the update the gradients are checked for Inf/NaN and divided
 * by the scale. A step with an Inf/NaN is skipped (no update, the step
 * count and so the LR schedule stay) and the scale backs off; after
 * growth_interval clean steps in a row it grows. dt_step_update runs it
 * (dt_step_config.scaler). The decision is the same on every rank: the
 * check is the global gradient norm, which dt_optim_grad_norm sums over
 * the shards (sum_over_shards) when each rank holds other gradients
 * (ZeRO), and the step sums the found-inf flag over the ranks in any
 * case, so that no rank can step alone. */
typedef struct dt_grad_scaler_config {
  float init_scale;     /* 2^16 */
  float growth_factor;  /* 2 */
  float backoff_factor; /* 0.5 */
  int growth_interval;  /* 2000 clean steps */
} dt_grad_scaler_config;
#define DT_GRAD_SCALER_CONFIG_DEFAULT ((dt_grad_scaler_config){65536.0f, 2.0f, 0.5f, 2000})

/* The scaler's state: a value (nothing to free); checkpoints save scale,
 * growth_tracker and skipped_steps. */
typedef struct dt_grad_scaler {
  dt_grad_scaler_config cfg;
  float scale;
  int64_t growth_tracker; /* clean steps since the scale last changed */
  int64_t skipped_steps;  /* optimizer steps skipped for Inf/NaN so far */
  bool last_skipped;      /* the last dt_step_update skipped its step */
  /* Debugging: at this optimizer step (0-based) this rank's gradients get
   * an Inf after the reduction (dt_optim_poison_grads), once; -1 = never. */
  int64_t debug_overflow_step;
} dt_grad_scaler;

/* Checks cfg (init_scale finite > 0, growth_factor > 1, backoff_factor in
 * (0, 1), growth_interval >= 1: DT_ERR_INVALID_ARG otherwise) and starts
 * at init_scale. */
dt_status dt_grad_scaler_init(dt_grad_scaler *s, const dt_grad_scaler_config *cfg);
/* *found_inf = whether the gradients `o` updates hold an Inf or NaN (on
 * any rank when sharded: the norm is collective then). The training step
 * then sums the flag over the ranks (dt_grad_sync.sum_over_ranks). */
dt_status dt_grad_scaler_check(dt_grad_scaler *s, dt_optimizer *o, bool *found_inf);
/* Divides the gradients `o` updates by the scale (exact: a power of two). */
dt_status dt_grad_scaler_unscale(const dt_grad_scaler *s, dt_optimizer *o);
/* The scale for the next step: x backoff_factor after an overflow (and
 * the clean-step count restarts), x growth_factor after growth_interval
 * clean steps. Counts skipped steps. */
void dt_grad_scaler_update(dt_grad_scaler *s, bool found_inf);

#ifdef __cplusplus
}
#endif
#endif
