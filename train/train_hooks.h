/* What a training run shows of itself and when it stops, as hooks: the
 * library calls them; the command line's progress line, metrics file,
 * trace and status for `dtrain top` (launch/observe.h) and its signal
 * handling are implementations of them, and so can an embedder's be.
 *
 *   static dt_status on_eval(void *user, const dt_train_eval *ev) {
 *     printf("epoch %d %s_loss %.4f\n", ev->epoch, ev->split, ev->test_loss);
 *     return DT_OK;
 *   }
 *   cfg.hooks.eval_end = on_eval;
 *   cfg.hooks.user = &my_state;
 *
 * Every hook is optional (NULL = not called) and gets `user`. They run on
 * the thread that called dt_train_run, in this order:
 *   start, then per epoch: epoch_begin, per optimizer step: step_begin,
 *   micro_batch_end per micro-batch, step_end, should_stop, and
 *   checkpoint_saved after a save; interval when interval_due (or every
 *   log_interval micro-batches); eval_begin/eval_end around evaluations;
 *   finish at the very end, also after a failure.
 * A hook returning an error ends the run with it (after finish). Hooks
 * that communicate across ranks (the metrics' gathering) must be called
 * at the same points on every rank: the library calls them so, given the
 * same interval_due answers. */
#ifndef DT_TRAIN_TRAIN_HOOKS_H
#define DT_TRAIN_TRAIN_HOOKS_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "core/device.h"
#include "core/optim.h"
#include "core/status.h"
#include "core/step.h"
#include "dist/comm.h"
#include "dist/ddp.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The run's facts, when it starts (after the model, the data and the run
 * directory exist). Pointers are valid until finish. */
typedef struct dt_train_run_info {
  const char *model, *data, *device_name, *comm_name;
  const char *metric_name;  /* "accuracy", NULL = the task has none */
  dt_device dev;            /* this rank's (dp: the first replica's) */
  const dt_device *devices; /* dp: every replica's device; NULL = dev */
  int n_devices;
  dt_comm *comm; /* world > 1: the rank's communicator */
  int world;
  int batch, accum, epochs, threads;
  int64_t total_steps, steps_per_epoch;
  int64_t tokens_per_sample;    /* token inputs: tokens per sample (tokens/s); 0 = samples/s */
  dt_step_stats *stats;         /* the training step's; NULL = none (dp) */
  int64_t steps_done;           /* optimizer steps before this process started (resumed) */
  const dt_grad_scaler *scaler; /* fp16: the loss scale and skipped steps; NULL = none */
  /* Where the run writes. */
  int rank;
  FILE *log;              /* the run's lines (also into train.log); NULL = this rank is silent */
  FILE *console;          /* the stream behind log that a live line may go to */
  FILE *log_file;         /* the run directory's train.log, NULL = none */
  const char *run_dir;    /* "" = none */
  const char *log_prefix; /* "" or "rank 1: " */
  int log_interval;       /* the configuration's */
  bool resumed;           /* continued from a checkpoint */
} dt_train_run_info;

typedef struct dt_train_interval {
  int epoch;
  int64_t batch, batches; /* micro-batches done in the epoch, and in all of it */
  double loss;            /* mean micro-batch loss over the interval */
  double lr;
  double samples_per_s;   /* every rank's */
  const char *rate_extra; /* after samples/s in a plain line (" tokens/s N mfu X%"), or NULL */
  const char *extra;      /* memory figures for a plain line ("" or NULL = none) */
  double mfu;             /* model FLOPs utilisation 0..1, < 0 = unknown */
} dt_train_interval;

typedef struct dt_train_eval {
  int epoch;         /* 0 = the epoch under way (an evaluation during training) */
  const char *split; /* "test", "val" */
  double train_loss; /* the epoch's mean, NAN = none (mid-epoch) */
  double test_loss, test_metric;
  /* Image folders read with `skip_bad_images`: the distinct bad files met
   * so far (train and eval splits, on any rank); -1 = not counted (no
   * such run). */
  int64_t bad_images;
} dt_train_eval;

/* An out-of-memory error inside a step, recovered from (train/train_oom.c):
 * the step after `step` optimizer steps is redone from its start. */
typedef struct dt_train_oom {
  int64_t step;      /* optimizer steps done */
  int epoch;         /* 1-based */
  int64_t batch;     /* the redone step's first micro-batch (of `batch` samples) in the epoch */
  int micro_batch;   /* the new micro-batch, per rank */
  int accum;         /* the new micro-batches per optimizer step */
  int retries;       /* out-of-memory recoveries in the run so far, this one included */
  const char *error; /* the out-of-memory message (this rank's, or that another rank had one) */
} dt_train_oom;

typedef struct dt_train_hooks {
  void *user;
  dt_status (*start)(void *user, const dt_train_run_info *run);
  /* Whether `interval` is due after `batch` micro-batches of the epoch;
   * NULL = every log_interval micro-batches. */
  bool (*interval_due)(void *user, int64_t batch);
  void (*epoch_begin)(void *user, int epoch, int64_t batches);
  /* An optimizer step over micro-batches [first_batch, first_batch + group). */
  void (*step_begin)(void *user, int64_t first_batch, int group);
  /* `batch` micro-batches of the epoch done, `samples` this rank's in the last. */
  void (*micro_batch_end)(void *user, int64_t batch, int64_t samples);
  /* The optimizer step is done (ddp: its all-reduces, NULL = none). */
  dt_status (*step_end)(void *user, const dt_ddp *ddp);
  dt_status (*interval)(void *user, const dt_train_interval *iv);
  void (*eval_begin)(void *user);
  dt_status (*eval_end)(void *user, const dt_train_eval *ev);
  /* A checkpoint of optimizer step `step` is complete on disk at `dir`
   * (rank 0, which writes them). */
  dt_status (*checkpoint_saved)(void *user, const char *dir, int64_t step);
  /* After an out-of-memory recovery, before the step is redone. */
  dt_status (*oom)(void *user, const dt_train_oom *ev);
  /* Asked after every optimizer step: nonzero requests a stop (the value
   * comes back in dt_train_result.stop_code). The ranks agree: a stop on
   * any rank stops all, after a checkpoint when there is a run directory. */
  int (*should_stop)(void *user);
  /* The end: `st` is the run's status; returns it, or when it is DT_OK the
   * hook's first error. */
  dt_status (*finish)(void *user, dt_status st);
} dt_train_hooks;

#ifdef __cplusplus
}
#endif
#endif
