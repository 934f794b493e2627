/* Helpers the zoo's model builders share (models/gpt2.c, models/llama.c):
 * modules over an impl struct, children attached by name, and the
 * initialisation of every parameter. Not part of the public API. */
#ifndef DT_MODELS_BUILDER_INTERNAL_H
#define DT_MODELS_BUILDER_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "core/module.h"
#include "core/rng.h"

#ifdef __cplusplus
extern "C" {
#endif

/* A module over impl (calloc'd by the caller, freed here when impl is NULL
 * or creation fails: DT_ERR_OOM / the creation's status). */
dt_status dt_models_create_module(const dt_module_vtable *vt, void *impl, dt_module **out);

/* Adds the child a builder made (`built` its status: nothing to add unless
 * DT_OK; *made the child) to m as `name`; *slot borrows it. The child is
 * destroyed when it cannot be added. */
dt_status dt_models_attach(dt_module *m, const char *name, dt_status built, dt_module **made,
                           dt_module **slot);

/* The end of a builder: on failure *out is destroyed and cleared; returns st. */
dt_status dt_models_finish(dt_status st, dt_module **out);

/* *index = the entry named `name` of a table of n entries `stride` bytes
 * apart, each starting with its name (const char *); an unknown name is
 * DT_ERR_INVALID_ARG "unknown <family> configuration" listing the known. */
dt_status dt_models_find_config(const char *family, const char *name, const void *table,
                                size_t stride, int n, int *index);

/* Every parameter of model, in registration order, from one generator
 * seeded with `seed`: std_of(name, ctx, &fill) > 0 draws N(0, std^2), 0
 * sets every element to fill, < 0 keeps the parameter as it is. */
typedef float (*dt_models_std_fn)(const char *name, const void *ctx, float *fill);
dt_status dt_models_init_normal(dt_module *model, uint64_t seed, dt_models_std_fn std_of,
                                const void *ctx);

/* A language model's input: token ids (B, T) with 1 <= T <= context,
 * else DT_ERR_SHAPE naming the family and the context. */
dt_status dt_models_check_tokens(const char *family, const dt_tensor *idx, int64_t context);

/* A model of the zoo: a module of vtable vt over impl (calloc'd by the
 * caller, its configuration filled in; NULL is DT_ERR_OOM), its children
 * made by build(model, impl, gen), gen seeded with `seed`, then every
 * parameter set by dt_models_init_normal(std_of, std_ctx) (the builders'
 * own draws replaced). On failure the model is destroyed and the error
 * says it was building `family` (n_layer layers, C n_embd). */
typedef dt_status (*dt_models_build_fn)(dt_module *model, void *impl, dt_generator *gen);
dt_status dt_models_build(const dt_module_vtable *vt, void *impl, dt_models_build_fn build,
                          uint64_t seed, dt_models_std_fn std_of, const void *std_ctx,
                          const char *family, int n_layer, int n_embd, dt_module **out);

#ifdef __cplusplus
}
#endif
#endif
