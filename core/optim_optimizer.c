/* SGD and AdamW over a flat parameter arena: each step is one fused backend
 * kernel over the whole arena (be->sgd_update / be->adamw_update), which
 * follow torch.optim.SGD and torch.optim.AdamW exactly. */
#include <limits.h>
#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "core/optim.h"
#include "core/tensor_internal.h"

typedef enum optim_kind { OPTIM_SGD = 0, OPTIM_ADAMW } optim_kind;

#define OPTIM_MAX_STATE 2

struct dt_optimizer {
  optim_kind kind;
  dt_param_arena *arena; /* borrowed */
  dt_sgd_config sgd;
  dt_adamw_config adamw;
  float lr;
  int64_t steps; /* updates taken */
  /* SGD: momentum buffer (absent when momentum is 0). AdamW: m, v. Each
   * (numel) f32 on the arena's device; the flat state is their
   * concatenation in this order. */
  dt_tensor *state[OPTIM_MAX_STATE];
  int n_state;
  /* Runs of the flat buffer updated by one kernel call each, with or
   * without weight decay; NULL = one run over everything, decayed. */
  struct decay_run {
    int64_t offset, numel;
    bool decay;
  } * runs;
  int n_runs;
};

static int is_finite(float x) { return isfinite(x); }

static dt_status check_lr(const char *who, float lr) {
  if (!(lr >= 0.0f) || !is_finite(lr))
    return DT_ERROR(DT_ERR_INVALID_ARG, "%s: invalid learning rate %g: must be finite and >= 0",
                    who, (double)lr);
  return DT_OK;
}

static dt_status check_sgd_config(const dt_sgd_config *c) {
  DT_CHECK(check_lr("sgd", c->lr));
  if (!(c->momentum >= 0.0f) || !is_finite(c->momentum))
    return DT_ERROR(DT_ERR_INVALID_ARG, "sgd: invalid momentum %g: must be finite and >= 0",
                    (double)c->momentum);
  if (!is_finite(c->dampening))
    return DT_ERROR(DT_ERR_INVALID_ARG, "sgd: invalid dampening %g: must be finite",
                    (double)c->dampening);
  if (!(c->weight_decay >= 0.0f) || !is_finite(c->weight_decay))
    return DT_ERROR(DT_ERR_INVALID_ARG, "sgd: invalid weight_decay %g: must be finite and >= 0",
                    (double)c->weight_decay);
  if (c->nesterov && (c->momentum <= 0.0f || c->dampening != 0.0f))
    return DT_ERROR(DT_ERR_INVALID_ARG,
                    "sgd: nesterov momentum requires momentum > 0 and dampening 0 (got momentum "
                    "%g, dampening %g)",
                    (double)c->momentum, (double)c->dampening);
  return DT_OK;
}

static dt_status check_adamw_config(const dt_adamw_config *c) {
  DT_CHECK(check_lr("adamw", c->lr));
  if (!(c->beta1 >= 0.0f && c->beta1 < 1.0f))
    return DT_ERROR(DT_ERR_INVALID_ARG, "adamw: invalid beta1 %g: must be in [0, 1)",
                    (double)c->beta1);
  if (!(c->beta2 >= 0.0f && c->beta2 < 1.0f))
    return DT_ERROR(DT_ERR_INVALID_ARG, "adamw: invalid beta2 %g: must be in [0, 1)",
                    (double)c->beta2);
  if (!(c->eps >= 0.0f) || !is_finite(c->eps))
    return DT_ERROR(DT_ERR_INVALID_ARG, "adamw: invalid eps %g: must be finite and >= 0",
                    (double)c->eps);
  if (!(c->weight_decay >= 0.0f) || !is_finite(c->weight_decay))
    return DT_ERROR(DT_ERR_INVALID_ARG, "adamw: invalid weight_decay %g: must be finite and >= 0",
                    (double)c->weight_decay);
  return DT_OK;
}

/* Allocates an optimizer with n_state zeroed buffers the size of the arena. */
static dt_status optim_create(dt_param_arena *arena, optim_kind kind, int n_state,
                              dt_optimizer **out) {
  dt_optimizer *o = calloc(1, sizeof *o);
  if (!o)
    return DT_ERROR(DT_ERR_OOM, "cannot allocate an optimizer");
  o->kind = kind;
  o->arena = arena;
  int64_t n = dt_param_arena_numel(arena);
  for (int i = 0; i < n_state && n > 0; i++) {
    int64_t shape[1] = {n};
    dt_status st =
        dt_tensor_zeros(shape, 1, DT_DTYPE_F32, dt_param_arena_device(arena), &o->state[i]);
    if (st != DT_OK) {
      dt_optim_destroy(o);
      return dt_error_wrap(st, "%s state buffer %d of %lld floats",
                           kind == OPTIM_SGD ? "sgd" : "adamw", i, (long long)n);
    }
    o->n_state = i + 1;
  }
  *out = o;
  return DT_OK;
}

static dt_status check_create_args(dt_param_arena *arena, const void *cfg, dt_optimizer **out) {
  if (!out)
    return DT_ERROR(DT_ERR_INVALID_ARG, "out is NULL");
  *out = NULL;
  if (!arena || !cfg)
    return DT_ERROR(DT_ERR_INVALID_ARG, "arena and config must not be NULL");
  return DT_OK;
}

dt_status dt_optim_sgd_create(dt_param_arena *arena, const dt_sgd_config *cfg, dt_optimizer **out) {
  DT_CHECK(check_create_args(arena, cfg, out));
  DT_CHECK(check_sgd_config(cfg));
  DT_CHECK(optim_create(arena, OPTIM_SGD, cfg->momentum != 0.0f ? 1 : 0, out));
  (*out)->sgd = *cfg;
  (*out)->lr = cfg->lr;
  return DT_OK;
}

dt_status dt_optim_adamw_create(dt_param_arena *arena, const dt_adamw_config *cfg,
                                dt_optimizer **out) {
  DT_CHECK(check_create_args(arena, cfg, out));
  DT_CHECK(check_adamw_config(cfg));
  DT_CHECK(optim_create(arena, OPTIM_ADAMW, 2, out));
  (*out)->adamw = *cfg;
  (*out)->lr = cfg->lr;
  return DT_OK;
}

void dt_optim_destroy(dt_optimizer *o) {
  if (!o)
    return;
  for (int i = 0; i < OPTIM_MAX_STATE; i++)
    dt_tensor_release(o->state[i]);
  free(o->runs);
  free(o);
}

dt_status dt_optim_set_decay_mask(dt_optimizer *o, const uint8_t *decay, int n) {
  if (!o)
    return DT_ERROR(DT_ERR_INVALID_ARG, "optimizer is NULL");
  free(o->runs);
  o->runs = NULL;
  o->n_runs = 0;
  if (!decay)
    return DT_OK;
  int count = dt_param_arena_count(o->arena);
  if (n != count)
    return DT_ERROR(DT_ERR_INVALID_ARG,
                    "weight-decay mask of %d entries for an arena of %d parameters", n, count);
  o->runs = calloc((size_t)(count > 0 ? count : 1), sizeof *o->runs);
  if (!o->runs)
    return DT_ERROR(DT_ERR_OOM, "no host memory for %d weight-decay groups", count);
  for (int i = 0; i < count; i++) {
    int64_t off = dt_param_arena_offset(o->arena, i);
    int64_t len = dt_tensor_numel(dt_param_arena_param(o->arena, i, NULL));
    bool d = decay[i] != 0;
    struct decay_run *last = o->n_runs ? &o->runs[o->n_runs - 1] : NULL;
    if (last && last->decay == d && last->offset + last->numel == off)
      last->numel += len;
    else
      o->runs[o->n_runs++] = (struct decay_run){off, len, d};
  }
  return DT_OK;
}

dt_status dt_optim_decay_matrices_only(dt_optimizer *o) {
  if (!o)
    return DT_ERROR(DT_ERR_INVALID_ARG, "optimizer is NULL");
  int n = dt_param_arena_count(o->arena);
  uint8_t *mask = malloc((size_t)(n > 0 ? n : 1));
  if (!mask)
    return DT_ERROR(DT_ERR_OOM, "no host memory for a weight-decay mask of %d", n);
  for (int i = 0; i < n; i++)
    mask[i] = dt_tensor_ndim(dt_param_arena_param(o->arena, i, NULL)) >= 2;
  dt_status st = dt_optim_set_decay_mask(o, mask, n);
  free(mask);
  return st;
}

static float *state_ptr(const dt_optimizer *o, int i, int64_t offset) {
  return i < o->n_state ? (float *)dt_tensor_data(o->state[i]) + offset : NULL;
}

/* The fused kernel over elements [offset, offset + n) of the arena. */
static dt_status update_run(dt_optimizer *o, const dt_exec *ex, float *p, const float *g,
                            int64_t offset, int64_t n, bool decay) {
  p += offset;
  g += offset;
  if (o->kind == OPTIM_SGD) {
    const dt_sgd_config *c = &o->sgd;
    return dt_kernel_sgd_update(ex, p, g, state_ptr(o, 0, offset), n, o->lr, c->momentum,
                                c->dampening, decay ? c->weight_decay : 0.0f, c->nesterov,
                                o->steps == 0);
  }
  const dt_adamw_config *c = &o->adamw;
  return dt_kernel_adamw_update(ex, p, g, state_ptr(o, 0, offset), state_ptr(o, 1, offset), n,
                                o->lr, c->beta1, c->beta2, c->eps, decay ? c->weight_decay : 0.0f,
                                (int)(o->steps + 1));
}

dt_status dt_optim_step(dt_optimizer *o) {
  if (!o)
    return DT_ERROR(DT_ERR_INVALID_ARG, "optimizer is NULL");
  DT_CHECK(check_lr(dt_optim_name(o), o->lr));
  int64_t n = dt_param_arena_numel(o->arena);
  if (n == 0) {
    o->steps++;
    return DT_OK;
  }
  dt_tensor *params = dt_param_arena_data(o->arena);
  dt_tensor *grads = dt_param_arena_grads(o->arena);
  const dt_exec ex = dt_tensor_exec(params);
  float *p = dt_tensor_data(params);
  const float *g = dt_tensor_data(grads);
  if (o->kind == OPTIM_ADAMW && o->steps >= INT_MAX)
    return DT_ERROR(DT_ERR_INVALID_ARG, "adamw: step count %lld exceeds the kernel's int range",
                    (long long)o->steps);
  dt_status st = DT_OK;
  if (!o->runs)
    st = update_run(o, &ex, p, g, 0, n, true);
  for (int r = 0; r < o->n_runs && st == DT_OK; r++)
    st = update_run(o, &ex, p, g, o->runs[r].offset, o->runs[r].numel, o->runs[r].decay);
  if (st != DT_OK)
    return dt_error_wrap(st, "%s step %lld", dt_optim_name(o), (long long)o->steps);
  o->steps++;
  return DT_OK;
}

dt_status dt_optim_zero_grad(dt_optimizer *o) {
  if (!o)
    return DT_ERROR(DT_ERR_INVALID_ARG, "optimizer is NULL");
  return dt_param_arena_zero_grad(o->arena);
}

void dt_optim_set_lr(dt_optimizer *o, float lr) { o->lr = lr; }
float dt_optim_lr(const dt_optimizer *o) { return o->lr; }
int64_t dt_optim_step_count(const dt_optimizer *o) { return o->steps; }
const char *dt_optim_name(const dt_optimizer *o) { return o->kind == OPTIM_SGD ? "sgd" : "adamw"; }

int64_t dt_optim_state_numel(const dt_optimizer *o) {
  return (int64_t)o->n_state * dt_param_arena_numel(o->arena);
}

dt_status dt_optim_state_get(const dt_optimizer *o, float *host, int64_t numel) {
  if (!o || (!host && numel > 0))
    return DT_ERROR(DT_ERR_INVALID_ARG, "optimizer and host buffer must not be NULL");
  int64_t want = dt_optim_state_numel(o);
  if (numel != want)
    return DT_ERROR(DT_ERR_SHAPE, "%s state holds %lld floats, the buffer %lld", dt_optim_name(o),
                    (long long)want, (long long)numel);
  int64_t n = dt_param_arena_numel(o->arena);
  for (int i = 0; i < o->n_state; i++)
    DT_CHECK(dt_tensor_to_host(o->state[i], host + i * n, (size_t)n * sizeof(float)));
  return DT_OK;
}

dt_status dt_optim_state_set(dt_optimizer *o, const float *host, int64_t numel,
                             int64_t step_count) {
  if (!o || (!host && numel > 0))
    return DT_ERROR(DT_ERR_INVALID_ARG, "optimizer and host buffer must not be NULL");
  int64_t want = dt_optim_state_numel(o);
  if (numel != want)
    return DT_ERROR(DT_ERR_SHAPE,
                    "%s state holds %lld floats, the checkpoint %lld: was it saved with "
                    "another model or optimizer configuration?",
                    dt_optim_name(o), (long long)want, (long long)numel);
  if (step_count < 0)
    return DT_ERROR(DT_ERR_INVALID_ARG, "step count %lld: must be >= 0", (long long)step_count);
  int64_t n = dt_param_arena_numel(o->arena);
  for (int i = 0; i < o->n_state; i++) {
    dt_tensor *t = o->state[i];
    const dt_backend_ops *be = dt_tensor_backend(t);
    DT_CHECK(be->copy(dt_tensor_data(t), dt_tensor_device(t), host + i * n, DT_CPU,
                      (size_t)n * sizeof(float), NULL));
  }
  o->steps = step_count;
  return DT_OK;
}
