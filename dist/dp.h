/* Single-process data parallelism over the devices of one node.
 *
 * One worker thread and one full replica (model, parameter arena,
 * optimizer, DDP reducer) per device; each batch is split across the
 * replicas; gradients are averaged by the same DDP reducer as multi-process
 * training, over the `local` communicator (cpu devices) or an NCCL clique
 * from ncclCommInitAll (cuda devices: each replica thread enqueues on its
 * own GPU's comm stream; cfg.comm.backend = mpi, or auto without NCCL,
 * host-stages the gradients through the local communicator instead); every
 * replica runs forward, backward and its own optimizer step on its own
 * device on identical gradients, so no device is special (nothing is
 * gathered to one GPU) and the replicas stay identical.
 *
 *   dt_dp_config cfg = DT_DP_CONFIG_DEFAULT;
 *   cfg.step.loss = task->loss;                 // the caller's loss (models/tasks.h)
 *   dt_device devs[2] = {{DT_DEVICE_CPU, 0}, {DT_DEVICE_CPU, 1}};
 *   dt_dp *dp;
 *   DT_CHECK(dt_dp_create(devs, 2, build_model, &seed, build_sgd, &sgd_cfg, &cfg, &dp));
 *   double loss;
 *   DT_CHECK(dt_dp_step(dp, inputs, targets, &loss));  // forward, backward, reduce, step
 *   dt_dp_destroy(dp);
 *
 * Every replica runs the one training step (core/step.h) on its slice of
 * the batch, with the loss, clipping and learning-rate schedule of
 * cfg.step: this mode never chooses a loss. The loss must be a mean over
 * the samples; uneven splits are then exact: replica r's mean over its b_r
 * samples is weighted by n * b_r / B before backward, so the averaged
 * gradient is the gradient of the mean over all B samples.
 *
 * CPU threads: every replica runs the CPU kernels from its own thread, and
 * OpenMP's thread count is a per-thread setting, so each replica thread
 * sets its own (cfg.threads_per_replica) before it does anything else;
 * otherwise every replica would start a team of one thread per core and
 * they would fight over the cores.
 * Functions other than the accessors must be called from one thread.
 */
#ifndef DT_DIST_DP_H
#define DT_DIST_DP_H

#include <stdbool.h>

#include "core/module.h"
#include "core/ops.h"
#include "core/optim.h"
#include "core/status.h"
#include "core/step.h"
#include "core/tensor.h"
#include "dist/comm.h"
#include "dist/ddp.h"
#include "dist/replica.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Builds replica `replica`'s model (anywhere; dp moves it to the replica's
 * device). Every replica must get the same architecture; parameters are
 * broadcast from replica 0 anyway. Called on the replica's thread. */
typedef dt_status (*dt_dp_model_fn)(void *user, int replica, dt_module **out);
/* Builds replica `replica`'s optimizer over its arena. */
typedef dt_replica_optim_fn dt_dp_optim_fn;

typedef struct dt_dp_config {
  dt_ddp_config ddp;
  dt_comm_config comm;
  /* The step every replica runs: loss (required), clipping, learning-rate
   * schedule (borrowed: it must outlive the dp). */
  dt_step_config step;
  /* CPU threads each replica thread runs its kernels with
   * (dt_cpu_set_num_threads on that thread, first thing). 0 = the caller's
   * count at dt_dp_create (dt_cpu_num_threads()) shared out: max(1, that / n).
   * dt_cpu_num_threads() reports the per-replica count afterwards. */
  int threads_per_replica;
} dt_dp_config;
#define DT_DP_CONFIG_DEFAULT \
  ((dt_dp_config){DT_DDP_CONFIG_DEFAULT, DT_COMM_CONFIG_DEFAULT, DT_STEP_CONFIG_DEFAULT, 0})

typedef struct dt_dp dt_dp;

/* Starts one thread per device and builds the replicas. Devices must be
 * distinct and of one type (all cpu or all cuda); cfg (NULL = the
 * defaults) must give cfg->step.loss (DT_ERR_INVALID_ARG otherwise).
 * The user pointers must stay valid during the call only. */
dt_status dt_dp_create(const dt_device *devices, int n_devices, dt_dp_model_fn model_fn,
                       void *model_user, dt_dp_optim_fn optim_fn, void *optim_user,
                       const dt_dp_config *cfg, dt_dp **out);
/* Stops the threads and frees every replica. NULL is a no-op. */
void dt_dp_destroy(dt_dp *dp);

int dt_dp_num_replicas(const dt_dp *dp);

/* Forward and backward of one (micro-)batch: inputs (B, ...) and targets
 * (B, ...) on any device, B >= replicas; each replica takes its slice of
 * both. Each replica's loss is multiplied by `loss_scale` (1/K for K
 * accumulated micro-batches) before backward. sync true all-reduces the
 * gradients (accumulated ones included); false only accumulates (DDP
 * no_sync). *loss (may be NULL) receives the unscaled mean loss over the B
 * samples. */
dt_status dt_dp_forward_backward(dt_dp *dp, dt_tensor *inputs, dt_tensor *targets, float loss_scale,
                                 bool sync, double *loss);
/* dt_step_update on every replica: clipping, learning rate, optimizer step,
 * zero_grad (cfg.step). */
dt_status dt_dp_optimizer_step(dt_dp *dp);
/* Drops every replica's gradients without a step (dt_optim_zero_grad): a
 * step abandoned after an out-of-memory error, to be redone. */
dt_status dt_dp_zero_grad(dt_dp *dp);
/* dt_dp_forward_backward(scale 1, sync) + dt_dp_optimizer_step. */
dt_status dt_dp_step(dt_dp *dp, dt_tensor *inputs, dt_tensor *targets, double *loss);

/* Replica i (borrowed; its objects through dist/replica.h). Replica 0's
 * model is the one to evaluate or checkpoint: all replicas hold the same
 * parameters. */
dt_replica *dt_dp_replica(const dt_dp *dp, int i);

#ifdef __cplusplus
}
#endif
#endif
