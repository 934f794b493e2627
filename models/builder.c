/* Helpers the zoo's model builders share (models/builder_internal.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/rng.h"
#include "core/tensor.h"
#include "models/builder_internal.h"

dt_status dt_models_create_module(const dt_module_vtable *vt, void *impl, dt_module **out) {
  if (!impl)
    return DT_ERROR(DT_ERR_OOM, "no host memory for a %s module", vt->type_name);
  dt_status st = dt_module_create(vt, impl, out);
  if (st != DT_OK)
    free(impl);
  return st;
}

dt_status dt_models_attach(dt_module *m, const char *name, dt_status built, dt_module **made,
                           dt_module **slot) {
  DT_CHECK(built);
  dt_module *child = *made; /* read after the builder ran (argument order) */
  dt_status st = dt_module_add_child(m, name, child);
  if (st != DT_OK) {
    dt_module_destroy(child);
    return st;
  }
  *slot = child;
  return DT_OK;
}

dt_status dt_models_finish(dt_status st, dt_module **out) {
  if (st != DT_OK) {
    dt_module_destroy(*out);
    *out = NULL;
  }
  return st;
}

dt_status dt_models_init_normal(dt_module *model, uint64_t seed, dt_models_std_fn std_of,
                                const void *ctx) {
  dt_generator gen;
  dt_generator_init(&gen, seed);
  for (int i = 0; i < dt_module_num_parameters(model); i++) {
    const char *name = NULL;
    dt_tensor *p = dt_module_parameter_at(model, i, &name);
    int64_t n = dt_tensor_numel(p);
    float fill = 0.0f, std = std_of(name, ctx, &fill);
    if (std < 0.0f)
      continue; /* kept as the builder drew it */
    float *v = malloc((size_t)(n > 0 ? n : 1) * sizeof *v);
    if (!v)
      return DT_ERROR(DT_ERR_OOM, "no host memory to initialise %s (%lld floats)", name,
                      (long long)n);
    for (int64_t j = 0; j < n; j++)
      v[j] = std > 0.0f ? std * dt_generator_normal(&gen) : fill;
    dt_tensor *host = NULL;
    dt_status st = dt_tensor_from_host(v, dt_tensor_shape(p), dt_tensor_ndim(p), DT_DTYPE_F32,
                                       dt_tensor_device(p), &host);
    free(v);
    if (st == DT_OK)
      st = dt_tensor_copy_(p, host);
    dt_tensor_release(host);
    DT_CHECK(st);
  }
  return DT_OK;
}

dt_status dt_models_find_config(const char *family, const char *name, const void *table,
                                size_t stride, int n, int *index) {
  char names[160] = "";
  size_t used = 0;
  for (int i = 0; i < n; i++) {
    const char *known = *(const char *const *)((const char *)table + (size_t)i * stride);
    if (name && !strcmp(name, known)) {
      *index = i;
      return DT_OK;
    }
    if (used < sizeof names)
      used += (size_t)snprintf(names + used, sizeof names - used, "%s%s", i ? ", " : "", known);
  }
  return DT_ERROR(DT_ERR_INVALID_ARG, "unknown %s configuration \"%s\": known are %s", family,
                  name ? name : "(null)", names);
}

dt_status dt_models_build(const dt_module_vtable *vt, void *impl, dt_models_build_fn build,
                          uint64_t seed, dt_models_std_fn std_of, const void *std_ctx,
                          const char *family, int n_layer, int n_embd, dt_module **out) {
  dt_module *model = NULL;
  DT_CHECK(dt_models_create_module(vt, impl, &model));
  dt_generator gen;
  dt_generator_init(&gen, seed);
  dt_status st = build(model, impl, &gen);
  if (st == DT_OK)
    st = dt_models_init_normal(model, seed, std_of, std_ctx);
  if (st != DT_OK) {
    dt_module_destroy(model);
    return dt_error_wrap(st, "building %s (%d layers, C %d)", family, n_layer, n_embd);
  }
  *out = model;
  return DT_OK;
}

dt_status dt_models_check_tokens(const char *family, const dt_tensor *idx, int64_t context) {
  if (dt_tensor_ndim(idx) == 2 && dt_tensor_dim(idx, 1) >= 1 && dt_tensor_dim(idx, 1) <= context)
    return DT_OK;
  char d[96];
  return DT_ERROR(DT_ERR_SHAPE,
                  "%s takes token ids (B, T) with 1 <= T <= %lld (its context), got %s", family,
                  (long long)context, dt_tensor_describe(idx, d, sizeof d));
}

/* A ResNet's residual blocks (layer1.0, layer1.1, ... layer4.*). */
static void set_resnet_recompute(dt_module *model, int on) {
  static const char *stages[4] = {"layer1", "layer2", "layer3", "layer4"};
  for (int s = 0; s < 4; s++) {
    dt_module *stage = dt_module_child(model, stages[s]);
    for (int i = 0; stage != NULL && i < dt_module_num_children(stage); i++)
      dt_module_set_recompute(dt_module_child_at(stage, i), on);
  }
}

dt_status dt_model_set_recompute(dt_module *model, int on) {
  const char *type = model != NULL ? dt_module_type_name(model) : "(none)";
  if (!strcmp(type, "ResNet")) {
    set_resnet_recompute(model, on);
    return DT_OK;
  }
  const char *blocks_name = !strcmp(type, "GPT2")               ? "h"
                            : !strcmp(type, "LlamaForCausalLM") ? "layers"
                                                                : NULL;
  dt_module *blocks = blocks_name != NULL ? dt_module_child(model, blocks_name) : NULL;
  if (blocks == NULL)
    return DT_ERROR(DT_ERR_INVALID_ARG,
                    "recomputation is per transformer or residual block: a GPT-2, Llama or ResNet "
                    "model, not a %s",
                    type);
  for (int i = 0; i < dt_module_num_children(blocks); i++)
    dt_module_set_recompute(dt_module_child_at(blocks, i), on);
  return DT_OK;
}
