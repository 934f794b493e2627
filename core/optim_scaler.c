/* The GradScaler (core/optim.h): dynamic loss scaling for fp16. */
#include <math.h>

#include "core/optim.h"

dt_status dt_grad_scaler_init(dt_grad_scaler *s, const dt_grad_scaler_config *cfg) {
  if (!s || !cfg)
    return DT_ERROR(DT_ERR_INVALID_ARG, "grad scaler: NULL argument");
  if (!(cfg->init_scale > 0.0f) || !isfinite(cfg->init_scale) || !(cfg->growth_factor > 1.0f) ||
      !isfinite(cfg->growth_factor) || !(cfg->backoff_factor > 0.0f) ||
      !(cfg->backoff_factor < 1.0f) || cfg->growth_interval < 1)
    return DT_ERROR(DT_ERR_INVALID_ARG,
                    "grad scaler: init_scale %g, growth_factor %g, backoff_factor %g, "
                    "growth_interval %d: expected a finite init_scale > 0, growth_factor > 1, "
                    "backoff_factor in (0, 1) and growth_interval >= 1",
                    (double)cfg->init_scale, (double)cfg->growth_factor,
                    (double)cfg->backoff_factor, cfg->growth_interval);
  s->cfg = *cfg;
  s->scale = cfg->init_scale;
  s->growth_tracker = 0;
  s->skipped_steps = 0;
  s->last_skipped = false;
  s->debug_overflow_step = -1;
  return DT_OK;
}

dt_status dt_grad_scaler_check(dt_grad_scaler *s, dt_optimizer *o, bool *found_inf) {
  *found_inf = false;
  if (s->debug_overflow_step >= 0 && dt_optim_step_count(o) == s->debug_overflow_step) {
    s->debug_overflow_step = -1; /* once: the skipped step keeps the step count */
    DT_CHECK(dt_optim_poison_grads(o));
  }
  /* Any Inf or NaN makes the sum of squares non-finite; the norm is
   * collective when sharded. */
  double norm = 0.0;
  DT_CHECK(dt_optim_grad_norm(o, &norm));
  *found_inf = !isfinite(norm);
  return DT_OK;
}

dt_status dt_grad_scaler_unscale(const dt_grad_scaler *s, dt_optimizer *o) {
  return dt_optim_scale_grads(o, 1.0f / s->scale);
}

void dt_grad_scaler_update(dt_grad_scaler *s, bool found_inf) {
  s->last_skipped = found_inf;
  if (found_inf) {
    s->skipped_steps++;
    s->scale *= s->cfg.backoff_factor;
    s->growth_tracker = 0;
    return;
  }
  if (++s->growth_tracker >= s->cfg.growth_interval) {
    float grown = s->scale * s->cfg.growth_factor;
    if (isfinite(grown)) /* as PyTorch: the scale never becomes Inf */
      s->scale = grown;
    s->growth_tracker = 0;
  }
}
