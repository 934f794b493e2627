/* `batch auto` (train/plan.h): the seed's rule, then a trial step. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/memory.h"
#include "dist/comm.h"
#include "dist/replica.h"
#include "train/plan.h"

/* One training step of a fresh replica of the model at `batch` on the
 * run's device. */
static dt_status trial_step(const dt_plan_auto_config *a, int batch) {
  dt_grad_scaler scaler;
  dt_replica *rep = NULL;
  dt_status st = dt_plan_replica_create(a->task, a->device, a->precision, a->recompute,
                                        &a->optimizer, NULL, NULL, &scaler, &rep);
  if (st == DT_OK)
    st = dt_plan_step(a->task, rep, batch, 0);
  dt_replica_destroy(rep);
  dt_empty_cache(a->device);
  return st;
}

static int64_t largest_divisor_at_most(int64_t n, int64_t cap) {
  for (int64_t d = cap < n ? cap : n; d > 1; d--)
    if (n % d == 0)
      return d;
  return 1;
}

dt_status dt_plan_auto_batch(const dt_plan_auto_config *a, dt_plan_auto *out) {
  memset(out, 0, sizeof *out);
  int ranks = a->ranks > 0 ? a->ranks : 1;
  if (a->global_batch < 0 || a->global_batch % ranks != 0)
    return DT_ERROR(DT_ERR_INVALID_ARG, "`global_batch` %lld: not a multiple of the %d ranks",
                    (long long)a->global_batch, ranks);
  dt_memory_stats ms;
  DT_CHECK(dt_memory_stats_get(a->device, &ms));
  dt_plan_config c = DT_PLAN_CONFIG_DEFAULT;
  c.task = a->task;
  c.precision = a->precision;
  c.device.cpu = a->device.type == DT_DEVICE_CPU;
  c.device.memory = (double)(ms.limit ? ms.limit : ms.capacity);
  c.device.alloc_overhead = c.device.cpu ? 0.0 : 0.05;
  c.device.workspace = c.device.cpu ? 0.0 : 32.0 * DT_MIB;
  c.device.f32_flops = c.device.tf32_flops = c.device.bf16_flops = 1.0; /* time is not asked */
  c.device.mem_bw = c.device.nvlink_bw = c.device.net_bw = 1.0;
  c.zero = a->zero;
  c.gpus_per_node = ranks;
  c.data_samples = a->data_samples;
  c.adamw = a->optimizer.kind == DT_TRAIN_ADAMW;
  c.recompute = a->recompute;
  dt_plan_probe_result probe;
  dt_status st = dt_plan_probe(a->task, a->precision, a->recompute, &a->optimizer, &probe);
  if (st == DT_ERR_OOM)
    return dt_error_wrap(st,
                         "batch auto: model %s does not fit at micro-batch 1 (the plan's probe "
                         "ran out of memory): use ZeRO stage 1 or 2, recomputation, or bf16 "
                         "precision, or give it more memory",
                         a->task->name);
  DT_CHECK(st);
  dt_plan_result r;
  DT_CHECK(dt_plan_compute(&c, &probe, &r));
  out->memory = c.device.memory;
  out->fixed = r.fixed;
  out->per_sample = r.per_sample;
  out->rule_batch = r.rule_batch;
  int64_t per_rank = a->global_batch / ranks;
  int64_t micro = (r.rule_batch > 0 ? r.rule_batch : 1) * (a->overshoot > 1 ? a->overshoot : 1);
  if (per_rank > 0)
    micro = largest_divisor_at_most(per_rank, micro);
  for (;;) {
    st = trial_step(a, (int)micro);
    if (st == DT_OK)
      break;
    if (st != DT_ERR_OOM)
      return st;
    if (micro == 1)
      return DT_ERROR(
          DT_ERR_OOM,
          "micro-batch 1 does not fit: the plan needs %.1f MiB at micro-batch 0 and %.3f MiB per "
          "sample of the %.1f MiB the device offers (weights %.1f, gradients %.1f, optimizer "
          "%.1f): use ZeRO stage 1 or 2, recomputation, or bf16 precision",
          r.fixed / DT_MIB, r.per_sample / DT_MIB, out->memory / DT_MIB, r.memory.weights / DT_MIB,
          r.memory.gradients / DT_MIB, r.memory.optimizer / DT_MIB);
    dt_clear_error();
    out->halvings++;
    micro = per_rank > 0 ? largest_divisor_at_most(per_rank, micro / 2) : micro / 2;
  }
  out->micro_batch = (int)micro;
  out->accumulation = per_rank > 0 ? (int)(per_rank / micro) : 1;
  return DT_OK;
}

/* The size of the run's training split (opened and closed again). */
static dt_status train_split_size(const dt_train_config *c, const dt_task *task, int64_t *out) {
  const dt_task_data *data = c->data ? c->data : &task->data[0];
  char folder[4096];
  if (c->data_dir) {
    size_t n = strlen(c->data_dir);
    const char *sep = n > 0 && c->data_dir[n - 1] == '/' ? "" : "/";
    if ((size_t)snprintf(folder, sizeof folder, "%s%s%s", c->data_dir, sep, data->name) >=
        sizeof folder)
      return DT_ERROR(DT_ERR_INVALID_ARG, "`data_dir` %s: too long", c->data_dir);
  }
  dt_dataset *ds = NULL;
  DT_CHECK(data->open(task, data, c->data_dir ? folder : NULL, "train", &ds));
  *out = dt_dataset_length(ds);
  dt_dataset_destroy(ds);
  return DT_OK;
}

/* The smallest of the ranks' micro-batches into *micro (0: this rank's
 * plan failed; *least 0: a rank's did), over a host communicator of the
 * process group; the ranks may see different memory. Collective. */
static dt_status least_over_ranks(const dt_train_config *c, int64_t micro, int64_t *least) {
  int world = c->pg ? dt_pg_world_size(c->pg) : 1;
  *least = micro;
  if (world < 2)
    return DT_OK;
  dt_comm_config cc = DT_COMM_CONFIG_DEFAULT;
  if (c->comm_timeout > 0)
    cc.timeout_s = c->comm_timeout;
  DT_CHECK(dt_comm_config_from_env(&cc));
  dt_comm *comm = NULL;
  DT_CHECK(dt_comm_create_for_pg(c->pg, &cc, &comm));
  float mine = (float)micro, *all = calloc((size_t)world, sizeof *all);
  int64_t one = 1, n = world;
  dt_tensor *in = NULL, *out = NULL;
  const dt_device cpu = {DT_DEVICE_CPU, 0};
  dt_status st = all ? DT_OK : DT_ERROR(DT_ERR_OOM, "batch auto: %d ranks' micro-batches", world);
  if (st == DT_OK)
    st = dt_tensor_from_host(&mine, &one, 1, DT_DTYPE_F32, cpu, &in);
  if (st == DT_OK)
    st = dt_tensor_from_host(all, &n, 1, DT_DTYPE_F32, cpu, &out);
  if (st == DT_OK)
    st = dt_comm_allgather_sync(comm, in, out);
  if (st == DT_OK)
    st = dt_tensor_to_host(out, all, (size_t)world * sizeof *all);
  for (int i = 0; i < world && st == DT_OK; i++)
    if ((int64_t)all[i] < *least)
      *least = (int64_t)all[i];
  dt_tensor_release(in);
  dt_tensor_release(out);
  free(all);
  dt_comm_destroy(comm);
  return st;
}

dt_status dt_train_resolve_batch_auto(dt_train_config *c, FILE *log) {
  dt_task task = *c->task;
  if (c->ctx > 0)
    DT_CHECK(dt_task_with_context(c->task, c->ctx, &task));
  dt_plan_auto_config a = {.task = &task, .precision = c->precision, .recompute = c->recompute};
  DT_CHECK(dt_train_rank_device(c->device, c->pg, &a.device));
  a.optimizer = dt_train_bench_optimizer(&task, c->optimizer == DT_TRAIN_ADAMW);
  a.optimizer.momentum = c->momentum;
  a.zero = c->zero;
  a.ranks = c->pg ? dt_pg_world_size(c->pg) : 1;
  a.global_batch = c->global_batch;
  a.overshoot = c->batch_auto_overshoot;
  DT_CHECK(train_split_size(c, &task, &a.data_samples));
  /* Every rank takes the smallest micro-batch (a divisor of the per-rank
   * batch, as each rank's is); a rank whose plan failed fails them all. */
  dt_plan_auto r;
  dt_status st = dt_plan_auto_batch(&a, &r);
  char why[DT_ERROR_MAX];
  snprintf(why, sizeof why, "%s", st == DT_OK ? "" : dt_last_error());
  int64_t least = 0;
  DT_CHECK(least_over_ranks(c, st == DT_OK ? r.micro_batch : 0, &least));
  if (st != DT_OK)
    return DT_ERROR(st, "%s", why);
  if (least < 1)
    return DT_ERROR(DT_ERR_DIST_MISMATCH,
                    "batch auto: another rank found no micro-batch that fits (its message names "
                    "the rank)");
  bool smaller = least < r.micro_batch;
  r.micro_batch = (int)least;
  if (a.global_batch > 0)
    r.accumulation = (int)(a.global_batch / a.ranks / least);
  c->batch = r.micro_batch;
  c->accum = r.accumulation;
  c->batch_auto = false;
  if (log && !c->quiet) {
    fprintf(log,
            "%sdtrain train: batch auto: micro-batch %d (the seed's rule min(%.1f MiB free / "
            "%.3f MiB per sample x 0.9, %lld samples / 10) = %d; %d trial step(s) out of memory, "
            "halved%s), accumulation %d, global batch %lld\n",
            c->log_prefix ? c->log_prefix : "", r.micro_batch, (r.memory - r.fixed) / DT_MIB,
            r.per_sample / DT_MIB, (long long)a.data_samples, r.rule_batch, r.halvings,
            smaller ? "; another rank's, the smallest" : "", r.accumulation,
            (long long)r.micro_batch * r.accumulation * a.ranks);
    fflush(log);
  }
  return DT_OK;
}
