/* What the training loop (train/train_loop.c) does for tasks that say so
 * in the task table (models/tasks.h): sequence tasks' tokens/s, MFU from a
 * task's FLOPs per sample, samples of generated text, the result line.
 * The loop calls these for every task; what a task lacks prints nothing. */
#ifndef DT_TRAIN_TRAIN_LM_H
#define DT_TRAIN_TRAIN_LM_H

#include <stddef.h>
#include <stdio.h>

#include "core/device.h"
#include "core/module.h"
#include "core/status.h"
#include "models/tasks.h"
#include "train/mfu.h"
#include "train/train_loop.h"

#ifdef __cplusplus
extern "C" {
#endif

/* " tokens/s N" for sequence tasks and " mfu X.X%" for tasks with
 * flops_per_sample (peak: train/mfu.h, times `world` devices, the CPU roof kept in *cache; " mfu
 * n/a (above the measured roof)" when the run beat a CPU roof measured again) into buf; "" when the
 * task has neither. samples_per_s counts every rank. Returns the MFU in [0, 1], -1 when there is
 * none to report. */
double dt_train_throughput_text(const dt_task *task, dt_device dev, dt_precision precision,
                                dt_mfu_cache *cache, int world, double samples_per_s, char *buf,
                                size_t cap);

/* The header line on throughput: the FLOPs per token and the peak the MFU
 * is taken against (nothing for a task without flops_per_sample). Both
 * take the run's precision (train/mfu.h). */
void dt_train_log_flops(FILE *log, const char *prefix, const dt_task *task, dt_device dev,
                        dt_precision precision, dt_mfu_cache *cache);

/* Prints a sample of the model's text after optimizer step `step` (0: at
 * the end) to `log`, for text tasks with c->sample.length > 0. */
dt_status dt_train_log_sample(FILE *log, const dt_train_config *c, const dt_task *task,
                              dt_module *model, dt_device dev, long long step);

/* "val_loss" / "test_accuracy": what the result line names. */
const char *dt_train_result_name(const dt_task *task, char *buf, size_t cap);

#ifdef __cplusplus
}
#endif
#endif
