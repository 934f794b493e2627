/* `max_memory` and the recovery from an out-of-memory error inside a step
 * (train/train_config.h): the cap on the device's allocator, the ranks'
 * agreement, and the step redone with each micro-batch run as two halves.
 *
 * The data order stays: a micro-batch of `batch` samples is still read as
 * one (the loader, the position and the checkpoints count them), and runs
 * as consecutive pieces of batch / split samples, each piece's loss
 * weighted by its share of the step's samples (train_loop.c). A run that
 * starts with micro-batch batch / 2 and twice the accumulation sees the
 * same samples in the same order, with the same weights. */
#include <stdio.h>
#include <string.h>

#include "core/cpu.h"
#include "core/memory.h"
#include "cuda/cuda.h"
#include "train/train_state_internal.h"

static double mib(size_t bytes) { return (double)bytes / DT_MIB; }

dt_status dt_train_cap_device_memory(dt_device dev, int mib_cap) {
  if (mib_cap <= 0)
    return DT_OK;
  size_t bytes = (size_t)mib_cap * DT_MIB;
  if (dev.type == DT_DEVICE_CPU) {
    dt_cpu_set_memory_limit(bytes);
    return DT_OK;
  }
  return dt_cuda_set_memory_limit(dev.index, bytes);
}

int64_t dt_train_piece_size(const dt_train_config *c, const train_state *s) {
  int split = s->split > 1 ? s->split : 1;
  return ((int64_t)c->batch + split - 1) / split;
}

/* Whether `max_memory` is in force on `rank` after `steps` optimizer steps. */
static bool cap_due(const dt_train_config *c, int rank, int64_t steps) {
  return c->max_memory_mib > 0 && steps >= c->max_memory_from_step &&
         (c->max_memory_rank < 0 || c->max_memory_rank == rank);
}

/* `max_memory` on dev, and under dp on every replica's device. */
static dt_status cap_devices(const dt_train_config *c, dt_device dev) {
  if (c->mode == DT_TRAIN_MODE_DP)
    for (int i = 0; i < c->n_devices; i++)
      DT_CHECK(dt_train_cap_device_memory(c->devices[i], c->max_memory_mib));
  return dt_train_cap_device_memory(dev, c->max_memory_mib);
}

dt_status dt_train_oom_cap(const dt_train_config *c, train_state *s, int64_t steps) {
  if (s->capped || !cap_due(c, s->rank, steps))
    return DT_OK;
  DT_CHECK(cap_devices(c, s->dev));
  s->capped = true;
  return DT_OK;
}

dt_status dt_train_oom_cap_before_start(const dt_train_config *c) {
  dt_device dev;
  if (!cap_due(c, c->pg ? dt_pg_rank(c->pg) : 0, 0))
    return DT_OK;
  DT_CHECK(dt_train_rank_device(c->device, c->pg, &dev));
  return cap_devices(c, dev);
}

bool dt_train_oom_caught(const dt_train_config *c, train_state *s, dt_status st) {
  if (st != DT_ERR_OOM || c->max_memory_mib <= 0)
    return false;
  snprintf(s->oom_error, sizeof s->oom_error, "%s", dt_last_error());
  dt_clear_error();
  return true;
}

dt_status dt_train_oom_agree(const dt_train_config *c, train_state *s, bool *oom) {
  if (c->max_memory_mib <= 0 || !s->comm)
    return DT_OK;
  double any = *oom ? 1.0 : 0.0;
  DT_CHECK(dt_train_sum_over_ranks(s->comm, s->dev, &any, 1));
  if (any > 0 && !*oom)
    snprintf(s->oom_error, sizeof s->oom_error, "another rank ran out of memory");
  *oom = any > 0;
  return DT_OK;
}

/* What the memory holds between steps, per rank (dp: per replica). */
static void breakdown(const train_state *s, char *buf, size_t cap) {
  const dt_replica *r = s->replica ? s->replica : dt_dp_replica(s->dp, 0);
  dt_replica_memory rm = dt_replica_memory_use(r);
  size_t params = (size_t)dt_module_parameter_count(s->model) * sizeof(float);
  dt_memory_stats ms;
  memset(&ms, 0, sizeof ms);
  dt_memory_stats_get(s->dev, &ms);
  snprintf(buf, cap,
           "the memory holds %.2f MiB in live tensors (peak %.2f MiB, cap %.2f MiB): parameters "
           "%.2f MiB, gradients %.2f MiB, optimizer state %.2f MiB, the rest activations and "
           "workspaces",
           mib(ms.allocated), mib(ms.peak_allocated), mib(ms.limit), mib(params), mib(rm.gradients),
           mib(rm.optimizer_state));
  dt_clear_error();
}

dt_status dt_train_oom_recover(const dt_train_config *c, train_state *s, int epoch,
                               int64_t first_batch, int64_t steps, dt_train_oom *ev) {
  /* The step's partial gradients go; parameters and optimizer state were
   * not touched (the update runs only after an agreed, complete step). */
  DT_CHECK(s->dp ? dt_dp_zero_grad(s->dp) : dt_optim_zero_grad(s->opt));
  if (s->dp)
    for (int i = 0; i < c->n_devices; i++)
      DT_CHECK(dt_empty_cache(c->devices[i]));
  else
    DT_CHECK(dt_empty_cache(s->dev));
  /* The pieces after the halving: dp splits each across its replicas, so
   * none (the last, batch % piece, included) may have fewer samples than
   * there are replicas; one process's pieces must shrink. */
  int64_t piece = dt_train_piece_size(c, s);
  int split = s->split > 1 ? 2 * s->split : 2;
  int64_t next = ((int64_t)c->batch + split - 1) / split, rest = c->batch % next;
  int64_t least = s->dp ? s->n_replicas : 1;
  if (next >= piece || next < least || (rest != 0 && rest < least)) {
    char held[512], replicas[160] = "";
    breakdown(s, held, sizeof held);
    if (s->dp)
      snprintf(replicas, sizeof replicas,
               "; `mode` dp splits each piece across its %d replicas: halving it again would "
               "leave a piece of %lld samples",
               s->n_replicas, (long long)(next < least || rest == 0 ? next : rest));
    return DT_ERROR(DT_ERR_OOM,
                    "out of memory at optimizer step %lld even with a micro-batch of %lld (of "
                    "`batch` %d, after %d halving%s%s): %s; %s. The model's state does not leave "
                    "room for one sample: shard the optimizer state and gradients (`zero` 1 or 2 "
                    "under DDP), recompute activations (`recompute`), train in 16-bit "
                    "(`precision` bf16), or raise `max_memory`",
                    (long long)steps + 1, (long long)piece, c->batch, s->oom_retries,
                    s->oom_retries == 1 ? "" : "s", replicas, s->oom_error, held);
  }
  s->split = split;
  s->oom_retries++;
  piece = next;
  int pieces = (int)((c->batch + piece - 1) / piece);
  *ev = (dt_train_oom){steps,          epoch,       first_batch, (int)piece, c->accum * pieces,
                       s->oom_retries, s->oom_error};
  return DT_OK;
}
