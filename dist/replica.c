/* A model replica with its arena, optimizer and reducer (dist/replica.h). */
#include "dist/replica.h"

#include <stdlib.h>

struct dt_replica {
  dt_device device;
  dt_step step; /* model, arena, optimizer, sync hooks, config */
  dt_comm *comm;
  dt_ddp *ddp;
};

void dt_replica_destroy(dt_replica *r) {
  if (r == NULL)
    return;
  dt_ddp_destroy(r->ddp);
  dt_comm_destroy(r->comm);
  dt_optim_destroy(r->step.opt);
  dt_param_arena_destroy(r->step.arena);
  dt_module_destroy(r->step.model);
  free(r);
}

dt_status dt_replica_create(dt_module *model, dt_device device, int index,
                            dt_replica_optim_fn optim_fn, void *optim_user,
                            const dt_step_config *step, dt_replica **out) {
  if (model == NULL || optim_fn == NULL || step == NULL || out == NULL) {
    dt_module_destroy(model);
    return DT_ERROR(DT_ERR_INVALID_ARG,
                    "replica %d: model, optimizer builder, step config and out are required",
                    index);
  }
  *out = NULL;
  dt_replica *r = calloc(1, sizeof *r);
  if (r == NULL) {
    dt_module_destroy(model);
    return DT_ERROR(DT_ERR_OOM, "replica %d: out of host memory", index);
  }
  r->device = device;
  r->step.model = model;
  r->step.sync = DT_GRAD_SYNC_NONE;
  r->step.cfg = *step;
  dt_status st;
  DT_CHECK_GOTO(dt_module_to(model, device), st, destroy_replica);
  dt_module_train(model, 1);
  DT_CHECK_GOTO(dt_param_arena_create(model, &r->step.arena), st, destroy_replica);
  DT_CHECK_GOTO(optim_fn(optim_user, index, r->step.arena, &r->step.opt), st, destroy_replica);
  *out = r;
  return DT_OK;

destroy_replica:
  dt_replica_destroy(r);
  return st;
}

dt_status dt_replica_connect(dt_replica *r, dt_comm *comm, const dt_ddp_config *cfg) {
  if (r->comm != NULL) {
    dt_comm_destroy(comm);
    return DT_ERROR(DT_ERR_STATE, "replica: already connected to a communicator");
  }
  r->comm = comm;
  DT_CHECK(dt_ddp_create(r->step.model, r->step.arena, comm, cfg, &r->ddp));
  DT_CHECK(dt_ddp_shard_optimizer(r->ddp, r->step.opt)); /* ZeRO; else a no-op */
  r->step.sync = dt_ddp_grad_sync(r->ddp);
  return DT_OK;
}

dt_replica_memory dt_replica_memory_use(const dt_replica *r) {
  dt_replica_memory m = {dt_optim_state_bytes(r->step.opt), 0, 0};
  if (r->ddp != NULL) {
    m.gradients = dt_ddp_gradient_bytes(r->ddp);
    m.gradients_in_flight = dt_ddp_bucket_buffer_peak(r->ddp);
  } else
    m.gradients = (size_t)dt_param_arena_numel(r->step.arena) * sizeof(float);
  return m;
}

const dt_step *dt_replica_step(const dt_replica *r) { return &r->step; }
dt_device dt_replica_device(const dt_replica *r) { return r->device; }
dt_module *dt_replica_model(const dt_replica *r) { return r->step.model; }
dt_param_arena *dt_replica_arena(const dt_replica *r) { return r->step.arena; }
dt_optimizer *dt_replica_optimizer(const dt_replica *r) { return r->step.opt; }
dt_comm *dt_replica_comm(const dt_replica *r) { return r->comm; }
dt_ddp *dt_replica_ddp(const dt_replica *r) { return r->ddp; }
