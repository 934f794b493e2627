/* Commands over a checkpoint's model: `dtrain eval --checkpoint PATH` (the
 * test metrics) and `dtrain sample --checkpoint PATH` (text from a language
 * model). */
#ifndef DT_LAUNCH_EVAL_H
#define DT_LAUNCH_EVAL_H

#include <stdio.h>

#include "core/image.h"
#include "core/module.h"
#include "launch/flags.h"
#include "models/tasks.h"
#include "train/sample.h"

#ifdef __cplusplus
extern "C" {
#endif

/* argv holds the arguments after "eval". PATH is a checkpoint directory or
 * a run directory (its newest complete checkpoint). Prints
 * "test_loss=... test_<metric>=..." on stdout. Returns the exit status: 0,
 * 1 on a failure (the message printed), 2 on a bad command line. */
int dt_cli_eval(int argc, char **argv, FILE *err);

/* argv holds the arguments after "sample". Rebuilds the checkpoint's
 * language model (at the checkpoint's --ctx), loads its weights and prints
 * the prompt and its continuation on stdout (what one line about the
 * checkpoint and the settings goes to stderr); the same checkpoint,
 * prompt, settings and --sample-seed give the same text. Exit status: 0;
 * 1 for a checkpoint that is missing, damaged or not of a language model;
 * 2 for a bad command line (an empty --prompt, which has no tokens,
 * included: without --prompt the text starts from <|endoftext|>). */
int dt_cli_sample(int argc, char **argv, FILE *err);

/* ---- for the commands over a checkpoint (launch/export.c) ---- */

/* A checkpoint's model, loaded. */
typedef struct dt_cli_ckpt_model {
  char dir[4400], model[64], data[64], step[32];
  dt_task task; /* at the checkpoint's context (an image folder's: its images and classes) */
  /* A checkpoint of a run on an image folder: the folder (absolute), its
   * config (evaluation: no augmentation) and classes; "" = none. */
  char image_folder[4096];
  dt_image_folder_config image;
  int image_classes;
  dt_device dev;
  dt_module *module;
} dt_cli_ckpt_model;

/* Finds the checkpoint of `path` (a checkpoint or run directory), builds
 * its model on `device` and loads its weights; text_command non-NULL: the
 * model must generate text (else an error naming the model and "dtrain
 * <text_command>"). dt_cli_ckpt_model_close frees it, also after a
 * failure. */
dt_status dt_cli_ckpt_model_open(const char *path, const char *device, const char *text_command,
                                 dt_cli_ckpt_model *m);
void dt_cli_ckpt_model_close(dt_cli_ckpt_model *m);

/* The targets of a checkpoint command's flags. */
typedef struct dt_cli_ckpt_args {
  const char *checkpoint, *data_dir, *device;
  int batch;
  dt_sample_config sample;
  const char *format, *out; /* dtrain export */
  int required;             /* the first `required` own flags (strings) must be given */
  const char *dtype;        /* dtrain export --format gguf: f32, f16, bf16 */
  const char *data;         /* dtrain eval: an image folder in place of the checkpoint's */
} dt_cli_ckpt_args;

/* The command line of a command over a checkpoint: --checkpoint, the
 * command's `own` flags (targets in *a; at most 12), --data-dir, --device,
 * --threads; --checkpoint and own[0, a->required) missing are a bad
 * command line; then the environment, and `work`'s status as the exit status
 * (1 with the message printed; 2 for a bad command line). */
int dt_cli_checkpoint_command(dt_flag_set *set, dt_cli_ckpt_args *a, const dt_flag *own, int n_own,
                              int argc, char **argv, FILE *err, dt_status (*work)(void *));

#ifdef __cplusplus
}
#endif
#endif
