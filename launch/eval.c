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

/* Meta key `key` of the checkpoint as an integer in [lo, hi]. */
static dt_status meta_int_in(const char *dir, const char *key, long lo, long hi, long *out) {
  char v[64], *end = NULL;
  DT_CHECK(dt_train_ckpt_meta(dir, key, v, sizeof v));
  *out = strtol(v, &end, 10);
  if (end == v || *end || *out < lo || *out > hi)
    return DT_ERROR(DT_ERR_FORMAT, "%s/trainer_state.bin: meta '%s' is '%s', expected %ld to %ld",
                    dir, key, v, lo, hi);
  return DT_OK;
}

/* Meta key `key` as three numbers "a,b,c" (an image folder's mean, std). */
static dt_status meta_triple(const char *dir, const char *key, float out[3]) {
  char v[128];
  DT_CHECK(dt_train_ckpt_meta(dir, key, v, sizeof v));
  char tail;
  if (sscanf(v, "%f,%f,%f%c", &out[0], &out[1], &out[2], &tail) != 3)
    return DT_ERROR(DT_ERR_FORMAT,
                    "%s/trainer_state.bin: meta '%s' is '%s', expected three numbers a,b,c", dir,
                    key, v);
  return DT_OK;
}

/* A checkpoint of a run on an image folder (meta image.*, written since
 * the folder's settings were kept): the folder, its evaluation config, and
 * the model's input and classes (a ResNet is built for the folder). */
static dt_status checkpoint_image(dt_cli_ckpt_model *m) {
  if (dt_train_ckpt_meta(m->dir, "image.folder", m->image_folder, sizeof m->image_folder) !=
      DT_OK) {
    dt_clear_error();
    m->image_folder[0] = '\0';
    return DT_OK;
  }
  dt_image_folder_config ic = DT_IMAGE_FOLDER_CONFIG_DEFAULT;
  long channels, size, classes;
  char augment[32];
  DT_CHECK(meta_int_in(m->dir, "image.channels", 1, 3, &channels));
  DT_CHECK(meta_int_in(m->dir, "image.size", 1, 4096, &size));
  DT_CHECK(meta_int_in(m->dir, "image.classes", 1, 1L << 30, &classes));
  DT_CHECK(meta_triple(m->dir, "image.mean", ic.mean));
  DT_CHECK(meta_triple(m->dir, "image.std", ic.std));
  DT_CHECK(dt_train_ckpt_meta(m->dir, "image.augment", augment, sizeof augment));
  DT_CHECK(dt_image_augment_parse(augment, &ic.recipe));
  ic.channels = (int)channels;
  ic.size = (int)size;
  ic.augment = 0; /* evaluation */
  m->image = ic;
  m->image_classes = (int)classes;
  if (m->task.any_image_size) {
    m->task.input_shape[0] = channels;
    m->task.input_shape[1] = m->task.input_shape[2] = size;
    m->task.num_classes = (int)classes;
  }
  return DT_OK;
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
  DT_CHECK(checkpoint_image(m));
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

/* The val/ split of the image folder `folder`, which must hold the
 * checkpoint's classes. */
static dt_status open_image_val(const dt_cli_ckpt_model *m, const char *folder, dt_dataset **out) {
  DT_CHECK(dt_dataset_image_folder(folder, "val", &m->image, out));
  int k = dt_dataset_num_classes(*out);
  if (k != m->image_classes)
    return DT_ERROR(DT_ERR_SHAPE,
                    "image folder %s/val has %d classes, the checkpoint %s was trained on %d: "
                    "evaluate it on a folder of the same classes",
                    folder, k, m->dir, m->image_classes);
  return DT_OK;
}

static dt_status evaluate_checkpoint(const dt_cli_ckpt_args *a) {
  dt_cli_ckpt_model m;
  const dt_task_data *td = NULL;
  dt_dataset *test = NULL;
  double loss = 0, metric = 0;
  char folder[4200];
  dt_status st = dt_cli_ckpt_model_open(a->checkpoint, a->device, NULL, &m);
  const dt_task *task = &m.task;
  const char *data = m.data;
  if (st == DT_OK && a->data && !m.image_folder[0])
    st = DT_ERROR(DT_ERR_INVALID_ARG,
                  "--data %s: the checkpoint %s records no image folder (its data: %s): --data "
                  "is for checkpoints of runs on an image folder, which record it",
                  a->data, m.dir, m.data);
  if (st == DT_OK && m.image_folder[0]) {
    data = a->data ? a->data : m.image_folder;
    st = open_image_val(&m, data, &test);
  } else if (st == DT_OK) {
    st = dt_task_find_data(task, m.data, &td);
    snprintf(folder, sizeof folder, "%s/%s", a->data_dir, m.data);
    if (st == DT_OK)
      st = td->open(task, td, folder, task->eval_split, &test);
  }
  if (st == DT_OK)
    st = dt_train_evaluate(task, m.module, test, a->batch, m.dev, &loss, &metric);
  if (st == DT_OK) {
    printf("dtrain eval: checkpoint %s (model %s, data %s, optimizer step %s)\n%s_loss=%.4f", m.dir,
           m.model, data, m.step, task->eval_split, loss);
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
  return evaluate_checkpoint(a);
}

int dt_cli_eval(int argc, char **argv, FILE *err) {
  dt_cli_ckpt_args a = {NULL, "data", "cpu", 1000, DT_SAMPLE_CONFIG_DEFAULT};
  dt_env_string(DT_ENV_DATA_DIR, &a.data_dir);
  dt_flag own[] = {
      DT_INT_FLAG("eval-batch", &a.batch, "N", "batch size of the evaluation", .min = 1),
      DT_STRING_FLAG("data", &a.data, "DIR",
                     "a checkpoint trained on an image folder: evaluate on DIR/val instead of "
                     "the folder it was trained on (the same classes)"),
  };
  dt_flag_set set = {
      .command = "eval",
      .usage = "eval --checkpoint PATH [flags]",
      .about =
          "Evaluates a checkpoint of dtrain train on the test split of its data set\n"
          "and prints test_loss=... test_accuracy=.... Exit status: 0, 1 when it fails\n"
          "(a damaged checkpoint is named by file and section), 2 for a bad command line.",
  };
  return dt_cli_checkpoint_command(&set, &a, own, 2, argc, argv, err, eval_work);
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
