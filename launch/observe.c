/* The run's observers behind one interface (launch/observe.h). */
#include "launch/observe.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/memory.h"
#include "core/tensor.h"
#include "core/trace.h"
#include "launch/gpu_monitor.h"
#include "launch/job_status.h"
#include "launch/metrics.h"
#include "launch/progress.h"
#include "launch/trace.h"

#define STATUS_INTERVAL_S 1.0
#define GPU_SAMPLE_INTERVAL_S 1.0
#define PER_RANK_FIGURES 4 /* step_ms, allocated, reserved, peak (MiB) */

struct dt_observer {
  dt_observe_config cfg;
  int rank;
  dt_device dev;
  FILE *log;
  dt_progress progress;
  dt_metrics *metrics;
  dt_trace *trace;
  dt_observe_run run;
  dt_device devices[64];
  dt_step_stats no_stats; /* when the run has none */
  /* the status file for dtrain top */
  dt_job_status status;
  dt_job_status_file status_file;
  double status_written_s;
  /* the GPU monitor (cuda devices) */
  dt_gpu_monitor *gpu;
  int gpu_index; /* NVML's index of dev */
  char gpu_text[160];
  double gpu_sampled_s;
  /* progress */
  int epoch;
  int64_t batches, batch, steps_done, epoch_samples, epoch_steps;
  double epoch_start_s, start_s, last_loss;
  /* the interval since the last record */
  double interval_start_s;
  int64_t interval_steps, interval_syncs;
  dt_ddp_comm_times comm; /* summed over the interval's synchronised steps */
  size_t comm_bytes;      /* handed to the all-reduces per synchronised step */
  int record_interval;    /* rank 0's --log-interval with metrics, else 0 */
  dt_status first_error;
  double eval_span;
};

/* NVML counts every GPU of the machine; CUDA's index is within
 * CUDA_VISIBLE_DEVICES when that lists indices. */
static int nvml_index_of(int cuda_index) {
  const char *v = getenv("CUDA_VISIBLE_DEVICES");
  if (!v || !v[0])
    return cuda_index;
  int i = 0;
  for (const char *p = v; *p; i++) {
    char *end = NULL;
    long id = strtol(p, &end, 10);
    if (end == p)
      return cuda_index; /* UUIDs: no mapping known */
    if (i == cuda_index)
      return (int)id;
    p = *end == ',' ? end + 1 : end;
  }
  return cuda_index;
}

dt_status dt_observer_create(const dt_observe_config *cfg, int rank, dt_device dev, FILE *log,
                             FILE *console, const char *prefix, bool resumed, dt_observer **out) {
  *out = NULL;
  dt_observer *o = calloc(1, sizeof *o);
  if (!o)
    return DT_ERROR(DT_ERR_OOM, "no host memory for the run's observer");
  o->cfg = *cfg;
  o->rank = rank;
  o->dev = dev;
  o->log = log;
  o->start_s = o->interval_start_s = dt_trace_now();
  o->last_loss = NAN;
  dt_progress_init(&o->progress, log, console, prefix, cfg->quiet);
  o->progress.file_out = cfg->log_file;
  dt_status st = DT_OK;
  if (cfg->metrics_path && rank == 0)
    DT_CHECK_GOTO(dt_metrics_open(cfg->metrics_path, resumed, &o->metrics), st, fail);
  if (cfg->trace_path || dev.type == DT_DEVICE_CUDA) {
    dt_trace_config tc = {cfg->trace_path, rank, cfg->trace_first, cfg->trace_last, dev};
    DT_CHECK_GOTO(dt_trace_open(&tc, &o->trace), st, fail);
  }
  if (dev.type == DT_DEVICE_CUDA) {
    o->gpu_index = nvml_index_of(dev.index);
    if (dt_gpu_monitor_open(&o->gpu) != DT_OK)
      snprintf(o->gpu_text, sizeof o->gpu_text, "gpu: %s", dt_last_error());
    dt_clear_error();
  }
  *out = o;
  return DT_OK;
fail:
  dt_observer_destroy(o, DT_OK);
  return st;
}

/* Sums v[0..n) over the ranks in place (on the rank's device: an nccl
 * communicator reduces GPU memory only). */
static dt_status sum_over_ranks(dt_observer *o, float *v, int64_t n) {
  if (o->run.world <= 1 || !o->run.comm)
    return DT_OK;
  dt_tensor *t = NULL;
  DT_CHECK(dt_tensor_from_host(v, &n, 1, DT_DTYPE_F32, o->dev, &t));
  dt_status st = dt_comm_allreduce_sync(o->run.comm, t, DT_REDUCE_SUM);
  if (st == DT_OK)
    st = dt_tensor_to_host(t, v, (size_t)n * sizeof *v);
  dt_tensor_release(t);
  return st;
}

/* Rank 0's --log-interval to every rank (a sum of it and zeros). */
static dt_status share_record_interval(dt_observer *o) {
  float v = o->rank == 0 ? (float)o->cfg.log_interval : 0.0f;
  DT_CHECK(sum_over_ranks(o, &v, 1));
  o->record_interval = (int)v;
  return DT_OK;
}

/* Every rank's {step_ms, allocated, reserved, peak}: each rank fills its
 * slot and the sum over the ranks is the gathered table. */
static dt_status gather_ranks(dt_observer *o, const float *mine, float *all) {
  int64_t n = (int64_t)o->run.world * PER_RANK_FIGURES;
  memset(all, 0, (size_t)n * sizeof *all);
  memcpy(all + (size_t)o->rank * PER_RANK_FIGURES, mine, PER_RANK_FIGURES * sizeof *all);
  return sum_over_ranks(o, all, n);
}

dt_status dt_observer_start(dt_observer *o, const dt_observe_run *run) {
  o->run = *run;
  int n = run->devices ? run->n_devices : 1;
  if (n > (int)(sizeof o->devices / sizeof o->devices[0]))
    n = (int)(sizeof o->devices / sizeof o->devices[0]);
  for (int i = 0; i < n; i++)
    o->devices[i] = run->devices ? run->devices[i] : run->dev;
  o->run.devices = o->devices;
  o->steps_done = run->steps_done;
  if (!o->run.stats)
    o->run.stats = &o->no_stats;
  o->run.n_devices = n;
  if (o->cfg.metrics_path)
    DT_CHECK(share_record_interval(o));
  dt_metrics_run mr = {run->model,  run->data,    run->device_name,        run->comm_name,
                       run->world,  run->batch,   run->batch * run->world, run->accum,
                       run->epochs, run->threads, run->total_steps,        run->steps_per_epoch};
  DT_CHECK(dt_metrics_write_run(o->metrics, &mr));
  o->status = (dt_job_status){.world = run->world,
                              .model = run->model,
                              .data = run->data,
                              .device = run->device_name,
                              .state = "starting",
                              .rate_unit = run->tokens_per_sample > 0 ? "tokens/s" : "samples/s",
                              .epochs = run->epochs,
                              .total_steps = run->total_steps};
  char dir[4096];
  dt_job_status_dir(o->cfg.status_dir, dir, sizeof dir);
  /* top is a convenience: a folder it cannot use must not stop training,
   * but it is said (once, on the log) */
  if (dt_job_status_open(dir, o->rank, &o->status, &o->status_file) != DT_OK) {
    if (o->log)
      fprintf(o->log, "dtrain train: warning: %s (dtrain top will not show this run)\n",
              dt_last_error());
    dt_clear_error();
  }
  return DT_OK;
}

bool dt_observer_collective(const dt_observer *o) { return o->record_interval > 0; }

static bool record_due(const dt_observer *o, int64_t batch) {
  return o->record_interval > 0 && batch % o->record_interval == 0;
}

static bool line_due(const dt_observer *o, int64_t batch) {
  return o->log && o->cfg.log_interval > 0 && batch % o->cfg.log_interval == 0;
}

bool dt_observer_interval_due(const dt_observer *o, int64_t batch) {
  return record_due(o, batch) || line_due(o, batch);
}

void dt_observer_epoch_begin(dt_observer *o, int epoch, int64_t batches) {
  o->epoch = epoch;
  o->batches = batches;
  o->batch = 0;
  o->epoch_samples = 0;
  o->epoch_start_s = dt_trace_now();
  int64_t accum = o->run.accum > 0 ? o->run.accum : 1;
  o->epoch_steps = (batches + accum - 1) / accum;
  dt_progress_epoch_begin(&o->progress, o->steps_done);
  o->status.epoch = epoch;
  o->status.state = "training";
}

void dt_observer_step_begin(dt_observer *o, int64_t first_batch, int group) {
  dt_trace_set_step(o->trace, o->steps_done + 1);
  /* The norm is read where a record falls in this step's micro-batches. */
  int ri = o->record_interval;
  /* every rank alike: under ZeRO the norm is a collective */
  bool record = ri > 0 && (first_batch + group) / ri > first_batch / ri;
  o->run.stats->want_grad_norm = record;
}

static void update_gpu_text(dt_observer *o, double now) {
  if (!o->gpu || now - o->gpu_sampled_s < GPU_SAMPLE_INTERVAL_S)
    return;
  o->gpu_sampled_s = now;
  dt_gpu_sample s;
  if (dt_gpu_monitor_sample(o->gpu, o->gpu_index, &s) == DT_OK)
    dt_gpu_sample_format(o->gpu_index, &s, o->gpu_text, sizeof o->gpu_text);
  else
    snprintf(o->gpu_text, sizeof o->gpu_text, "gpu: %s", dt_last_error());
}

static double rate_now(const dt_observer *o, double now) {
  double t = now - o->epoch_start_s;
  double r = t > 0 ? (double)o->run.world * (double)o->epoch_samples / t : 0.0;
  return o->run.tokens_per_sample > 0 ? r * (double)o->run.tokens_per_sample : r;
}

static void write_status(dt_observer *o, double now, bool force) {
  if (!o->status_file.active || (!force && now - o->status_written_s < STATUS_INTERVAL_S))
    return;
  o->status_written_s = now;
  o->status.step = o->steps_done;
  o->status.loss = o->last_loss;
  o->status.rate = rate_now(o, now);
  int64_t ep_steps = o->steps_done - o->progress.epoch_first_step;
  double per_step = ep_steps > 0 ? (now - o->epoch_start_s) / (double)ep_steps : -1.0;
  o->status.eta_s = per_step < 0 ? -1.0 : per_step * (double)(o->run.total_steps - o->steps_done);
  dt_memory_stats ms;
  o->status.mem_mib =
      dt_memory_stats_get(o->dev, &ms) == DT_OK ? (double)ms.allocated / DT_MIB : 0.0;
  if (dt_job_status_write(&o->status_file, &o->status) != DT_OK) {
    if (o->log)
      fprintf(o->log, "dtrain train: warning: %s (dtrain top will not show this run)\n",
              dt_last_error());
    dt_clear_error();
    dt_job_status_remove(&o->status_file); /* stop trying */
  }
}

static void draw(dt_observer *o, double now, bool force) {
  if (!o->progress.live)
    return;
  update_gpu_text(o, now);
  dt_progress_state ps = {o->epoch,
                          o->run.epochs,
                          o->batch,
                          o->batches,
                          o->steps_done,
                          o->run.total_steps,
                          o->epoch_steps,
                          rate_now(o, now),
                          o->run.tokens_per_sample > 0 ? "tokens/s" : "samples/s",
                          o->gpu_text[0] ? o->gpu_text : NULL};
  dt_progress_draw(&o->progress, &ps, force);
}

void dt_observer_tick(dt_observer *o, int64_t batch, int64_t samples) {
  o->batch = batch;
  o->epoch_samples += samples;
  double now = dt_trace_now();
  draw(o, now, false);
  write_status(o, now, false);
}

dt_status dt_observer_step_end(dt_observer *o, const dt_ddp *ddp) {
  o->steps_done++;
  o->interval_steps++;
  if (ddp) {
    dt_ddp_comm_times c = dt_ddp_last_comm_times(ddp);
    o->comm.allreduce_s += c.allreduce_s;
    o->comm.hidden_s += c.hidden_s;
    o->comm_bytes = dt_ddp_comm_bytes_per_pass(ddp);
    o->interval_syncs++;
    dt_trace_add_comm(o->trace, ddp);
  }
  DT_CHECK(dt_trace_step_end(o->trace));
  dt_trace_set_step(o->trace, o->steps_done + 1);
  return DT_OK;
}

static void memory_of(dt_device dev, float *out) {
  dt_memory_stats ms;
  memset(&ms, 0, sizeof ms);
  if (dt_memory_stats_get(dev, &ms) != DT_OK)
    memset(&ms, 0, sizeof ms);
  out[0] = (float)((double)ms.allocated / DT_MIB);
  out[1] = (float)((double)ms.reserved / DT_MIB);
  out[2] = (float)((double)ms.peak_allocated / DT_MIB);
}

static dt_status write_record(dt_observer *o, const dt_observe_interval *iv, double now,
                              double step_ms, const float *all) {
  int world = o->run.world, n_dev = world > 1 ? world : o->run.n_devices;
  double *rank_ms = calloc((size_t)world, sizeof *rank_ms);
  dt_metrics_device *devs = calloc((size_t)n_dev, sizeof *devs);
  dt_status st = DT_OK;
  if (!rank_ms || !devs) {
    st = DT_ERROR(DT_ERR_OOM, "no host memory for a metrics record");
    goto done;
  }
  for (int r = 0; r < world; r++)
    rank_ms[r] = all[r * PER_RANK_FIGURES];
  for (int i = 0; i < n_dev; i++) {
    dt_device d = world > 1 ? o->dev : o->run.devices[i];
    float mem[3];
    const float *m = mem;
    if (world > 1) {
      m = all + i * PER_RANK_FIGURES + 1; /* rank i's device */
      char name[24];
      dt_device_format(d, name, sizeof name);
      snprintf(devs[i].device, sizeof devs[i].device, "rank%d:%s", i, name);
    } else {
      memory_of(d, mem);
      dt_device_format(d, devs[i].device, sizeof devs[i].device);
    }
    devs[i].allocated_mib = m[0];
    devs[i].reserved_mib = m[1];
    devs[i].peak_mib = m[2];
  }
  dt_metrics_step r = dt_metrics_step_default();
  r.step = o->steps_done;
  r.epoch = iv->epoch;
  r.batch = iv->batch;
  r.batches = iv->batches;
  r.time_s = now - o->start_s;
  r.loss = iv->loss;
  r.lr = iv->lr;
  r.grad_norm = o->run.stats == &o->no_stats ? NAN : o->run.stats->grad_norm;
  r.samples_per_s = iv->samples_per_s;
  if (o->run.tokens_per_sample > 0)
    r.tokens_per_s = iv->samples_per_s * (double)o->run.tokens_per_sample;
  r.step_ms = step_ms;
  r.mfu = iv->mfu;
  if (o->run.scaler) {
    r.loss_scale = o->run.scaler->scale;
    r.skipped_steps = o->run.scaler->skipped_steps;
  }
  r.rank_step_ms = rank_ms;
  r.n_ranks = world;
  r.devices = devs;
  r.n_devices = n_dev;
  if (world > 1 && o->interval_syncs > 0) {
    r.allreduce_ms = 1e3 * o->comm.allreduce_s / (double)o->interval_syncs;
    r.allreduce_hidden = o->comm.allreduce_s > 0 ? o->comm.hidden_s / o->comm.allreduce_s : 0.0;
    r.allreduce_bytes = (double)o->comm_bytes;
  }
  st = dt_metrics_write_step(o->metrics, &r);
done:
  free(devs);
  free(rank_ms);
  return st;
}

dt_status dt_observer_interval(dt_observer *o, const dt_observe_interval *iv) {
  double now = dt_trace_now();
  o->last_loss = iv->loss;
  double span = now - o->interval_start_s;
  double step_ms = o->interval_steps > 0 ? 1e3 * span / (double)o->interval_steps : 0.0;
  dt_status st = DT_OK;
  if (record_due(o, iv->batch)) {
    int world = o->run.world > 0 ? o->run.world : 1;
    float mine[PER_RANK_FIGURES] = {(float)step_ms, 0, 0, 0};
    memory_of(o->dev, mine + 1);
    float *all = calloc((size_t)world * PER_RANK_FIGURES, sizeof *all);
    if (!all)
      return DT_ERROR(DT_ERR_OOM, "no host memory for the ranks' figures");
    st = gather_ranks(o, mine, all);
    if (st == DT_OK && o->metrics)
      st = write_record(o, iv, now, step_ms, all);
    free(all);
  }
  if (line_due(o, iv->batch)) {
    float mem[3];
    memory_of(o->dev, mem);
    char line[320], scale[64] = "";
    if (o->run.scaler)
      snprintf(scale, sizeof scale, " scale %g skipped %lld", (double)o->run.scaler->scale,
               (long long)o->run.scaler->skipped_steps);
    snprintf(line, sizeof line,
             "epoch %d step %lld/%lld loss %.4f lr %.4g%s samples/s %.0f%s mem %.1f MiB (peak "
             "%.1f MiB)%s\n",
             iv->epoch, (long long)iv->batch, (long long)iv->batches, iv->loss, iv->lr, scale,
             iv->samples_per_s, iv->rate_extra ? iv->rate_extra : "", mem[0], mem[2],
             iv->extra ? iv->extra : "");
    dt_progress_line(&o->progress, line);
  }
  draw(o, now, true);
  o->interval_start_s = now;
  o->interval_steps = o->interval_syncs = 0;
  o->comm = (dt_ddp_comm_times){0.0, 0.0, 0.0};
  return st;
}

void dt_observer_eval_begin(dt_observer *o) {
  dt_progress_clear(&o->progress);
  o->status.state = "evaluating";
  write_status(o, dt_trace_now(), true);
  o->eval_span = dt_trace_begin(DT_TRACE_LANE_STEP, "evaluate");
}

dt_status dt_observer_eval_end(dt_observer *o, const dt_observe_eval *ev) {
  dt_trace_end(DT_TRACE_LANE_STEP, "evaluate", o->eval_span);
  o->status.state = "training";
  dt_progress_clear(&o->progress);
  dt_metrics_eval r = {o->steps_done,
                       ev->epoch > 0 ? ev->epoch : o->epoch,
                       dt_trace_now() - o->start_s,
                       ev->split,
                       ev->train_loss,
                       ev->test_loss,
                       ev->test_metric,
                       o->run.metric_name,
                       ev->bad_images};
  return dt_metrics_write_eval(o->metrics, &r);
}

dt_status dt_observer_oom(dt_observer *o, const dt_train_oom *ev) {
  dt_progress_clear(&o->progress);
  dt_metrics_oom r = {ev->step,
                      ev->batch,
                      ev->epoch,
                      ev->micro_batch,
                      ev->accum,
                      ev->retries,
                      dt_trace_now() - o->start_s,
                      ev->error};
  return dt_metrics_write_oom(o->metrics, &r);
}

dt_status dt_observer_destroy(dt_observer *o, dt_status st) {
  if (!o)
    return st;
  dt_progress_clear(&o->progress);
  dt_job_status_remove(&o->status_file);
  dt_status closing = dt_trace_close(o->trace);
  dt_status m = dt_metrics_close(o->metrics);
  if (closing == DT_OK)
    closing = m;
  dt_gpu_monitor_close(o->gpu);
  free(o);
  return st != DT_OK ? st : closing;
}

/* ---- the observer as the trainer's hooks ---- */
static dt_status hook_start(void *user, const dt_train_run_info *run) {
  dt_observe_hooks *h = user;
  dt_observe_config oc = h->cfg;
  oc.log_interval = run->log_interval;
  oc.log_file = run->log_file;
  if (!oc.metrics_path && run->run_dir && run->run_dir[0]) { /* a run directory keeps its metrics */
    snprintf(h->metrics_path, sizeof h->metrics_path, "%s/metrics.jsonl", run->run_dir);
    oc.metrics_path = h->metrics_path;
  }
  DT_CHECK(dt_observer_create(&oc, run->rank, run->dev, run->log, run->console, run->log_prefix,
                              run->resumed, &h->observer));
  return dt_observer_start(h->observer, run);
}

static bool hook_interval_due(void *user, int64_t batch) {
  return dt_observer_interval_due(((dt_observe_hooks *)user)->observer, batch);
}

static void hook_epoch_begin(void *user, int epoch, int64_t batches) {
  dt_observer_epoch_begin(((dt_observe_hooks *)user)->observer, epoch, batches);
}

static void hook_step_begin(void *user, int64_t first_batch, int group) {
  dt_observer_step_begin(((dt_observe_hooks *)user)->observer, first_batch, group);
}

static void hook_micro_batch_end(void *user, int64_t batch, int64_t samples) {
  dt_observer_tick(((dt_observe_hooks *)user)->observer, batch, samples);
}

static dt_status hook_step_end(void *user, const dt_ddp *ddp) {
  return dt_observer_step_end(((dt_observe_hooks *)user)->observer, ddp);
}

static dt_status hook_interval(void *user, const dt_train_interval *iv) {
  return dt_observer_interval(((dt_observe_hooks *)user)->observer, iv);
}

static void hook_eval_begin(void *user) {
  dt_observer_eval_begin(((dt_observe_hooks *)user)->observer);
}

static dt_status hook_eval_end(void *user, const dt_train_eval *ev) {
  return dt_observer_eval_end(((dt_observe_hooks *)user)->observer, ev);
}

static dt_status hook_oom(void *user, const dt_train_oom *ev) {
  return dt_observer_oom(((dt_observe_hooks *)user)->observer, ev);
}

static int hook_should_stop(void *user) { return ((dt_observe_hooks *)user)->should_stop(); }

static dt_status hook_finish(void *user, dt_status st) {
  dt_observe_hooks *h = user;
  st = dt_observer_destroy(h->observer, st);
  h->observer = NULL;
  return st;
}

void dt_observe_hooks_init(dt_observe_hooks *h, const dt_observe_config *cfg,
                           int (*should_stop)(void), dt_train_hooks *out) {
  memset(h, 0, sizeof *h);
  h->cfg = *cfg;
  h->should_stop = should_stop;
  *out = (dt_train_hooks){.user = h,
                          .start = hook_start,
                          .interval_due = hook_interval_due,
                          .epoch_begin = hook_epoch_begin,
                          .step_begin = hook_step_begin,
                          .micro_batch_end = hook_micro_batch_end,
                          .step_end = hook_step_end,
                          .interval = hook_interval,
                          .eval_begin = hook_eval_begin,
                          .eval_end = hook_eval_end,
                          .oom = hook_oom,
                          .should_stop = should_stop ? hook_should_stop : NULL,
                          .finish = hook_finish};
}
