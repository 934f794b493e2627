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
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/backend.h"
#include "core/status.h"
#include "dist/process_group.h"
#include "launch/bench.h"
#include "launch/doctor.h"
#include "launch/flags.h"
#include "launch/launcher.h"
#include "launch/train_loop.h"

typedef struct command {
  const char *name;
  const char *summary;
  int in_group; /* runs in the process group (train, bench) */
  int (*run)(int argc, char **argv, dt_pg *pg, FILE *err);
} command;

static int cli_train(int argc, char **argv, dt_pg *pg, FILE *err);
static int cli_bench(int argc, char **argv, dt_pg *pg, FILE *err);
static int cli_doctor(int argc, char **argv, dt_pg *pg, FILE *err);
static int cli_launch(int argc, char **argv, dt_pg *pg, FILE *err);
static int cli_help(int argc, char **argv, dt_pg *pg, FILE *err);

static const command commands[] = {
    {"train", "train a model (default: LeNet-5 on Fashion-MNIST, one epoch, CPU)", 1, cli_train},
    {"bench", "time training steps on synthetic data (steps_per_s=...)", 1, cli_bench},
    {"launch", "run train or bench on N ranks with mpirun: dtrain launch -n 2 -- train", 0,
     cli_launch},
    {"doctor", "report the devices, threads and data sets this build can use", 0, cli_doctor},
    {"help", "show this help, or the help of a command: dtrain help train", 0, cli_help},
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

static int cli_bench(int argc, char **argv, dt_pg *pg, FILE *err) {
  return dt_cli_bench(argc, argv, pg, err);
}

static int cli_doctor(int argc, char **argv, dt_pg *pg, FILE *err) {
  (void)pg;
  (void)err;
  return dt_cli_doctor(argc, argv);
}

static int cli_launch(int argc, char **argv, dt_pg *pg, FILE *err) {
  (void)pg;
  (void)err;
  return dt_cli_launch(argc, argv);
}

static int cli_help(int argc, char **argv, dt_pg *pg, FILE *err) {
  (void)pg;
  (void)err;
  if (argc == 0) {
    print_usage(stdout);
    return 0;
  }
  const command *c = find_command(argv[0]);
  if (!c) {
    print_unknown_command(argv[0]);
    return 2;
  }
  if (c->run == cli_help) {
    print_usage(stdout);
    return 0;
  }
  char help_flag[] = "--help";
  char *args[] = {help_flag, NULL};
  return c->run(1, args, NULL, stderr);
}

static int cli_train(int argc, char **argv, dt_pg *pg, FILE *err) {
  dt_train_config cfg = dt_train_config_default();
  float comm_timeout = (float)cfg.comm_timeout;
  int verbose_ranks = 0;
  int nesterov = cfg.nesterov, allow_unused = cfg.allow_unused; /* DT_FLAG_BOOL: int */
  /* Shown as the default: DT_COMM_BACKEND when set (dist/ reads and checks
   * it), else auto; cfg gets the flag only when it is given. */
  const char *env_backend = getenv("DT_COMM_BACKEND");
  const char *default_backend = env_backend && env_backend[0] ? env_backend : "auto";
  const char *comm_backend = default_backend;
  const char *env_dir = getenv("DT_DATA_DIR");
  if (env_dir && env_dir[0])
    cfg.data_dir = env_dir;
  dt_flag flags[] = {
      {"model", DT_FLAG_STRING, &cfg.model, "NAME", "model: lenet or mlp", 0, NULL},
      {"data", DT_FLAG_STRING, &cfg.data, "NAME", "data set, a folder under --data-dir", 0,
       "fashion-mnist|mnist"},
      {"data-dir", DT_FLAG_STRING, &cfg.data_dir, "DIR",
       "folder holding the data sets (env DT_DATA_DIR)", 0, NULL},
      {"epochs", DT_FLAG_INT, &cfg.epochs, "N", "passes over the training set", 1, NULL},
      {"batch", DT_FLAG_INT, &cfg.batch, "N", "micro-batch size", 1, NULL},
      {"accum", DT_FLAG_INT, &cfg.accum, "K",
       "micro-batches per optimizer step (loss scaled by 1/K)", 1, NULL},
      {"lr", DT_FLAG_FLOAT, &cfg.lr, "LR", "peak learning rate", 0, NULL},
      {"optimizer", DT_FLAG_STRING, &cfg.optimizer, "NAME", "sgd or adamw", 0, "sgd|adamw"},
      {"momentum", DT_FLAG_FLOAT, &cfg.momentum, "M", "SGD momentum", 0, NULL},
      {"nesterov", DT_FLAG_BOOL, &nesterov, NULL, "SGD with Nesterov momentum", 0, NULL},
      {"weight-decay", DT_FLAG_FLOAT, &cfg.weight_decay, "WD", "weight decay (decoupled for adamw)",
       0, NULL},
      {"schedule", DT_FLAG_STRING, &cfg.schedule, "NAME",
       "LR decay after the warm-up: constant, cosine or step", 0, "constant|cosine|step"},
      {"warmup", DT_FLAG_INT, &cfg.warmup, "STEPS", "optimizer steps of linear LR warm-up", 0,
       NULL},
      {"step-size", DT_FLAG_INT, &cfg.step_size, "STEPS",
       "step schedule: steps between decays, 0 = one epoch", 0, NULL},
      {"gamma", DT_FLAG_FLOAT, &cfg.gamma, "G", "step schedule: decay factor", 0, NULL},
      {"min-lr", DT_FLAG_FLOAT, &cfg.min_lr, "LR", "cosine schedule: final learning rate", 0, NULL},
      {"clip", DT_FLAG_FLOAT, &cfg.clip, "NORM", "clip the global gradient norm, 0 = off", 0, NULL},
      {"seed", DT_FLAG_U64, &cfg.seed, "N", "seed for initialisation and data order", 0, NULL},
      {"threads", DT_FLAG_INT, &cfg.threads, "N", "CPU threads, 0 = all available cores", 0, NULL},
      {"device", DT_FLAG_STRING, &cfg.device, "DEV",
       "cpu, cpu:N, cuda:N, or cuda: under a launcher each rank's own GPU (local rank)", 0,
       NULL},
      {"log-interval", DT_FLAG_INT, &cfg.log_interval, "N",
       "micro-batches between progress lines, 0 = none", 0, NULL},
      {"max-steps", DT_FLAG_INT, &cfg.max_steps, "N",
       "stop after N optimizer steps in all (mid-epoch too; the LR schedule spans them), "
       "0 = --epochs decide",
       0, NULL},
      {"eval-batch", DT_FLAG_INT, &cfg.eval_batch, "N", "batch size for the test-set evaluation", 1,
       NULL},
      {"mode", DT_FLAG_STRING, &cfg.mode, "MODE",
       "ddp: one process per rank (under a launcher); dp: one process, one replica per "
       "device of --devices",
       0, "ddp|dp"},
      {"devices", DT_FLAG_STRING, &cfg.devices, "LIST",
       "--mode dp: replicas' devices, cpu:0,cpu:1 or cuda:0,cuda:1", 0, NULL},
      {"comm-backend", DT_FLAG_STRING, &comm_backend, "NAME",
       "gradient all-reduce: auto (nccl on GPUs, else mpi), mpi (GPU tensors host-staged) or "
       "nccl; overrides env DT_COMM_BACKEND",
       0, "auto|mpi|nccl"},
      {"comm-timeout", DT_FLAG_FLOAT, &comm_timeout, "S",
       "seconds a collective may take before the job is aborted", 0.001, NULL},
      {"bucket-cap-mb", DT_FLAG_FLOAT, &cfg.bucket_cap_mb, "MB", "DDP: gradient bucket size",
       1e-6, NULL},
      {"first-bucket-mb", DT_FLAG_FLOAT, &cfg.first_bucket_mb, "MB",
       "DDP: first bucket (small, so the first all-reduce starts early)", 1e-6, NULL},
      {"allow-unused", DT_FLAG_BOOL, &allow_unused, NULL,
       "DDP: zero-fill gradients of parameters the forward did not use", 0, NULL},
      {"verbose-ranks", DT_FLAG_BOOL, &verbose_ranks, NULL,
       "every rank prints its progress (prefixed rank R:), not only rank 0", 0, NULL},
  };
  int nflags = (int)(sizeof flags / sizeof flags[0]);
  switch (dt_flags_parse("train", flags, nflags, argc, argv, err)) {
    case DT_FLAGS_OK: break;
    case DT_FLAGS_HELP:
      printf(
          "usage: dtrain train [flags]\n\n"
          "Trains a model, evaluates it on the test split after every epoch and ends with\n"
          "a line test_accuracy=0.XXXX. With no flags: LeNet-5 on Fashion-MNIST, one\n"
          "epoch, SGD with momentum and a cosine learning-rate decay, on the CPU.\n"
          "Under a launcher (dtrain launch -n N -- train, mpirun, srun --mpi=pmix) it\n"
          "trains with DDP: --batch per rank, global batch N x --batch. On GPUs,\n"
          "--device cuda gives each rank its own GPU (its local rank among\n"
          "CUDA_VISIBLE_DEVICES) and the gradients go over NCCL (--comm-backend).\n\nflags:\n");
      dt_flags_print(flags, nflags, stdout);
      return 0;
    case DT_FLAGS_ERROR: return 2;
  }
  if (cfg.devices && strcmp(cfg.mode, "dp") == 0) {
    dt_device devs[DT_TRAIN_MAX_DEVICES];
    int n = 0;
    if (dt_train_parse_devices(cfg.devices, devs, DT_TRAIN_MAX_DEVICES, &n) != DT_OK) {
      fprintf(err, "dtrain train: invalid value '%s' for --devices: %s\n", cfg.devices,
              dt_last_error());
      return 2;
    }
  }
  cfg.nesterov = nesterov;
  cfg.allow_unused = allow_unused;
  cfg.comm_timeout = comm_timeout;
  cfg.comm_backend = comm_backend != default_backend ? comm_backend : NULL;
  cfg.pg = pg;
  int rank = dt_pg_rank(pg);
  char prefix[32] = "";
  if (rank != 0)
    snprintf(prefix, sizeof prefix, "rank %d: ", rank);
  cfg.log_prefix = prefix;
  dt_status st = dt_train_run(&cfg, rank == 0 || verbose_ranks ? stdout : NULL, NULL);
  return st == DT_OK ? 0 : 1;
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
  const char *env = getenv("DT_NUM_THREADS");
  if (dt_pg_local_size(pg) <= 1 || (env && env[0]))
    return;
  cpu_set_t set;
  CPU_ZERO(&set);
  int cores = sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : 1;
  int per_rank = cores / dt_pg_local_size(pg);
  dt_cpu_set_num_threads(per_rank > 0 ? per_rank : 1);
}

/* Runs a command inside the process group; never returns. */
static void run_in_group(const command *c, int argc, char **argv) {
  int env_rank = launcher_env_rank();
  FILE *err = stderr, *devnull = NULL;
  if (env_rank != 0 && (devnull = fopen("/dev/null", "w")) != NULL)
    err = devnull;
  dt_pg *pg = NULL;
  if (dt_pg_create(NULL, &pg) != DT_OK) {
    fprintf(stderr, "dtrain: error: rank %d: %s\n", env_rank, dt_last_error());
    exit(1);
  }
  share_cores(pg);
  dt_clear_error();
  int rc = c->run(argc, argv, pg, err);
  if (rc == 1) {
    fflush(stdout);
    if (dt_pg_world_size(pg) > 1)
      fprintf(stderr, "dtrain: error: rank %d: %s\n", dt_pg_rank(pg), dt_last_error());
    else
      fprintf(stderr, "dtrain: error: %s\n", dt_last_error());
    /* The other ranks may be waiting in a collective: end the whole job. */
    if (dt_pg_uses_mpi(pg) && dt_pg_world_size(pg) > 1)
      dt_pg_abort(pg, 1);
  }
  fflush(stdout);
  dt_pg_destroy(pg);
  if (devnull)
    fclose(devnull);
  exit(rc);
}

int main(int argc, char **argv) {
  if (argc < 2) {
    print_usage(stderr);
    exit(2);
  }
  const char *name = argv[1];
  if (!strcmp(name, "--help") || !strcmp(name, "-h"))
    exit(cli_help(0, NULL, NULL, stderr));
  const command *c = find_command(name);
  if (!c) {
    print_unknown_command(name);
    exit(2);
  }
  if (c->in_group)
    run_in_group(c, argc - 2, argv + 2);
  exit(c->run(argc - 2, argv + 2, NULL, stderr));
}
