/* The metrics file of a run: `dtrain train --metrics FILE`, JSON Lines (one
 * object per line, written with cJSON), flushed after every record so that
 * `dtrain report` and `tail -f` read a live run. Rank 0 writes it. Records:
 *
 *   {"type":"run", "model", "data", "device", "world", "batch", "global_batch",
 *    "accum", "epochs", "total_steps", "steps_per_epoch", "threads", "comm"}
 *   {"type":"train", "step", "epoch", "batch", "batches", "time", "loss", "lr",
 *    "grad_norm", "samples_per_s", "tokens_per_s" (token inputs only),
 *    "step_ms", "rank_step_ms": [per rank],
 *    "memory": [{"device", "allocated_mib", "reserved_mib", "peak_mib"} per device],
 *    "allreduce_ms", "allreduce_hidden", "allreduce_bytes" (null without DDP),
 *    optional: "mfu", "loss_scale", "skipped_steps"}
 *   {"type":"eval", "step", "epoch", "time", "split", "train_loss" (null
 *    mid-epoch), "<split>_loss", "<split>_<metric>" (e.g. test_accuracy;
 *    only for tasks with a metric)}
 *   {"type":"oom", "step", "epoch", "batch", "time", "micro_batch", "accum",
 *    "retries", "error"}: an out-of-memory error inside optimizer step
 *    step + 1 (under --max-memory), recovered from: the step is redone from
 *    micro-batch `batch` of the epoch with the new micro_batch and accum
 *
 * step: optimizer steps done; batch: micro-batches done in the epoch; time:
 * seconds since the run began; loss: mean micro-batch loss over the
 * interval since the last record (all ranks' mean at epoch ends, this
 * rank's otherwise); step_ms: wall milliseconds per optimizer step over the
 * interval; allreduce_ms: the all-reduces' time per synchronised step,
 * allreduce_hidden the share of it that ran before backward ended (0..1),
 * allreduce_bytes the bytes each synchronised step hands the all-reduces
 * (ZeRO: reduce-scatters), halved by --grad-compress.
 */
#ifndef DT_LAUNCH_METRICS_H
#define DT_LAUNCH_METRICS_H

#include <stdbool.h>
#include <stdint.h>

#include "core/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct dt_metrics dt_metrics;

/* A number field of a JSON record (the metrics and status files). */
typedef struct dt_json_number {
  const char *key;
  double value;
} dt_json_number;
/* Adds each field to `obj` (a cJSON object: cJSON *): a number, or null
 * when the value is not finite (JSON has no NaN). */
void dt_json_add_numbers(void *obj, const dt_json_number *fields, int n);

/* Creates (truncates) the file, or appends to it (a resumed run); DT_ERR_IO
 * naming it. */
dt_status dt_metrics_open(const char *path, bool append, dt_metrics **out);
/* Closes it; DT_ERR_IO when a write failed. NULL is a no-op. */
dt_status dt_metrics_close(dt_metrics *m);

typedef struct dt_metrics_run {
  const char *model, *data, *device, *comm; /* comm: "none", "mpi", "nccl", ... */
  int world, batch, global_batch, accum, epochs, threads;
  int64_t total_steps, steps_per_epoch;
} dt_metrics_run;
dt_status dt_metrics_write_run(dt_metrics *m, const dt_metrics_run *r);

typedef struct dt_metrics_device {
  char device[32];
  double allocated_mib, reserved_mib, peak_mib;
} dt_metrics_device;

typedef struct dt_metrics_step {
  int64_t step, batch, batches;
  int epoch;
  double time_s, loss, lr, grad_norm;
  double samples_per_s, tokens_per_s; /* tokens_per_s < 0: not a token task */
  double step_ms;
  const double *rank_step_ms;
  int n_ranks;
  const dt_metrics_device *devices;
  int n_devices;
  double allreduce_ms, allreduce_hidden, allreduce_bytes; /* < 0: no DDP (written as null) */
  /* Optional, written only when set (mixed precision, model FLOPs). */
  double mfu;            /* < 0: unknown */
  double loss_scale;     /* < 0: no loss scaling */
  int64_t skipped_steps; /* < 0: no loss scaling */
} dt_metrics_step;
/* A step record with every optional field unset. */
dt_metrics_step dt_metrics_step_default(void);
dt_status dt_metrics_write_step(dt_metrics *m, const dt_metrics_step *r);

typedef struct dt_metrics_eval {
  int64_t step;
  int epoch;
  double time_s;
  const char *split; /* "test" (NULL), "val": keys <split>_loss and <split>_<metric> */
  double train_loss; /* NAN (null) mid-epoch */
  double test_loss, test_metric;
  const char *metric_name; /* "accuracy" -> "test_accuracy"; NULL = the task has no metric */
  int64_t bad_images;      /* image folders skipping bad files: how many so far; < 0 = none */
} dt_metrics_eval;
dt_status dt_metrics_write_eval(dt_metrics *m, const dt_metrics_eval *r);

typedef struct dt_metrics_oom {
  int64_t step, batch;
  int epoch, micro_batch, accum, retries;
  double time_s;
  const char *error;
} dt_metrics_oom;
dt_status dt_metrics_write_oom(dt_metrics *m, const dt_metrics_oom *r);

#ifdef __cplusplus
}
#endif
#endif
