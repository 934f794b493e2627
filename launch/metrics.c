/* The metrics file (launch/metrics.h): one cJSON object per line. */
#include "launch/metrics.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct dt_metrics {
  FILE *f;
  char path[4096];
  bool failed;
  int err;
};

dt_status dt_metrics_open(const char *path, bool append, dt_metrics **out) {
  *out = NULL;
  dt_metrics *m = calloc(1, sizeof *m);
  if (!m)
    return DT_ERROR(DT_ERR_OOM, "no host memory for the metrics file");
  snprintf(m->path, sizeof m->path, "%s", path);
  m->f = fopen(path, append ? "a" : "w");
  if (!m->f) {
    dt_status st =
        DT_ERROR(DT_ERR_IO, "cannot create the metrics file %s: %s", path, strerror(errno));
    free(m);
    return st;
  }
  *out = m;
  return DT_OK;
}

dt_status dt_metrics_close(dt_metrics *m) {
  if (!m)
    return DT_OK;
  bool failed = m->failed;
  int e = m->err;
  if (fclose(m->f) != 0 && !failed) {
    failed = true;
    e = errno;
  }
  dt_status st = DT_OK;
  if (failed)
    st = DT_ERROR(DT_ERR_IO, "writing the metrics file %s failed: %s", m->path,
                  e ? strerror(e) : "write error");
  free(m);
  return st;
}

/* Writes obj (taken) as one line. */
static dt_status write_record(dt_metrics *m, cJSON *obj) {
  char *text = obj ? cJSON_PrintUnformatted(obj) : NULL;
  cJSON_Delete(obj);
  if (!text)
    return DT_ERROR(DT_ERR_OOM, "no host memory for a metrics record");
  errno = 0;
  if (fprintf(m->f, "%s\n", text) < 0 || fflush(m->f) != 0) {
    if (!m->failed)
      m->err = errno;
    m->failed = true;
  }
  cJSON_free(text);
  if (m->failed)
    return DT_ERROR(DT_ERR_IO, "writing the metrics file %s failed: %s", m->path,
                    m->err ? strerror(m->err) : "write error");
  return DT_OK;
}

/* A number, or null when not finite (JSON has no NaN). */
static void add_number(cJSON *o, const char *key, double v) {
  if (isfinite(v))
    cJSON_AddNumberToObject(o, key, v);
  else
    cJSON_AddNullToObject(o, key);
}

void dt_json_add_numbers(void *obj, const dt_json_number *fields, int n) {
  for (int i = 0; i < n; i++)
    add_number(obj, fields[i].key, fields[i].value);
}

#define ADD_NUMBERS(o, ...)                       \
  dt_json_add_numbers(                            \
      (o), (const dt_json_number[]){__VA_ARGS__}, \
      (int)(sizeof((const dt_json_number[]){__VA_ARGS__}) / sizeof(dt_json_number)))

/* A record {"type": type, ...} filled in by fill(o, r) and written: what
 * every dt_metrics_write_* does. Nothing when there is no metrics file. */
static dt_status write_new_record(dt_metrics *m, const char *type,
                                  void (*fill)(cJSON *o, const void *r), const void *r) {
  if (!m)
    return DT_OK;
  cJSON *o = cJSON_CreateObject();
  if (!o)
    return DT_ERROR(DT_ERR_OOM, "no host memory for a metrics record");
  cJSON_AddStringToObject(o, "type", type);
  fill(o, r);
  return write_record(m, o);
}

static void fill_run(cJSON *o, const void *rec) {
  const dt_metrics_run *r = rec;
  cJSON_AddStringToObject(o, "model", r->model);
  cJSON_AddStringToObject(o, "data", r->data);
  cJSON_AddStringToObject(o, "device", r->device);
  ADD_NUMBERS(o, {"world", r->world}, {"batch", r->batch}, {"global_batch", r->global_batch},
              {"accum", r->accum}, {"epochs", r->epochs}, {"total_steps", (double)r->total_steps},
              {"steps_per_epoch", (double)r->steps_per_epoch}, {"threads", r->threads});
  cJSON_AddStringToObject(o, "comm", r->comm);
}

dt_status dt_metrics_write_run(dt_metrics *m, const dt_metrics_run *r) {
  return write_new_record(m, "run", fill_run, r);
}

dt_metrics_step dt_metrics_step_default(void) {
  dt_metrics_step r;
  memset(&r, 0, sizeof r);
  r.tokens_per_s = r.allreduce_ms = r.allreduce_hidden = r.allreduce_bytes = -1.0;
  r.mfu = r.loss_scale = -1.0;
  r.skipped_steps = -1;
  return r;
}

static cJSON *memory_array(const dt_metrics_step *r) {
  cJSON *a = cJSON_CreateArray();
  for (int i = 0; a && i < r->n_devices; i++) {
    cJSON *d = cJSON_CreateObject();
    if (!d)
      break;
    cJSON_AddStringToObject(d, "device", r->devices[i].device);
    ADD_NUMBERS(d, {"allocated_mib", r->devices[i].allocated_mib},
                {"reserved_mib", r->devices[i].reserved_mib}, {"peak_mib", r->devices[i].peak_mib});
    cJSON_AddItemToArray(a, d);
  }
  return a;
}

static void fill_step(cJSON *o, const void *rec) {
  const dt_metrics_step *r = rec;
  ADD_NUMBERS(o, {"step", (double)r->step}, {"epoch", r->epoch}, {"batch", (double)r->batch},
              {"batches", (double)r->batches}, {"time", r->time_s}, {"loss", r->loss},
              {"lr", r->lr}, {"grad_norm", r->grad_norm}, {"samples_per_s", r->samples_per_s});
  if (r->tokens_per_s >= 0)
    add_number(o, "tokens_per_s", r->tokens_per_s);
  add_number(o, "step_ms", r->step_ms);
  cJSON *ranks = cJSON_CreateDoubleArray(r->rank_step_ms, r->n_ranks);
  if (ranks)
    cJSON_AddItemToObject(o, "rank_step_ms", ranks);
  cJSON *mem = memory_array(r);
  if (mem)
    cJSON_AddItemToObject(o, "memory", mem);
  if (r->allreduce_ms >= 0) {
    add_number(o, "allreduce_ms", r->allreduce_ms);
    add_number(o, "allreduce_hidden", r->allreduce_hidden);
    add_number(o, "allreduce_bytes", r->allreduce_bytes);
  } else {
    cJSON_AddNullToObject(o, "allreduce_ms");
    cJSON_AddNullToObject(o, "allreduce_hidden");
    cJSON_AddNullToObject(o, "allreduce_bytes");
  }
  if (r->mfu >= 0)
    add_number(o, "mfu", r->mfu);
  if (r->loss_scale >= 0)
    add_number(o, "loss_scale", r->loss_scale);
  if (r->skipped_steps >= 0)
    cJSON_AddNumberToObject(o, "skipped_steps", (double)r->skipped_steps);
}

dt_status dt_metrics_write_step(dt_metrics *m, const dt_metrics_step *r) {
  return write_new_record(m, "train", fill_step, r);
}

static void fill_eval(cJSON *o, const void *rec) {
  const dt_metrics_eval *r = rec;
  const char *split = r->split ? r->split : "test";
  char loss_key[64], metric_key[96];
  snprintf(loss_key, sizeof loss_key, "%s_loss", split);
  snprintf(metric_key, sizeof metric_key, "%s_%s", split, r->metric_name ? r->metric_name : "");
  cJSON_AddStringToObject(o, "split", split);
  ADD_NUMBERS(o, {"step", (double)r->step}, {"epoch", r->epoch}, {"time", r->time_s},
              {"train_loss", r->train_loss}, {loss_key, r->test_loss});
  if (r->metric_name)
    ADD_NUMBERS(o, {metric_key, r->test_metric});
  if (r->bad_images >= 0)
    cJSON_AddNumberToObject(o, "bad_images", (double)r->bad_images);
}

dt_status dt_metrics_write_eval(dt_metrics *m, const dt_metrics_eval *r) {
  return write_new_record(m, "eval", fill_eval, r);
}

static void fill_oom(cJSON *o, const void *rec) {
  const dt_metrics_oom *r = rec;
  ADD_NUMBERS(o, {"step", (double)r->step}, {"epoch", r->epoch}, {"batch", (double)r->batch},
              {"time", r->time_s}, {"micro_batch", r->micro_batch}, {"accum", r->accum},
              {"retries", r->retries});
  cJSON_AddStringToObject(o, "error", r->error ? r->error : "");
}

dt_status dt_metrics_write_oom(dt_metrics *m, const dt_metrics_oom *r) {
  return write_new_record(m, "oom", fill_oom, r);
}
