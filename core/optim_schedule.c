/* Learning-rate schedules and global-norm gradient clipping. */
#include <math.h>

#include "core/optim.h"
#include "core/tensor_internal.h"

dt_status dt_lr_schedule_check(const dt_lr_schedule *s) {
  if (!s)
    return DT_ERROR(DT_ERR_INVALID_ARG, "schedule is NULL");
  if (!(s->base_lr >= 0.0f) || !isfinite(s->base_lr))
    return DT_ERROR(DT_ERR_INVALID_ARG, "lr schedule: base_lr %g: must be finite and >= 0",
                    (double)s->base_lr);
  if (s->warmup_steps < 0)
    return DT_ERROR(DT_ERR_INVALID_ARG, "lr schedule: warmup_steps %lld: must be >= 0",
                    (long long)s->warmup_steps);
  switch (s->decay) {
    case DT_LR_DECAY_CONSTANT: return DT_OK;
    case DT_LR_DECAY_COSINE:
      if (s->total_steps <= s->warmup_steps)
        return DT_ERROR(DT_ERR_INVALID_ARG,
                        "lr schedule: cosine decay needs total_steps (%lld) > warmup_steps "
                        "(%lld)",
                        (long long)s->total_steps, (long long)s->warmup_steps);
      if (!(s->min_lr >= 0.0f) || !(s->min_lr <= s->base_lr))
        return DT_ERROR(DT_ERR_INVALID_ARG, "lr schedule: min_lr %g: must be in [0, base_lr %g]",
                        (double)s->min_lr, (double)s->base_lr);
      return DT_OK;
    case DT_LR_DECAY_STEP:
      if (s->step_size < 1)
        return DT_ERROR(DT_ERR_INVALID_ARG, "lr schedule: step_size %lld: must be >= 1",
                        (long long)s->step_size);
      if (!(s->gamma > 0.0f) || !isfinite(s->gamma))
        return DT_ERROR(DT_ERR_INVALID_ARG, "lr schedule: gamma %g: must be finite and > 0",
                        (double)s->gamma);
      return DT_OK;
  }
  return DT_ERROR(DT_ERR_INVALID_ARG, "lr schedule: unknown decay %d", (int)s->decay);
}

float dt_lr_at(const dt_lr_schedule *s, int64_t step) {
  if (step < 0)
    step = 0;
  double base = s->base_lr;
  if (s->warmup_steps > 0 && step < s->warmup_steps)
    return (float)(base * (double)(step + 1) / (double)s->warmup_steps);
  int64_t t = step - (s->warmup_steps > 0 ? s->warmup_steps : 0);
  switch (s->decay) {
    case DT_LR_DECAY_CONSTANT: return (float)base;
    case DT_LR_DECAY_COSINE: {
      int64_t span = s->total_steps - (s->warmup_steps > 0 ? s->warmup_steps : 0);
      if (span <= 0 || t >= span)
        return s->min_lr;
      double cosine = 0.5 * (1.0 + cos(M_PI * (double)t / (double)span));
      return (float)(s->min_lr + (base - s->min_lr) * cosine);
    }
    case DT_LR_DECAY_STEP: {
      int64_t size = s->step_size > 0 ? s->step_size : 1;
      return (float)(base * pow((double)s->gamma, (double)(t / size)));
    }
  }
  return (float)base;
}

dt_status dt_grad_norm(dt_param_arena *arena, double *norm) {
  *norm = 0.0;
  if (!arena)
    return DT_ERROR(DT_ERR_INVALID_ARG, "arena is NULL");
  int64_t n = dt_param_arena_numel(arena);
  if (n == 0)
    return DT_OK;
  dt_tensor *grads = dt_param_arena_grads(arena);
  const dt_exec ex = dt_tensor_exec(grads);
  double sum_sq = 0.0;
  DT_CHECK(dt_kernel_sum_squares(&ex, dt_tensor_data(grads), n, &sum_sq));
  *norm = sqrt(sum_sq);
  return DT_OK;
}

dt_status dt_clip_grad_norm(dt_param_arena *arena, float max_norm, double *total_norm) {
  if (total_norm)
    *total_norm = 0.0;
  if (!arena)
    return DT_ERROR(DT_ERR_INVALID_ARG, "arena is NULL");
  if (!(max_norm > 0.0f) || !isfinite(max_norm))
    return DT_ERROR(DT_ERR_INVALID_ARG, "max_norm %g: must be finite and > 0", (double)max_norm);
  double norm = 0.0;
  DT_CHECK(dt_grad_norm(arena, &norm));
  if (total_norm)
    *total_norm = norm;
  int64_t n = dt_param_arena_numel(arena);
  dt_tensor *grads = dt_param_arena_grads(arena);
  const dt_exec ex = dt_tensor_exec(grads);
  float *g = dt_tensor_data(grads);
  /* A non-finite norm fails this test and leaves the gradients as they are
   * (the caller sees it in *total_norm; GradScaler skips such steps). */
  if (norm > (double)max_norm) {
    float coef = (float)((double)max_norm / (norm + 1e-6));
    /* g = 0 * g + coef * g: scales in place without relying on x != y. */
    DT_CHECK(dt_kernel_axpby(&ex, n, 0.0f, g, coef, g));
  }
  return DT_OK;
}
