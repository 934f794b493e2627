/* Helpers shared by the built-in modules (core/nn_*.c). Not public. */
#ifndef DT_CORE_NN_INTERNAL_H
#define DT_CORE_NN_INTERNAL_H

#include <stdbool.h>
#include <stdint.h>

#include "core/module.h"
#include "core/rng.h"

#ifdef __cplusplus
extern "C" {
#endif

/* dt_module_create that frees `impl` (with free()) when it fails. */
dt_status dt_nn_create(const dt_module_vtable *vt, void *impl, dt_module **out);

/* Ends a builder whose initialisation returned st: *out = m on DT_OK, else
 * m is destroyed (and *out untouched). Returns st. */
dt_status dt_nn_finish_create(dt_module *m, dt_status st, dt_module **out);

/* Registers `t` as parameter / buffer `name` and drops the caller's
 * reference, also on failure (so builders can hand over fresh tensors). */
dt_status dt_nn_add_parameter(dt_module *m, const char *name, dt_tensor *t);
dt_status dt_nn_add_buffer(dt_module *m, const char *name, dt_tensor *t);

/* New CPU f32 tensors, initialised on the host. Uniform draws
 * (2u - 1) * bound for u = dt_generator_uniform(gen), in row-major order. */
dt_status dt_nn_uniform(const int64_t *shape, int ndim, float bound, dt_generator *gen,
                        dt_tensor **out);
dt_status dt_nn_normal(const int64_t *shape, int ndim, float std, dt_generator *gen,
                       dt_tensor **out);
dt_status dt_nn_constant(const int64_t *shape, int ndim, float value, dt_tensor **out);

/* Fetches a registered parameter or reports which module lacks it. */
dt_status dt_nn_param(dt_module *m, const char *name, dt_tensor **out);

/* Fetches "weight" and, when has_bias, "bias" (*bias = NULL otherwise). */
dt_status dt_nn_weight_bias(dt_module *m, int has_bias, dt_tensor **weight, dt_tensor **bias);

/* dt_module_call without the recompute dispatch: pre-hooks, forward,
 * hooks, recorded on the tape as grad mode says. */
dt_status dt_module_call_recorded(dt_module *m, dt_tensor *input, dt_tensor **output);

/* dt_module_call of a module with recompute on, in grad mode
 * (core/nn_recompute.c). */
dt_status dt_nn_recompute_call(dt_module *m, dt_tensor *input, dt_tensor **output);

/* Sets the channels-last flag of m when it is a Conv2d (1), a BatchNorm2d
 * (1), else 0 (dt_nn_set_channels_last walks the tree with these). */
int dt_nn_conv2d_channels_last(dt_module *m, bool on);
int dt_nn_batch_norm_channels_last(dt_module *m, bool on);

/* The generator of a Dropout module (dt_nn_dropout), NULL for any other. */
dt_generator *dt_nn_dropout_generator(dt_module *m);
/* Nonzero while this thread re-runs a recomputed module in backward
 * (core/nn_recompute.c): BatchNorm leaves its running statistics alone. */
int dt_nn_recomputing(void);

#ifdef __cplusplus
}
#endif
#endif
