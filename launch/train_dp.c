/* `dtrain train --mode dp`: one process, one replica per device (dist/dp.h),
 * each micro-batch split across the replicas. */
#include <string.h>

#include "core/backend.h"
#include "core/memory.h"
#include "launch/train_internal.h"
#include "models/models.h"

/* Runs on the replica's thread (dist/dp.c has set its CPU thread count). */
static dt_status build_replica_model(void *user, int replica, dt_module **out) {
  (void)replica;
  const dt_train_config *c = user;
  DT_CHECK(dt_model_create(c->model, c->seed, out));
  dt_module_train(*out, 1);
  return DT_OK;
}

static dt_status build_replica_optimizer(void *user, int replica, dt_param_arena *arena,
                                         dt_optimizer **out) {
  (void)replica;
  return train_build_optimizer(user, arena, out);
}

dt_status train_dp_create(const dt_train_config *c, train_state *s) {
  dt_device devs[DT_TRAIN_MAX_DEVICES];
  int n = 0;
  DT_CHECK(dt_train_parse_devices(c->devices, devs, DT_TRAIN_MAX_DEVICES, &n));
  if (c->batch < n)
    return DT_ERROR(DT_ERR_INVALID_ARG,
                    "--mode dp splits each micro-batch across the %d devices of --devices: "
                    "--batch %d is too small (use --batch >= %d)",
                    n, c->batch, n);
  dt_dp_config cfg = DT_DP_CONFIG_DEFAULT;
  /* Replicas run their kernels side by side: --threads each, or (0) this
   * thread's count (cores, or DT_NUM_THREADS) shared out by dist/dp.c. */
  cfg.threads_per_replica = c->threads;
  cfg.comm.timeout_s = c->comm_timeout;
  DT_CHECK(dt_train_comm_config(c->comm_backend, &cfg.comm));
  cfg.ddp.first_bucket_bytes = (size_t)(c->first_bucket_mb * DT_MIB);
  cfg.ddp.bucket_bytes = (size_t)(c->bucket_cap_mb * DT_MIB);
  if (cfg.ddp.first_bucket_bytes < 4)
    cfg.ddp.first_bucket_bytes = 4;
  if (cfg.ddp.bucket_bytes < 4)
    cfg.ddp.bucket_bytes = 4;
  cfg.ddp.allow_unused = c->allow_unused;
  /* The builders only read the config, during the call. */
  DT_CHECK(dt_dp_create(devs, n, build_replica_model, (void *)c, build_replica_optimizer,
                        (void *)c, &cfg, &s->dp));
  s->n_replicas = n;
  s->dev = dt_dp_replica_device(s->dp, 0);
  s->model = dt_dp_replica_model(s->dp, 0);
  s->arena = dt_dp_replica_arena(s->dp, 0);
  s->opt = dt_dp_replica_optimizer(s->dp, 0);
  return DT_OK;
}

dt_status train_dp_micro_batch(train_state *s, dt_tensor *x, dt_tensor *y, int group, int sync,
                               double *loss) {
  if (dt_tensor_dim(x, 0) < s->n_replicas)
    return DT_ERROR(DT_ERR_INVALID_ARG,
                    "--mode dp: a micro-batch of %lld samples cannot be split across %d "
                    "replicas (the last batch of the epoch is smaller: use --max-steps or a "
                    "--batch that leaves a larger remainder)",
                    (long long)dt_tensor_dim(x, 0), s->n_replicas);
  return dt_dp_forward_backward(s->dp, x, y, 1.0f / (float)group, sync, loss);
}

dt_status train_dp_optimizer_step(const dt_train_config *c, train_state *s) {
  if (c->clip > 0)
    DT_CHECK(dt_dp_clip_grad_norm(s->dp, c->clip, NULL));
  dt_dp_set_lr(s->dp, dt_lr_at(&s->schedule, dt_optim_step_count(s->opt)));
  return dt_dp_optimizer_step(s->dp);
}
