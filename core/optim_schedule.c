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
