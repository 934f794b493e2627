/* DDP internals shared by ddp.c and ddp_verify.c. */
#ifndef DT_DIST_DDP_INTERNAL_H
#define DT_DIST_DDP_INTERNAL_H

#include "core/module.h"
#include "dist/comm.h"

/* Checks (collectively) that every rank registered the same parameters and
 * buffers, in the same order, with the same names, shapes and dtypes.
 * DT_ERR_DIST_MISMATCH on every rank, naming the first difference between
 * rank 0 and the lowest rank that differs from it. */
dt_status dt_ddp_verify_parameters(dt_comm *comm, dt_module *model, dt_param_arena *arena);

#endif
