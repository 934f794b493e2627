/* What `dtrain train` and `dtrain bench` set up alike: devices, the
 * communicator and DDP reducer of a rank, the optimizer. */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "core/amp.h"
#include "cuda/cuda.h"
#include "dist/agree.h"
#include "train/train_loop.h"

#define MIB (1024.0 * 1024.0)

dt_status dt_train_parse_devices(const char *list, dt_device *devs, int cap, int *n) {
  *n = 0;
  if (!list || !list[0])
    return DT_ERROR(DT_ERR_INVALID_ARG,
                    "empty device list: expected devices separated by commas, e.g. cpu:0,cpu:1");
  const char *p = list;
  for (;;) {
    const char *end = strchr(p, ',');
    size_t len = end ? (size_t)(end - p) : strlen(p);
    char item[64];
    if (len == 0 || len >= sizeof item)
      return DT_ERROR(DT_ERR_INVALID_ARG,
                      "device list '%s': %s item: expected devices separated by commas, e.g. "
                      "cpu:0,cpu:1",
                      list, len == 0 ? "an empty" : "an overlong");
    if (*n >= cap)
      return DT_ERROR(DT_ERR_INVALID_ARG, "device list '%s': more than %d devices", list, cap);
    memcpy(item, p, len);
    item[len] = '\0';
    dt_status st = dt_device_parse(item, &devs[*n]);
    if (st != DT_OK)
      return dt_error_wrap(st, "device list '%s': item '%s'", list, item);
    (*n)++;
    if (!end)
      break;
    p = end + 1;
  }
  return DT_OK;
}

dt_status dt_train_rank_device(const char *name, const dt_pg *pg, dt_device *out) {
  DT_CHECK(dt_device_parse(name, out));
  if (out->type == DT_DEVICE_CUDA && !strchr(name, ':') && pg != NULL)
    return dt_comm_pick_device(pg, out);
  return DT_OK;
}

dt_status dt_train_comm_config(const char *backend, dt_comm_config *cfg) {
  DT_CHECK(dt_comm_config_from_env(cfg));
  if (backend != NULL && backend[0] != '\0') {
    dt_status st = dt_comm_backend_parse(backend, &cfg->backend);
    if (st != DT_OK)
      return dt_error_wrap(st, "--comm-backend");
  }
  return DT_OK;
}

/* MiB to bytes without undefined behaviour: at least one f32, at most
 * 2^50 bytes (more than any model's gradients: one bucket). */
static size_t bucket_bytes(float mib) {
  double b = (double)mib * MIB;
  if (!(b >= 4.0))
    return 4;
  return b >= 0x1p50 ? (size_t)1 << 50 : (size_t)b;
}

dt_ddp_config dt_train_ddp_config(const dt_train_comm_options *o) {
  dt_ddp_config dc = DT_DDP_CONFIG_DEFAULT;
  dc.first_bucket_bytes = bucket_bytes(o->first_bucket_mb);
  dc.bucket_bytes = bucket_bytes(o->bucket_cap_mb);
  dc.allow_unused = o->allow_unused;
  dc.zero_stage = o->zero_stage;
  dc.grad_compress = o->grad_compress;
  dc.split_bytes = o->split_bucket_mb > 0 ? bucket_bytes(o->split_bucket_mb) : 0;
  dc.update_per_bucket = o->update_per_bucket;
  return dc;
}

bool dt_train_update_per_bucket(const char *bucket_update) {
  return bucket_update != NULL && strcmp(bucket_update, "each") == 0;
}

dt_status dt_train_connect(dt_replica *r, dt_pg *pg, const dt_train_comm_options *o) {
  dt_comm_config cc = DT_COMM_CONFIG_DEFAULT;
  cc.timeout_s = o->timeout;
  DT_CHECK(dt_train_comm_config(o->backend, &cc));
  dt_comm *comm = NULL;
  DT_CHECK(dt_comm_create_for_device(pg, dt_replica_device(r), &cc, &comm));
  if (o->agree_text) {
    dt_status st = dt_dist_agree_text(comm, dt_replica_device(r), o->agree_text,
                                      "were started with different settings",
                                      "start every rank with the same flags and data");
    if (st != DT_OK) {
      dt_comm_destroy(comm);
      return st;
    }
  }
  dt_ddp_config dc = dt_train_ddp_config(o);
  return dt_replica_connect(r, comm, &dc);
}

dt_status dt_train_optimizer_create(void *spec, int replica, dt_param_arena *arena,
                                    dt_optimizer **out) {
  (void)replica;
  const dt_optimizer_spec *o = spec;
  if (!strcmp(o->name, "sgd")) {
    dt_sgd_config sgd = DT_SGD_CONFIG_DEFAULT;
    sgd.lr = o->lr;
    sgd.momentum = o->momentum;
    sgd.weight_decay = o->weight_decay;
    sgd.nesterov = o->nesterov;
    DT_CHECK(dt_optim_sgd_create(arena, &sgd, out));
  } else if (!strcmp(o->name, "adamw")) {
    dt_adamw_config adamw = DT_ADAMW_CONFIG_DEFAULT;
    adamw.lr = o->lr;
    adamw.beta2 = o->beta2;
    adamw.weight_decay = o->weight_decay;
    DT_CHECK(dt_optim_adamw_create(arena, &adamw, out));
  } else {
    return DT_ERROR(DT_ERR_INVALID_ARG, "unknown optimizer '%s': expected sgd or adamw", o->name);
  }
  dt_status st = o->decay_matrices_only ? dt_optim_decay_matrices_only(*out) : DT_OK;
  if (st != DT_OK) {
    dt_optim_destroy(*out);
    *out = NULL;
  }
  return st;
}

dt_status dt_train_parse_debug_overflow(const char *s, int *rank, int64_t *step) {
  char tail;
  long long r = -1, t = -1;
  if (!s || sscanf(s, "%lld:%lld%c", &r, &t, &tail) != 2 || r < 0 || t < 0 || r > INT32_MAX)
    return DT_ERROR(DT_ERR_INVALID_ARG,
                    "--debug-overflow '%s': expected RANK:STEP (rank R's gradients get an Inf at "
                    "optimizer step S, both >= 0)",
                    s ? s : "(null)");
  *rank = (int)r;
  *step = (int64_t)t;
  return DT_OK;
}

dt_status dt_train_rounding_setup(bool stochastic, uint64_t seed, dt_step_config *step) {
  if (stochastic && step->autocast == DT_DTYPE_F32)
    return DT_ERROR(DT_ERR_INVALID_ARG,
                    "--stochastic-rounding rounds the 16-bit working copy of the weights: it "
                    "needs --precision bf16 or fp16");
  step->stochastic_rounding = stochastic;
  step->rounding_seed = seed;
  return DT_OK;
}

dt_status dt_train_precision_setup(const char *precision, const char *debug_overflow, dt_device dev,
                                   int rank, dt_step_config *step, dt_grad_scaler *scaler) {
  bool cuda = dev.type == DT_DEVICE_CUDA;
  dt_precision p = cuda ? DT_PRECISION_TF32 : DT_PRECISION_FP32;
  if (precision)
    DT_CHECK(dt_precision_parse(precision, &p));
  if (p == DT_PRECISION_TF32 && !cuda)
    return DT_ERROR(DT_ERR_INVALID_ARG,
                    "--precision tf32 needs a CUDA device: use fp32 (or bf16, fp16) on the CPU");
  if (cuda && (p == DT_PRECISION_FP32 || p == DT_PRECISION_TF32))
    dt_cuda_set_tf32(p == DT_PRECISION_TF32);
  step->autocast = dt_precision_autocast_dtype(p);
  step->scaler = NULL;
  if (debug_overflow && !dt_precision_needs_scaler(p))
    return DT_ERROR(DT_ERR_INVALID_ARG,
                    "--debug-overflow tests the GradScaler, which only --precision fp16 has (the "
                    "precision is %s)",
                    dt_precision_name(p));
  if (!dt_precision_needs_scaler(p))
    return DT_OK;
  dt_grad_scaler_config sc = DT_GRAD_SCALER_CONFIG_DEFAULT;
  DT_CHECK(dt_grad_scaler_init(scaler, &sc));
  if (debug_overflow) {
    int r = 0;
    int64_t s = 0;
    DT_CHECK(dt_train_parse_debug_overflow(debug_overflow, &r, &s));
    if (r == rank)
      scaler->debug_overflow_step = s;
  }
  step->scaler = scaler;
  return DT_OK;
}
