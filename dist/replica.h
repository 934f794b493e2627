/* One model replica and the training step over it: the model on its
 * device, its flat parameter arena, the optimizer and, once connected to a
 * communicator, the DDP reducer. A single process trains one replica, a DDP
 * rank one, the data-parallel mode (dist/dp.h) one per device; bench times
 * one. All of them build, step and free it here.
 *
 *   dt_replica *r;
 *   DT_CHECK(dt_replica_create(model, dev, 0, build_optimizer, &spec, &step_cfg, &r));
 *   DT_CHECK(dt_replica_connect(r, comm, &ddp_cfg));   // DDP, collective (optional)
 *   DT_CHECK(dt_step_forward_backward(dt_replica_step(r), x, y, 1.0f, true, NULL));
 *   DT_CHECK(dt_step_update(dt_replica_step(r)));
 *   dt_replica_destroy(r);
 */
#ifndef DT_DIST_REPLICA_H
#define DT_DIST_REPLICA_H

#include "core/module.h"
#include "core/optim.h"
#include "core/status.h"
#include "core/step.h"
#include "dist/comm.h"
#include "dist/ddp.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Builds replica `replica`'s optimizer over its arena. */
typedef dt_status (*dt_replica_optim_fn)(void *user, int replica, dt_param_arena *arena,
                                         dt_optimizer **out);

typedef struct dt_replica dt_replica;

/* Takes `model` (also on failure): moves it to `device`, sets training mode,
 * flattens its parameters into an arena, builds the optimizer with
 * optim_fn(optim_user, index, arena) (the user pointer is used during the
 * call only). The step runs with *step (copied; its schedule and on_phase
 * user are borrowed) and no gradient reduction until dt_replica_connect. */
dt_status dt_replica_create(dt_module *model, dt_device device, int index,
                            dt_replica_optim_fn optim_fn, void *optim_user,
                            const dt_step_config *step, dt_replica **out);

/* Collective over `comm`, which the replica takes (also on failure): the DDP
 * reducer (dist/ddp.h: parameters checked and broadcast from rank 0), whose
 * hooks the step then uses; with cfg->zero_stage > 0 it shards the
 * replica's optimizer (dt_ddp_shard_optimizer). Once per replica. */
dt_status dt_replica_connect(dt_replica *r, dt_comm *comm, const dt_ddp_config *cfg);

/* Frees the reducer, the communicator, the optimizer, the arena and the
 * model, in that order. NULL is a no-op. */
void dt_replica_destroy(dt_replica *r);

/* What this replica holds for the optimizer's state (allocated at its
 * first step) and for gradients (dt_ddp_gradient_bytes; without a reducer
 * the arena's flat buffer), in bytes: ZeRO's per-rank figures. */
typedef struct dt_replica_memory {
  size_t optimizer_state;
  size_t gradients; /* kept between steps (dt_ddp_gradient_bytes) */
  size_t
      gradients_in_flight; /* stage 2: bucket buffers at their peak (dt_ddp_bucket_buffer_peak) */
} dt_replica_memory;
dt_replica_memory dt_replica_memory_use(const dt_replica *r);

/* The training step over this replica (core/step.h). */
const dt_step *dt_replica_step(const dt_replica *r);

/* Borrowed. comm and ddp are NULL before dt_replica_connect. */
dt_device dt_replica_device(const dt_replica *r);
dt_module *dt_replica_model(const dt_replica *r);
dt_param_arena *dt_replica_arena(const dt_replica *r);
dt_optimizer *dt_replica_optimizer(const dt_replica *r);
dt_comm *dt_replica_comm(const dt_replica *r);
dt_ddp *dt_replica_ddp(const dt_replica *r);

#ifdef __cplusplus
}
#endif
#endif
