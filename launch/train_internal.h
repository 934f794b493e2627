/* Shared by the training loop's files (train_loop.c, train_eval.c,
 * train_dp.c); not a public header. */
#ifndef DT_LAUNCH_TRAIN_INTERNAL_H
#define DT_LAUNCH_TRAIN_INTERNAL_H

#include "core/data.h"
#include "core/module.h"
#include "core/optim.h"
#include "dist/comm.h"
#include "dist/ddp.h"
#include "dist/dp.h"
#include "launch/train_loop.h"

/* Everything one run owns, released in reverse order by state_destroy. */
typedef struct train_state {
  dt_device dev;
  dt_dataset *train_set;
  dt_dataset *test_set;
  dt_sampler *sampler;
  dt_loader *loader;
  /* Owned in single-process and DDP runs; in dp mode, replica 0's objects
   * (borrowed from `dp`). */
  dt_module *model;
  dt_param_arena *arena;
  dt_optimizer *opt;
  dt_lr_schedule schedule;
  int64_t batches_per_epoch; /* micro-batches run per epoch */
  int64_t steps_per_epoch;   /* optimizer steps per epoch */
  /* DDP (world > 1) */
  int rank, world;
  dt_comm *comm;
  dt_ddp *ddp;
  /* Data-parallel mode */
  dt_dp *dp;
  int n_replicas;
} train_state;

/* The configured optimizer over `arena`. */
dt_status train_build_optimizer(const dt_train_config *c, dt_param_arena *arena,
                                dt_optimizer **out);

/* Data-parallel mode (train_dp.c). */
dt_status train_dp_create(const dt_train_config *c, train_state *s);
/* Forward + backward of one micro-batch over the replicas; *loss gets the
 * unscaled mean loss. `sync` = 0 inside an accumulation group. */
dt_status train_dp_micro_batch(train_state *s, dt_tensor *x, dt_tensor *y, int group, int sync,
                               double *loss);
dt_status train_dp_optimizer_step(const dt_train_config *c, train_state *s);

#endif
