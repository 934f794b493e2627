/* What one training run owns, shared by train/train_loop.c (the loop) and
 * train/train_state.c (setting the run up and tearing it down). Private to
 * train/. */
#ifndef DT_TRAIN_TRAIN_STATE_INTERNAL_H
#define DT_TRAIN_TRAIN_STATE_INTERNAL_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "dist/dp.h"
#include "train/mfu.h"
#include "train/train_checkpoint.h"
#include "train/train_loop.h"

/* Everything one run owns, released in reverse order by state_destroy. */
typedef struct train_state {
  const dt_task *task; /* &task_ctx */
  dt_task task_ctx;    /* the table's, at the run's context (--ctx) */
  const dt_task_data *data;
  dt_task_data folder_data;         /* `data` for an image folder: its path and classes */
  dt_image_folder_config image_cfg; /* an image folder's, defaults resolved */
  dt_device dev;
  char device_text[DT_TRAIN_MAX_DEVICES * 12]; /* the hooks' device_name: valid until finish */
  dt_dataset *train_set;
  dt_dataset *test_set;
  dt_sampler *sampler;
  dt_loader *loader;
  dt_lr_schedule schedule;
  dt_step_config step;       /* the task's loss, clipping, the schedule */
  int64_t batches_per_epoch; /* micro-batches in a whole epoch */
  int64_t steps_per_epoch;   /* optimizer steps in a whole epoch */
  int64_t total_steps;       /* optimizer steps in the run */
  /* One replica (single process, DDP rank), or dp's replicas. */
  dt_replica *replica;
  dt_dp *dp;
  int n_replicas;
  /* Borrowed from the replica (dp: replica 0's). */
  dt_module *model;
  dt_optimizer *opt;
  dt_comm *comm; /* DDP (world > 1) */
  dt_ddp *ddp;
  int rank, world;
  double first_loss;           /* the run's first micro-batch loss (0 = not yet, -1 = none) */
  dt_train_ckpt *ck;           /* run directory and checkpoints, NULL = none */
  dt_train_position pos;       /* after the last optimizer step (or the resumed one) */
  bool stopped;                /* a stop was requested (should_stop): saved, ending */
  int stop_code;               /* should_stop's answer (see dt_train_result) */
  dt_step_stats stats;         /* the gradient norm for the metrics */
  dt_grad_scaler scaler;       /* --precision fp16: the step's (step.scaler) */
  dt_precision precision;      /* the run's (the device's default resolved): the MFU's peak */
  const dt_train_hooks *hooks; /* the configuration's */
  bool started;                /* hooks->start was called: finish is due */
  dt_mfu_cache mfu;            /* the CPU roof, measured once per run */
  /* `max_memory` and the out-of-memory recovery (train/train_oom.c). */
  bool capped;          /* the cap is in force */
  int split;            /* each micro-batch runs as pieces of batch / split (rounded up) */
  int oom_retries;      /* recoveries so far */
  char oom_error[1024]; /* the last out-of-memory message */
} train_state;

/* The device, the task at its context, the data (this rank's shard and the
 * loader), the plan of steps and the LR schedule, the step's precision,
 * and the replica (DDP: connected to its peers) or dp's replicas. On
 * failure what was made stays in *s for dt_train_state_destroy. */
dt_status dt_train_state_create(const dt_train_config *c, train_state *s);
/* The run directory and the resumed state in every replica (*log also
 * writes train.log from here on). */
dt_status dt_train_state_open_checkpoints(const dt_train_config *c, train_state *s, FILE **log);
/* Releases everything state_create made (the loader's thread stops). */
void dt_train_state_destroy(train_state *s);
/* The samples of each piece a micro-batch runs as (OOM recovery's split). */
int64_t dt_train_piece_size(const dt_train_config *c, const train_state *s);
/* Puts `max_memory` in force on the run's device(s) once the run has taken
 * `max_memory_from_step` optimizer steps (`steps`); a no-op otherwise. */
dt_status dt_train_oom_cap(const dt_train_config *c, train_state *s, int64_t steps);
/* The same before the run's state exists, for `batch` auto's plan and
 * trial step: `max_memory` on this rank's device(s) when it is in force
 * from the start (`max_memory_from_step` 0). */
dt_status dt_train_oom_cap_before_start(const dt_train_config *c);
/* Whether st (an error of a step's micro-batch) is an out-of-memory error
 * the run recovers from (with `max_memory`); keeps its message. */
bool dt_train_oom_caught(const dt_train_config *c, train_state *s, dt_status st);
/* At the end of an accumulation group: whether any rank had an
 * out-of-memory error in it (*oom, this rank's in, the ranks' out). */
dt_status dt_train_oom_agree(const dt_train_config *c, train_state *s, bool *oom);
/* After an agreed out-of-memory error: drops the group's gradients and
 * the cached memory, halves the micro-batch (doubles the split) and fills
 * *ev; the caller redoes the step from `first_batch`. DT_ERR_OOM with the
 * memory's breakdown and the levers when the micro-batch is already the
 * smallest, or (dp) when a piece, the last included, would have fewer
 * samples than the replicas. */
dt_status dt_train_oom_recover(const dt_train_config *c, train_state *s, int epoch,
                               int64_t first_batch, int64_t steps, dt_train_oom *ev);

/* "nccl", "mpi", or "mpi (host-staged)" for device tensors over mpi. */
const char *dt_train_comm_description(const train_state *s);

#endif
