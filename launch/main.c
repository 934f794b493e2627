/* The dtrain command: subcommand dispatch and `dtrain train`.
 * Only this folder calls exit(); everything below returns a dt_status. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/status.h"
#include "launch/bench.h"
#include "launch/doctor.h"
#include "launch/flags.h"
#include "launch/train_loop.h"

typedef struct command {
  const char *name;
  const char *summary;
  int (*run)(int argc, char **argv);
} command;

static int cli_train(int argc, char **argv);
static int cli_help(int argc, char **argv);

static const command commands[] = {
    {"train", "train a model (default: LeNet-5 on Fashion-MNIST, one epoch, CPU)", cli_train},
    {"bench", "time training steps on synthetic data (steps_per_s=...)", dt_cli_bench},
    {"doctor", "report the devices, threads and data sets this build can use", dt_cli_doctor},
    {"help", "show this help, or the help of a command: dtrain help train", cli_help},
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

static int cli_help(int argc, char **argv) {
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
  return c->run(1, args);
}

static int cli_train(int argc, char **argv) {
  dt_train_config cfg = dt_train_config_default();
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
      {"nesterov", DT_FLAG_BOOL, &cfg.nesterov, NULL, "SGD with Nesterov momentum", 0, NULL},
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
      {"device", DT_FLAG_STRING, &cfg.device, "DEV", "cpu, cpu:N or cuda:N", 0, NULL},
      {"log-interval", DT_FLAG_INT, &cfg.log_interval, "N",
       "micro-batches between progress lines, 0 = none", 0, NULL},
      {"max-steps", DT_FLAG_INT, &cfg.max_steps, "N",
       "stop each epoch after N micro-batches, 0 = full epochs", 0, NULL},
      {"eval-batch", DT_FLAG_INT, &cfg.eval_batch, "N", "batch size for the test-set evaluation", 1,
       NULL},
  };
  int nflags = (int)(sizeof flags / sizeof flags[0]);
  switch (dt_flags_parse("train", flags, nflags, argc, argv, stderr)) {
    case DT_FLAGS_OK: break;
    case DT_FLAGS_HELP:
      printf(
          "usage: dtrain train [flags]\n\n"
          "Trains a model, evaluates it on the test split after every epoch and ends with\n"
          "a line test_accuracy=0.XXXX. With no flags: LeNet-5 on Fashion-MNIST, one\n"
          "epoch, SGD with momentum and a cosine learning-rate decay, on the CPU.\n\nflags:\n");
      dt_flags_print(flags, nflags, stdout);
      return 0;
    case DT_FLAGS_ERROR: return 2;
  }
  dt_status st = dt_train_run(&cfg, stdout, NULL);
  if (st != DT_OK) {
    fflush(stdout);
    fprintf(stderr, "dtrain: error: %s\n", dt_last_error());
    return 1;
  }
  return 0;
}

int main(int argc, char **argv) {
  if (argc < 2) {
    print_usage(stderr);
    exit(2);
  }
  const char *name = argv[1];
  if (!strcmp(name, "--help") || !strcmp(name, "-h"))
    exit(cli_help(0, NULL));
  const command *c = find_command(name);
  if (!c) {
    print_unknown_command(name);
    exit(2);
  }
  exit(c->run(argc - 2, argv + 2));
}
