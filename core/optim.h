/* Optimizers over a flat parameter arena (core/module.h), LR schedules and
 * global-norm gradient clipping. One fused backend kernel per step. */
#ifndef DT_CORE_OPTIM_H
#define DT_CORE_OPTIM_H

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
 * momentum or with dampening, betas outside [0,1)) are DT_ERR_INVALID_ARG. */
dt_status dt_optim_sgd_create(dt_param_arena *arena, const dt_sgd_config *cfg,
                              dt_optimizer **out);
dt_status dt_optim_adamw_create(dt_param_arena *arena, const dt_adamw_config *cfg,
                                dt_optimizer **out);
void dt_optim_destroy(dt_optimizer *o);

/* One update with the gradients in the arena's flat gradient buffer. */
dt_status dt_optim_step(dt_optimizer *o);
dt_status dt_optim_zero_grad(dt_optimizer *o);
void dt_optim_set_lr(dt_optimizer *o, float lr);
float dt_optim_lr(const dt_optimizer *o);
int64_t dt_optim_step_count(const dt_optimizer *o);
const char *dt_optim_name(const dt_optimizer *o); /* "sgd", "adamw" */

/* State (step count, momentum / moment buffers) as a flat f32 array:
 * size in elements, copy out, copy in (for checkpoints). */
int64_t dt_optim_state_numel(const dt_optimizer *o);
dt_status dt_optim_state_get(const dt_optimizer *o, float *host, int64_t numel);
dt_status dt_optim_state_set(dt_optimizer *o, const float *host, int64_t numel,
                             int64_t step_count);

/* ---- learning-rate schedule ---- */
typedef enum dt_lr_decay {
  DT_LR_DECAY_CONSTANT = 0,
  DT_LR_DECAY_COSINE,
  DT_LR_DECAY_STEP,
} dt_lr_decay;

typedef struct dt_lr_schedule {
  float base_lr;
  int64_t warmup_steps;  /* linear from base_lr/warmup_steps up to base_lr */
  int64_t total_steps;   /* cosine: decays to min_lr at total_steps */
  dt_lr_decay decay;
  float min_lr;          /* cosine floor */
  int64_t step_size;     /* step decay: multiply by gamma every step_size steps */
  float gamma;
} dt_lr_schedule;
#define DT_LR_SCHEDULE_DEFAULT ((dt_lr_schedule){0.01f, 0, 0, DT_LR_DECAY_CONSTANT, 0.0f, 1, 0.1f})

/* Learning rate for 0-based optimizer step `step`. */
float dt_lr_at(const dt_lr_schedule *s, int64_t step);

/* ---- clipping ---- */
/* Scales the arena's gradients so that their global L2 norm is at most
 * max_norm (PyTorch's clip_grad_norm_, eps 1e-6). *total_norm (may be NULL)
 * receives the norm before clipping. */
dt_status dt_clip_grad_norm(dt_param_arena *arena, float max_norm, double *total_norm);

#ifdef __cplusplus
}
#endif
#endif
