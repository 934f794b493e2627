/* The run directory and checkpoints of `dtrain train` (the files
 * themselves: core/checkpoint.h).
 *
 *   <run dir>/config.json                     the resolved configuration
 *   <run dir>/train.log                       rank 0's log lines
 *   <run dir>/checkpoints/step_NNNNNNNN/      model.safetensors, trainer_state.bin, manifest.json
 *
 * The run directory is run_dir, default runs/<model>-<data>-<UTC time>
 * (rank 0's clock, the same on every rank). It must be on a file system
 * every rank sees: each rank reads the checkpoint it resumes from.
 *
 * trainer_state.bin holds the sections
 *   "meta"       text lines "key value": the position (optimizer step, epoch,
 *                micro-batches of the epoch done, the global sample
 *                position), world size and per-rank batch, the first loss
 *                (divergence check), the RNG streams (the sampler's seed and
 *                epoch, the model initialisation's seed; the models have no
 *                other random state) and "config.*": what must match on
 *                resume (model, data set and its size, optimizer and its
 *                hyper-parameters, schedule and the steps it spans, accum,
 *                clip, seed, global batch, a language model's context)
 *   "optimizer"  the optimizer's moments as one shard [0, numel) of the flat
 *                parameter space (dt_ckpt_optim_section_*); under ZeRO each
 *                rank's shard becomes its own section "optimizer.rank<R>"
 *                written by its owner, which the reader already assembles.
 *
 * Saving: after the optimizer step that save_every names, at the end of
 * the run, and when a stop was requested. Training waits only for the copy
 * of the parameters and moments to host memory; a background thread writes
 * the files (one checkpoint in flight: the next save waits for the
 * previous), then removes all but the newest `keep`. Rank 0 writes
 * (everything is replicated).
 *
 * Resume (resume AUTO or PATH): auto takes the newest complete checkpoint of
 * the run directory (reporting and skipping corrupt or partial ones), or
 * starts from scratch when there is none; PATH must be a complete
 * checkpoint directory. The world size may differ when the global batch
 * stays (batch x ranks): the data position is a position in the global
 * sample stream, which does not depend on the world size. Not exact across
 * world sizes: the sum of the gradients is taken in another order (f32
 * rounding), and an epoch whose length is not a multiple of the world size
 * is padded differently by the DistributedSampler.
 *
 * Stopping: after each optimizer step the ranks agree (one all-reduce)
 * whether the hooks' should_stop asked for a stop on any rank; if so all
 * save, wait for the write and stop: dt_train_run returns DT_OK with
 * stop_code set (`dtrain train`, whose hook answers SIGTERM and SIGUSR1,
 * then exits 75). */
#ifndef DT_TRAIN_TRAIN_CHECKPOINT_H
#define DT_TRAIN_TRAIN_CHECKPOINT_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "core/image.h"
#include "core/module.h"
#include "core/optim.h"
#include "core/status.h"
#include "dist/comm.h"
#include "train/run_lock.h"

#ifdef __cplusplus
extern "C" {
#endif

struct dt_train_config;

/* What the checkpoint code sees of a run (borrowed). */
typedef struct dt_train_ckpt_run {
  const struct dt_train_config *cfg;
  dt_module *models[64]; /* every replica (one, or dp's) */
  dt_optimizer *opts[64];
  int n_replicas;
  dt_comm *comm; /* DDP, else NULL */
  dt_device dev;
  int rank, world;
  int64_t train_samples;     /* the training set's size */
  int64_t batches_per_epoch; /* this rank's micro-batches per epoch */
  const dt_lr_schedule *schedule;
  int64_t context; /* a sequence task's context T (ctx or the model's), 0 = none */
  /* fp16: the GradScaler, saved in a "scaler" section with the optimizer's
   * own step count (skipped steps leave it behind the run's step) and
   * restored on resume; NULL = none. */
  dt_grad_scaler *scaler;
  /* An image folder's config with its defaults resolved, and its classes
   * (NULL, 0: no image folder): kept in the meta for `dtrain eval`. */
  const dt_image_folder_config *image;
  int image_classes;
} dt_train_ckpt_run;

/* Where a run stands: after `step` optimizer steps, `batch` micro-batches of
 * epoch `epoch` (0-based) are done. */
typedef struct dt_train_position {
  int64_t step;
  int64_t epoch;
  int64_t batch;
  double first_loss;
  /* Out-of-memory recovery (train/train_oom.c): each micro-batch of `batch`
   * samples runs as pieces of batch / split (rounded up); 1 = whole. The
   * position counts micro-batches of `batch` whatever the split. */
  int split;
} dt_train_position;

typedef struct dt_train_ckpt dt_train_ckpt;

/* Sets up the run directory (rank 0 creates it, takes its lock for the
 * job: another live run's directory is DT_ERR_STATE naming its pid and
 * host on every rank; then writes config.json and opens train.log, which
 * *log then also writes to) and resumes when asked:
 * loads the weights and optimizer state into every replica and sets *pos
 * (else *pos is the start). Collective under DDP. NULL cfg->run_dir and
 * !cfg->run_dir_default: no run directory, no checkpoints (*out NULL). */
dt_status dt_train_ckpt_open(const dt_train_ckpt_run *run, FILE **log, dt_train_position *pos,
                             dt_train_ckpt **out);

/* After each optimizer step: the save that save_every calls for, unless
 * the ranks agreed to stop (`stop`: dt_train_ckpt_finish saves then).
 * Collective under DDP when it saves. NULL ck: no checkpoints. */
dt_status dt_train_ckpt_after_step(dt_train_ckpt *ck, const dt_train_position *pos, bool stop);

/* The end of the run: the final save (unless this step is saved already),
 * then waits for the writer; every rank learns whether rank 0's writes
 * succeeded (collective). */
dt_status dt_train_ckpt_finish(dt_train_ckpt *ck, const dt_train_position *pos);

/* train.log (rank 0), NULL = none: for lines the terminal does not show. */
FILE *dt_train_ckpt_log_file(const dt_train_ckpt *ck);
/* The run directory ("" for NULL). */
const char *dt_train_ckpt_run_dir(const dt_train_ckpt *ck);
/* The last checkpoint saved (a directory), "" = none. */
const char *dt_train_ckpt_last_saved(const dt_train_ckpt *ck);

/* The run directory's lock (train/run_lock.h; rank 0's, NULL on the
 * others), handed to the caller, who releases it after the run's last
 * write there (the hooks' metrics file); else dt_train_ckpt_close
 * releases it. */
dt_train_run_lock *dt_train_ckpt_take_lock(dt_train_ckpt *ck);

/* Waits for the writer, closes train.log, releases the run directory's
 * lock unless taken; *log (from open) goes back to the caller's stream.
 * NULL is a no-op. */
void dt_train_ckpt_close(dt_train_ckpt *ck, FILE **log);

/* A checkpoint to read: `path` itself when it holds a manifest, else the
 * newest complete checkpoint of the run directory `path` (corrupt or
 * partial ones are reported to `log` and skipped). Each candidate is
 * verified (dt_ckpt_verify). */
dt_status dt_train_ckpt_resolve(const char *path, FILE *log, char *out, size_t cap);

/* The meta value `key` of a checkpoint directory's trainer state. */
dt_status dt_train_ckpt_meta(const char *ckpt_dir, const char *key, char *buf, size_t cap);

#ifdef __cplusplus
}
#endif
#endif
