/* `dtrain eval`: rebuilds the checkpoint's model (its task from the trainer
 * state), loads model.safetensors and evaluates it on the test split. */
#include "launch/eval.h"

#include <stdlib.h>
#include <string.h>

#include "core/backend.h"
#include "core/checkpoint.h"
#include "core/cpu.h"
#include "core/env.h"
#include "launch/cli.h"
#include "launch/flags.h"
#include "launch/train_checkpoint.h"
#include "launch/train_loop.h"
#include "models/tasks.h"

static dt_status evaluate_checkpoint(const char *path, const char *data_dir, const char *device,
                                     int batch) {
  char dir[4400], model[64], data[64], step[32], folder[4200];
  DT_CHECK(dt_train_ckpt_resolve(path, stderr, dir, sizeof dir));
  if (!dir[0])
    return DT_ERROR(DT_ERR_IO, "%s holds no checkpoint", path);
  DT_CHECK(dt_train_ckpt_meta(dir, "config.model", model, sizeof model));
  DT_CHECK(dt_train_ckpt_meta(dir, "config.data", data, sizeof data));
  DT_CHECK(dt_train_ckpt_meta(dir, "step", step, sizeof step));
  const dt_task *task = NULL;
  const dt_task_data *td = NULL;
  DT_CHECK(dt_task_find(model, &task));
  DT_CHECK(dt_task_find_data(task, data, &td));
  dt_device dev;
  DT_CHECK(dt_train_rank_device(device, NULL, &dev));
  snprintf(folder, sizeof folder, "%s/%s", data_dir, data);
  dt_module *m = NULL;
  dt_dataset *test = NULL;
  double loss = 0, metric = 0;
  DT_CHECK(task->build(task, 0, &m));
  char weights[4500];
  snprintf(weights, sizeof weights, "%s/model.safetensors", dir);
  dt_status st = dt_module_to(m, dev);
  if (st == DT_OK)
    st = dt_safetensors_load_module(weights, m);
  if (st == DT_OK)
    st = td->open(task, td, folder, task->eval_split, &test);
  if (st == DT_OK)
    st = dt_train_evaluate(task, m, test, batch, dev, &loss, &metric);
  if (st == DT_OK) {
    printf("dtrain eval: checkpoint %s (model %s, data %s, optimizer step %s)\n%s_loss=%.4f", dir,
           model, data, step, task->eval_split, loss);
    if (task->metric)
      printf(" %s_%s=%.4f", task->eval_split, task->metric_name, metric);
    printf("\n");
  }
  dt_dataset_destroy(test);
  dt_module_destroy(m);
  return st;
}

int dt_cli_eval(int argc, char **argv, FILE *err) {
  const char *checkpoint = NULL, *data_dir = "data", *device = "cpu";
  int batch = 1000, threads = 0;
  dt_env_string(DT_ENV_DATA_DIR, &data_dir);
  dt_flag flags[] = {
      DT_STRING_FLAG("checkpoint", &checkpoint, "PATH",
                     "a checkpoint directory, or a run directory (its newest complete checkpoint)"),
      dt_cli_flag_data_dir(&data_dir),
      DT_INT_FLAG("eval-batch", &batch, "N", "batch size of the evaluation", .min = 1),
      dt_cli_flag_device(&device),
      dt_cli_flag_threads(&threads),
  };
  dt_flag_set set = {
      .command = "eval",
      .usage = "eval --checkpoint PATH [flags]",
      .about =
          "Evaluates a checkpoint of dtrain train on the test split of its data set\n"
          "and prints test_loss=... test_accuracy=.... Exit status: 0, 1 when it fails\n"
          "(a damaged checkpoint is named by file and section), 2 for a bad command line.",
      DT_FLAG_TABLE(flags),
  };
  DT_FLAGS_PARSE_OR_RETURN(&set, argc, argv, err, NULL);
  if (!checkpoint) {
    fprintf(err, "dtrain eval: --checkpoint PATH is required\n");
    return 2;
  }
  if (dt_cli_check_env() != DT_OK)
    return 1;
  if (threads > 0)
    dt_cpu_set_num_threads(threads);
  if (evaluate_checkpoint(checkpoint, data_dir, device, batch) != DT_OK) {
    dt_cli_print_error(stderr, "");
    return 1;
  }
  return 0;
}
