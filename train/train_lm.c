/* Task-driven parts of the training loop (train/train_lm.h). */
#include "train/train_lm.h"

#include <stdlib.h>
#include <string.h>

#include "train/mfu.h"

double dt_train_throughput_text(const dt_task *task, dt_device dev, dt_precision precision,
                                dt_mfu_cache *cache, int world, double samples_per_s, char *buf,
                                size_t cap) {
  size_t used = 0;
  buf[0] = '\0';
  if (task->max_context > 0)
    used +=
        (size_t)snprintf(buf, cap, " tokens/s %.0f", samples_per_s * (double)task->input_shape[0]);
  dt_mfu mfu;
  if (!task->flops_per_sample || world < 1 ||
      dt_mfu_of(dev, precision, cache, samples_per_s * task->flops_per_sample(task) / world,
                &mfu) != DT_OK) {
    dt_clear_error();
    return -1.0;
  }
  if (used < cap && mfu.above_roof)
    snprintf(buf + used, cap - used, " mfu n/a (above the measured roof)");
  else if (used < cap)
    snprintf(buf + used, cap - used, " mfu %.1f%%", 100.0 * mfu.value);
  return mfu.value;
}

void dt_train_log_flops(FILE *log, const char *prefix, const dt_task *task, dt_device dev,
                        dt_precision precision, dt_mfu_cache *cache) {
  dt_peak_flops peak;
  if (!log || !task->flops_per_sample)
    return;
  if (dt_mfu_peak(dev, precision, cache, &peak) != DT_OK) {
    fprintf(log, "%sdtrain train: no MFU: %s\n", prefix, dt_last_error());
    dt_clear_error();
    return;
  }
  double per_sample = task->flops_per_sample(task);
  double per_token = task->max_context > 0 ? per_sample / (double)task->input_shape[0] : 0.0;
  if (per_token > 0)
    fprintf(log,
            "%sdtrain train: %.1f MFLOP per token (6 N + 12 L T C), MFU against %.1f GFLOP/s "
            "(%s)\n",
            prefix, per_token / 1e6, peak.flops / 1e9, peak.source);
  else
    fprintf(log, "%sdtrain train: %.1f MFLOP per sample, MFU against %.1f GFLOP/s (%s)\n", prefix,
            per_sample / 1e6, peak.flops / 1e9, peak.source);
  fflush(log);
}

dt_status dt_train_log_sample(FILE *log, const dt_train_config *c, const dt_task *task,
                              dt_module *model, dt_device dev, long long step) {
  if (!log || !task->tokenizer || c->sample.length <= 0)
    return DT_OK;
  char *text = NULL;
  dt_sample_config sc = c->sample;
  sc.emit = NULL; /* the log takes the text whole, under its header */
  DT_CHECK(dt_sample_text(model, task, dev, c->data_dir, &sc, &text));
  const char *prefix = c->log_prefix ? c->log_prefix : "";
  if (step > 0)
    fprintf(log, "%ssample after step %lld (%d tokens, temperature %g, top-k %d, seed %llu):\n",
            prefix, step, sc.length, (double)sc.temperature, sc.top_k, (unsigned long long)sc.seed);
  else
    fprintf(log, "%ssample (%d tokens, temperature %g, top-k %d, seed %llu):\n", prefix, sc.length,
            (double)sc.temperature, sc.top_k, (unsigned long long)sc.seed);
  fprintf(log, "%s%s\n%s---\n", prefix, text, prefix);
  fflush(log);
  free(text);
  return DT_OK;
}

const char *dt_train_result_name(const dt_task *task, char *buf, size_t cap) {
  snprintf(buf, cap, "%s_%s", task->eval_split,
           task->result == DT_TASK_RESULT_LOSS ? "loss" : task->metric_name);
  return buf;
}
