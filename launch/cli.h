/* What the dtrain subcommands share: the flags that several of them take
 * (written once here, so train and bench describe and check them alike),
 * the lists of accepted names, the environment check and the way errors
 * are printed. */
#ifndef DT_LAUNCH_CLI_H
#define DT_LAUNCH_CLI_H

#include <stdint.h>
#include <stdio.h>

#include "core/device.h"
#include "core/status.h"
#include "launch/flags.h"
#include "models/tasks.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The data sets `--data` accepts: folders of the same name under the data
 * directory, in the MNIST idx format. */
#define DT_CLI_DATA_SETS "fashion-mnist|mnist"

/* "lenet|mlp": the model registry's names (models/models.h), for --model. */
const char *dt_cli_model_choices(void);
/* "fashion-mnist|mnist|brown": every data set of the task table, for
 * train's --data (which of them a model takes is checked at the start). */
const char *dt_cli_data_choices(void);
/* The same names joined by ", " (for messages). */
const char *dt_cli_data_names(void);
/* train's --data: one of dt_cli_data_choices(), or an existing folder (an
 * image folder: DIR/train/<class>/, DIR/val/<class>/). */
bool dt_cli_check_data(const char *value, char *why, size_t cap);
/* Per-channel values "V" (every channel) or "R,G,B" into out[3]: --image-mean,
 * --image-std (a check function and the parse). */
bool dt_cli_check_channel_values(const char *value, char *why, size_t cap);
bool dt_cli_check_channel_std(const char *value, char *why, size_t cap); /* each > 0 */
void dt_cli_parse_channel_values(const char *value, float out[3]);

/* The value of `--name V` / `--name=V` in argv before any `--` (the last
 * one given), or NULL: what train needs before it parses (--model decides
 * the defaults the other flags start from). */
const char *dt_cli_peek_flag(int argc, char **argv, const char *name);

/* `--batch auto` (or --batch=auto) before a `--` taken out of argv
 * (train and bench: the parser sees the rest); returns the new argc, *found
 * whether it was there. */
int dt_cli_take_batch_auto(int argc, char **argv, bool *found);

/* Shared flags: each returns the table row for a target. */
dt_flag dt_cli_flag_model(const char **target);
dt_flag dt_cli_flag_optimizer(const char **target, const char *help);
/* --data-dir (per rank: each rank may read its own copy). */
dt_flag dt_cli_flag_data_dir(const char **target);
dt_flag dt_cli_flag_device(const char **target);
dt_flag dt_cli_flag_threads(int *target);
/* --ctx T: a language model's context (0 = the model's own). */
dt_flag dt_cli_flag_ctx(int *target);
/* --image-size PX and --channels C for the image models (plan, bench). */
#define DT_CLI_IMAGE_SHAPE_FLAGS(size_, channels_)                                           \
  DT_INT_FLAG("image-size", (size_), "PX",                                                   \
              "image models: the images' height and width, 0 = the model's input", .min = 0, \
              .max = 4096),                                                                  \
      DT_INT_FLAG("channels", (channels_), "C",                                              \
                  "image models: 1 (grey) or 3 (RGB), 0 = the model's input", .min = 0, .max = 3)
/* The task at --image-size and --channels (0: its own): only a model built
 * for any image size (the ResNets) takes them; errors name the flag. */
dt_status dt_cli_task_image_shape(dt_task *task, int image_size, int channels);
/* After parsing: --ctx `ctx` fits model `model` (a sequence task, T at
 * most its context); otherwise prints "dtrain <command>: invalid value ..."
 * to err and returns false (exit 2). An unknown model is left to the run. */
bool dt_cli_check_ctx(const char *command, const char *model, int ctx, FILE *err);
/* --precision fp32|tf32|bf16|fp16 (core/amp.h); *target NULL = the
 * device's default (tf32 on CUDA, fp32 on the CPU). */
dt_flag dt_cli_flag_precision(const char **target);
/* --stochastic-rounding: of the 16-bit working copy of the weights (llm.c's) */
dt_flag dt_cli_flag_stochastic_rounding(bool *target);
/* --recompute: activation recomputation per transformer block (train, bench). */
dt_flag dt_cli_flag_recompute(bool *target);
/* --channels-last (train, bench): the ResNets' activations NHWC. */
dt_flag dt_cli_flag_channels_last(bool *target);
/* --max-memory MIB: the device's memory cap (train, bench; at least 1). */
dt_flag dt_cli_flag_max_memory(int *target);
/* After parsing: --precision `precision` (NULL: the default) suits the
 * device(s) (`device`, and dp's `devices` list when not NULL): tf32 needs
 * CUDA; and --stochastic-rounding (`stochastic`) needs bf16 or fp16.
 * Otherwise prints "dtrain <command>: ..." to err and returns false
 * (exit 2). */
bool dt_cli_check_precision(const char *command, const char *precision, bool stochastic,
                            const char *device, const char *devices, FILE *err);
/* --debug-overflow's value: RANK:STEP. */
bool dt_cli_check_debug_overflow(const char *value, char *why, size_t cap);
dt_flag dt_cli_flag_seed(uint64_t *target, const char *help);
/* --comm-backend: start *target at dt_cli_comm_backend_default()
 * (DT_COMM_BACKEND's value, or "auto") so that the help shows it; the flag
 * was given when *target no longer points at that string. */
dt_flag dt_cli_flag_comm_backend(const char **target);
const char *dt_cli_comm_backend_default(void);
dt_flag dt_cli_flag_comm_timeout(double *target);
dt_flag dt_cli_flag_bucket_cap_mb(float *target);
dt_flag dt_cli_flag_first_bucket_mb(float *target);
/* --zero 0|1|2: the ZeRO stage of the DDP reducer (dist/ddp.h). */
dt_flag dt_cli_flag_zero(int *target);
/* --grad-compress none|bf16|fp16: the reducer's 16-bit all-reduce
 * (dist/ddp.h, dt_ddp_grad_compress_parse). */
dt_flag dt_cli_flag_grad_compress(const char **target);
/* --split-bucket-mb: dt_ddp_config.split_bytes in MiB (0 = off). */
dt_flag dt_cli_flag_split_bucket_mb(float *target);
/* --bucket-update each|last: dt_ddp_config.update_per_bucket. */
#define DT_CLI_BUCKET_UPDATE_CHOICES "each|last"
dt_flag dt_cli_flag_bucket_update(const char **target);
/* The DDP flags of train and bench, in this order, as rows of a flag
 * table: --comm-backend, --comm-timeout, --bucket-cap-mb, --first-bucket-mb,
 * --split-bucket-mb, --bucket-update, --zero, --grad-compress. */
#define DT_CLI_DDP_FLAGS(comm_backend, comm_timeout, bucket_cap_mb, first_bucket_mb,          \
                         split_bucket_mb, bucket_update, zero, grad_compress)                 \
  dt_cli_flag_comm_backend(comm_backend), dt_cli_flag_comm_timeout(comm_timeout),             \
      dt_cli_flag_bucket_cap_mb(bucket_cap_mb), dt_cli_flag_first_bucket_mb(first_bucket_mb), \
      dt_cli_flag_split_bucket_mb(split_bucket_mb), dt_cli_flag_bucket_update(bucket_update), \
      dt_cli_flag_zero(zero), dt_cli_flag_grad_compress(grad_compress)

/* The sampling flags of train and sample over a dt_sample_config
 * (train/sample.h), as rows of a flag table: --sample-len, --temperature,
 * --top-k, --prompt, --sample-seed. */
#define DT_CLI_SAMPLE_FLAGS(sc)                                                                   \
  DT_INT_FLAG("sample-len", &(sc)->length, "N", "text models: tokens per sample, 0 = no samples", \
              .min = 0),                                                                          \
      DT_FLOAT_FLAG("temperature", &(sc)->temperature, "T",                                       \
                    "text models: sampling temperature, 0 = greedy", .min = 0),                   \
      DT_INT_FLAG("top-k", &(sc)->top_k, "K",                                                     \
                  "text models: sample among the K likeliest tokens, 0 = all", .min = 0),         \
      DT_STRING_FLAG("prompt", &(sc)->prompt, "TEXT", "text models: the samples' beginning",      \
                     .default_text = "<|endoftext|>"),                                            \
      DT_U64_FLAG("sample-seed", &(sc)->seed, "N", "text models: seed of the samples' draws")

/* False, with a message to err, when argv gives a text model's flag
 * (--prompt, --sample-len, ...) to a task without a tokenizer: refused
 * as --ctx is, not ignored. */
bool dt_cli_check_text_flags(const char *command, const dt_task *task, int argc, char **argv,
                             FILE *err);

/* Checks for STRING flags: a device name (cpu, cpu:N, cuda, cuda:N), a
 * device list (cpu:0,cpu:1). */
bool dt_cli_check_device(const char *value, char *why, size_t cap);
/* --device: as dt_device_parse, "cuda" without an index is the rank's own
 * GPU (DT_TRAIN_RANK_DEVICE). */
dt_status dt_cli_device(const char *name, dt_device *out);
/* --devices "cpu:0,cpu:1" (no spaces, no empty items, at most cap) into
 * devs; *n gets the count. DT_ERR_INVALID_ARG naming the bad item. */
dt_status dt_cli_parse_devices(const char *list, dt_device *devs, int cap, int *n);
/* --debug-overflow "R:S" (R, S >= 0). */
dt_status dt_cli_parse_debug_overflow(const char *s, int *rank, int64_t *step);
bool dt_cli_check_device_list(const char *value, char *why, size_t cap);
/* --trace-steps A:B (launch/trace.h's dt_trace_parse_steps). */
bool dt_cli_check_trace_steps(const char *value, char *why, size_t cap);

/* Validates every DT_* variable a run reads (core/env_params.def, the test
 * group aside). DT_ERR_INVALID_ARG with the first bad one in
 * dt_last_error(). */
dt_status dt_cli_check_env(void);

/* Prints the last error as "dtrain: error: <prefix><message>" to `err`,
 * and with DT_DEBUG=1 a second line saying where it arose. */
void dt_cli_print_error(FILE *err, const char *prefix);

#ifdef __cplusplus
}
#endif
#endif
