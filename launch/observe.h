/* What a run shows of itself, in one place for the training loop: the
 * progress display (launch/progress.h), the metrics file (launch/metrics.h),
 * the timeline (launch/trace.h), the status file for `dtrain top`
 * (launch/job_status.h) and the GPU monitor in the progress line.
 *
 *   dt_observer *o = NULL;
 *   DT_CHECK(dt_observer_create(&cfg, rank, dev, log, console, prefix, resumed, &o));
 *   DT_CHECK(dt_observer_start(o, &run));             // after the model and data exist
 *   per epoch: dt_observer_epoch_begin(o, epoch, batches);
 *     per optimizer step: dt_observer_step_begin(o, first_batch, group);
 *       per micro-batch: dt_observer_tick(o, batch, samples);
 *       after the update: DT_CHECK(dt_observer_step_end(o, ddp));
 *       every log interval: DT_CHECK(dt_observer_interval(o, &iv));   // collective with metrics
 *     dt_observer_eval_begin(o); ...; DT_CHECK(dt_observer_eval_end(o, &ev));
 *   st = dt_observer_destroy(o, st);   // after the loader's thread has stopped
 */
#ifndef DT_LAUNCH_OBSERVE_H
#define DT_LAUNCH_OBSERVE_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "core/device.h"
#include "core/status.h"
#include "core/step.h"
#include "dist/comm.h"
#include "dist/ddp.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct dt_observe_config {
  const char *metrics_path;        /* JSONL, written by rank 0; NULL = none */
  const char *trace_path;          /* per rank ("{rank}" in it); NULL = none */
  int64_t trace_first, trace_last; /* optimizer steps the trace records */
  bool quiet;                      /* no header, no progress lines */
  const char *status_dir;          /* for dtrain top; NULL = DT_STATUS_DIR or the default */
  int log_interval;                /* micro-batches between records */
  FILE *log_file; /* the run's train.log: the plain lines while the live line is shown */
} dt_observe_config;
#define DT_OBSERVE_CONFIG_DEFAULT ((dt_observe_config){NULL, NULL, 1, 50, false, NULL, 100})

typedef struct dt_observe_run {
  const char *model, *data, *device_name, *comm_name, *metric_name;
  dt_device dev;            /* this rank's (dp: the first replica's) */
  const dt_device *devices; /* dp: every replica's device; NULL = dev */
  int n_devices;
  dt_comm *comm; /* world > 1: the rank's communicator (gathers the ranks' figures) */
  int world;
  int batch, accum, epochs, threads;
  int64_t total_steps, steps_per_epoch;
  int64_t tokens_per_sample;    /* token inputs: tokens per sample (tokens/s); 0 = samples/s */
  dt_step_stats *stats;         /* the training step's (dt_step_config.stats); NULL = none */
  int64_t steps_done;           /* optimizer steps before this process started (resumed) */
  const dt_grad_scaler *scaler; /* fp16: the loss scale and skipped steps shown; NULL = none */
} dt_observe_run;

typedef struct dt_observer dt_observer;

/* Opens the trace (every rank) and the metrics file (rank 0; appended to
 * when `resumed`: a run continued from a checkpoint). log: where progress
 * lines go (NULL = this rank is silent); console: the stream behind it
 * that a live line may go to (log itself, or the terminal when log also
 * writes train.log). */
dt_status dt_observer_create(const dt_observe_config *cfg, int rank, dt_device dev, FILE *log,
                             FILE *console, const char *prefix, bool resumed, dt_observer **out);
/* The run's facts (copied): the metrics file's run record, the status file;
 * rank 0's record interval to every rank. Collective under DDP. */
dt_status dt_observer_start(dt_observer *o, const dt_observe_run *run);
/* Whether the metrics records are collective (they gather the ranks'
 * figures): every rank then calls dt_observer_interval at each record,
 * also ranks that print nothing. Records fall every rank 0's
 * --log-interval micro-batches (dt_observer_start shares it: the flag may
 * differ between ranks); progress lines every this rank's. */
bool dt_observer_collective(const dt_observer *o);
/* Whether dt_observer_interval is due after `batch` micro-batches of the
 * epoch: a record (every rank alike) or this rank's progress line. */
bool dt_observer_interval_due(const dt_observer *o, int64_t batch);

void dt_observer_epoch_begin(dt_observer *o, int epoch, int64_t batches);
/* An optimizer step over micro-batches [first_batch, first_batch + group)
 * of the epoch begins. */
void dt_observer_step_begin(dt_observer *o, int64_t first_batch, int group);
/* A micro-batch is done: `batch` micro-batches of the epoch so far, with
 * `samples` samples of this rank's in it. */
void dt_observer_tick(dt_observer *o, int64_t batch, int64_t samples);
/* The optimizer step is done; ddp (NULL = none) holds its all-reduces. */
dt_status dt_observer_step_end(dt_observer *o, const dt_ddp *ddp);

typedef struct dt_observe_interval {
  int epoch;
  int64_t batch, batches; /* micro-batches done in the epoch, and in all of it */
  double loss;            /* mean micro-batch loss over the interval */
  double lr;
  double samples_per_s;   /* every rank's */
  const char *rate_extra; /* after samples/s in the plain line (" tokens/s N mfu X%"), or NULL */
  const char *extra;      /* appended to the plain progress line ("" or NULL = none) */
  double mfu;             /* model FLOPs utilisation 0..1 for the metrics, < 0 = unknown */
} dt_observe_interval;
/* The progress line and the metrics record, whichever is due. Collective
 * at records when dt_observer_collective. */
dt_status dt_observer_interval(dt_observer *o, const dt_observe_interval *iv);

void dt_observer_eval_begin(dt_observer *o);
typedef struct dt_observe_eval {
  int epoch;         /* 0 = the epoch under way (an evaluation during training) */
  const char *split; /* "test", "val": the record's keys <split>_loss, <split>_<metric> */
  double train_loss; /* the epoch's mean, NAN = none (mid-epoch) */
  double test_loss, test_metric;
} dt_observe_eval;
dt_status dt_observer_eval_end(dt_observer *o, const dt_observe_eval *ev);

/* Closes everything; returns `st`, or when st is DT_OK the first error of
 * closing the files. NULL: st. */
dt_status dt_observer_destroy(dt_observer *o, dt_status st);

#ifdef __cplusplus
}
#endif
#endif
