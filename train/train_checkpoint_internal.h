/* Shared by train/train_checkpoint.c (saving) and train/train_resume.c
 * (resuming); not for other users. */
#ifndef DT_TRAIN_TRAIN_CHECKPOINT_INTERNAL_H
#define DT_TRAIN_TRAIN_CHECKPOINT_INTERNAL_H

#include <stdint.h>
#include <stdio.h>

#include "core/checkpoint.h"
#include "train/train_checkpoint.h"

#define DT_CKPT_STATE_FILE "trainer_state.bin"
#define DT_CKPT_WEIGHTS_FILE "model.safetensors"

/* batch x ranks. */
int64_t dt_train_ckpt_global_batch(const dt_train_ckpt_run *r);
/* The run's model (task) and data set names. */
const char *dt_train_ckpt_model_name(const dt_train_ckpt_run *r);
const char *dt_train_ckpt_data_name(const dt_train_ckpt_run *r);
/* The "config.<flag> value" lines of the meta section: what must match. */
void dt_train_ckpt_config_lines(const dt_train_ckpt_run *r, char *buf, size_t cap);
/* The newest complete checkpoint in `parent` (a run's checkpoints/), ""
 * when there is none (or no parent yet); damaged ones are reported to log
 * and skipped; all damaged is an error. */
dt_status dt_train_ckpt_newest(const char *parent, FILE *log, char *out, size_t cap);
/* Between the optimizer state in the arena's coordinates (`flat`:
 * shard->n_buffers x shard->total, dt_optim_state_to_flat) and a
 * checkpoint section's packed data (each buffer's segments in order):
 * to_flat copies shard->data into flat, else flat into the packed `data`
 * (shard->data's storage when saving). */
void dt_train_ckpt_copy_segments(const dt_ckpt_optim_shard *shard, float *flat, float *data,
                                 int to_flat);
/* Loads checkpoint `dir` into every replica of `r` and sets *pos; the
 * configuration must match (an error naming the difference). */
dt_status dt_train_ckpt_load(const dt_train_ckpt_run *r, const char *dir, dt_train_position *pos);

#endif
