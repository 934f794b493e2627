/* Helpers shared by the built-in modules: creation with ownership of impl,
 * registration that hands over a reference, host-side initialisation. */
#include <stdlib.h>

#include "core/nn_internal.h"
#include "core/tensor_internal.h"

dt_status dt_nn_create(const dt_module_vtable *vt, void *impl, dt_module **out) {
  if (impl == NULL)
    return DT_ERROR(DT_ERR_OOM, "allocating the state of a %s module: out of host memory",
                    vt->type_name);
  dt_status st = dt_module_create(vt, impl, out);
  if (st != DT_OK)
    free(impl);
  return st;
}

dt_status dt_nn_finish_create(dt_module *m, dt_status st, dt_module **out) {
  if (st != DT_OK) {
    dt_module_destroy(m);
    return st;
  }
  *out = m;
  return DT_OK;
}

dt_status dt_nn_add_parameter(dt_module *m, const char *name, dt_tensor *t) {
  dt_status st = dt_module_register_parameter(m, name, t);
  dt_tensor_release(t);
  return st;
}

dt_status dt_nn_add_buffer(dt_module *m, const char *name, dt_tensor *t) {
  dt_status st = dt_module_register_buffer(m, name, t);
  dt_tensor_release(t);
  return st;
}

typedef enum { INIT_UNIFORM, INIT_NORMAL, INIT_CONSTANT } init_kind;

static dt_status init_host(const int64_t *shape, int ndim, init_kind kind, float scale,
                           dt_generator *gen, dt_tensor **out) {
  if (kind != INIT_CONSTANT && gen == NULL)
    return DT_ERROR(DT_ERR_INVALID_ARG,
                    "initialising a parameter: the generator is NULL: pass a dt_generator "
                    "seeded with dt_generator_init()");
  int64_t n = dt_shape_numel(shape, ndim);
  float *host = malloc((size_t)(n > 0 ? n : 1) * sizeof *host);
  if (host == NULL)
    return DT_ERROR(DT_ERR_OOM, "initialising a parameter of %lld elements: out of host memory",
                    (long long)n);
  for (int64_t i = 0; i < n; i++) {
    switch (kind) {
      case INIT_UNIFORM: host[i] = (2.0f * dt_generator_uniform(gen) - 1.0f) * scale; break;
      case INIT_NORMAL: host[i] = dt_generator_normal(gen) * scale; break;
      case INIT_CONSTANT: host[i] = scale; break;
    }
  }
  dt_status st = dt_tensor_from_host(host, shape, ndim, DT_DTYPE_F32, DT_CPU, out);
  free(host);
  return st;
}

dt_status dt_nn_uniform(const int64_t *shape, int ndim, float bound, dt_generator *gen,
                        dt_tensor **out) {
  return init_host(shape, ndim, INIT_UNIFORM, bound, gen, out);
}

dt_status dt_nn_normal(const int64_t *shape, int ndim, float std, dt_generator *gen,
                       dt_tensor **out) {
  return init_host(shape, ndim, INIT_NORMAL, std, gen, out);
}

dt_status dt_nn_constant(const int64_t *shape, int ndim, float value, dt_tensor **out) {
  return init_host(shape, ndim, INIT_CONSTANT, value, NULL, out);
}

dt_status dt_nn_param(dt_module *m, const char *name, dt_tensor **out) {
  *out = dt_module_parameter(m, name);
  if (*out == NULL)
    return DT_ERROR(DT_ERR_STATE, "%s module has no parameter \"%s\"", dt_module_type_name(m),
                    name);
  return DT_OK;
}

dt_status dt_nn_weight_bias(dt_module *m, int has_bias, dt_tensor **weight, dt_tensor **bias) {
  *bias = NULL;
  DT_CHECK(dt_nn_param(m, "weight", weight));
  if (has_bias)
    DT_CHECK(dt_nn_param(m, "bias", bias));
  return DT_OK;
}
