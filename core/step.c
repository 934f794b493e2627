/* The training step (core/step.h). */
#include "core/step.h"

#include <math.h>

#include "core/autograd.h"
#include "core/trace.h"

static dt_status phase_ended(const dt_step *s, dt_step_phase phase) {
  return s->cfg.on_phase ? s->cfg.on_phase(s->cfg.on_phase_user, phase) : DT_OK;
}

/* The update may run piece by piece as the gradients are reduced: nothing
 * in it needs all of them first (clipping's global norm, the scaler's
 * found-inf decision), and the optimizer is not sharded (ZeRO's steps its
 * shard with its own gathers). */
static bool update_per_piece(const dt_step *s) {
  return s->sync.finish_backward_update != NULL && s->opt != NULL && s->cfg.scaler == NULL &&
         !(s->cfg.clip > 0) && !dt_optim_is_sharded(s->opt);
}

/* The learning rate of the optimizer's next step, from the schedule. */
static void set_scheduled_lr(const dt_step *s) {
  if (s->cfg.schedule)
    dt_optim_set_lr(s->opt, dt_lr_at(s->cfg.schedule, dt_optim_step_count(s->opt)));
}

dt_status dt_step_forward_backward(const dt_step *s, dt_tensor *input, dt_tensor *target,
                                   float loss_scale, bool sync, dt_tensor **loss) {
  if (loss)
    *loss = NULL;
  if (s->cfg.loss == NULL)
    return DT_ERROR(DT_ERR_INVALID_ARG,
                    "the training step has no loss: set dt_step_config.loss (the task's loss, "
                    "models/tasks.h)");
  dt_status st = DT_OK;
  dt_tensor *output = NULL, *value = NULL, *scaled = NULL;
  const dt_grad_sync *gs = &s->sync;
  bool reduce = gs->ctx != NULL;
  bool no_sync = reduce && !sync;
  if (no_sync)
    DT_CHECK(gs->no_sync_begin(gs->ctx));
  if (s->opt && (s->cfg.autocast == DT_DTYPE_BF16 || s->cfg.autocast == DT_DTYPE_F16)) {
    const dt_working_copy_config wc = {s->cfg.autocast, s->cfg.stochastic_rounding,
                                       s->cfg.rounding_seed};
    DT_CHECK_GOTO(dt_optim_use_working_copy(s->opt, &wc), st, end_pass);
  }
  double span = dt_trace_begin(DT_TRACE_LANE_STEP, "forward");
  dt_dtype prev = dt_autocast_begin(s->cfg.autocast);
  st = dt_module_call(s->model, input, &output);
  if (st == DT_OK)
    st = s->cfg.loss(output, target, DT_REDUCTION_MEAN, &value);
  dt_autocast_end(prev);
  dt_trace_end(DT_TRACE_LANE_STEP, "forward", span);
  DT_CHECK_GOTO(st, st, end_pass);
  DT_CHECK_GOTO(phase_ended(s, DT_STEP_PHASE_FORWARD), st, end_pass);
  span = dt_trace_begin(DT_TRACE_LANE_STEP, "backward");
  if (s->cfg.scaler)
    loss_scale *= s->cfg.scaler->scale; /* a power of two: exact */
  if (loss_scale != 1.0f)
    st = dt_op_scale(value, loss_scale, &scaled);
  if (st == DT_OK)
    st = dt_backward(scaled ? scaled : value, NULL);
  dt_trace_end(DT_TRACE_LANE_STEP, "backward", span);

end_pass:
  if (no_sync) {
    dt_status end = gs->no_sync_end(gs->ctx);
    if (st == DT_OK)
      st = end;
  }
  /* Even after a failed backward a synchronised pass must finish: the
   * other replicas wait for this one's buckets. */
  if (reduce && sync) {
    double wait = dt_trace_begin(DT_TRACE_LANE_STEP, "gradient sync");
    dt_status fin;
    if (st == DT_OK && update_per_piece(s)) {
      set_scheduled_lr(s);
      fin = gs->finish_backward_update(gs->ctx, s->opt);
    } else {
      fin = gs->finish_backward(gs->ctx);
    }
    dt_trace_end(DT_TRACE_LANE_STEP, "gradient sync", wait);
    if (st == DT_OK)
      st = fin;
  }
  if (st == DT_OK)
    st = phase_ended(s, DT_STEP_PHASE_BACKWARD);
  if (st == DT_OK && loss)
    st = dt_tensor_detach(value, loss);
  dt_tensor_release(scaled);
  dt_tensor_release(value);
  dt_tensor_release(output);
  return st;
}

static dt_status update(const dt_step *s);

dt_status dt_step_update(const dt_step *s) {
  double span = dt_trace_begin(DT_TRACE_LANE_STEP, "optimizer");
  dt_status st = update(s);
  dt_trace_end(DT_TRACE_LANE_STEP, "optimizer", span);
  return st;
}

/* After zero_grad: the learning rate of the next step, the phase's end. */
static dt_status update_done(const dt_step *s) {
  set_scheduled_lr(s);
  return phase_ended(s, DT_STEP_PHASE_UPDATE);
}

static dt_status update(const dt_step *s) {
  if (s->opt != NULL && dt_optim_step_begun(s->opt)) {
    /* updated piece by piece in the gradient sync; the gradients are as
     * they were reduced */
    if (s->cfg.stats && s->cfg.stats->want_grad_norm)
      DT_CHECK(dt_optim_grad_norm(s->opt, &s->cfg.stats->grad_norm));
    DT_CHECK(dt_optim_step_end(s->opt, DT_OK));
    DT_CHECK(dt_optim_zero_grad(s->opt));
    return update_done(s);
  }
  dt_grad_scaler *scaler = s->cfg.scaler;
  if (scaler) {
    bool found_inf = false;
    DT_CHECK(dt_grad_scaler_check(scaler, s->opt, &found_inf));
    if (s->sync.sum_over_ranks) { /* by construction: every rank decides alike */
      double any = found_inf ? 1.0 : 0.0;
      DT_CHECK(s->sync.sum_over_ranks(s->sync.ctx, &any, 1));
      found_inf = any > 0.0;
    }
    if (!found_inf)
      DT_CHECK(dt_grad_scaler_unscale(scaler, s->opt));
    dt_grad_scaler_update(scaler, found_inf);
    if (found_inf) { /* skipped: no update, the step count and the lr stay */
      DT_CHECK(dt_optim_zero_grad(s->opt));
      return phase_ended(s, DT_STEP_PHASE_UPDATE);
    }
  }
  if (s->cfg.clip > 0) {
    /* Clipping would scale a non-finite gradient to 0 (or NaN) and the run
     * would go on without learning: a divergence to report. */
    double norm = 0.0;
    DT_CHECK(dt_optim_clip_grad_norm(s->opt, s->cfg.clip, &norm));
    if (!isfinite(norm))
      return DT_ERROR(DT_ERR_STATE,
                      "training diverged: the gradient norm is %s at optimizer step %lld (before "
                      "clipping to %g); lower --lr or add --warmup",
                      isnan(norm) ? "nan" : "inf", (long long)dt_optim_step_count(s->opt) + 1,
                      (double)s->cfg.clip);
    if (s->cfg.stats)
      s->cfg.stats->grad_norm = norm;
  } else if (s->cfg.stats && s->cfg.stats->want_grad_norm) {
    DT_CHECK(dt_optim_grad_norm(s->opt, &s->cfg.stats->grad_norm));
  }
  set_scheduled_lr(s);
  DT_CHECK(dt_optim_step(s->opt));
  DT_CHECK(dt_optim_zero_grad(s->opt));
  return update_done(s);
}
