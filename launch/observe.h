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
#include "train/train_hooks.h"

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

/* The run's facts, its progress records and evaluations: the trainer's
 * (train/train_hooks.h). */
typedef dt_train_run_info dt_observe_run;
typedef dt_train_interval dt_observe_interval;
typedef dt_train_eval dt_observe_eval;

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

/* The progress line and the metrics record, whichever is due. Collective
 * at records when dt_observer_collective. */
dt_status dt_observer_interval(dt_observer *o, const dt_observe_interval *iv);

void dt_observer_eval_begin(dt_observer *o);
dt_status dt_observer_eval_end(dt_observer *o, const dt_observe_eval *ev);
/* An out-of-memory recovery: the metrics file's "oom" record. */
dt_status dt_observer_oom(dt_observer *o, const dt_train_oom *ev);

/* Closes everything; returns `st`, or when st is DT_OK the first error of
 * closing the files. NULL: st. */
dt_status dt_observer_destroy(dt_observer *o, dt_status st);

/* The observer as the trainer's hooks (train/train_hooks.h): `start`
 * creates it from *cfg (copied; metrics default to <run dir>/metrics.jsonl
 * when the run has a run directory) and the run's facts, `finish`
 * destroys it; should_stop (NULL = none) is passed through. */
typedef struct dt_observe_hooks {
  dt_observe_config cfg;
  dt_observer *observer;
  int (*should_stop)(void);
  char metrics_path[4200];
} dt_observe_hooks;
void dt_observe_hooks_init(dt_observe_hooks *h, const dt_observe_config *cfg,
                           int (*should_stop)(void), dt_train_hooks *out);

#ifdef __cplusplus
}
#endif
#endif
