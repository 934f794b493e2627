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
 *   dt_device devs[2] = {{DT_DEVICE_CPU, 0}, {DT_DEVICE_CPU, 1}};
 *   dt_dp *dp;
 *   DT_CHECK(dt_dp_create(devs, 2, build_model, &seed, build_sgd, &sgd_cfg, &cfg, &dp));
 *   double loss;
 *   DT_CHECK(dt_dp_step(dp, inputs, labels, &loss));  // forward, backward, reduce, step
 *   dt_dp_destroy(dp);
 *
 * Loss: cross-entropy, mean over the whole batch. Uneven splits are exact:
 * replica r's mean loss over its b_r samples is weighted by n * b_r / B
 * before backward, so the averaged gradient is the gradient of the mean
 * over all B samples.
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

#include "core/module.h"
#include "core/ops.h"
#include "core/optim.h"
#include "core/status.h"
#include "core/tensor.h"
#include "dist/comm.h"
#include "dist/ddp.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Builds replica `replica`'s model (anywhere; dp moves it to the replica's
 * device). Every replica must get the same architecture; parameters are
 * broadcast from replica 0 anyway. Called on the replica's thread. */
typedef dt_status (*dt_dp_model_fn)(void *user, int replica, dt_module **out);
/* Builds replica `replica`'s optimizer over its arena. */
typedef dt_status (*dt_dp_optim_fn)(void *user, int replica, dt_param_arena *arena,
                                    dt_optimizer **out);

typedef struct dt_dp_config {
  dt_ddp_config ddp;
  dt_comm_config comm;
  int64_t ignore_index; /* cross-entropy target to ignore (DT_IGNORE_INDEX) */
  /* CPU threads each replica thread runs its kernels with
   * (dt_cpu_set_num_threads on that thread, first thing). 0 = the caller's
   * count at dt_dp_create (dt_cpu_num_threads()) shared out: max(1, that / n).
   * dt_cpu_num_threads() reports the per-replica count afterwards. */
  int threads_per_replica;
} dt_dp_config;
#define DT_DP_CONFIG_DEFAULT \
  ((dt_dp_config){DT_DDP_CONFIG_DEFAULT, DT_COMM_CONFIG_DEFAULT, DT_IGNORE_INDEX, 0})

typedef struct dt_dp dt_dp;

/* Starts one thread per device and builds the replicas. Devices must be
 * distinct and of one type (all cpu or all cuda).
 * The user pointers must stay valid during the call only. */
dt_status dt_dp_create(const dt_device *devices, int n_devices, dt_dp_model_fn model_fn,
                       void *model_user, dt_dp_optim_fn optim_fn, void *optim_user,
                       const dt_dp_config *cfg, dt_dp **out);
/* Stops the threads and frees every replica. NULL is a no-op. */
void dt_dp_destroy(dt_dp *dp);

int dt_dp_num_replicas(const dt_dp *dp);

/* Forward and backward of one (micro-)batch: inputs (B, ...) f32 and labels
 * (B) i32/i64 on any device, B >= replicas. Each replica's loss is
 * multiplied by `loss_scale` (1/K for K accumulated micro-batches) before
 * backward. sync = 1 all-reduces the gradients (accumulated ones included);
 * sync = 0 only accumulates (DDP no_sync). *loss (may be NULL) receives the
 * unscaled mean cross-entropy over the B samples. */
dt_status dt_dp_forward_backward(dt_dp *dp, dt_tensor *inputs, dt_tensor *labels,
                                 float loss_scale, int sync, double *loss);
/* Optimizer step then zero_grad on every replica. */
dt_status dt_dp_optimizer_step(dt_dp *dp);
/* dt_dp_forward_backward(scale 1, sync) + dt_dp_optimizer_step. */
dt_status dt_dp_step(dt_dp *dp, dt_tensor *inputs, dt_tensor *labels, double *loss);
/* Global-norm clipping on every replica (after the reduction, before the
 * step). *norm (may be NULL) gets replica 0's norm before clipping. */
dt_status dt_dp_clip_grad_norm(dt_dp *dp, float max_norm, double *norm);
void dt_dp_set_lr(dt_dp *dp, float lr);

/* Replica i's objects (borrowed). Replica 0's model is the one to evaluate
 * or checkpoint: all replicas hold the same parameters. */
dt_module *dt_dp_replica_model(const dt_dp *dp, int i);
dt_param_arena *dt_dp_replica_arena(const dt_dp *dp, int i);
dt_optimizer *dt_dp_replica_optimizer(const dt_dp *dp, int i);
dt_ddp *dt_dp_replica_ddp(const dt_dp *dp, int i);
dt_device dt_dp_replica_device(const dt_dp *dp, int i);

#ifdef __cplusplus
}
#endif
#endif
