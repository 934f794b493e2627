/* SGD and AdamW over a flat parameter arena: each step is one fused backend
 * kernel over the whole arena (be->sgd_update / be->adamw_update), which
 * follow torch.optim.SGD and torch.optim.AdamW exactly. */
#include <limits.h>
#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "core/optim.h"
#include "core/optim_internal.h"
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
   * (local_numel) f32 on the arena's device, allocated at the first step
   * or state_set (zeros until then); the flat state is their
   * concatenation in this order. */
  dt_tensor *state[OPTIM_MAX_STATE];
  int n_state;
  /* What the state covers: the whole arena as one segment, or a shard
   * (dt_optim_set_shard) with its own reduced gradients and hooks. */
  dt_optim_segment *segs;
  int n_segs;
  int64_t local_numel;
  dt_optim_shard shard; /* shard.grads retained; all zero when not sharded */
  /* Runs of arena elements with or without weight decay, in order
   * (dt_optim_set_decay_mask); NULL = everything decays. */
  struct decay_run {
    int64_t offset, numel;
    bool decay;
  } * runs;
  int n_runs;
  dt_working_copy *working; /* NULL = none (dt_optim_use_working_copy) */
  /* A step taken in pieces (dt_optim_step_begin .. _end): arena elements
   * updated so far. */
  bool in_step;
  int64_t step_done;
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

/* An optimizer over the whole arena whose n_state buffers are allocated
 * at the first step. */
static dt_status optim_create(dt_param_arena *arena, optim_kind kind, int n_state,
                              dt_optimizer **out) {
  dt_optimizer *o = calloc(1, sizeof *o);
  dt_optim_segment *seg = calloc(1, sizeof *seg);
  if (!o || !seg) {
    free(o);
    free(seg);
    return DT_ERROR(DT_ERR_OOM, "cannot allocate an optimizer");
  }
  o->kind = kind;
  o->arena = arena;
  o->n_state = n_state;
  o->local_numel = dt_param_arena_numel(arena);
  *seg = (dt_optim_segment){0, o->local_numel, 0};
  o->segs = seg;
  o->n_segs = 1;
  *out = o;
  return DT_OK;
}

static void release_state(dt_optimizer *o) {
  for (int i = 0; i < OPTIM_MAX_STATE; i++) {
    dt_tensor_release(o->state[i]);
    o->state[i] = NULL;
  }
}

/* The state buffers, zeroed, once. */
static dt_status ensure_state(dt_optimizer *o) {
  int64_t shape[1] = {o->local_numel};
  for (int i = 0; i < o->n_state && o->local_numel > 0; i++) {
    if (o->state[i] != NULL)
      continue;
    dt_status st =
        dt_tensor_zeros(shape, 1, DT_DTYPE_F32, dt_param_arena_device(o->arena), &o->state[i]);
    if (st != DT_OK)
      return dt_error_wrap(st, "%s state buffer %d of %lld floats", dt_optim_name(o), i,
                           (long long)o->local_numel);
  }
  return DT_OK;
}

static dt_status check_create_args(dt_param_arena *arena, const void *cfg, dt_optimizer **out) {
  DT_CHECK_OUT(out);
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
  release_state(o);
  dt_working_copy_destroy(o->working);
  dt_tensor_release(o->shard.grads);
  free(o->segs);
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

static float *state_ptr(const dt_optimizer *o, int i) {
  return i < o->n_state && o->state[i] ? (float *)dt_tensor_data(o->state[i]) : NULL;
}

/* The gradients the update reads: the shard's, or the arena's. */
static dt_tensor *update_grads(const dt_optimizer *o) {
  return o->shard.grads ? o->shard.grads : dt_param_arena_grads(o->arena);
}

static dt_status check_grads(const dt_optimizer *o, dt_tensor *grads) {
  if (grads == NULL)
    return DT_ERROR(DT_ERR_STATE,
                    "%s: the arena has no gradient buffer (dropped for ZeRO stage 2) and the "
                    "optimizer was given no shard (dt_optim_set_shard)",
                    dt_optim_name(o));
  return DT_OK;
}

/* The fused kernel over arena elements [start, start + n) of segment sg,
 * with or without weight decay. */
static dt_status rebuild_outside_segments(dt_optimizer *o, int64_t steps);

static dt_status update_range(dt_optimizer *o, const dt_exec *ex, float *params, const float *grads,
                              const dt_optim_segment *sg, int64_t start, int64_t n, bool decay) {
  int64_t local = sg->local_offset + (start - sg->offset);
  float *p = params + start;
  const float *g = grads + local;
  /* the working copy as it is after this update */
  dt_half_out half =
      o->working ? dt_working_copy_out(o->working, start, o->steps + 1) : (dt_half_out){0};
  const dt_half_out *h = o->working ? &half : NULL;
  if (o->kind == OPTIM_SGD) {
    const dt_sgd_config *c = &o->sgd;
    float *m = state_ptr(o, 0);
    return dt_kernel_sgd_update(ex, p, g, m ? m + local : NULL, n, o->lr, c->momentum, c->dampening,
                                decay ? c->weight_decay : 0.0f, c->nesterov, o->steps == 0, h);
  }
  const dt_adamw_config *c = &o->adamw;
  return dt_kernel_adamw_update(ex, p, g, state_ptr(o, 0) + local, state_ptr(o, 1) + local, n,
                                o->lr, c->beta1, c->beta2, c->eps, decay ? c->weight_decay : 0.0f,
                                (int)(o->steps + 1), h);
}

/* The fused kernel over the arena elements [lo, hi) of segment `i`: once,
 * or once per weight-decay run that meets them. */
static dt_status update_segment_part(dt_optimizer *o, const dt_exec *ex, float *params,
                                     const float *grads, int i, int64_t lo, int64_t hi) {
  const dt_optim_segment *sg = &o->segs[i];
  lo = lo > sg->offset ? lo : sg->offset;
  hi = hi < sg->offset + sg->numel ? hi : sg->offset + sg->numel;
  if (hi <= lo)
    return DT_OK;
  if (!o->runs)
    return update_range(o, ex, params, grads, sg, lo, hi - lo, true);
  for (int r = 0; r < o->n_runs; r++) {
    int64_t rlo = o->runs[r].offset > lo ? o->runs[r].offset : lo;
    int64_t rhi = o->runs[r].offset + o->runs[r].numel;
    rhi = rhi < hi ? rhi : hi;
    if (rhi > rlo)
      DT_CHECK(update_range(o, ex, params, grads, sg, rlo, rhi - rlo, o->runs[r].decay));
  }
  return DT_OK;
}

/* What every update checks first: the lr, the step count's range, the
 * gradients, the state buffers. */
static dt_status step_prepare(dt_optimizer *o) {
  dt_status st = check_lr(dt_optim_name(o), o->lr);
  if (st == DT_OK && o->kind == OPTIM_ADAMW && o->steps >= INT_MAX)
    st = DT_ERROR(DT_ERR_INVALID_ARG, "adamw: step count %lld exceeds the kernel's int range",
                  (long long)o->steps);
  if (st == DT_OK)
    st = check_grads(o, update_grads(o));
  if (st == DT_OK)
    st = ensure_state(o);
  return st;
}

/* The end of every update: the working copy is fresh again (or not, after
 * an error: rebuilt from the masters at its next use), the count grows. */
static dt_status step_finish(dt_optimizer *o, dt_status st) {
  /* a shard wrote its own segments' copy: the rest from the gathered masters */
  if (st == DT_OK && o->working)
    st = rebuild_outside_segments(o, o->steps + 1);
  if (o->working)
    dt_working_copy_set_fresh(o->working, st == DT_OK);
  if (st != DT_OK)
    return dt_error_wrap(st, "%s step %lld", dt_optim_name(o), (long long)o->steps);
  o->steps++;
  return DT_OK;
}

dt_status dt_optim_step(dt_optimizer *o) {
  if (!o)
    return DT_ERROR(DT_ERR_INVALID_ARG, "optimizer is NULL");
  if (o->in_step)
    return DT_ERROR(DT_ERR_STATE,
                    "%s: dt_optim_step during a step taken in pieces (dt_optim_step_begin "
                    "without dt_optim_step_end)",
                    dt_optim_name(o));
  dt_status st = step_prepare(o);
  dt_tensor *params = dt_param_arena_data(o->arena);
  dt_tensor *grads = update_grads(o);
  const dt_exec ex = dt_tensor_exec(params);
  /* A shard's hooks see every segment, also after an error, so that the
   * ranks' collectives stay matched (step_done gathers what is left). */
  for (int i = 0; i < o->n_segs && st == DT_OK; i++) {
    const dt_optim_segment *sg = &o->segs[i];
    st = update_segment_part(o, &ex, dt_tensor_data(params), dt_tensor_data(grads), i, sg->offset,
                             sg->offset + sg->numel);
    if (st == DT_OK && o->shard.segment_updated)
      st = o->shard.segment_updated(o->shard.ctx, i);
  }
  if (o->shard.step_done)
    st = o->shard.step_done(o->shard.ctx, st);
  return step_finish(o, st);
}

/* ---- a step in pieces ---- */

dt_status dt_optim_step_begin(dt_optimizer *o) {
  if (!o)
    return DT_ERROR(DT_ERR_INVALID_ARG, "optimizer is NULL");
  if (o->in_step)
    return DT_ERROR(DT_ERR_STATE, "%s: dt_optim_step_begin twice without dt_optim_step_end",
                    dt_optim_name(o));
  if (dt_optim_is_sharded(o))
    return DT_ERROR(DT_ERR_STATE,
                    "%s: a sharded optimizer (ZeRO) steps its segments with dt_optim_step, not "
                    "in pieces",
                    dt_optim_name(o));
  DT_CHECK(step_prepare(o));
  o->in_step = true;
  o->step_done = 0;
  return DT_OK;
}

dt_status dt_optim_step_range(dt_optimizer *o, int64_t offset, int64_t numel) {
  if (!o)
    return DT_ERROR(DT_ERR_INVALID_ARG, "optimizer is NULL");
  if (!o->in_step)
    return DT_ERROR(DT_ERR_STATE, "%s: dt_optim_step_range outside dt_optim_step_begin .. _end",
                    dt_optim_name(o));
  int64_t total = dt_param_arena_numel(o->arena);
  if (offset < 0 || numel < 0 || offset + numel > total || o->step_done + numel > total)
    return DT_ERROR(DT_ERR_INVALID_ARG,
                    "%s: update of arena elements %lld + %lld: outside the arena (%lld), or more "
                    "than it holds with the %lld updated in this step",
                    dt_optim_name(o), (long long)offset, (long long)numel, (long long)total,
                    (long long)o->step_done);
  dt_tensor *params = dt_param_arena_data(o->arena);
  const dt_exec ex = dt_tensor_exec(params);
  DT_CHECK(update_segment_part(o, &ex, dt_tensor_data(params), dt_tensor_data(update_grads(o)), 0,
                               offset, offset + numel));
  o->step_done += numel;
  return DT_OK;
}

dt_status dt_optim_step_end(dt_optimizer *o, dt_status st) {
  if (!o)
    return DT_ERROR(DT_ERR_INVALID_ARG, "optimizer is NULL");
  if (!o->in_step)
    return st != DT_OK ? st
                       : DT_ERROR(DT_ERR_STATE, "%s: dt_optim_step_end without dt_optim_step_begin",
                                  dt_optim_name(o));
  o->in_step = false;
  int64_t total = dt_param_arena_numel(o->arena);
  if (st == DT_OK && o->step_done != total)
    st = DT_ERROR(DT_ERR_STATE, "%s: the step's pieces updated %lld of the arena's %lld elements",
                  dt_optim_name(o), (long long)o->step_done, (long long)total);
  return step_finish(o, st);
}

bool dt_optim_step_begun(const dt_optimizer *o) { return o != NULL && o->in_step; }

/* ---- the working copy of the weights ---- */

static int compare_segments(const void *a, const void *b) {
  int64_t x = ((const dt_optim_segment *)a)->offset, y = ((const dt_optim_segment *)b)->offset;
  return (x > y) - (x < y);
}

/* Rebuilds the working copy of the arena elements no segment covers (all
 * of them when there is none): a ZeRO rank's view of the other shards. */
static dt_status rebuild_outside_segments(dt_optimizer *o, int64_t steps) {
  int64_t numel = dt_param_arena_numel(o->arena);
  dt_optim_segment *sorted = malloc((size_t)(o->n_segs > 0 ? o->n_segs : 1) * sizeof *sorted);
  if (!sorted)
    return DT_ERROR(DT_ERR_OOM, "%s: no host memory for %d segments", dt_optim_name(o), o->n_segs);
  memcpy(sorted, o->segs, (size_t)o->n_segs * sizeof *sorted);
  qsort(sorted, (size_t)o->n_segs, sizeof *sorted, compare_segments);
  dt_status st = DT_OK;
  int64_t done = 0; /* arena elements below this are covered or rebuilt */
  for (int i = 0; i <= o->n_segs && st == DT_OK; i++) {
    int64_t lo = i < o->n_segs ? sorted[i].offset : numel;
    lo = lo < numel ? lo : numel;
    if (lo > done)
      st = dt_working_copy_rebuild(o->working, done, lo - done, steps);
    if (i < o->n_segs && sorted[i].offset + sorted[i].numel > done)
      done = sorted[i].offset + sorted[i].numel;
    done = done > lo ? done : lo;
  }
  free(sorted);
  return st;
}

static bool same_working_config(const dt_working_copy_config *a, const dt_working_copy_config *b) {
  return a->dtype == b->dtype && a->stochastic == b->stochastic &&
         (!a->stochastic || a->seed == b->seed);
}

dt_status dt_optim_use_working_copy(dt_optimizer *o, const dt_working_copy_config *cfg) {
  if (!o || !cfg)
    return DT_ERROR(DT_ERR_INVALID_ARG, "dt_optim_use_working_copy: NULL argument");
  if (o->working && !same_working_config(dt_working_copy_config_of(o->working), cfg))
    dt_optim_drop_working_copy(o);
  if (!o->working)
    DT_CHECK(dt_working_copy_create(o->arena, cfg, &o->working));
  if (dt_working_copy_is_fresh(o->working))
    return DT_OK;
  DT_CHECK(dt_working_copy_rebuild(o->working, 0, dt_param_arena_numel(o->arena), o->steps));
  dt_working_copy_set_fresh(o->working, true);
  return DT_OK;
}

void dt_optim_drop_working_copy(dt_optimizer *o) {
  if (!o)
    return;
  dt_working_copy_destroy(o->working);
  o->working = NULL;
}

void dt_optim_working_copy_invalidate(dt_optimizer *o) {
  if (o && o->working)
    dt_working_copy_set_fresh(o->working, false);
}

dt_tensor *dt_optim_working_copy(const dt_optimizer *o) {
  return o && o->working ? dt_working_copy_data(o->working) : NULL;
}

bool dt_optim_working_copy_is_fresh(const dt_optimizer *o) {
  return o && o->working && dt_working_copy_is_fresh(o->working);
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

int64_t dt_optim_state_numel(const dt_optimizer *o) { return (int64_t)o->n_state * o->local_numel; }

size_t dt_optim_state_bytes(const dt_optimizer *o) {
  return (size_t)dt_optim_state_numel(o) * sizeof(float);
}

dt_status dt_optim_state_get(const dt_optimizer *o, float *host, int64_t numel) {
  if (!o || (!host && numel > 0))
    return DT_ERROR(DT_ERR_INVALID_ARG, "optimizer and host buffer must not be NULL");
  int64_t want = dt_optim_state_numel(o);
  if (numel != want)
    return DT_ERROR(DT_ERR_SHAPE, "%s state holds %lld floats, the buffer %lld", dt_optim_name(o),
                    (long long)want, (long long)numel);
  int64_t n = o->local_numel;
  for (int i = 0; i < o->n_state; i++) {
    if (o->state[i] == NULL) /* before the first step: zeros */
      memset(host + i * n, 0, (size_t)n * sizeof(float));
    else
      DT_CHECK(dt_tensor_to_host(o->state[i], host + i * n, (size_t)n * sizeof(float)));
  }
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
  DT_CHECK(ensure_state(o));
  int64_t n = o->local_numel;
  for (int i = 0; i < o->n_state && n > 0; i++) {
    dt_tensor *t = o->state[i];
    const dt_backend_ops *be = dt_tensor_backend(t);
    DT_CHECK(be->copy(dt_tensor_data(t), dt_tensor_device(t), host + i * n, DT_CPU,
                      (size_t)n * sizeof(float), NULL));
  }
  o->steps = step_count;
  dt_optim_working_copy_invalidate(o); /* a checkpoint's masters come with it */
  return DT_OK;
}

static dt_status check_flat(const dt_optimizer *o, const float *flat, int64_t flat_numel) {
  int64_t want = (int64_t)o->n_state * dt_param_arena_numel(o->arena);
  if (flat_numel != want || (!flat && want > 0))
    return DT_ERROR(DT_ERR_SHAPE,
                    "%s state in the arena's coordinates holds %d x %lld floats, the buffer %lld",
                    dt_optim_name(o), o->n_state, (long long)dt_param_arena_numel(o->arena),
                    (long long)flat_numel);
  return DT_OK;
}

dt_status dt_optim_state_to_flat(const dt_optimizer *o, float *flat, int64_t flat_numel) {
  if (!o)
    return DT_ERROR(DT_ERR_INVALID_ARG, "optimizer is NULL");
  DT_CHECK(check_flat(o, flat, flat_numel));
  int64_t n = dt_param_arena_numel(o->arena), local = dt_optim_state_numel(o);
  float *mine = malloc((size_t)(local > 0 ? local : 1) * sizeof(float));
  if (!mine)
    return DT_ERROR(DT_ERR_OOM, "%s state: out of host memory", dt_optim_name(o));
  dt_status st = dt_optim_state_get(o, mine, local);
  for (int i = 0; i < o->n_state && st == DT_OK; i++)
    for (int k = 0; k < o->n_segs; k++)
      memcpy(flat + i * n + o->segs[k].offset, mine + i * o->local_numel + o->segs[k].local_offset,
             (size_t)o->segs[k].numel * sizeof(float));
  free(mine);
  return st;
}

dt_status dt_optim_state_from_flat(dt_optimizer *o, const float *flat, int64_t flat_numel,
                                   int64_t step_count) {
  if (!o)
    return DT_ERROR(DT_ERR_INVALID_ARG, "optimizer is NULL");
  DT_CHECK(check_flat(o, flat, flat_numel));
  int64_t n = dt_param_arena_numel(o->arena), local = dt_optim_state_numel(o);
  float *mine = calloc((size_t)(local > 0 ? local : 1), sizeof(float));
  if (!mine)
    return DT_ERROR(DT_ERR_OOM, "%s state: out of host memory", dt_optim_name(o));
  for (int i = 0; i < o->n_state; i++)
    for (int k = 0; k < o->n_segs; k++)
      memcpy(mine + i * o->local_numel + o->segs[k].local_offset, flat + i * n + o->segs[k].offset,
             (size_t)o->segs[k].numel * sizeof(float));
  dt_status st = dt_optim_state_set(o, mine, local, step_count);
  free(mine);
  return st;
}

/* ---- shards (ZeRO) ---- */

static dt_status check_shard(const dt_optimizer *o, const dt_optim_shard *sh) {
  int64_t arena_n = dt_param_arena_numel(o->arena);
  if (sh->n_segments < 0 || (sh->n_segments > 0 && sh->segments == NULL) || sh->local_numel < 0)
    return DT_ERROR(DT_ERR_INVALID_ARG, "optimizer shard: %d segments at %p, %lld local elements",
                    sh->n_segments, (const void *)sh->segments, (long long)sh->local_numel);
  for (int i = 0; i < sh->n_segments; i++) {
    const dt_optim_segment *g = &sh->segments[i];
    if (g->offset < 0 || g->numel < 0 || g->local_offset < 0 || g->offset + g->numel > arena_n ||
        g->local_offset + g->numel > sh->local_numel)
      return DT_ERROR(DT_ERR_INVALID_ARG,
                      "optimizer shard: segment %d (arena elements %lld + %lld at local %lld) "
                      "lies outside the arena (%lld) or the shard (%lld)",
                      i, (long long)g->offset, (long long)g->numel, (long long)g->local_offset,
                      (long long)arena_n, (long long)sh->local_numel);
  }
  dt_tensor *g = sh->grads;
  if (g == NULL || dt_tensor_dtype(g) != DT_DTYPE_F32 || dt_tensor_numel(g) != sh->local_numel ||
      !dt_tensor_is_contiguous(g) ||
      !dt_device_equal(dt_tensor_device(g), dt_param_arena_device(o->arena)))
    return DT_ERROR(DT_ERR_INVALID_ARG,
                    "optimizer shard: the gradients must be a contiguous f32 tensor of %lld "
                    "elements on the arena's device",
                    (long long)sh->local_numel);
  return DT_OK;
}

dt_status dt_optim_set_shard(dt_optimizer *o, const dt_optim_shard *shard) {
  if (!o || !shard)
    return DT_ERROR(DT_ERR_INVALID_ARG, "optimizer and shard must not be NULL");
  if (o->steps > 0)
    return DT_ERROR(DT_ERR_STATE,
                    "%s has taken %lld steps: shard it before the first step (load a sharded "
                    "checkpoint with dt_optim_state_set afterwards)",
                    dt_optim_name(o), (long long)o->steps);
  DT_CHECK(check_shard(o, shard));
  dt_optim_segment *segs =
      calloc((size_t)(shard->n_segments > 0 ? shard->n_segments : 1), sizeof *segs);
  if (!segs)
    return DT_ERROR(DT_ERR_OOM, "optimizer shard: out of host memory for %d segments",
                    shard->n_segments);
  if (shard->n_segments > 0)
    memcpy(segs, shard->segments, (size_t)shard->n_segments * sizeof *segs);
  release_state(o);
  free(o->segs);
  dt_tensor_release(o->shard.grads);
  o->segs = segs;
  o->n_segs = shard->n_segments;
  o->local_numel = shard->local_numel;
  o->shard = *shard;
  o->shard.segments = segs;
  dt_tensor_retain(o->shard.grads);
  return DT_OK;
}

int dt_optim_is_sharded(const dt_optimizer *o) { return o->shard.grads != NULL; }
int dt_optim_num_segments(const dt_optimizer *o) { return o->n_segs; }
dt_optim_segment dt_optim_segment_at(const dt_optimizer *o, int i) { return o->segs[i]; }
int64_t dt_optim_local_numel(const dt_optimizer *o) { return o->local_numel; }
dt_tensor *dt_optim_state_tensor(const dt_optimizer *o, int i) {
  return i >= 0 && i < o->n_state ? o->state[i] : NULL;
}

/* ---- clipping ---- */

/* The global norm of the n gradients at g (device of ex); `sum` (NULL =
 * none) adds the other shards' sums of squares. */
static dt_status norm_flat(const dt_exec *ex, const float *g, int64_t n, const dt_optim_shard *sum,
                           double *norm) {
  double sum_sq = 0.0;
  if (n > 0)
    DT_CHECK(dt_kernel_sum_squares(ex, g, n, &sum_sq));
  if (sum != NULL && sum->sum_over_shards != NULL)
    DT_CHECK(sum->sum_over_shards(sum->ctx, &sum_sq, 1));
  *norm = sqrt(sum_sq);
  return DT_OK;
}

/* Clips the n gradients at g (device of ex) to a global norm of max_norm;
 * `sum` (NULL = none) adds the other shards' sums of squares. */
static dt_status clip_flat(const dt_exec *ex, float *g, int64_t n, float max_norm,
                           const dt_optim_shard *sum, double *total_norm) {
  if (total_norm)
    *total_norm = 0.0;
  if (!(max_norm > 0.0f) || !isfinite(max_norm))
    return DT_ERROR(DT_ERR_INVALID_ARG, "max_norm %g: must be finite and > 0", (double)max_norm);
  double norm = 0.0;
  DT_CHECK(norm_flat(ex, g, n, sum, &norm));
  if (total_norm)
    *total_norm = norm;
  /* A non-finite norm fails this test and leaves the gradients as they are
   * (the caller sees it in *total_norm; GradScaler skips such steps). */
  if (norm > (double)max_norm && n > 0) {
    float coef = (float)((double)max_norm / (norm + 1e-6));
    /* g = 0 * g + coef * g: scales in place without relying on x != y. */
    DT_CHECK(dt_kernel_axpby(ex, n, 0.0f, g, coef, g));
  }
  return DT_OK;
}

dt_status dt_clip_grad_norm(dt_param_arena *arena, float max_norm, double *total_norm) {
  if (total_norm)
    *total_norm = 0.0;
  if (!arena)
    return DT_ERROR(DT_ERR_INVALID_ARG, "arena is NULL");
  dt_tensor *grads = dt_param_arena_grads(arena);
  if (grads == NULL)
    return DT_ERROR(DT_ERR_STATE,
                    "clipping: the arena's gradients were dropped (ZeRO stage 2): clip the "
                    "shard through its optimizer (dt_optim_clip_grad_norm)");
  const dt_exec ex = dt_tensor_exec(grads);
  return clip_flat(&ex, dt_tensor_data(grads), dt_param_arena_numel(arena), max_norm, NULL,
                   total_norm);
}

dt_status dt_optim_grad_norm(dt_optimizer *o, double *norm) {
  *norm = 0.0;
  if (!o)
    return DT_ERROR(DT_ERR_INVALID_ARG, "optimizer is NULL");
  dt_tensor *grads = update_grads(o);
  DT_CHECK(check_grads(o, grads));
  const dt_exec ex = dt_tensor_exec(grads);
  return norm_flat(&ex, dt_tensor_data(grads), dt_tensor_numel(grads), &o->shard, norm);
}

dt_status dt_optim_clip_grad_norm(dt_optimizer *o, float max_norm, double *total_norm) {
  if (!o)
    return DT_ERROR(DT_ERR_INVALID_ARG, "optimizer is NULL");
  dt_tensor *grads = update_grads(o);
  DT_CHECK(check_grads(o, grads));
  const dt_exec ex = dt_tensor_exec(grads);
  return clip_flat(&ex, dt_tensor_data(grads), dt_tensor_numel(grads), max_norm, &o->shard,
                   total_norm);
}

/* ---- the GradScaler's access to the gradients ---- */

dt_status dt_optim_scale_grads(dt_optimizer *o, float factor) {
  if (!o)
    return DT_ERROR(DT_ERR_INVALID_ARG, "optimizer is NULL");
  dt_tensor *grads = update_grads(o);
  DT_CHECK(check_grads(o, grads));
  int64_t n = dt_tensor_numel(grads);
  float *g = dt_tensor_data(grads);
  return n > 0 ? dt_kernel_axpby(DT_TENSOR_EXEC(grads), n, 0.0f, g, factor, g) : DT_OK;
}

dt_status dt_optim_poison_grads(dt_optimizer *o) {
  if (!o)
    return DT_ERROR(DT_ERR_INVALID_ARG, "optimizer is NULL");
  dt_tensor *grads = update_grads(o);
  DT_CHECK(check_grads(o, grads));
  if (dt_tensor_numel(grads) == 0)
    return DT_OK;
  return dt_kernel_fill(DT_TENSOR_EXEC(grads), dt_tensor_data(grads), INFINITY, 1);
}
