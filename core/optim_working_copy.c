/* The 16-bit working copy of the weights (core/optim_internal.h). */
#include <stdlib.h>

#include "core/optim_internal.h"
#include "core/rng.h"
#include "core/tensor_internal.h"

struct dt_working_copy {
  dt_param_arena *arena; /* borrowed */
  dt_working_copy_config cfg;
  dt_tensor *data; /* flat (arena numel) 16-bit */
  bool fresh;      /* the parameters' half_fresh point here */
};

static void unlink_params(dt_working_copy *w) {
  for (int i = 0; i < dt_param_arena_count(w->arena); i++) {
    dt_tensor *p = dt_param_arena_param(w->arena, i, NULL);
    if (p->half_fresh != &w->fresh)
      continue;
    dt_tensor_release(p->half_copy);
    p->half_copy = NULL;
    p->half_fresh = NULL;
  }
}

void dt_working_copy_destroy(dt_working_copy *w) {
  if (!w)
    return;
  unlink_params(w);
  dt_tensor_release(w->data);
  free(w);
}

dt_status dt_working_copy_create(dt_param_arena *arena, const dt_working_copy_config *cfg,
                                 dt_working_copy **out) {
  *out = NULL;
  if (cfg->dtype != DT_DTYPE_BF16 && cfg->dtype != DT_DTYPE_F16)
    return DT_ERROR(DT_ERR_DTYPE, "the working copy of the weights is %s: expected bf16 or f16",
                    dt_dtype_name(cfg->dtype));
  dt_working_copy *w = calloc(1, sizeof *w);
  if (!w)
    return DT_ERROR(DT_ERR_OOM, "cannot allocate the working copy of the weights");
  w->arena = arena;
  w->cfg = *cfg;
  int64_t numel = dt_param_arena_numel(arena);
  dt_status st = dt_tensor_empty(&numel, 1, cfg->dtype, dt_param_arena_device(arena), &w->data);
  if (st != DT_OK) {
    free(w);
    return dt_error_wrap(st, "the %s working copy of %lld weights", dt_dtype_name(cfg->dtype),
                         (long long)numel);
  }
  for (int i = 0; i < dt_param_arena_count(arena) && st == DT_OK; i++) {
    dt_tensor *p = dt_param_arena_param(arena, i, NULL);
    dt_tensor *view = NULL;
    st = dt_tensor_view_flat(w->data, dt_param_arena_offset(arena, i), dt_tensor_shape(p),
                             dt_tensor_ndim(p), &view);
    if (st != DT_OK)
      break;
    dt_tensor_release(p->half_copy); /* an earlier optimizer's, if any */
    p->half_copy = view;
    p->half_fresh = &w->fresh;
  }
  if (st != DT_OK) {
    dt_working_copy_destroy(w);
    return st;
  }
  *out = w;
  return DT_OK;
}

const dt_working_copy_config *dt_working_copy_config_of(const dt_working_copy *w) {
  return &w->cfg;
}

dt_half_out dt_working_copy_out(const dt_working_copy *w, int64_t start, int64_t steps) {
  dt_half_out h = {(uint16_t *)dt_tensor_data(w->data) + start, w->cfg.dtype, w->cfg.stochastic, 0,
                   0};
  if (w->cfg.stochastic) {
    h.seed = dt_rng_bits(w->cfg.seed, (uint64_t)steps); /* a stream per step */
    h.offset = (uint64_t)start;
  }
  return h;
}

dt_status dt_working_copy_rebuild(dt_working_copy *w, int64_t start, int64_t n, int64_t steps) {
  if (n <= 0)
    return DT_OK;
  dt_tensor *masters = dt_param_arena_data(w->arena);
  const dt_exec ex = dt_tensor_exec(masters);
  dt_half_out h = dt_working_copy_out(w, start, steps);
  return dt_kernel_half_copy(&ex, (const float *)dt_tensor_data(masters) + start, n, &h);
}

void dt_working_copy_set_fresh(dt_working_copy *w, bool fresh) { w->fresh = fresh; }
bool dt_working_copy_is_fresh(const dt_working_copy *w) { return w->fresh; }
dt_tensor *dt_working_copy_data(const dt_working_copy *w) { return w->data; }
