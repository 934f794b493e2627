/* The optimizer's 16-bit working copy of the weights (core/optim.h,
 * dt_optim_use_working_copy): one flat 16-bit buffer beside the arena's f32
 * masters, each parameter's piece a view the parameter tensor links to
 * (dt_tensor.half_copy) for the LOW ops. Private to core/optim_*.c. */
#ifndef DT_CORE_OPTIM_INTERNAL_H
#define DT_CORE_OPTIM_INTERNAL_H

#include <stdbool.h>
#include <stdint.h>

#include "core/backend.h"
#include "core/module.h"
#include "core/optim.h"

typedef struct dt_working_copy dt_working_copy;

/* A working copy of every arena parameter, linked to the parameters and
 * not yet fresh (dt_working_copy_rebuild fills it). */
dt_status dt_working_copy_create(dt_param_arena *arena, const dt_working_copy_config *cfg,
                                 dt_working_copy **out);
/* Unlinks the parameters (a LOW op that still holds a piece keeps it). */
void dt_working_copy_destroy(dt_working_copy *w);
const dt_working_copy_config *dt_working_copy_config_of(const dt_working_copy *w);

/* The kernels' 16-bit output for arena elements [start, ...) of the working
 * copy after `steps` optimizer updates (the stochastic draws depend on the
 * seed, `steps` and the arena index: the same on every rank and resume). */
dt_half_out dt_working_copy_out(const dt_working_copy *w, int64_t start, int64_t steps);
/* Converts the masters of arena elements [start, start + n) (on the
 * device's compute stream), as the optimizer would after `steps` updates. */
dt_status dt_working_copy_rebuild(dt_working_copy *w, int64_t start, int64_t n, int64_t steps);

/* Whether the copy holds the masters' current values: the LOW ops use it
 * only then. */
void dt_working_copy_set_fresh(dt_working_copy *w, bool fresh);
bool dt_working_copy_is_fresh(const dt_working_copy *w);
dt_tensor *dt_working_copy_data(const dt_working_copy *w); /* flat (arena numel), borrowed */

#endif
