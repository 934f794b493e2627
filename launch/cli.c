#include "launch/cli.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "core/backend.h"
#include "core/env.h"
#include "core/tensor.h"
#include "dist/ddp.h"
#include "launch/trace.h"
#include "models/models.h"
#include "models/tasks.h"
#include "train/train_loop.h"

const char *dt_cli_model_choices(void) {
  static char list[256];
  if (!list[0]) {
    size_t used = 0;
    for (int i = 0; dt_model_name(i) && used < sizeof list; i++)
      used +=
          (size_t)snprintf(list + used, sizeof list - used, "%s%s", i ? "|" : "", dt_model_name(i));
  }
  return list;
}

const char *dt_cli_data_choices(void) {
  static char list[256];
  if (!list[0]) {
    size_t used = 0;
    for (int t = 0; t < dt_task_count(); t++) {
      const dt_task *task = dt_task_at(t);
      for (int d = 0; d < task->n_data && used < sizeof list; d++) {
        const char *name = task->data[d].name;
        if (used > 0 && dt_flags_is_choice(name, list))
          continue;
        used += (size_t)snprintf(list + used, sizeof list - used, "%s%s", used ? "|" : "", name);
      }
    }
  }
  return list;
}

const char *dt_cli_peek_flag(int argc, char **argv, const char *name) {
  const char *value = NULL;
  size_t n = strlen(name);
  for (int i = 0; i < argc && strcmp(argv[i], "--") != 0; i++) {
    const char *a = argv[i];
    if (strncmp(a, "--", 2) != 0 || strncmp(a + 2, name, n) != 0)
      continue;
    if (a[2 + n] == '\0' && i + 1 < argc)
      value = argv[i + 1];
    else if (a[2 + n] == '=')
      value = a + 3 + n;
  }
  return value;
}

int dt_cli_take_batch_auto(int argc, char **argv, bool *found) {
  *found = false;
  for (int i = 0; i < argc && strcmp(argv[i], "--") != 0; i++) {
    int n = !strcmp(argv[i], "--batch=auto")                                              ? 1
            : !strcmp(argv[i], "--batch") && i + 1 < argc && !strcmp(argv[i + 1], "auto") ? 2
                                                                                          : 0;
    if (n == 0)
      continue;
    *found = true;
    memmove(&argv[i], &argv[i + n], (size_t)(argc - i - n) * sizeof *argv);
    argc -= n;
    i--;
  }
  return argc;
}

dt_flag dt_cli_flag_model(const char **target) {
  return (dt_flag)DT_CHOICE_FLAG("model", target, "NAME",
                                 "the network to train (mlp is 784-512-512-10, lenet is LeNet-5, "
                                 "gpt2-* and llama-* are GPT-2 and Llama language models, "
                                 "resnet* torchvision's ResNets, -small with the 3x3 stride-1 "
                                 "stem and no max-pool for 28-64 px images)",
                                 dt_cli_model_choices());
}

dt_flag dt_cli_flag_optimizer(const char **target, const char *help) {
  return (dt_flag)DT_CHOICE_FLAG("optimizer", target, "NAME", help, "sgd|adamw");
}

const char *dt_cli_data_names(void) {
  static char names[256];
  return names[0] ? names : dt_flags_format_choices(dt_cli_data_choices(), names, sizeof names);
}

bool dt_cli_check_data(const char *value, char *why, size_t cap) {
  struct stat sb;
  if (dt_flags_is_choice(value, dt_cli_data_choices()) ||
      (stat(value, &sb) == 0 && S_ISDIR(sb.st_mode)))
    return true;
  snprintf(why, cap, "expected one of %s, or an image folder (a folder holding train/ and val/)",
           dt_cli_data_names());
  return false;
}

/* Up to 3 comma-separated numbers; returns how many (0: a bad one). */
static int channel_values(const char *value, float out[3]) {
  const char *p = value;
  int n = 0;
  for (; n < 3; n++) {
    char *end = NULL;
    out[n] = strtof(p, &end);
    if (end == p || !(out[n] == out[n]))
      return 0;
    p = end;
    if (*p == '\0')
      return n + 1;
    if (*p++ != ',')
      return 0;
  }
  return 0;
}

bool dt_cli_check_channel_values(const char *value, char *why, size_t cap) {
  float v[3];
  int n = channel_values(value, v);
  if (n == 1 || n == 3)
    return true;
  snprintf(why, cap, "expected one number or three (R,G,B), comma-separated");
  return false;
}

bool dt_cli_check_channel_std(const char *value, char *why, size_t cap) {
  float v[3];
  int n = channel_values(value, v);
  for (int k = 0; k < n; k++)
    if (!(v[k] > 0.0f))
      n = 0;
  if (n == 1 || n == 3)
    return true;
  snprintf(why, cap, "expected one number or three (R,G,B), comma-separated, each > 0");
  return false;
}

void dt_cli_parse_channel_values(const char *value, float out[3]) {
  float v[3] = {0};
  int n = channel_values(value, v);
  for (int k = 0; k < 3; k++)
    out[k] = n == 1 ? v[0] : v[k];
}

dt_flag dt_cli_flag_data_dir(const char **target) {
  return (dt_flag)DT_STRING_FLAG("data-dir", target, "DIR",
                                 "folder holding the data sets; env DT_DATA_DIR sets the default",
                                 .per_rank = true);
}

bool dt_cli_check_device(const char *value, char *why, size_t cap) {
  dt_device d;
  if (dt_device_parse(value, &d) == DT_OK)
    return true;
  snprintf(why, cap, "expected cpu, cpu:N, cuda or cuda:N");
  dt_clear_error();
  return false;
}

bool dt_cli_check_trace_steps(const char *value, char *why, size_t cap) {
  int64_t a = 0, b = 0;
  if (dt_trace_parse_steps(value, &a, &b) == DT_OK)
    return true;
  snprintf(why, cap, "expected A:B, the first and last optimizer step to record (1 <= A <= B)");
  dt_clear_error();
  return false;
}

dt_status dt_cli_parse_devices(const char *list, dt_device *devs, int cap, int *n) {
  *n = 0;
  if (!list || !list[0])
    return DT_ERROR(DT_ERR_INVALID_ARG,
                    "empty device list: expected devices separated by commas, e.g. cpu:0,cpu:1");
  const char *p = list;
  for (;;) {
    const char *end = strchr(p, ',');
    size_t len = end ? (size_t)(end - p) : strlen(p);
    char item[64];
    if (len == 0 || len >= sizeof item)
      return DT_ERROR(DT_ERR_INVALID_ARG,
                      "device list '%s': %s item: expected devices separated by commas, e.g. "
                      "cpu:0,cpu:1",
                      list, len == 0 ? "an empty" : "an overlong");
    if (*n >= cap)
      return DT_ERROR(DT_ERR_INVALID_ARG, "device list '%s': more than %d devices", list, cap);
    memcpy(item, p, len);
    item[len] = '\0';
    dt_status st = dt_device_parse(item, &devs[*n]);
    if (st != DT_OK)
      return dt_error_wrap(st, "device list '%s': item '%s'", list, item);
    (*n)++;
    if (!end)
      break;
    p = end + 1;
  }
  return DT_OK;
}

dt_status dt_cli_device(const char *name, dt_device *out) {
  DT_CHECK(dt_device_parse(name, out));
  if (out->type == DT_DEVICE_CUDA && !strchr(name, ':'))
    out->index = DT_TRAIN_RANK_DEVICE;
  return DT_OK;
}

dt_status dt_cli_parse_debug_overflow(const char *s, int *rank, int64_t *step) {
  char tail;
  long long r = -1, t = -1;
  if (!s || sscanf(s, "%lld:%lld%c", &r, &t, &tail) != 2 || r < 0 || t < 0 || r > INT32_MAX)
    return DT_ERROR(DT_ERR_INVALID_ARG,
                    "--debug-overflow '%s': expected RANK:STEP (rank R's gradients get an Inf at "
                    "optimizer step S, both >= 0)",
                    s ? s : "(null)");
  *rank = (int)r;
  *step = (int64_t)t;
  return DT_OK;
}

bool dt_cli_check_device_list(const char *value, char *why, size_t cap) {
  dt_device devs[DT_TRAIN_MAX_DEVICES];
  int n = 0;
  if (dt_cli_parse_devices(value, devs, DT_TRAIN_MAX_DEVICES, &n) == DT_OK)
    return true;
  snprintf(why, cap, "%s", dt_last_error());
  dt_clear_error();
  return false;
}

dt_flag dt_cli_flag_device(const char **target) {
  return (dt_flag)DT_STRING_FLAG("device", target, "DEV",
                                 "cpu, cpu:N, cuda:N, or cuda: under a launcher each rank's own "
                                 "GPU (its local rank)",
                                 .check = dt_cli_check_device, .per_rank = true);
}

dt_flag dt_cli_flag_precision(const char **target) {
  return (dt_flag)DT_CHOICE_FLAG(
      "precision", target, "P",
      "arithmetic: fp32, tf32 (CUDA's tensor cores for f32 GEMMs), bf16 or fp16 (autocast "
      "with f32 master weights; fp16 with a GradScaler): docs/mixed-precision.md",
      "fp32|tf32|bf16|fp16", .default_text = "tf32 on CUDA, fp32 on the CPU");
}

dt_flag dt_cli_flag_stochastic_rounding(bool *target) {
  return (dt_flag)DT_BOOL_FLAG("stochastic-rounding", target,
                               "bf16/fp16: round the optimizer's 16-bit working copy of the "
                               "weights stochastically (seeded by --seed), not to nearest");
}

dt_flag dt_cli_flag_recompute(bool *target) {
  return (dt_flag)DT_BOOL_FLAG("recompute", target,
                               "GPT-2, Llama and ResNets: recompute each transformer or residual "
                               "block's activations in backward instead of keeping them (less "
                               "memory, the same gradients, one more forward of the blocks)");
}

dt_flag dt_cli_flag_channels_last(bool *target) {
  return (dt_flag)DT_BOOL_FLAG("channels-last", target,
                               "resnet*: (N, H, W, C) activations through every convolution, batch "
                               "norm and pooling (cuDNN's NHWC kernels on a GPU; the same weights "
                               "and checkpoints)");
}

dt_flag dt_cli_flag_max_memory(int *target) {
  return (dt_flag)DT_INT_FLAG(
      "max-memory", target, "MIB",
      "cap the memory the run's tensors may take on its device, in MiB: the CPU allocator's cap, "
      "or what the CUDA caching allocator may reserve. train: an out-of-memory error inside a "
      "step is then recovered from by halving the micro-batch and doubling --accum (the same "
      "global batch and data order)",
      .min = 1, .default_text = "none (the device's default cap)");
}

bool dt_cli_check_precision(const char *command, const char *precision, bool stochastic,
                            const char *device, const char *devices, FILE *err) {
  bool half = precision && (!strcmp(precision, "bf16") || !strcmp(precision, "fp16"));
  if (stochastic && !half) {
    fprintf(err,
            "dtrain %s: --stochastic-rounding rounds the 16-bit working copy of the weights: it "
            "needs --precision bf16 or fp16\n",
            command);
    return false;
  }
  if (precision == NULL || strcmp(precision, "tf32") != 0)
    return true;
  const char *on = devices ? devices : device ? device : "cpu";
  if (strncmp(on, "cpu", 3) != 0 && strstr(on, "cpu") == NULL)
    return true;
  fprintf(err,
          "dtrain %s: --precision tf32 needs a CUDA device (TF32 is a tensor-core format), not "
          "%s: use --precision fp32 on the CPU (or bf16, fp16)\n",
          command, on);
  return false;
}

bool dt_cli_check_debug_overflow(const char *value, char *why, size_t cap) {
  int rank = 0;
  int64_t step = 0;
  if (dt_cli_parse_debug_overflow(value, &rank, &step) == DT_OK)
    return true;
  dt_clear_error();
  snprintf(why, cap, "expected RANK:STEP, both >= 0 (e.g. 1:5)");
  return false;
}

dt_flag dt_cli_flag_threads(int *target) {
  return (dt_flag)DT_INT_FLAG("threads", target, "N",
                              "CPU threads, 0 = all available cores (or DT_NUM_THREADS)", .min = 0,
                              .max = DT_CPU_MAX_THREADS, .per_rank = true);
}

dt_status dt_cli_task_image_shape(dt_task *task, int image_size, int channels) {
  if (!image_size && !channels)
    return DT_OK;
  const char *flag = image_size ? "image-size" : "channels";
  if (!task->any_image_size)
    return DT_ERROR(DT_ERR_INVALID_ARG,
                    "--%s: model %s does not take images of another size or channel count "
                    "(the resnet* models do)",
                    flag, task->name);
  if (channels != 0 && channels != 1 && channels != 3)
    return DT_ERROR(DT_ERR_INVALID_ARG, "--channels %d: expected 1 (grey) or 3 (RGB)", channels);
  if (image_size)
    task->input_shape[1] = task->input_shape[2] = image_size;
  if (channels)
    task->input_shape[0] = channels;
  return DT_OK;
}

dt_flag dt_cli_flag_ctx(int *target) {
  return (dt_flag)DT_INT_FLAG("ctx", target, "T",
                              "language models: context length (at most the model's), 0 = the "
                              "model's own",
                              .min = 0);
}

bool dt_cli_check_ctx(const char *command, const char *model, int ctx, FILE *err) {
  const dt_task *task = NULL;
  if (ctx == 0 || dt_task_find(model, &task) != DT_OK) {
    dt_clear_error();
    return true;
  }
  if (task->max_context > 0 && ctx <= task->max_context)
    return true;
  if (task->max_context > 0)
    fprintf(err, "dtrain %s: invalid value '%d' for --ctx: model %s's context is 1 to %lld\n",
            command, ctx, model, (long long)task->max_context);
  else
    fprintf(err,
            "dtrain %s: --ctx %d: model %s takes no sequence (--ctx is for the gpt2-* and llama-* "
            "models)\n",
            command, ctx, model);
  return false;
}

bool dt_cli_check_text_flags(const char *command, const dt_task *task, int argc, char **argv,
                             FILE *err) {
  static const char *const text_flags[] = {"prompt", "sample-len",  "temperature",
                                           "top-k",  "sample-seed", "sample-every"};
  if (task->tokenizer)
    return true;
  for (size_t i = 0; i < sizeof text_flags / sizeof text_flags[0]; i++)
    if (dt_cli_peek_flag(argc, argv, text_flags[i])) {
      fprintf(err,
              "dtrain %s: --%s: model %s does not generate text (--%s is for the gpt2-* "
              "and llama-* models)\n",
              command, text_flags[i], task->name, text_flags[i]);
      return false;
    }
  return true;
}

dt_flag dt_cli_flag_seed(uint64_t *target, const char *help) {
  return (dt_flag)DT_U64_FLAG("seed", target, "N", help);
}

const char *dt_cli_comm_backend_default(void) {
  const char *env = dt_env_raw(DT_ENV_COMM_BACKEND);
  return env ? env : dt_env_default_text(DT_ENV_COMM_BACKEND);
}

dt_flag dt_cli_flag_comm_backend(const char **target) {
  return (dt_flag)DT_CHOICE_FLAG("comm-backend", target, "NAME",
                                 "how gradients are all-reduced: auto = nccl on GPUs, else mpi; "
                                 "mpi stages GPU tensors through host memory; overrides env "
                                 "DT_COMM_BACKEND",
                                 dt_env_info_of(DT_ENV_COMM_BACKEND)->choices);
}

dt_flag dt_cli_flag_comm_timeout(double *target) {
  return (dt_flag)DT_DOUBLE_FLAG("comm-timeout", target, "S",
                                 "DDP: seconds a collective may take before the watchdog names "
                                 "it and aborts the job",
                                 .min = 0, .min_exclusive = true);
}

/* A DDP bucket size in MiB: above 0, or from 0 where 0 turns it off. */
static dt_flag bucket_mib_flag(const char *name, float *target, const char *help,
                               bool zero_is_off) {
  return (dt_flag)DT_FLOAT_FLAG(name, target, "MB", help, .min = 0, .min_exclusive = !zero_is_off);
}

dt_flag dt_cli_flag_bucket_cap_mb(float *target) {
  return bucket_mib_flag("bucket-cap-mb", target,
                         "DDP: gradient bucket size after the first, in MiB", false);
}

dt_flag dt_cli_flag_split_bucket_mb(float *target) {
  return bucket_mib_flag("split-bucket-mb", target,
                         "DDP: split each parameter of the last bucket above this many MiB into "
                         "parts (row blocks) that all-reduce as backward writes them; 0 = off",
                         true);
}

dt_flag dt_cli_flag_bucket_update(const char **target) {
  return (dt_flag)DT_CHOICE_FLAG("bucket-update", target, "WHEN",
                                 "DDP: each: the optimizer updates each bucket as its "
                                 "all-reduce completes (without --clip, fp16 and --zero); last: "
                                 "one update after the last bucket",
                                 DT_CLI_BUCKET_UPDATE_CHOICES);
}

dt_flag dt_cli_flag_first_bucket_mb(float *target) {
  return bucket_mib_flag("first-bucket-mb", target,
                         "DDP: first gradient bucket, in MiB (small, so that the first "
                         "all-reduce starts early)",
                         false);
}

dt_flag dt_cli_flag_zero(int *target) {
  return (dt_flag)DT_INT_FLAG("zero", target, "STAGE",
                              "DDP and dp: ZeRO stage: 0 all-reduce; 1 shard the optimizer state "
                              "over the ranks (gradients reduce-scattered, parameters "
                              "all-gathered); 2 also the gradients",
                              .min = 0, .max = 2);
}

dt_flag dt_cli_flag_grad_compress(const char **target) {
  return (dt_flag)DT_CHOICE_FLAG("grad-compress", target, "TYPE",
                                 "DDP and dp: all-reduce (ZeRO: reduce-scatter) the gradient "
                                 "buckets in 16 bits, half the bytes: cast, reduced in f32 and "
                                 "rounded to nearest even, cast back; fp16 overflows to inf",
                                 DT_DDP_GRAD_COMPRESS_CHOICES);
}

dt_status dt_cli_check_env(void) {
  for (int p = 0; p < DT_ENV_COUNT; p++) {
    if (!strcmp(dt_env_info_of((dt_env_param)p)->group, "test"))
      continue;
    DT_CHECK(dt_env_check((dt_env_param)p));
  }
  return DT_OK;
}

void dt_cli_print_error(FILE *err, const char *prefix) {
  fprintf(err, "dtrain: error: %s%s\n", prefix ? prefix : "", dt_last_error());
  bool debug = false;
  dt_env_bool(DT_ENV_DEBUG, &debug);
  if (debug && dt_last_error_location()[0])
    fprintf(err, "dtrain: debug: the error arose in %s\n", dt_last_error_location());
}
