/* What `dtrain train` and `dtrain bench` set up alike: devices, the
 * communicator and DDP reducer of a rank, the optimizer. */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "core/amp.h"
#include "cuda/cuda.h"
#include "dist/agree.h"
#include "models/gguf_export.h"
#include "models/hf_export.h"
#include "models/models.h"
#include "train/train_loop.h"

#define MIB (1024.0 * 1024.0)

dt_status dt_train_rank_device(dt_device dev, const dt_pg *pg, dt_device *out) {
  *out = dev;
  if (dev.type != DT_DEVICE_CUDA || dev.index != DT_TRAIN_RANK_DEVICE)
    return DT_OK;
  out->index = 0;
  return pg != NULL ? dt_comm_pick_device(pg, out) : DT_OK;
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

dt_status dt_train_connect(dt_replica *r, dt_pg *pg, const dt_train_comm_options *o) {
  dt_comm_config cc = DT_COMM_CONFIG_DEFAULT;
  cc.timeout_s = o->timeout;
  DT_CHECK(dt_comm_config_from_env(&cc));
  cc.backend = o->backend;
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
  if (o->kind == DT_TRAIN_SGD) {
    dt_sgd_config sgd = DT_SGD_CONFIG_DEFAULT;
    sgd.lr = o->lr;
    sgd.momentum = o->momentum;
    sgd.weight_decay = o->weight_decay;
    sgd.nesterov = o->nesterov;
    DT_CHECK(dt_optim_sgd_create(arena, &sgd, out));
  } else if (o->kind == DT_TRAIN_ADAMW) {
    dt_adamw_config adamw = DT_ADAMW_CONFIG_DEFAULT;
    adamw.lr = o->lr;
    adamw.beta2 = o->beta2;
    adamw.weight_decay = o->weight_decay;
    DT_CHECK(dt_optim_adamw_create(arena, &adamw, out));
  } else {
    return DT_ERROR(DT_ERR_INVALID_ARG, "`optimizer` %d: expected sgd or adamw", (int)o->kind);
  }
  dt_status st = o->decay_matrices_only ? dt_optim_decay_matrices_only(*out) : DT_OK;
  if (st != DT_OK) {
    dt_optim_destroy(*out);
    *out = NULL;
  }
  return st;
}

dt_status dt_train_build_model(const dt_task *task, uint64_t seed, bool recompute,
                               const char *init_path, dt_module **out) {
  DT_CHECK(task->build(task, seed, out));
  dt_status st = recompute ? dt_model_set_recompute(*out, 1) : DT_OK;
  if (st != DT_OK)
    dt_error_wrap(st, "`recompute` on task %s", task->name);
  struct stat sb; /* a file is a GGUF export, a folder the Hugging Face layout */
  const bool gguf = init_path && stat(init_path, &sb) == 0 && S_ISREG(sb.st_mode);
  if (st == DT_OK && init_path &&
      (st = gguf ? dt_gguf_import(task, *out, init_path) : dt_hf_import(task, *out, init_path)) !=
          DT_OK)
    dt_error_wrap(st, "`init_path` %s", init_path);
  if (st != DT_OK) {
    dt_module_destroy(*out);
    *out = NULL;
  }
  return st;
}

dt_status dt_train_rounding_setup(bool stochastic, uint64_t seed, dt_step_config *step) {
  if (stochastic && step->autocast == DT_DTYPE_F32)
    return DT_ERROR(DT_ERR_INVALID_ARG,
                    "`stochastic_rounding` rounds the 16-bit working copy of the weights: it "
                    "needs `precision` bf16 or fp16");
  step->stochastic_rounding = stochastic;
  step->rounding_seed = seed;
  return DT_OK;
}

dt_status dt_train_precision_setup(dt_precision precision, int overflow_rank, int64_t overflow_step,
                                   dt_device dev, int rank, dt_step_config *step,
                                   dt_grad_scaler *scaler) {
  bool cuda = dev.type == DT_DEVICE_CUDA;
  dt_precision p = dt_precision_resolve(precision, dev.type);
  if ((int)p < 0 || p >= DT_PRECISION_COUNT)
    return DT_ERROR(DT_ERR_INVALID_ARG, "`precision` %d: expected fp32, tf32, bf16 or fp16",
                    (int)p);
  if (p == DT_PRECISION_TF32 && !cuda)
    return DT_ERROR(DT_ERR_INVALID_ARG,
                    "`precision` tf32 needs a CUDA device: use fp32 (or bf16, fp16) on the CPU");
  if (cuda && (p == DT_PRECISION_FP32 || p == DT_PRECISION_TF32))
    dt_cuda_set_tf32(p == DT_PRECISION_TF32);
  step->autocast = dt_precision_autocast_dtype(p);
  step->scaler = NULL;
  if (overflow_rank >= 0 && !dt_precision_needs_scaler(p))
    return DT_ERROR(DT_ERR_INVALID_ARG,
                    "`debug_overflow` tests the GradScaler, which only `precision` fp16 has (the "
                    "precision is %s)",
                    dt_precision_name(p));
  if (!dt_precision_needs_scaler(p))
    return DT_OK;
  dt_grad_scaler_config sc = DT_GRAD_SCALER_CONFIG_DEFAULT;
  DT_CHECK(dt_grad_scaler_init(scaler, &sc));
  if (overflow_rank >= 0 && overflow_rank == rank)
    scaler->debug_overflow_step = overflow_step;
  step->scaler = scaler;
  return DT_OK;
}

dt_status dt_train_sum_over_ranks(dt_comm *comm, dt_device dev, double *vals, int n) {
  if (!comm)
    return DT_OK;
  float buf[8];
  int64_t shape = n;
  dt_tensor *t = NULL;
  if (n < 1 || n > 8)
    return DT_ERROR(DT_ERR_INTERNAL, "summing %d values over the ranks: 1 to 8 at a time", n);
  for (int i = 0; i < n; i++)
    buf[i] = (float)vals[i];
  DT_CHECK(dt_tensor_from_host(buf, &shape, 1, DT_DTYPE_F32, dev, &t));
  dt_status st = dt_comm_allreduce_sync(comm, t, DT_REDUCE_SUM);
  if (st == DT_OK)
    st = dt_tensor_to_host(t, buf, (size_t)n * sizeof *buf);
  dt_tensor_release(t);
  DT_CHECK(st);
  for (int i = 0; i < n; i++)
    vals[i] = buf[i];
  return DT_OK;
}

dt_status dt_train_broadcast_text(dt_comm *comm, dt_device dev, char *text, size_t len) {
  if (!comm)
    return DT_OK;
  int64_t shape = (int64_t)len;
  dt_tensor *t = NULL;
  DT_CHECK(dt_tensor_from_host(text, &shape, 1, DT_DTYPE_U8, dev, &t));
  dt_status st = dt_comm_broadcast_sync(comm, t, 0);
  if (st == DT_OK)
    st = dt_tensor_to_host(t, text, len);
  dt_tensor_release(t);
  text[len - 1] = '\0';
  return st;
}
