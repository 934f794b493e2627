/* `dtrain eval` and `dtrain sample`: rebuild the checkpoint's model (its
 * task and context from the trainer state), load model.safetensors, then
 * evaluate it on the test split or draw text from it. */
#include "launch/eval.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/backend.h"
#include "core/checkpoint.h"
#include "core/cpu.h"
#include "core/env.h"
#include "launch/cli.h"
#include "launch/flags.h"
#include "models/tasks.h"
#include "train/sample.h"
#include "train/train_checkpoint.h"
#include "train/train_loop.h"

/* The checkpoint's context: config.ctx (0, or missing in a checkpoint of
 * an earlier dtrain: the model's own). */
static dt_status checkpoint_task(const char *dir, const char *model, dt_task *out) {
  const dt_task *task = NULL;
  DT_CHECK(dt_task_find(model, &task));
  *out = *task;
  char ctx[32];
  if (dt_train_ckpt_meta(dir, "config.ctx", ctx, sizeof ctx) != DT_OK) {
    dt_clear_error();
    return DT_OK;
  }
  long long t = atoll(ctx);
  return t > 0 && task->max_context > 0 ? dt_task_with_context(task, t, out) : DT_OK;
}

dt_status dt_cli_ckpt_model_open(const char *path, const char *device, const char *text_command,
                                 dt_cli_ckpt_model *m) {
  memset(m, 0, sizeof *m);
  DT_CHECK(dt_train_ckpt_resolve(path, stderr, m->dir, sizeof m->dir));
  if (!m->dir[0])
    return DT_ERROR(DT_ERR_IO, "%s holds no checkpoint", path);
  DT_CHECK(dt_train_ckpt_meta(m->dir, "config.model", m->model, sizeof m->model));
  DT_CHECK(dt_train_ckpt_meta(m->dir, "config.data", m->data, sizeof m->data));
  DT_CHECK(dt_train_ckpt_meta(m->dir, "step", m->step, sizeof m->step));
  DT_CHECK(checkpoint_task(m->dir, m->model, &m->task));
  if (text_command && (!m->task.tokenizer || m->task.max_context <= 0))
    return DT_ERROR(DT_ERR_INVALID_ARG,
                    "checkpoint %s holds model %s, which does not generate text: dtrain %s "
                    "takes the checkpoint of a language model (gpt2-tiny, llama-tiny, ...)",
                    m->dir, m->model, text_command);
  dt_device asked;
  DT_CHECK(dt_cli_device(device, &asked));
  DT_CHECK(dt_train_rank_device(asked, NULL, &m->dev));
  DT_CHECK(m->task.build(&m->task, 0, &m->module));
  char weights[4500];
  snprintf(weights, sizeof weights, "%s/model.safetensors", m->dir);
  DT_CHECK(dt_module_to(m->module, m->dev));
  return dt_safetensors_load_module(weights, m->module);
}

void dt_cli_ckpt_model_close(dt_cli_ckpt_model *m) {
  dt_module_destroy(m->module);
  m->module = NULL;
}

static dt_status evaluate_checkpoint(const char *path, const char *data_dir, const char *device,
                                     int batch) {
  dt_cli_ckpt_model m;
  const dt_task_data *td = NULL;
  dt_dataset *test = NULL;
  double loss = 0, metric = 0;
  char folder[4200];
  dt_status st = dt_cli_ckpt_model_open(path, device, NULL, &m);
  const dt_task *task = &m.task;
  if (st == DT_OK)
    st = dt_task_find_data(task, m.data, &td);
  snprintf(folder, sizeof folder, "%s/%s", data_dir, m.data);
  if (st == DT_OK)
    st = td->open(task, td, folder, task->eval_split, &test);
  if (st == DT_OK)
    st = dt_train_evaluate(task, m.module, test, batch, m.dev, &loss, &metric);
  if (st == DT_OK) {
    printf("dtrain eval: checkpoint %s (model %s, data %s, optimizer step %s)\n%s_loss=%.4f", m.dir,
           m.model, m.data, m.step, task->eval_split, loss);
    if (task->metric)
      printf(" %s_%s=%.4f", task->eval_split, task->metric_name, metric);
    printf("\n");
  }
  dt_dataset_destroy(test);
  dt_cli_ckpt_model_close(&m);
  return st;
}

int dt_cli_checkpoint_command(dt_flag_set *set, dt_cli_ckpt_args *a, const dt_flag *own, int n_own,
                              int argc, char **argv, FILE *err, dt_status (*work)(void *)) {
  int threads = 0, n = 0;
  dt_flag flags[16];
  flags[n++] = (dt_flag)DT_STRING_FLAG(
      "checkpoint", &a->checkpoint, "PATH",
      "a checkpoint directory, or a run directory (its newest complete checkpoint)");
  for (int i = 0; i < n_own && n < 13; i++)
    flags[n++] = own[i];
  flags[n++] = dt_cli_flag_data_dir(&a->data_dir);
  flags[n++] = dt_cli_flag_device(&a->device);
  flags[n++] = dt_cli_flag_threads(&threads);
  set->flags = flags;
  set->nflags = n;
  DT_FLAGS_PARSE_OR_RETURN(set, argc, argv, err, NULL);
  for (int i = 0; i <= a->required && i < n; i++) /* --checkpoint, then own[0, required) */
    if (!*(const char **)flags[i].target) {
      fprintf(err, "dtrain %s: --%s %s is required\n", set->command, flags[i].name,
              flags[i].metavar);
      return 2;
    }
  if (dt_cli_check_env() != DT_OK)
    return 1;
  if (threads > 0)
    dt_cpu_set_num_threads(threads);
  if (work(a) != DT_OK) {
    dt_cli_print_error(stderr, "");
    return 1;
  }
  return 0;
}

static dt_status eval_work(void *arg) {
  dt_cli_ckpt_args *a = arg;
  return evaluate_checkpoint(a->checkpoint, a->data_dir, a->device, a->batch);
}

int dt_cli_eval(int argc, char **argv, FILE *err) {
  dt_cli_ckpt_args a = {NULL, "data", "cpu", 1000, DT_SAMPLE_CONFIG_DEFAULT};
  dt_env_string(DT_ENV_DATA_DIR, &a.data_dir);
  dt_flag own[] = {
      DT_INT_FLAG("eval-batch", &a.batch, "N", "batch size of the evaluation", .min = 1),
  };
  dt_flag_set set = {
      .command = "eval",
      .usage = "eval --checkpoint PATH [flags]",
      .about =
          "Evaluates a checkpoint of dtrain train on the test split of its data set\n"
          "and prints test_loss=... test_accuracy=.... Exit status: 0, 1 when it fails\n"
          "(a damaged checkpoint is named by file and section), 2 for a bad command line.",
  };
  return dt_cli_checkpoint_command(&set, &a, own, 1, argc, argv, err, eval_work);
}

/* dtrain sample's text to stdout as each token is drawn: a long sample
 * shows from its first token, and a write error (a full disk, a closed
 * pipe) ends it at once. */
static dt_status emit_stdout(void *ctx, const char *bytes, size_t n) {
  (void)ctx;
  if (fwrite(bytes, 1, n, stdout) != n || fflush(stdout) != 0)
    return DT_ERROR(DT_ERR_IO, "writing the sample to the standard output failed: %s",
                    strerror(errno));
  return DT_OK;
}

static dt_status sample_work(void *arg) {
  dt_cli_ckpt_args *a = arg;
  dt_cli_ckpt_model m;
  dt_status st = dt_cli_ckpt_model_open(a->checkpoint, a->device, "sample", &m);
  if (st == DT_OK) {
    fprintf(stderr,
            "dtrain sample: checkpoint %s (model %s, context %lld, optimizer step %s): %d "
            "tokens, temperature %g, top-k %d, seed %llu\n",
            m.dir, m.model, (long long)m.task.input_shape[0], m.step, a->sample.length,
            (double)a->sample.temperature, a->sample.top_k, (unsigned long long)a->sample.seed);
    dt_sample_config sc = a->sample;
    sc.emit = emit_stdout;
    st = dt_sample_text(m.module, &m.task, m.dev, a->data_dir, &sc, NULL);
  }
  if (st == DT_OK)
    st = emit_stdout(NULL, "\n", 1);
  dt_cli_ckpt_model_close(&m);
  return st;
}

int dt_cli_sample(int argc, char **argv, FILE *err) {
  dt_cli_ckpt_args a = {NULL, "data", "cpu", 1, DT_SAMPLE_CONFIG_DEFAULT};
  dt_env_string(DT_ENV_DATA_DIR, &a.data_dir);
  dt_flag own[] = {DT_CLI_SAMPLE_FLAGS(&a.sample)};
  dt_flag_set set = {
      .command = "sample",
      .usage = "sample --checkpoint PATH [--prompt TEXT] [flags]",
      .about =
          "Continues --prompt with a language model's checkpoint of dtrain train and\n"
          "prints the text: --sample-len tokens, each drawn from the model's next-token\n"
          "distribution (--temperature, --top-k) by a generator seeded with\n"
          "--sample-seed, so the same seed gives the same text. The tokenizer is GPT-2's\n"
          "from --data-dir/gpt2. Exit status: 0, 1 when it fails (a missing or damaged\n"
          "checkpoint, one of a model that is not a language model), 2 for a bad\n"
          "command line.",
  };
  return dt_cli_checkpoint_command(&set, &a, own, (int)(sizeof own / sizeof own[0]), argc, argv,
                                   err, sample_work);
}
