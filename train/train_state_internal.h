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
  dt_task_data folder_data; /* `data` for an image folder: its path and classes */
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
  int stop_code;               /* should_stop's answer (the largest over the ranks) */
  dt_step_stats stats;         /* the gradient norm for the metrics */
  dt_grad_scaler scaler;       /* --precision fp16: the step's (step.scaler) */
  dt_precision precision;      /* the run's (the device's default resolved): the MFU's peak */
  const dt_train_hooks *hooks; /* the configuration's */
  bool started;                /* hooks->start was called: finish is due */
  dt_mfu_cache mfu;            /* the CPU roof, measured once per run */
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
/* "nccl", "mpi", or "mpi (host-staged)" for device tensors over mpi. */
const char *dt_train_comm_description(const train_state *s);

#endif
