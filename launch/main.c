/* The dtrain command: subcommand dispatch, `dtrain train`, and the process
 * group of a distributed run. Only this folder calls exit(); everything
 * below returns a dt_status.
 *
 * train and bench run in a process group (dist/process_group.h), created
 * once here: a plain single process without a launcher, one rank of an MPI
 * job under mpirun / `srun --mpi=pmix` / `dtrain launch`. Rank 0 prints the
 * progress and results (other ranks too with --verbose-ranks, prefixed
 * "rank R: "); an error on any rank is printed as
 * "dtrain: error: rank R: ..." and ends the whole job (MPI_Abort), so no
 * rank is left waiting in a collective. */
#define _GNU_SOURCE
#include <errno.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/backend.h"
#include "core/cpu.h"
#include "core/env.h"
#include "core/status.h"
#include "dist/ddp.h"
#include "dist/process_group.h"
#include "launch/bench.h"
#include "launch/cli.h"
#include "launch/doctor.h"
#include "launch/eval.h"
#include "launch/export.h"
#include "launch/flags.h"
#include "launch/images.h"
#include "launch/launcher.h"
#include "launch/observe.h"
#include "launch/plan.h"
#include "launch/report.h"
#include "launch/threads.h"
#include "launch/tokenize.h"
#include "launch/top.h"
#include "launch/trace.h"
#include "models/tasks.h"
#include "train/train_checkpoint.h"
#include "train/train_loop.h"

/* A command has one of the two: train and bench run in the process group
 * (run_in_group), the others on their own (run). */
typedef struct command {
  const char *name;
  const char *summary;
  int (*run_in_group)(int argc, char **argv, dt_pg *pg, FILE *err);
  int (*run)(int argc, char **argv, FILE *err);
} command;

static int cli_train(int argc, char **argv, dt_pg *pg, FILE *err);

/* `dtrain train`'s exit status after a requested stop (SIGTERM/SIGUSR1)
 * saved a checkpoint: EX_TEMPFAIL, "try again" (the Slurm scripts requeue). */
#define DT_TRAIN_EXIT_STOPPED 75

/* The stop signal this process received (SIGTERM, SIGUSR1), 0 = none: the
 * trainer's should_stop hook. The command line's one piece of process
 * state: a signal handler can only set a flag. */
static volatile sig_atomic_t stop_requested;

static void on_stop_signal(int sig) { stop_requested = sig; }

static int stop_signal_received(void) { return (int)stop_requested; }

/* SIGTERM and SIGUSR1 request a stop after the current optimizer step. */
static void install_stop_signal_handlers(void) {
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  sigaction(SIGTERM, &sa, NULL);
  sigaction(SIGUSR1, &sa, NULL);
}
static int cli_help(int argc, char **argv, FILE *err);

static const command commands[] = {
    {"train", "train a model (default: LeNet-5 on Fashion-MNIST, one epoch, CPU)", cli_train},
    {"bench", "time training steps on synthetic data (steps_per_s=...)", dt_cli_bench},
    {"eval", "test metrics of a checkpoint: dtrain eval --checkpoint PATH", NULL, dt_cli_eval},
    {"sample", "text from a language model's checkpoint: dtrain sample --checkpoint PATH", NULL,
     dt_cli_sample},
    {"export", "a language model's checkpoint for other tools: dtrain export --format hf", NULL,
     dt_cli_export},
    {"plan", "memory per rank, the batch that fits and the step time on cpu, a100, h100, h200",
     NULL, dt_cli_plan},
    {"launch", "run train or bench on N ranks with mpirun: dtrain launch -n 2 -- train", NULL,
     dt_cli_launch},
    {"doctor", "check this machine for the default job and GPU training: one verdict line", NULL,
     dt_cli_doctor},
    {"tokenize", "text to GPT-2 token shards in llm.c's format (train.bin, val.bin)", NULL,
     dt_cli_tokenize},
    {"images", "an idx data set as an image folder: dtrain images --from mnist --out DIR", NULL,
     dt_cli_images},
    {"report", "an HTML page of a run's metrics file: loss, throughput, memory, comm", NULL,
     dt_cli_report},
    {"top", "live view of this machine's GPUs and the ranks of running dtrain jobs", NULL,
     dt_cli_top},
    {"help", "show this help, or the help of a command: dtrain help train", NULL, cli_help},
};
#define NUM_COMMANDS ((int)(sizeof commands / sizeof commands[0]))

static void print_usage(FILE *out) {
  fprintf(out,
          "usage: dtrain <command> [flags]\n\n"
          "dtrain trains neural networks on the CPU (and CUDA GPUs), one process per device.\n\n"
          "commands:\n");
  for (int i = 0; i < NUM_COMMANDS; i++)
    fprintf(out, "  %-8s %s\n", commands[i].name, commands[i].summary);
  fprintf(out, "\nRun `dtrain <command> --help` for the flags of a command.\n");
}

static const command *find_command(const char *name) {
  for (int i = 0; i < NUM_COMMANDS; i++)
    if (!strcmp(commands[i].name, name))
      return &commands[i];
  return NULL;
}

static void print_unknown_command(const char *name) {
  fprintf(stderr, "dtrain: unknown command '%s' (commands:", name);
  for (int i = 0; i < NUM_COMMANDS; i++)
    fprintf(stderr, "%s %s", i ? "," : "", commands[i].name);
  fprintf(stderr, "; see dtrain --help)\n");
}

/* The command c, with the process group pg where it runs in one. */
static int run_command(const command *c, int argc, char **argv, dt_pg *pg, FILE *err) {
  return c->run_in_group ? c->run_in_group(argc, argv, pg, err) : c->run(argc, argv, err);
}

static int cli_help(int argc, char **argv, FILE *err) {
  dt_flag_set set = {
      .command = "help",
      .usage = "help [COMMAND]",
      .about = "Shows the commands, or the help of one: dtrain help train is dtrain train --help.",
      .max_args = 1,
  };
  dt_flags_args args;
  DT_FLAGS_PARSE_OR_RETURN(&set, argc, argv, err, &args);
  if (args.nargs == 0) {
    print_usage(stdout);
    return 0;
  }
  const command *c = find_command(args.args[0]);
  if (!c) {
    print_unknown_command(args.args[0]);
    return 2;
  }
  char help_flag[] = "--help";
  char *help_args[] = {help_flag, NULL};
  return run_command(c, 1, help_args, NULL, err);
}

static int cli_train(int argc, char **argv, dt_pg *pg, FILE *err) {
  dt_train_config cfg = dt_train_config_default();
  bool nesterov = cfg.nesterov, allow_unused = cfg.allow_unused, verbose_ranks = false;
  const char *comm_backend = dt_cli_comm_backend_default(); /* DT_COMM_BACKEND, else auto */
  dt_env_string(DT_ENV_DATA_DIR, &cfg.data_dir);
  /* The model decides where the other flags start (a language model's
   * optimizer, schedule, batch, steps); an unknown name is the parser's. */
  const dt_task *task = NULL;
  const char *model = "lenet", *data = NULL, *device = "cpu", *devices = NULL;
  const char *peeked = dt_cli_peek_flag(argc, argv, "model");
  if (peeked && dt_task_find(peeked, &task) == DT_OK)
    dt_train_apply_task_defaults(&cfg, task);
  dt_clear_error();
  if (cfg.task) {
    model = cfg.task->name;
    data = cfg.task->data[0].name;
  }
  const char *optimizer = dt_train_optimizer_name(cfg.optimizer);
  const char *schedule = dt_train_schedule_name(cfg.schedule), *mode = "ddp";
  const char *precision = NULL, *debug_overflow = NULL, *resume = NULL;
  const char *bucket_update = "each", *grad_compress = "none";
  dt_observe_config obs_cfg = DT_OBSERVE_CONFIG_DEFAULT;
  dt_observe_config *obs = &obs_cfg;
  const char *trace_steps = "1:50";
  const char *image_mean = NULL, *image_std = NULL;
  char data_help[512];
  snprintf(data_help, sizeof data_help,
           "data set, a folder of that name under --data-dir (the model's first by default); "
           "one of %s; or an image folder DIR holding train/<class>/ and val/<class>/ (PNG, JPEG)",
           dt_cli_data_names());
  bool skip_bad = false;
  const char *augment = NULL;
  bool batch_auto = false;
  argc = dt_cli_take_batch_auto(argc, argv, &batch_auto);
  int global_batch = 0;
  dt_flag flags[] = {
      dt_cli_flag_model(&model),
      DT_STRING_FLAG("data", &data, "NAME|DIR", data_help, .check = dt_cli_check_data),
      dt_cli_flag_data_dir(&cfg.data_dir),
      DT_INT_FLAG("channels", &cfg.image.channels, "C",
                  "image folders: 1 (grey) or 3 (RGB), 0 = the model's input", .min = 0, .max = 3),
      DT_INT_FLAG("image-size", &cfg.image.size, "PX",
                  "image folders: the samples' height and width, 0 = the model's input", .min = 0,
                  .max = 4096),
      DT_STRING_FLAG("image-mean", &image_mean, "M|R,G,B",
                     "image folders: the normalisation's mean per channel (of [0,1] values)",
                     .check = dt_cli_check_channel_values,
                     .default_text = "ImageNet's for RGB, the model's data set's for grey"),
      DT_STRING_FLAG("image-std", &image_std, "S|R,G,B",
                     "image folders: the normalisation's std per channel",
                     .check = dt_cli_check_channel_std,
                     .default_text = "ImageNet's for RGB, the model's data set's for grey"),
      DT_CHOICE_FLAG("augment", &augment, "RECIPE",
                     "image folders: the training augmentation and its evaluation geometry: "
                     "resized-crop (RandomResizedCrop + flip; evaluation resizes to size/0.875 "
                     "and crops the centre), pad-crop (shifts of up to size/8 px with black "
                     "let in, + flip; evaluation resizes to size), flip, none",
                     DT_IMAGE_AUGMENT_CHOICES, .default_text = "resized-crop"),
      DT_BOOL_FLAG("skip-bad-images", &skip_bad,
                   "image folders: replace an undecodable image by the next good one (counted "
                   "in the log and the metrics) instead of failing"),
      DT_INT_FLAG("workers", &cfg.workers, "N",
                  "loader threads preparing batches ahead (the batches are the same for any N)",
                  .min = 1, .max = 64, .per_rank = true),
      DT_INT_FLAG("epochs", &cfg.epochs, "N", "passes over the training set", .min = 1),
      DT_INT_FLAG("batch", &cfg.batch, "N",
                  "micro-batch size (per rank under a launcher), or auto: the seed's rule "
                  "min(free memory / the plan's memory per sample x 0.9, samples / 10), "
                  "confirmed by a trial step (halved while it runs out of memory)",
                  .min = 1),
      DT_INT_FLAG("global-batch", &global_batch, "G",
                  "with --batch auto: samples per optimizer step over all ranks; the "
                  "accumulation is G / (ranks x micro-batch)",
                  .min = 0),
      DT_INT_FLAG("accum", &cfg.accum, "K", "micro-batches per optimizer step (loss scaled by 1/K)",
                  .min = 1),
      DT_FLOAT_FLAG("lr", &cfg.lr, "LR", "peak learning rate"),
      dt_cli_flag_optimizer(&optimizer, "optimizer"),
      DT_FLOAT_FLAG("momentum", &cfg.momentum, "M", "SGD momentum"),
      DT_BOOL_FLAG("nesterov", &nesterov, "SGD with Nesterov momentum"),
      DT_FLOAT_FLAG("weight-decay", &cfg.weight_decay, "WD", "weight decay (decoupled for adamw)"),
      DT_CHOICE_FLAG("schedule", &schedule, "NAME", "learning-rate decay after the warm-up",
                     "constant|cosine|step"),
      DT_INT_FLAG("warmup", &cfg.warmup, "STEPS",
                  "optimizer steps of linear learning-rate warm-up"),
      DT_INT_FLAG("step-size", &cfg.step_size, "STEPS",
                  "step schedule: optimizer steps between decays, 0 = one epoch"),
      DT_FLOAT_FLAG("gamma", &cfg.gamma, "G", "step schedule: decay factor", .min_exclusive = true),
      DT_FLOAT_FLAG("min-lr", &cfg.min_lr, "LR",
                    "cosine schedule: final learning rate (at most --lr)"),
      DT_FLOAT_FLAG("clip", &cfg.clip, "NORM", "clip the global gradient norm, 0 = off"),
      dt_cli_flag_precision(&precision),
      dt_cli_flag_stochastic_rounding(&cfg.stochastic_rounding),
      dt_cli_flag_recompute(&cfg.recompute),
      DT_BOOL_FLAG("zero-init-residual", &cfg.zero_init_residual,
                   "resnet*: the last BatchNorm of each residual block starts at weight 0 "
                   "(torchvision's zero_init_residual)"),
      dt_cli_flag_channels_last(&cfg.channels_last),
      DT_BOOL_FLAG("sync-bn", &cfg.sync_bn,
                   "resnet*: BatchNorm statistics over every DDP rank's micro-batch (PyTorch's "
                   "SyncBatchNorm); one process: nothing to do; not with --mode dp"),
      dt_cli_flag_max_memory(&cfg.max_memory_mib),
      DT_STRING_FLAG("debug-overflow", &debug_overflow, "R:S",
                     "fp16, testing the GradScaler: rank R's gradients get an Inf at optimizer "
                     "step S (0-based)",
                     .check = dt_cli_check_debug_overflow),
      dt_cli_flag_seed(&cfg.seed, "seed for initialisation and data order"),
      dt_cli_flag_threads(&cfg.threads),
      dt_cli_flag_device(&device),
      DT_INT_FLAG("log-interval", &cfg.log_interval, "N",
                  "micro-batches between progress lines, 0 = none", .per_rank = true),
      DT_INT_FLAG("max-steps", &cfg.max_steps, "N",
                  "stop after N optimizer steps in all (mid-epoch too; the LR schedule spans "
                  "them), 0 = --epochs decide"),
      DT_INT_FLAG("eval-batch", &cfg.eval_batch, "N", "batch size for the test-set evaluation",
                  .min = 1),
      DT_CHOICE_FLAG("mode", &mode, "MODE",
                     "ddp: one process per rank (under a launcher); dp: one process, one replica "
                     "per device of --devices",
                     "ddp|dp"),
      DT_STRING_FLAG("devices", &devices, "LIST",
                     "--mode dp: the replicas' devices, cpu:0,cpu:1 or cuda:0,cuda:1",
                     .check = dt_cli_check_device_list, .per_rank = true),
      DT_CLI_DDP_FLAGS(&comm_backend, &cfg.comm_timeout, &cfg.bucket_cap_mb, &cfg.first_bucket_mb,
                       &cfg.split_bucket_mb, &bucket_update, &cfg.zero, &grad_compress),
      DT_BOOL_FLAG("allow-unused", &allow_unused,
                   "DDP: zero-fill gradients of parameters the forward did not use"),
      DT_BOOL_FLAG("verbose-ranks", &verbose_ranks,
                   "every rank prints its progress (prefixed rank R:), not only rank 0",
                   .per_rank = true),
      dt_cli_flag_ctx(&cfg.ctx),
      DT_FLOAT_FLAG("beta2", &cfg.beta2, "B", "adamw: decay of the squared-gradient average",
                    .min = 0, .max = 0.999999),
      DT_BOOL_FLAG("decay-matrices-only", &cfg.decay_matrices_only,
                   "weight decay on weights of >= 2 dims only (not biases, norms)"),
      DT_INT_FLAG("val-every", &cfg.val_every, "N",
                  "evaluate on --val-batches every N optimizer steps, 0 = only at the end",
                  .min = 0),
      DT_INT_FLAG("val-batches", &cfg.val_batches, "N",
                  "eval batches (of --eval-batch) the --val-every evaluations take, 0 = all",
                  .min = 0),
      DT_INT_FLAG("sample-every", &cfg.sample.every, "N",
                  "text models: print a sample every N optimizer steps, 0 = at the end only",
                  .min = 0),
      DT_CLI_SAMPLE_FLAGS(&cfg.sample),
      DT_STRING_FLAG("run-dir", &cfg.run_dir, "DIR",
                     "run directory: config.json, train.log, checkpoints/step_NNNNNNNN/",
                     .default_text = "runs/<model>-<data>-<time>"),
      DT_INT_FLAG("save-every", &cfg.save_every, "N",
                  "save a checkpoint every N optimizer steps (and always at the end), 0 = only "
                  "at the end"),
      DT_INT_FLAG("keep", &cfg.keep, "K", "keep the newest K complete checkpoints, 0 = all"),
      DT_STRING_FLAG("resume", &resume, "auto|PATH",
                     "continue from a checkpoint: auto = the newest complete one in --run-dir "
                     "(none: start from scratch), or a checkpoint directory"),
      DT_STRING_FLAG("init", &cfg.init_path, "PATH",
                     "fine-tune: start from the weights of a Hugging Face-layout folder "
                     "(dtrain export --format hf) or a GGUF file (--format gguf; f32, f16 or "
                     "bf16) of the same --model; not with --resume"),
      DT_STRING_FLAG("metrics", &obs->metrics_path, "FILE",
                     "JSON Lines: one record per log interval and per evaluation (rank 0 "
                     "writes it)",
                     .default_text = "<run-dir>/metrics.jsonl"),
      DT_STRING_FLAG("trace", &obs->trace_path, "FILE",
                     "Chrome trace-event timeline per rank ({rank} in FILE is the rank), for "
                     "Perfetto",
                     .default_text = "none"),
      DT_STRING_FLAG("trace-steps", &trace_steps, "A:B",
                     "the optimizer steps --trace records (first:last)",
                     .check = dt_cli_check_trace_steps),
      DT_BOOL_FLAG("quiet", &obs->quiet,
                   "no header and no progress lines (the epoch lines and the result stay)",
                   .per_rank = true),
      DT_STRING_FLAG("status-dir", &obs->status_dir, "DIR",
                     "where the ranks write their status for dtrain top",
                     .default_text = "DT_STATUS_DIR, else /tmp/dtrain-status-<uid>",
                     .per_rank = true),
  };
  dt_flag_set set = {
      .command = "train",
      .usage = "train [flags]",
      .about =
          "Trains a model, evaluates it on the test split after every epoch and ends with\n"
          "a line test_accuracy=0.XXXX. With no flags: LeNet-5 on Fashion-MNIST, one\n"
          "epoch, SGD with momentum and a cosine learning-rate decay, on the CPU.\n"
          "Under a launcher (dtrain launch -n N -- train, mpirun, srun --mpi=pmix) it\n"
          "trains with DDP: --batch per rank, global batch N x --batch. On GPUs,\n"
          "--device cuda gives each rank its own GPU (its local rank among\n"
          "CUDA_VISIBLE_DEVICES) and the gradients go over NCCL (--comm-backend).\n"
          "Every run has a run directory (--run-dir) with its configuration, log and\n"
          "checkpoints, which it holds alone while it runs (another run on it is refused);\n"
          "--resume continues one. SIGTERM or SIGUSR1 on any rank: the ranks\n"
          "stop after the current optimizer step, save a checkpoint and exit 75.\n"
          "Exit status: 0 on success, 1 when the run fails (dtrain: error: ...), 2 for a\n"
          "bad command line, 75 after a stop requested by a signal.",
      DT_FLAG_TABLE(flags),
  };
  DT_FLAGS_PARSE_OR_RETURN(&set, argc, argv, err, NULL);
  /* The flags' strings as the trainer's typed configuration (the parser
   * accepted each name and value already). */
  bool ok = dt_task_find(model, &cfg.task) == DT_OK;
  if (data && !dt_flags_is_choice(data, dt_cli_data_choices())) {
    cfg.image_folder = data; /* a folder (the flag's check) */
    data = NULL;
  }
  if (!image_mean != !image_std) {
    fprintf(err, "dtrain train: --image-mean and --image-std go together: give both\n");
    return 2;
  }
  if (image_mean)
    dt_cli_parse_channel_values(image_mean, cfg.image.mean);
  if (image_std)
    dt_cli_parse_channel_values(image_std, cfg.image.std);
  cfg.image.skip_bad_images = skip_bad;
  if (augment)
    dt_image_augment_parse(augment, &cfg.image.recipe);
  ok = ok && (!data || dt_task_find_data(cfg.task, data, &cfg.data) == DT_OK);
  ok = ok && dt_cli_device(device, &cfg.device) == DT_OK;
  ok = ok && (!devices || dt_cli_parse_devices(devices, cfg.devices, DT_TRAIN_MAX_DEVICES,
                                               &cfg.n_devices) == DT_OK);
  ok = ok && (!precision || dt_precision_parse(precision, &cfg.precision) == DT_OK);
  ok = ok &&
       (!debug_overflow || dt_cli_parse_debug_overflow(debug_overflow, &cfg.debug_overflow_rank,
                                                       &cfg.debug_overflow_step) == DT_OK);
  ok = ok && dt_ddp_grad_compress_parse(grad_compress, &cfg.grad_compress) == DT_OK;
  ok = ok && dt_trace_parse_steps(trace_steps, &obs->trace_first, &obs->trace_last) == DT_OK;
  if (!ok) { /* the data set's name against the model's own ones, a device the build lacks */
    fprintf(err, "dtrain train: %s\n", dt_last_error());
    return 2;
  }
  if (!dt_cli_check_text_flags("train", cfg.task, argc, argv, err))
    return 2;
  cfg.batch_auto = batch_auto;
  cfg.global_batch = global_batch;
  cfg.optimizer = !strcmp(optimizer, "adamw") ? DT_TRAIN_ADAMW : DT_TRAIN_SGD;
  cfg.schedule = !strcmp(schedule, "step")       ? DT_LR_DECAY_STEP
                 : !strcmp(schedule, "constant") ? DT_LR_DECAY_CONSTANT
                                                 : DT_LR_DECAY_COSINE;
  cfg.mode = !strcmp(mode, "dp") ? DT_TRAIN_MODE_DP : DT_TRAIN_MODE_DDP;
  cfg.update_per_bucket = !strcmp(bucket_update, "each");
  cfg.resume = !resume                   ? DT_TRAIN_RESUME_NONE
               : !strcmp(resume, "auto") ? DT_TRAIN_RESUME_AUTO
                                         : DT_TRAIN_RESUME_PATH;
  cfg.resume_path = cfg.resume == DT_TRAIN_RESUME_PATH ? resume : NULL;
  cfg.nesterov = nesterov;
  cfg.allow_unused = allow_unused;
  cfg.run_dir_default = true;
  cfg.quiet = obs->quiet;
  cfg.pg = pg;
  if (dt_train_config_validate(&cfg) != DT_OK) {
    char msg[DT_ERROR_MAX];
    dt_flags_name_fields(&set, dt_last_error(), msg, sizeof msg);
    fprintf(err, "dtrain train: %s\n", msg);
    return 2;
  }
  if (dt_cli_check_env() != DT_OK)
    return 1;
  int64_t overshoot = 1; /* tests: --batch auto's trials run out of memory */
  if (cfg.batch_auto && dt_env_int(DT_ENV_TEST_BATCH_AUTO_OVERSHOOT, &overshoot) == DT_OK)
    cfg.batch_auto_overshoot = (int)overshoot;
  if (cfg.max_memory_mib > 0) { /* tests: an out-of-memory error mid-run */
    int64_t from = 0, rank = -1;
    if (dt_env_int(DT_ENV_TEST_MAX_MEMORY_FROM_STEP, &from) == DT_OK)
      cfg.max_memory_from_step = from;
    if (dt_env_int(DT_ENV_TEST_MAX_MEMORY_RANK, &rank) == DT_OK)
      cfg.max_memory_rank = (int)rank;
  }
  if (dt_comm_backend_parse(comm_backend, &cfg.comm_backend) != DT_OK) { /* checked: the flag's */
    fprintf(err, "dtrain train: %s\n", dt_last_error());                 /* choices, the env's */
    return 2;
  }
  if (cfg.threads == 0)
    dt_threads_choose_default(dt_pg_local_size(pg));
  cfg.threads_note = dt_threads_note();
  static char agreed[8192];
  dt_flags_format_values(&set, agreed, sizeof agreed);
  cfg.agreed_config = agreed;
  int rank = dt_pg_rank(pg);
  char prefix[32] = "";
  if (rank != 0)
    snprintf(prefix, sizeof prefix, "rank %d: ", rank);
  cfg.log_prefix = prefix;
  dt_observe_hooks observe_hooks;
  dt_observe_hooks_init(&observe_hooks, obs, stop_signal_received, &cfg.hooks);
  dt_train_result result;
  install_stop_signal_handlers();
  FILE *log = rank == 0 || verbose_ranks ? stdout : NULL;
  dt_status st = dt_train_run(&cfg, log, &result);
  if (st != DT_OK) {
    char msg[DT_ERROR_MAX];
    dt_flags_name_fields(&set, dt_last_error(), msg, sizeof msg);
    dt_error_replace_message(msg);
    return 1;
  }
  if (!result.stop_code)
    return 0;
  if (log) {
    fprintf(log,
            "%sdtrain train: stopped by %s after optimizer step %lld; checkpoint %s saved; "
            "continue with --resume auto (and the same --run-dir)\n",
            prefix,
            result.stop_code == SIGUSR1   ? "SIGUSR1"
            : result.stop_code == SIGTERM ? "SIGTERM"
                                          : "a stop signal on another rank",
            (long long)result.last_step, result.last_checkpoint);
    fflush(log);
  }
  return DT_TRAIN_EXIT_STOPPED;
}

/* Under a launcher, before MPI is up: this process's rank from the
 * launcher's environment (0 without one), so that only rank 0 reports a bad
 * command line. */
static int launcher_env_rank(void) {
  static const char *const vars[] = {"OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK",
                                     "SLURM_PROCID"};
  for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++) {
    const char *v = getenv(vars[i]);
    if (v && v[0])
      return atoi(v);
  }
  return 0;
}

/* Ranks of a job on one host share its cores: without --threads or
 * DT_NUM_THREADS (dtrain launch and the Slurm scripts set it), each rank
 * takes cores / local ranks threads. */
static void share_cores(const dt_pg *pg) {
  if (dt_pg_local_size(pg) <= 1 || dt_env_is_set(DT_ENV_NUM_THREADS))
    return;
  dt_cpu_set_num_threads(dt_threads_for(dt_threads_cores(), dt_pg_local_size(pg)));
}

/* The end of every command: what it wrote to stdout must have reached it
 * (a full disk, a closed pipe, /dev/full). A lost result line is an error:
 * exit 1 naming it, unless the command already failed (and said why). An
 * earlier failed flush (the trainer's log) leaves the error flag but not
 * its errno: one newline more, into output that already lost bytes, finds
 * the cause ("No space left on device"). */
static int finish_stdout(int rc) {
  errno = 0;
  bool failed = fflush(stdout) != 0 || ferror(stdout);
  int e = errno;
  if (failed && e == 0) {
    clearerr(stdout);
    if (fputc('\n', stdout) == EOF || fflush(stdout) != 0)
      e = errno;
  }
  if (fclose(stdout) != 0 && !failed) {
    failed = true;
    e = errno;
  }
  if (!failed || rc != 0)
    return rc;
  fprintf(stderr, "dtrain: error: writing the standard output failed: %s\n",
          e ? strerror(e) : "an earlier write failed");
  return 1;
}

/* The start-up deadline: MPI start-up comes before the flags are parsed,
 * but a rank stopped during it must end the job as a stuck collective
 * would, so --comm-timeout is peeked at here (the parser checks it
 * properly afterwards; a bad value keeps the default). */
static double startup_timeout(int argc, char **argv) {
  const char *v = dt_cli_peek_flag(argc, argv, "comm-timeout");
  char *end = NULL;
  double t = v ? strtod(v, &end) : 0.0;
  if (v && end != v && *end == '\0' && t > 0 && t < 1e9)
    return t;
  return DT_PG_CONFIG_DEFAULT.init_timeout_s;
}

/* Runs a command inside the process group; never returns. A failure on
 * any rank (exit 1, or 2 for a command line only that rank got wrong) is
 * printed with the rank and ends the whole job: the other ranks may be
 * waiting for it in a collective. Rank 0's messages go to stderr as they
 * come; another rank's are held and printed prefixed "rank R: ". */
static void run_in_group(const command *c, int argc, char **argv) {
  int env_rank = launcher_env_rank();
  FILE *err = stderr;
  char *held = NULL;
  size_t held_len = 0;
  if (env_rank != 0) {
    FILE *mem = open_memstream(&held, &held_len);
    if (mem)
      err = mem;
  }
  /* A stop requested during start-up counts too (after the first step). */
  if (c->run_in_group == cli_train)
    install_stop_signal_handlers();
  dt_pg *pg = NULL;
  dt_pg_config pc = DT_PG_CONFIG_DEFAULT;
  pc.init_timeout_s = startup_timeout(argc, argv);
  if (dt_pg_create(&pc, &pg) != DT_OK) {
    char prefix[32];
    snprintf(prefix, sizeof prefix, "rank %d: ", env_rank);
    dt_cli_print_error(stderr, prefix);
    exit(1);
  }
  share_cores(pg);
  dt_clear_error();
  int rc = c->run_in_group(argc, argv, pg, err);
  char prefix[32] = "";
  if (dt_pg_world_size(pg) > 1)
    snprintf(prefix, sizeof prefix, "rank %d: ", dt_pg_rank(pg));
  if (err != stderr) {
    fclose(err);
    for (char *line = held; rc != 0 && line && *line;) {
      char *end = strchr(line, '\n');
      int n = end ? (int)(end - line) : (int)strlen(line);
      fprintf(stderr, "%s%.*s\n", prefix, n, line);
      line = end ? end + 1 : line + n;
    }
    free(held);
  }
  if (rc == 1) {
    fflush(stdout);
    dt_cli_print_error(stderr, prefix);
  }
  /* The other ranks may be waiting in a collective: end the whole job. */
  if (rc != 0 && rc != DT_TRAIN_EXIT_STOPPED && dt_pg_uses_mpi(pg) && dt_pg_world_size(pg) > 1) {
    fflush(stdout);
    dt_pg_abort(pg, rc);
  }
  rc = finish_stdout(rc);
  dt_pg_destroy(pg);
  /* A SIGTERM/SIGUSR1 after the last optimizer step's agreement: the run had
   * finished (and saved), so it exits 0, but not silently. */
  int late = stop_signal_received();
  if (rc == 0 && late)
    fprintf(stderr,
            "%sdtrain %s: %s arrived after the last optimizer step: the run had finished; "
            "exit 0\n",
            prefix, c->name, late == SIGUSR1 ? "SIGUSR1" : "SIGTERM");
  exit(rc);
}

int main(int argc, char **argv) {
  if (argc < 2) {
    print_usage(stderr);
    exit(2);
  }
  const char *name = argv[1];
  if (!strcmp(name, "--help") || !strcmp(name, "-h"))
    exit(finish_stdout(cli_help(0, NULL, stderr)));
  const command *c = find_command(name);
  if (!c) {
    print_unknown_command(name);
    exit(2);
  }
  if (c->run_in_group)
    run_in_group(c, argc - 2, argv + 2);
  exit(finish_stdout(c->run(argc - 2, argv + 2, stderr)));
}
