#include "train/train_loop.h"

#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/autograd.h"
#include "core/backend.h"
#include "core/cpu.h"
#include "core/memory.h"
#include "core/ops.h"
#include "core/step.h"
#include "dist/dp.h"
#include "train/plan.h"
#include "train/train_checkpoint.h"
#include "train/train_lm.h"
#include "train/train_state_internal.h"

static double now_seconds(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static double mib(size_t bytes) { return (double)bytes / DT_MIB; }

/* Adds `loss` (a detached scalar, taken) into *sum on the device, without
 * waiting for the device. */
static dt_status accumulate_loss(dt_tensor *loss, dt_tensor **sum) {
  if (*sum == NULL) {
    *sum = loss;
    return DT_OK;
  }
  dt_tensor *next = NULL;
  dt_no_grad_begin();
  dt_status st = dt_op_add(*sum, loss, &next);
  dt_no_grad_end();
  dt_tensor_release(loss);
  if (st == DT_OK) {
    dt_tensor_release(*sum);
    *sum = next;
  }
  return st;
}

/* Reads and clears the device-side loss sum, plus the host-side one (dp). */
static dt_status take_loss_sum(dt_tensor **sum, double *host_sum, double *out) {
  *out = *host_sum;
  *host_sum = 0.0;
  if (*sum == NULL)
    return DT_OK;
  double v = 0.0;
  dt_status st = dt_tensor_item(*sum, 0, &v);
  *out += v;
  dt_tensor_release(*sum);
  *sum = NULL;
  return st;
}

/* A non-finite loss, or one 1000 times the run's first micro-batch loss
 * (with --clip a diverged run stays finite and learns nothing). */
static dt_status check_diverged(const train_state *s, double mean_loss, int epoch, int64_t batch) {
  if (isfinite(mean_loss) && !(s->first_loss > 0 && mean_loss > 1000.0 * s->first_loss))
    return DT_OK;
  char what[64];
  /* %g would print "-nan" for some NaNs: name the value instead. */
  if (isfinite(mean_loss))
    snprintf(what, sizeof what, "%g (the first step's was %g)", mean_loss, s->first_loss);
  else
    snprintf(what, sizeof what, "%s", isnan(mean_loss) ? "nan" : mean_loss > 0 ? "inf" : "-inf");
  return DT_ERROR(DT_ERR_STATE,
                  "training diverged: loss is %s at epoch %d step %lld; lower `lr`, add "
                  "`warmup` or set `clip`",
                  what, epoch, (long long)batch);
}

/* One piece of a micro-batch through the training step, its loss scaled by
 * `scale` (its share of the step's samples); its loss, weighted by
 * `weight` (its share of the micro-batch's), joins the sums. sync ends the
 * accumulation group (the gradients are reduced). */
static dt_status piece_step(train_state *s, dt_tensor *x, dt_tensor *y, float scale, double weight,
                            bool sync, dt_tensor **loss_sum, double *host_loss_sum) {
  if (s->dp) {
    if (dt_tensor_dim(x, 0) < s->n_replicas)
      return DT_ERROR(DT_ERR_INVALID_ARG,
                      "`mode` dp: a micro-batch of %lld samples cannot be split across %d "
                      "replicas (the last batch of the epoch is smaller: use `max_steps` or a "
                      "`batch` that leaves a larger remainder)",
                      (long long)dt_tensor_dim(x, 0), s->n_replicas);
    double loss = 0.0;
    DT_CHECK(dt_dp_forward_backward(s->dp, x, y, scale, sync, &loss));
    *host_loss_sum += weight * loss;
    return DT_OK;
  }
  dt_tensor *loss = NULL, *weighted = NULL;
  DT_CHECK(dt_step_forward_backward(dt_replica_step(s->replica), x, y, scale, sync, &loss));
  if (weight == 1.0)
    return accumulate_loss(loss, loss_sum);
  dt_no_grad_begin();
  dt_status st = dt_op_scale(loss, (float)weight, &weighted);
  dt_no_grad_end();
  dt_tensor_release(loss);
  return st == DT_OK ? accumulate_loss(weighted, loss_sum) : st;
}

/* One micro-batch through the training step, its loss scaled by 1/group;
 * sync ends the accumulation group. After an out-of-memory recovery it
 * runs as consecutive pieces (train/train_oom.c), each scaled by its share
 * of the group's samples (under dp a leftover smaller than the replicas
 * joins the piece before it: an epoch's last micro-batch may be smaller
 * than `batch`); the last carries the sync, and runs under DDP
 * even after a piece failed, so that the peers are not left waiting for
 * this rank's buckets. */
static dt_status micro_batch(const dt_train_config *c, train_state *s, dt_tensor *x, dt_tensor *y,
                             int group, bool sync, dt_tensor **loss_sum, double *host_loss_sum) {
  int64_t n = dt_tensor_dim(x, 0), m = dt_train_piece_size(c, s);
  if (m >= n)
    return piece_step(s, x, y, 1.0f / (float)group, 1.0, sync, loss_sum, host_loss_sum);
  dt_status first = DT_OK, st = DT_OK;
  for (int64_t lo = 0, hi; lo < n; lo = hi) {
    hi = lo + m < n ? lo + m : n;
    if (s->dp && n - hi < s->n_replicas) /* too few left to split: they join this piece */
      hi = n;
    bool last = hi == n;
    if (first != DT_OK && !(last && sync && s->comm))
      continue;
    dt_tensor *xs = NULL, *ys = NULL;
    st = dt_tensor_slice(x, lo, hi, &xs);
    if (st == DT_OK)
      st = dt_tensor_slice(y, lo, hi, &ys);
    if (st == DT_OK)
      st = piece_step(s, xs, ys, (float)(hi - lo) / ((float)n * (float)group),
                      (double)(hi - lo) / (double)n, sync && last, loss_sum, host_loss_sum);
    dt_tensor_release(xs);
    dt_tensor_release(ys);
    if (first == DT_OK)
      first = st;
  }
  return st != DT_OK ? st : first;
}

/* Clipping sees the reduced gradients (the group's last micro-batch
 * finished the reduction). */
static dt_status optimizer_step(train_state *s) {
  DT_CHECK(s->dp ? dt_dp_optimizer_step(s->dp) : dt_step_update(dt_replica_step(s->replica)));
  return s->hooks->step_end ? s->hooks->step_end(s->hooks->user, s->ddp) : DT_OK;
}

static void log_line(FILE *log, const dt_train_config *c, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void log_line(FILE *log, const dt_train_config *c, const char *fmt, ...) {
  if (!log)
    return;
  va_list ap;
  va_start(ap, fmt);
  fputs(c->log_prefix ? c->log_prefix : "", log);
  vfprintf(log, fmt, ap);
  va_end(ap);
  fflush(log);
}

static dt_status log_progress(train_state *s, int epoch, int64_t b, int64_t batches, double loss,
                              double samples_per_s) {
  /* Per rank (dp: per replica): what ZeRO shards. */
  dt_replica_memory rm = dt_replica_memory_use(s->replica ? s->replica : dt_dp_replica(s->dp, 0));
  char extra[128], in_flight[48] = "";
  if (rm.gradients_in_flight > 0)
    snprintf(in_flight, sizeof in_flight, " (+%.2f MiB in flight)", mib(rm.gradients_in_flight));
  char rate[96];
  int devices = s->dp ? s->n_replicas : s->world;
  double mfu = dt_train_throughput_text(s->task, s->dev, s->precision, &s->mfu, devices,
                                        samples_per_s, rate, sizeof rate);
  snprintf(extra, sizeof extra, " optimizer-state %.2f MiB grads %.2f MiB%s",
           mib(rm.optimizer_state), mib(rm.gradients), in_flight);
  dt_train_interval iv = {epoch,         b,    batches, loss, dt_optim_lr(s->opt),
                          samples_per_s, rate, extra,   mfu};
  return s->hooks->interval ? s->hooks->interval(s->hooks->user, &iv) : DT_OK;
}

static dt_status evaluate_first(const dt_train_config *c, train_state *s, int64_t first,
                                double *loss, double *metric);

/* The run's steps so far: the optimizer's, and those the GradScaler
 * skipped (--max-steps, --save-every and the position count both). */
static int64_t run_steps(const train_state *s) {
  return dt_optim_step_count(s->opt) + (s->step.scaler ? s->step.scaler->skipped_steps : 0);
}

/* Image folders with skip_bad_images: the distinct bad files both splits
 * met on any rank (a file two ranks met counts once: the ranks' masks of
 * bad files are summed, a collective every rank calls at the same point);
 * -1 for other runs. */
static dt_status count_bad_images(const dt_train_config *c, const train_state *s, int64_t *out) {
  *out = -1;
  if (!c->image_folder || !c->image.skip_bad_images)
    return DT_OK;
  int64_t nt = dt_dataset_length(s->train_set), n = nt + dt_dataset_length(s->test_set);
  float *mask = malloc((size_t)n * sizeof *mask);
  if (!mask)
    return DT_ERROR(DT_ERR_OOM, "no host memory for the bad-image marks of %lld files",
                    (long long)n);
  int64_t bad = dt_image_folder_bad_mask(s->train_set, mask, nt) +
                dt_image_folder_bad_mask(s->test_set, mask + nt, n - nt);
  dt_status st = DT_OK;
  if (s->comm) {
    dt_tensor *t = NULL;
    st = dt_tensor_from_host(mask, &n, 1, DT_DTYPE_F32, s->dev, &t);
    if (st == DT_OK)
      st = dt_comm_allreduce_sync(s->comm, t, DT_REDUCE_SUM);
    if (st == DT_OK)
      st = dt_tensor_to_host(t, mask, (size_t)n * sizeof *mask);
    dt_tensor_release(t);
    bad = 0;
    for (int64_t i = 0; i < n; i++)
      bad += mask[i] > 0.0f;
  }
  free(mask);
  *out = bad;
  return st;
}

/* After optimizer step `step` (not the run's last, which the evaluation
 * and the samples at the end cover): the evaluation on the first
 * --val-batches of the eval split every --val-every steps, a sample every
 * --sample-every. *seconds gets the time they took (not training time). */
static dt_status after_step(const dt_train_config *c, train_state *s, FILE *log, double *seconds) {
  int64_t step = run_steps(s);
  double t0 = now_seconds();
  *seconds = 0.0;
  if (step >= s->total_steps)
    return DT_OK;
  if (c->val_every > 0 && step % c->val_every == 0) {
    double loss = 0.0, metric = 0.0;
    DT_CHECK(evaluate_first(c, s, (int64_t)c->val_batches * c->eval_batch, &loss, &metric));
    dt_train_eval ev = {0, s->task->eval_split, NAN, loss, metric, -1};
    DT_CHECK(count_bad_images(c, s, &ev.bad_images));
    if (s->hooks->eval_end)
      DT_CHECK(s->hooks->eval_end(s->hooks->user, &ev));
    char name[64];
    snprintf(name, sizeof name, "%s_loss", s->task->eval_split);
    if (s->task->metric)
      log_line(log, c, "step %lld %s=%.4f %s_%s=%.4f\n", (long long)step, name, loss,
               s->task->eval_split, s->task->metric_name, metric);
    else
      log_line(log, c, "step %lld %s=%.4f\n", (long long)step, name, loss);
  }
  if (c->sample.every > 0 && step % c->sample.every == 0)
    DT_CHECK(dt_train_log_sample(log, c, s->task, s->model, s->dev, (long long)step));
  *seconds = now_seconds() - t0;
  return DT_OK;
}

/* Whether any rank's should_stop asks for a stop (one all-reduce under
 * DDP; every rank has the hook or none does). The stop code is this rank's
 * own answer; a rank that was not asked (a signal that reached its peers
 * first) takes its askers' code when they agree on one, else -1. */
static dt_status agree_stop(train_state *s) {
  if (!s->hooks->should_stop)
    return DT_OK;
  int code = s->hooks->should_stop(s->hooks->user);
  double v[2] = {code != 0, code};
  DT_CHECK(dt_train_sum_over_ranks(s->comm, s->dev, v, 2));
  if (v[0] > 0) {
    s->stopped = true;
    long askers = lround(v[0]), sum = lround(v[1]);
    s->stop_code = code != 0 ? code : sum % askers == 0 && sum != 0 ? (int)(sum / askers) : -1;
  }
  return DT_OK;
}

/* A progress record after `batch` micro-batches of the epoch: the hooks'
 * answer, else every log_interval micro-batches. */
static bool interval_due(const dt_train_config *c, const train_state *s, int64_t batch) {
  if (s->hooks->interval_due)
    return s->hooks->interval_due(s->hooks->user, batch);
  return c->log_interval > 0 && batch % c->log_interval == 0;
}

/* Where an accumulation group began: what its redo after an out-of-memory
 * error (`max_memory`) goes back to. A progress record inside the group
 * has been shown, but its sums are taken back too: the redo records them
 * again, and the epoch's mean counts every micro-batch once. */
typedef struct oom_mark {
  int64_t batch;       /* the group's first micro-batch in the epoch */
  dt_tensor *loss_sum; /* a reference to the loss sum then (NULL = none) */
  double host_loss_sum, epoch_loss;
  int64_t done_batches, interval_batches, interval_samples;
} oom_mark;

/* The sums and counts of train_epoch that a redo goes back on. */
typedef struct epoch_sums {
  dt_tensor **loss_sum;
  double *host_loss_sum, *epoch_loss;
  int64_t *done_batches, *interval_batches, *interval_samples;
} epoch_sums;

static void oom_mark_clear(oom_mark *m) {
  dt_tensor_release(m->loss_sum);
  m->loss_sum = NULL;
}

static void oom_mark_set(oom_mark *m, int64_t batch, const epoch_sums *e) {
  oom_mark_clear(m);
  dt_tensor *sum = *e->loss_sum;
  *m = (oom_mark){batch,
                  sum ? dt_tensor_retain(sum) : NULL,
                  *e->host_loss_sum,
                  *e->epoch_loss,
                  *e->done_batches,
                  *e->interval_batches,
                  *e->interval_samples};
}

/* Back to the mark: the abandoned micro-batches' losses and counts go. */
static void oom_mark_restore(oom_mark *m, const epoch_sums *e) {
  dt_tensor_release(*e->loss_sum);
  *e->loss_sum = m->loss_sum;
  m->loss_sum = NULL;
  *e->host_loss_sum = m->host_loss_sum;
  *e->epoch_loss = m->epoch_loss;
  *e->done_batches = m->done_batches;
  *e->interval_batches = m->interval_batches;
  *e->interval_samples = m->interval_samples;
}

/* The ranks agreed on an out-of-memory error in the group at `m`: the
 * step is redone in smaller pieces (train/train_oom.c), logged and told to
 * the hooks. */
static dt_status recover(const dt_train_config *c, train_state *s, FILE *log, int epoch,
                         const oom_mark *m) {
  dt_train_oom ev;
  DT_CHECK(dt_train_oom_recover(c, s, epoch, m->batch, run_steps(s), &ev));
  log_line(log, c,
           "out of memory in optimizer step %lld (%s): redoing the step with micro-batch %d "
           "and accum %d (the same global batch and data order)\n",
           (long long)ev.step + 1, ev.error, ev.micro_batch, ev.accum);
  return s->hooks->oom ? s->hooks->oom(s->hooks->user, &ev) : DT_OK;
}

/* One epoch over the training set (this rank's shard), or its first
 * `batches` micro-batches when the run's last optimizer step comes first;
 * *mean_loss = mean micro-batch loss over all ranks. samples/s in the
 * progress lines counts every rank's samples (world x this rank's). */
static dt_status train_epoch(const dt_train_config *c, train_state *s, int epoch, int64_t first,
                             int64_t batches, FILE *log, double *mean_loss) {
  dt_status st = DT_OK;
  dt_tensor *x = NULL, *y = NULL, *loss_sum = NULL;
  double host_loss_sum = 0.0;
  double epoch_loss = 0.0, interval_start = now_seconds();
  int64_t interval_batches = 0, interval_samples = 0, done_batches = 0;
  int group = 1;
  oom_mark mark = {0};
  epoch_sums sums = {&loss_sum,     &host_loss_sum,    &epoch_loss,
                     &done_batches, &interval_batches, &interval_samples};
  bool oom = false; /* this rank ran out of memory in the group (max_memory) */

  DT_CHECK(dt_loader_start_epoch_at(s->loader, epoch - 1, first));
  if (s->hooks->epoch_begin)
    s->hooks->epoch_begin(s->hooks->user, epoch, batches);
  for (int64_t b = first; b < batches && !s->stopped; b++) {
    DT_CHECK_GOTO(dt_loader_next(s->loader, &x, &y), st, fail);
    if (x == NULL)
      break;
    int64_t pos = b % c->accum;
    if (pos == 0) {
      int64_t left = batches - b;
      group = (int)(left < c->accum ? left : c->accum);
      if (c->max_memory_mib > 0)
        oom_mark_set(&mark, b, &sums);
      if (s->hooks->step_begin)
        s->hooks->step_begin(s->hooks->user, b, group);
    }
    bool sync = (pos == group - 1);
    int64_t samples = dt_tensor_dim(x, 0);
    interval_samples += samples;
    /* After this rank's out-of-memory error the group's other micro-batches
     * are skipped, but for DDP's last one (its buckets' peers wait). */
    if (!oom || (sync && s->comm)) {
      st = micro_batch(c, s, x, y, group, sync, &loss_sum, &host_loss_sum);
      oom = oom || dt_train_oom_caught(c, s, st);
      if (st != DT_OK && !oom)
        goto fail;
      st = DT_OK;
    }
    if (s->first_loss == 0.0 && epoch == 1 && b == 0 && !oom) { /* one sync in the run */
      double first = host_loss_sum;
      if (loss_sum)
        DT_CHECK_GOTO(dt_tensor_item(loss_sum, 0, &first), st, fail);
      s->first_loss = isfinite(first) && first > 0 ? first : -1.0;
    }
    dt_tensor_release(x);
    dt_tensor_release(y);
    x = y = NULL;
    if (sync) {
      DT_CHECK_GOTO(dt_train_oom_agree(c, s, &oom), st, fail);
      if (oom) { /* the step again from its start, in smaller pieces */
        DT_CHECK_GOTO(recover(c, s, log, epoch, &mark), st, fail);
        oom_mark_restore(&mark, &sums);
        b = mark.batch - 1;
        oom = false;
        DT_CHECK_GOTO(dt_loader_start_epoch_at(s->loader, epoch - 1, mark.batch), st, fail);
        continue;
      }
      oom_mark_clear(&mark);
      DT_CHECK_GOTO(optimizer_step(s), st, fail);
      s->pos = (dt_train_position){run_steps(s), epoch - 1, b + 1, s->first_loss, s->split};
      DT_CHECK_GOTO(dt_train_oom_cap(c, s, run_steps(s)), st, fail);
      DT_CHECK_GOTO(agree_stop(s), st, fail);
      DT_CHECK_GOTO(dt_train_ckpt_after_step(s->ck, &s->pos, s->stopped), st, fail);
      double aside = 0.0;
      DT_CHECK_GOTO(after_step(c, s, log, &aside), st, fail);
      interval_start += aside;
    }
    done_batches++;
    interval_batches++;
    if (s->hooks->micro_batch_end)
      s->hooks->micro_batch_end(s->hooks->user, b + 1, samples);

    bool last = (b + 1 == batches) || s->stopped;
    bool log_now = interval_due(c, s, b + 1) && !oom; /* not of a group to be redone */
    if (log_now || last) {
      double sum;
      DT_CHECK_GOTO(take_loss_sum(&loss_sum, &host_loss_sum, &sum), st, fail);
      epoch_loss += sum;
      DT_CHECK_GOTO(check_diverged(s, sum / (double)interval_batches, epoch, b + 1), st, fail);
      if (log_now) {
        double t = now_seconds();
        DT_CHECK_GOTO(
            log_progress(s, epoch, b + 1, batches, sum / (double)interval_batches,
                         (double)s->world * (double)interval_samples / (t - interval_start)),
            st, fail);
        interval_start = t;
      }
      interval_batches = interval_samples = 0;
    }
  }
  if (oom) { /* the loader ended inside the group: no step to redo it in */
    st = DT_ERROR(DT_ERR_OOM, "%s (the data loader ended inside the step)", s->oom_error);
    goto fail;
  }
  /* A loader that ended early (fewer batches than announced) leaves a
   * partial accumulation group: finish it and step on it too. */
  if (done_batches > 0 && done_batches % c->accum != 0 && done_batches < batches - first &&
      !s->stopped) {
    if (s->ddp || s->dp) {
      /* Its gradients were never reduced; every rank's loader announces
       * the same count, so this means the data changed under us. */
      st = DT_ERROR(DT_ERR_STATE,
                    "the data loader ended after %lld of %lld micro-batches inside an "
                    "accumulation group: the ranks would disagree; check the data set files",
                    (long long)done_batches, (long long)batches);
      goto fail;
    }
    DT_CHECK_GOTO(optimizer_step(s), st, fail);
  }
  double sum;
  DT_CHECK_GOTO(take_loss_sum(&loss_sum, &host_loss_sum, &sum), st, fail);
  epoch_loss += sum;
  double totals[2] = {epoch_loss, (double)done_batches};
  DT_CHECK_GOTO(dt_train_sum_over_ranks(s->comm, s->dev, totals, 2), st, fail);
  *mean_loss = totals[1] > 0 ? totals[0] / totals[1] : 0.0;
  return DT_OK;
fail:
  dt_tensor_release(x);
  dt_tensor_release(y);
  dt_tensor_release(loss_sum);
  oom_mark_clear(&mark);
  return st;
}

/* Test loss and metric over the first `first` samples of the test (or
 * validation) set, 0 = all of it: each rank its shard. */
static dt_status evaluate_first(const dt_train_config *c, train_state *s, int64_t first,
                                double *loss, double *metric) {
  if (s->hooks->eval_begin)
    s->hooks->eval_begin(s->hooks->user);
  /* Every rank evaluates with rank 0's buffers (BatchNorm's running
   * statistics), which its checkpoints hold: each rank's last forward moved
   * its own since DDP's broadcast at that forward's start. */
  if (s->ddp)
    DT_CHECK(dt_ddp_broadcast_buffers(s->ddp));
  double sums[3] = {0, 0, 0};
  int64_t count = 0;
  DT_CHECK(dt_train_evaluate_first(s->task, s->model, s->test_set, first, c->eval_batch, c->workers,
                                   s->dev, s->rank, s->world, &sums[0], &sums[1], &count));
  sums[2] = (double)count;
  DT_CHECK(dt_train_sum_over_ranks(s->comm, s->dev, sums, 3));
  *loss = sums[2] > 0 ? sums[0] / sums[2] : 0.0;
  *metric = sums[2] > 0 ? sums[1] / sums[2] : 0.0;
  return DT_OK;
}

static dt_status evaluate(const dt_train_config *c, train_state *s, double *loss, double *metric) {
  return evaluate_first(c, s, 0, loss, metric);
}

static void log_header(FILE *log, const dt_train_config *c, train_state *s) {
  char dev[32], devs[DT_TRAIN_MAX_DEVICES * 12];
  dt_device_format(s->dev, dev, sizeof dev);
  dt_train_devices_text(c->devices, s->dp ? c->n_devices : 0, devs, sizeof devs);
  log_line(log, c,
           "dtrain train: model %s (%lld parameters) data %s (%lld train, %lld test) device %s "
           "threads %d%s\n",
           s->task->name, (long long)dt_module_parameter_count(s->model), s->data->name,
           (long long)dt_dataset_length(s->train_set), (long long)dt_dataset_length(s->test_set),
           s->dp ? devs : dev, dt_cpu_num_threads(), c->threads_note ? c->threads_note : "");
  const char *compress = dt_ddp_grad_compress_name(c->grad_compress);
  if (s->dp) {
    log_line(log, c,
             "dtrain train: mode dp: %d replicas (one thread each), batch %d split across them "
             "(global batch %d), zero %d, grad-compress %s\n",
             s->n_replicas, c->batch, c->batch, c->zero, compress);
  } else if (s->world > 1) {
    char who[256];
    log_line(log, c,
             "dtrain train: ddp world %d (%s): per-rank batch %d, global batch %d; buckets %d "
             "(first %g MiB, then %g MiB) over %s, comm timeout %g s, zero %d, grad-compress %s\n",
             s->world, dt_pg_describe(c->pg, who, sizeof who), c->batch, s->world * c->batch,
             dt_ddp_num_buckets(s->ddp), c->first_bucket_mb, c->bucket_cap_mb,
             dt_train_comm_description(s), c->comm_timeout, c->zero, compress);
  }
  log_line(log, c,
           "dtrain train: epochs %d batch %d (global %d) accum %d optimizer %s lr %g schedule %s "
           "warmup %d seed %llu\n",
           c->epochs, c->batch, s->world * c->batch, c->accum,
           dt_train_optimizer_name(c->optimizer), c->lr, dt_train_schedule_name(c->schedule),
           c->warmup, (unsigned long long)c->seed);
}

/* The hooks' start: the run's facts (what the progress display, metrics,
 * trace and status file show). */
static dt_status hooks_start(const dt_train_config *c, train_state *s, FILE *log, FILE *console) {
  s->started = true;
  if (!s->hooks->start)
    return DT_OK;
  if (s->dp)
    dt_train_devices_text(c->devices, c->n_devices, s->device_text, sizeof s->device_text);
  else
    dt_device_format(s->dev, s->device_text, sizeof s->device_text);
  const dt_task *t = s->task;
  int64_t tokens = t->input_dtype == DT_DTYPE_I32 || t->input_dtype == DT_DTYPE_I64;
  for (int i = 0; tokens && i < t->input_ndim; i++)
    tokens *= t->input_shape[i]; /* token ids: tokens/s */
  dt_train_run_info run = {
      .model = t->name,
      .data = s->data->name,
      .device_name = s->device_text,
      .comm_name = s->comm ? dt_train_comm_description(s) : "none",
      .metric_name = t->metric ? t->metric_name : NULL,
      .dev = s->dev,
      .devices = s->dp ? c->devices : NULL,
      .n_devices = s->dp ? c->n_devices : 0,
      .comm = s->comm,
      .world = s->world,
      .batch = c->batch,
      .accum = c->accum,
      .epochs = c->epochs,
      .threads = dt_cpu_num_threads(),
      .total_steps = s->total_steps,
      .steps_per_epoch = s->steps_per_epoch,
      .tokens_per_sample = tokens,
      .stats = s->dp ? NULL : &s->stats,
      .steps_done = s->pos.step,
      .scaler = s->step.scaler,
      .rank = s->rank,
      .log = log,
      .console = console,
      .log_file = dt_train_ckpt_log_file(s->ck),
      .run_dir = dt_train_ckpt_run_dir(s->ck),
      .log_prefix = c->log_prefix ? c->log_prefix : "",
      .log_interval = c->log_interval,
      .resumed = s->pos.step > 0,
  };
  return s->hooks->start(s->hooks->user, &run);
}

/* Names this rank's phase for the deadlines' messages (dist/process_group.h). */
static void set_phase(const dt_train_config *c, const char *fmt, int epoch) {
  char text[96];
  snprintf(text, sizeof text, fmt, epoch);
  dt_pg_set_phase(c->pg, text);
}

dt_status dt_train_run(const dt_train_config *given, FILE *log, dt_train_result *out) {
  dt_status st;
  train_state s;
  dt_train_result r;
  memset(&s, 0, sizeof s);
  memset(&r, 0, sizeof r);
  double start = now_seconds();

  DT_CHECK(dt_train_config_validate(given));
  dt_train_config resolved = *given; /* batch auto: the micro-batch and accumulation */
  const dt_train_config *cfg = &resolved;
  if (given->batch_auto) { /* under the run's cap */
    DT_CHECK(dt_train_oom_cap_before_start(given));
    DT_CHECK(dt_train_resolve_batch_auto(&resolved, log));
  }
  set_phase(cfg, "the start of the run", 0);
  DT_CHECK_GOTO(dt_train_state_create(cfg, &s), st, done);
  FILE *console = log; /* before train.log joins it */
  DT_CHECK_GOTO(dt_train_state_open_checkpoints(cfg, &s, &log), st, done);
  s.split = s.pos.split > 1 ? s.pos.split : 1; /* a resumed run's pieces */
  if (s.split > 1 && !cfg->quiet) {
    int64_t piece = dt_train_piece_size(cfg, &s);
    log_line(log, cfg,
             "dtrain train: micro-batch %lld and accum %lld, as the checkpoint's run had after "
             "running out of memory\n",
             (long long)piece, (long long)(cfg->accum * ((cfg->batch + piece - 1) / piece)));
  }
  DT_CHECK_GOTO(dt_train_oom_cap(cfg, &s, run_steps(&s)), st, done);
  if (!cfg->quiet) {
    log_header(log, cfg, &s);
    dt_train_log_flops(log, cfg->log_prefix ? cfg->log_prefix : "", s.task, s.dev, s.precision,
                       &s.mfu);
  }
  DT_CHECK_GOTO(hooks_start(cfg, &s, log, console), st, done);

  const char *split = s.task->eval_split;
  for (int epoch = (int)s.pos.epoch + 1;
       epoch <= cfg->epochs && run_steps(&s) < s.total_steps && !s.stopped; epoch++) {
    double t0 = now_seconds();
    /* A resumed run starts inside its epoch; the run's last optimizer step
     * may come before the epoch's end. */
    int64_t first = epoch == s.pos.epoch + 1 ? s.pos.batch : 0;
    int64_t steps_left = s.total_steps - run_steps(&s);
    int64_t batches = s.batches_per_epoch;
    if (steps_left < (s.batches_per_epoch - first + cfg->accum - 1) / cfg->accum)
      batches = first + steps_left * cfg->accum;
    set_phase(cfg, "training (epoch %d)", epoch);
    DT_CHECK_GOTO(train_epoch(cfg, &s, epoch, first, batches, log, &r.train_loss), st, done);
    if (s.stopped)
      break;
    set_phase(cfg,
              epoch == cfg->epochs || run_steps(&s) >= s.total_steps
                  ? "the final evaluation (epoch %d)"
                  : "the evaluation after epoch %d",
              epoch);
    DT_CHECK_GOTO(evaluate(cfg, &s, &r.test_loss, &r.test_accuracy), st, done);
    /* The epoch's last optimizer step is seen by no training loss: a step
     * that made the parameters non-finite shows up here. */
    if (!isfinite(r.test_loss)) {
      st = DT_ERROR(DT_ERR_STATE,
                    "training diverged: the test loss is %g after epoch %d (the parameters are "
                    "no longer finite); lower `lr` or `weight_decay`, add `warmup` or set `clip`",
                    r.test_loss, epoch);
      goto done;
    }
    r.epochs = epoch;
    dt_train_eval ev = {epoch, split, r.train_loss, r.test_loss, r.test_accuracy, -1};
    DT_CHECK_GOTO(count_bad_images(cfg, &s, &ev.bad_images), st, done);
    if (s.hooks->eval_end)
      DT_CHECK_GOTO(s.hooks->eval_end(s.hooks->user, &ev), st, done);
    char metric[96] = "";
    if (s.task->metric)
      snprintf(metric, sizeof metric, " %s_%s=%.4f", split, s.task->metric_name, r.test_accuracy);
    if (ev.bad_images >= 0)
      snprintf(metric + strlen(metric), sizeof metric - strlen(metric), " bad_images=%lld",
               (long long)ev.bad_images);
    log_line(log, cfg, "epoch %d train_loss=%.4f %s_loss=%.4f%s time=%.1fs\n", epoch, r.train_loss,
             split, r.test_loss, metric, now_seconds() - t0);
  }
  if (r.epochs == 0 && !s.stopped) { /* resumed from the run's last step */
    set_phase(cfg, "the final evaluation", 0);
    DT_CHECK_GOTO(evaluate(cfg, &s, &r.test_loss, &r.test_accuracy), st, done);
  }
  if (!s.stopped)
    DT_CHECK_GOTO(dt_train_log_sample(log, cfg, s.task, s.model, s.dev, 0), st, done);
  r.optimizer_steps = dt_optim_step_count(s.opt);
  r.schedule_steps = s.schedule.total_steps;
  r.final_lr = dt_optim_lr(s.opt);
  set_phase(cfg, "the last checkpoint", 0);
  DT_CHECK_GOTO(dt_train_ckpt_finish(s.ck, &s.pos), st, done);
  r.stop_code = s.stop_code;
  r.last_step = s.pos.step;
  snprintf(r.last_checkpoint, sizeof r.last_checkpoint, "%s", dt_train_ckpt_last_saved(s.ck));
  r.seconds = now_seconds() - start;
  r.result = s.task->result == DT_TASK_RESULT_LOSS ? r.test_loss : r.test_accuracy;
  char name[64];
  if (!r.stop_code) /* a stopped run's last line is the caller's (it knows why it stopped) */
    log_line(log, cfg, "%s=%.4f\n", dt_train_result_name(s.task, name, sizeof name), r.result);
  if (out)
    *out = r;
  set_phase(cfg, "the end of the run", 0);
done:;
  if (st != DT_OK) /* peers may be dead or stuck: do not wait for them (ncclCommAbort) */
    dt_comm_abort(s.comm, "the training run failed");
  dt_train_run_lock *lock = dt_train_ckpt_take_lock(s.ck); /* to the hooks' last write */
  dt_train_ckpt_close(s.ck, &log);
  bool started = s.started;
  dt_train_state_destroy(&s); /* the loader's thread stops before the hooks' files close */
  if (started && cfg->hooks.finish)
    st = cfg->hooks.finish(cfg->hooks.user, st);
  dt_train_run_lock_release(lock);
  return st;
}
