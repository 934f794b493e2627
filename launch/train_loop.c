#include "launch/train_loop.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "core/autograd.h"
#include "core/backend.h"
#include "core/memory.h"
#include "core/ops.h"
#include "core/optim.h"
#include "models/models.h"

#define IGNORE_INDEX (-100)

dt_train_config dt_train_config_default(void) {
  dt_train_config c;
  memset(&c, 0, sizeof c);
  c.model = "lenet";
  c.data = "fashion-mnist";
  c.data_dir = "data";
  c.device = "cpu";
  c.optimizer = "sgd";
  c.schedule = "cosine";
  c.epochs = 1;
  c.batch = 64;
  c.lr = 0.05f;
  c.momentum = 0.9f;
  c.weight_decay = 0.0f;
  c.nesterov = 0;
  c.warmup = 0;
  c.step_size = 0;
  c.gamma = 0.1f;
  c.min_lr = 0.0f;
  c.accum = 1;
  c.clip = 0.0f;
  c.seed = 0;
  c.threads = 0;
  c.log_interval = 100;
  c.max_steps = 0;
  c.eval_batch = 1000;
  return c;
}

static double now_seconds(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static double mib(size_t bytes) { return (double)bytes / (1024.0 * 1024.0); }

/* Everything one run owns, released in reverse order by state_destroy. */
typedef struct train_state {
  dt_device dev;
  dt_dataset *train_set;
  dt_dataset *test_set;
  dt_sampler *sampler;
  dt_loader *loader;
  dt_module *model;
  dt_param_arena *arena;
  dt_optimizer *opt;
  dt_lr_schedule schedule;
  int64_t batches_per_epoch; /* micro-batches run per epoch */
  int64_t steps_per_epoch;   /* optimizer steps per epoch */
} train_state;

static void state_destroy(train_state *s) {
  dt_optim_destroy(s->opt);
  dt_param_arena_destroy(s->arena);
  dt_module_destroy(s->model);
  dt_loader_destroy(s->loader);
  dt_sampler_destroy(s->sampler);
  dt_dataset_destroy(s->test_set);
  dt_dataset_destroy(s->train_set);
  memset(s, 0, sizeof *s);
}

static dt_status check_config(const dt_train_config *c) {
  if (!c->model || !c->data || !c->data_dir || !c->device || !c->optimizer || !c->schedule)
    return DT_ERROR(DT_ERR_INVALID_ARG,
                    "model, data, data_dir, device, optimizer and schedule "
                    "must all be set (start from dt_train_config_default())");
  if (c->epochs < 1 || c->batch < 1 || c->accum < 1 || c->eval_batch < 1)
    return DT_ERROR(DT_ERR_INVALID_ARG,
                    "epochs (%d), batch (%d), accum (%d) and eval_batch (%d) must be >= 1",
                    c->epochs, c->batch, c->accum, c->eval_batch);
  if (c->warmup < 0 || c->step_size < 0 || c->log_interval < 0 || c->max_steps < 0 ||
      c->threads < 0)
    return DT_ERROR(DT_ERR_INVALID_ARG,
                    "warmup, step_size, log_interval, max_steps and threads "
                    "must be >= 0");
  if (!(c->lr >= 0) || !(c->clip >= 0) || !(c->weight_decay >= 0))
    return DT_ERROR(DT_ERR_INVALID_ARG, "lr (%g), clip (%g) and weight_decay (%g) must be >= 0",
                    c->lr, c->clip, c->weight_decay);
  if (strcmp(c->optimizer, "sgd") && strcmp(c->optimizer, "adamw"))
    return DT_ERROR(DT_ERR_INVALID_ARG, "unknown optimizer '%s': expected sgd or adamw",
                    c->optimizer);
  if (strcmp(c->schedule, "constant") && strcmp(c->schedule, "cosine") &&
      strcmp(c->schedule, "step"))
    return DT_ERROR(DT_ERR_INVALID_ARG, "unknown schedule '%s': expected constant, cosine or step",
                    c->schedule);
  return DT_OK;
}

/* data_dir/data must be a folder; say where we looked and how to fix it. */
static dt_status data_folder(const dt_train_config *c, char *path, size_t cap) {
  size_t n = strlen(c->data_dir);
  const char *sep = (n > 0 && c->data_dir[n - 1] == '/') ? "" : "/";
  if ((size_t)snprintf(path, cap, "%s%s%s", c->data_dir, sep, c->data) >= cap)
    return DT_ERROR(DT_ERR_INVALID_ARG, "data path too long: %s%s%s", c->data_dir, sep, c->data);
  struct stat st;
  if (stat(path, &st) != 0 || !S_ISDIR(st.st_mode))
    return DT_ERROR(DT_ERR_IO,
                    "data set folder %s not found (data dir '%s', data set '%s'): run "
                    "tools/setup.sh to fetch the data sets, or point --data-dir (or DT_DATA_DIR) "
                    "at a folder that holds %s/",
                    path, c->data_dir, c->data, c->data);
  return DT_OK;
}

static dt_status build_optimizer(const dt_train_config *c, train_state *s) {
  if (!strcmp(c->optimizer, "sgd")) {
    dt_sgd_config sgd = DT_SGD_CONFIG_DEFAULT;
    sgd.lr = c->lr;
    sgd.momentum = c->momentum;
    sgd.weight_decay = c->weight_decay;
    sgd.nesterov = c->nesterov;
    return dt_optim_sgd_create(s->arena, &sgd, &s->opt);
  }
  dt_adamw_config adamw = DT_ADAMW_CONFIG_DEFAULT;
  adamw.lr = c->lr;
  adamw.weight_decay = c->weight_decay;
  return dt_optim_adamw_create(s->arena, &adamw, &s->opt);
}

static dt_status state_create(const dt_train_config *c, train_state *s) {
  const dt_backend_ops *backend = NULL;
  char folder[4096];
  memset(s, 0, sizeof *s);

  /* Cheap checks first: the device, then the data folder. */
  DT_CHECK(dt_device_parse(c->device, &s->dev));
  DT_CHECK(dt_backend_get(s->dev, &backend));
  if (c->threads > 0)
    dt_cpu_set_num_threads(c->threads);
  DT_CHECK(data_folder(c, folder, sizeof folder));

  DT_CHECK(dt_dataset_mnist_like(folder, "train", &s->train_set));
  DT_CHECK(dt_dataset_mnist_like(folder, "test", &s->test_set));

  dt_sampler_config sc = DT_SAMPLER_CONFIG_DEFAULT;
  sc.shuffle = 1;
  sc.seed = c->seed;
  DT_CHECK(dt_sampler_create(dt_dataset_length(s->train_set), &sc, &s->sampler));
  dt_loader_config lc = DT_LOADER_CONFIG_DEFAULT;
  lc.batch_size = c->batch;
  lc.drop_last = 0;
  lc.device = s->dev;
  DT_CHECK(dt_loader_create(s->train_set, s->sampler, &lc, &s->loader));

  DT_CHECK(dt_model_create(c->model, c->seed, &s->model));
  DT_CHECK(dt_module_to(s->model, s->dev));
  dt_module_train(s->model, 1);
  DT_CHECK(dt_param_arena_create(s->model, &s->arena));
  DT_CHECK(build_optimizer(c, s));

  s->batches_per_epoch = dt_loader_num_batches(s->loader);
  if (c->max_steps > 0 && c->max_steps < s->batches_per_epoch)
    s->batches_per_epoch = c->max_steps;
  s->steps_per_epoch = (s->batches_per_epoch + c->accum - 1) / c->accum;

  dt_lr_schedule *ls = &s->schedule;
  *ls = DT_LR_SCHEDULE_DEFAULT;
  ls->base_lr = c->lr;
  ls->warmup_steps = c->warmup;
  ls->total_steps = (int64_t)c->epochs * s->steps_per_epoch;
  ls->min_lr = c->min_lr;
  ls->step_size = c->step_size > 0 ? c->step_size : s->steps_per_epoch;
  ls->gamma = c->gamma;
  ls->decay = !strcmp(c->schedule, "cosine") ? DT_LR_DECAY_COSINE
              : !strcmp(c->schedule, "step") ? DT_LR_DECAY_STEP
                                             : DT_LR_DECAY_CONSTANT;
  return DT_OK;
}

/* Adds `loss` (a scalar) into *sum on the device, without grad and without
 * waiting for the device. */
static dt_status accumulate_loss(dt_tensor *loss, dt_tensor **sum) {
  dt_status st = DT_OK;
  dt_no_grad_begin();
  if (*sum == NULL) {
    st = dt_tensor_detach(loss, sum);
  } else {
    dt_tensor *next = NULL;
    st = dt_op_add(*sum, loss, &next);
    if (st == DT_OK) {
      dt_tensor_release(*sum);
      *sum = next;
    }
  }
  dt_no_grad_end();
  return st;
}

/* Reads and clears the device-side loss sum. */
static dt_status take_loss_sum(dt_tensor **sum, double *out) {
  *out = 0.0;
  if (*sum == NULL)
    return DT_OK;
  dt_status st = dt_tensor_item(*sum, 0, out);
  dt_tensor_release(*sum);
  *sum = NULL;
  return st;
}

static dt_status check_finite(double mean_loss, int epoch, int64_t batch) {
  if (isfinite(mean_loss))
    return DT_OK;
  return DT_ERROR(DT_ERR_STATE,
                  "training diverged: loss is %g at epoch %d step %lld; lower --lr, add "
                  "--warmup or set --clip",
                  mean_loss, epoch, (long long)batch);
}

/* One micro-batch: forward, loss (scaled by 1/group), backward. */
static dt_status train_micro_batch(train_state *s, dt_tensor *x, dt_tensor *y, int group,
                                   dt_tensor **loss_sum) {
  dt_status st;
  dt_tensor *logits = NULL, *loss = NULL, *scaled = NULL;
  DT_CHECK_GOTO(dt_module_call(s->model, x, &logits), done);
  DT_CHECK_GOTO(dt_op_cross_entropy(logits, y, DT_REDUCTION_MEAN, IGNORE_INDEX, &loss), done);
  if (group > 1) {
    DT_CHECK_GOTO(dt_op_scale(loss, 1.0f / (float)group, &scaled), done);
    DT_CHECK_GOTO(dt_backward(scaled, NULL), done);
  } else {
    DT_CHECK_GOTO(dt_backward(loss, NULL), done);
  }
  DT_CHECK_GOTO(accumulate_loss(loss, loss_sum), done);
done:
  dt_tensor_release(scaled);
  dt_tensor_release(loss);
  dt_tensor_release(logits);
  return st;
}

static dt_status optimizer_step(const dt_train_config *c, train_state *s) {
  if (c->clip > 0)
    DT_CHECK(dt_clip_grad_norm(s->arena, c->clip, NULL));
  dt_optim_set_lr(s->opt, dt_lr_at(&s->schedule, dt_optim_step_count(s->opt)));
  DT_CHECK(dt_optim_step(s->opt));
  return dt_optim_zero_grad(s->opt);
}

static void log_progress(FILE *log, train_state *s, int epoch, int64_t b, double loss,
                         double samples_per_s) {
  dt_memory_stats ms;
  memset(&ms, 0, sizeof ms);
  if (dt_memory_stats_get(s->dev, &ms) != DT_OK)
    memset(&ms, 0, sizeof ms);
  fprintf(log,
          "epoch %d step %lld/%lld loss %.4f lr %.4g samples/s %.0f mem %.1f MiB (peak %.1f "
          "MiB)\n",
          epoch, (long long)b, (long long)s->batches_per_epoch, loss, dt_optim_lr(s->opt),
          samples_per_s, mib(ms.allocated), mib(ms.peak_allocated));
  fflush(log);
}

/* One epoch over the training set; *mean_loss = mean micro-batch loss. */
static dt_status train_epoch(const dt_train_config *c, train_state *s, int epoch, FILE *log,
                             double *mean_loss) {
  dt_status st = DT_OK;
  dt_tensor *x = NULL, *y = NULL, *loss_sum = NULL;
  double epoch_loss = 0.0, interval_start = now_seconds();
  int64_t interval_batches = 0, interval_samples = 0, done_batches = 0;
  int group = 1;

  DT_CHECK(dt_loader_start_epoch(s->loader, epoch - 1));
  for (int64_t b = 0; b < s->batches_per_epoch; b++) {
    DT_CHECK_GOTO(dt_loader_next(s->loader, &x, &y), fail);
    if (x == NULL)
      break;
    int64_t pos = b % c->accum;
    if (pos == 0) {
      int64_t left = s->batches_per_epoch - b;
      group = (int)(left < c->accum ? left : c->accum);
    }
    interval_samples += dt_tensor_dim(x, 0);
    DT_CHECK_GOTO(train_micro_batch(s, x, y, group, &loss_sum), fail);
    dt_tensor_release(x);
    dt_tensor_release(y);
    x = y = NULL;
    if (pos == group - 1)
      DT_CHECK_GOTO(optimizer_step(c, s), fail);
    done_batches++;
    interval_batches++;

    int last = (b + 1 == s->batches_per_epoch);
    int log_now = c->log_interval > 0 && log && (b + 1) % c->log_interval == 0;
    if (log_now || last) {
      double sum;
      DT_CHECK_GOTO(take_loss_sum(&loss_sum, &sum), fail);
      epoch_loss += sum;
      DT_CHECK_GOTO(check_finite(sum / (double)interval_batches, epoch, b + 1), fail);
      if (log_now) {
        double t = now_seconds();
        log_progress(log, s, epoch, b + 1, sum / (double)interval_batches,
                     (double)interval_samples / (t - interval_start));
        interval_start = t;
      }
      interval_batches = interval_samples = 0;
    }
  }
  /* A loader that ended early (fewer batches than announced) leaves a
   * partial accumulation group: step on it too. */
  if (done_batches > 0 && done_batches % c->accum != 0 && done_batches < s->batches_per_epoch)
    DT_CHECK_GOTO(optimizer_step(c, s), fail);
  if (loss_sum) {
    double sum;
    DT_CHECK_GOTO(take_loss_sum(&loss_sum, &sum), fail);
    epoch_loss += sum;
  }
  *mean_loss = done_batches > 0 ? epoch_loss / (double)done_batches : 0.0;
  return DT_OK;
fail:
  dt_tensor_release(x);
  dt_tensor_release(y);
  dt_tensor_release(loss_sum);
  return st;
}

/* Counts correct predictions of logits (B, C) against labels (B) i32. */
static dt_status count_correct(dt_tensor *logits, dt_tensor *labels, int64_t *correct) {
  dt_status st = DT_OK;
  dt_tensor *pred = NULL;
  int64_t n = dt_tensor_dim(labels, 0);
  int64_t *p = malloc((size_t)n * sizeof *p);
  int32_t *l = malloc((size_t)n * sizeof *l);
  if (!p || !l) {
    st = DT_ERROR(DT_ERR_OOM, "no host memory for %lld predictions", (long long)n);
    goto done;
  }
  DT_CHECK_GOTO(dt_op_argmax(logits, &pred), done);
  if (dt_tensor_dtype(labels) != DT_DTYPE_I32 || dt_tensor_dtype(pred) != DT_DTYPE_I64 ||
      dt_tensor_numel(pred) != n) {
    st = DT_ERROR(DT_ERR_DTYPE, "expected i32 labels (%s) and i64 predictions (%s) of %lld rows",
                  dt_dtype_name(dt_tensor_dtype(labels)), dt_dtype_name(dt_tensor_dtype(pred)),
                  (long long)n);
    goto done;
  }
  DT_CHECK_GOTO(dt_tensor_to_host(pred, p, (size_t)n * sizeof *p), done);
  DT_CHECK_GOTO(dt_tensor_to_host(labels, l, (size_t)n * sizeof *l), done);
  for (int64_t i = 0; i < n; i++)
    *correct += (p[i] == (int64_t)l[i]);
done:
  dt_tensor_release(pred);
  free(l);
  free(p);
  return st;
}

dt_status dt_train_evaluate(dt_module *model, const dt_dataset *data, int batch, dt_device dev,
                            double *loss, double *accuracy) {
  dt_status st = DT_OK;
  dt_sampler *sampler = NULL;
  dt_loader *loader = NULL;
  dt_tensor *x = NULL, *y = NULL, *logits = NULL, *batch_loss = NULL;
  double loss_sum = 0.0;
  int64_t seen = 0, correct = 0;
  int was_training = dt_module_is_training(model);

  dt_sampler_config sc = DT_SAMPLER_CONFIG_DEFAULT;
  sc.shuffle = 0;
  dt_loader_config lc = DT_LOADER_CONFIG_DEFAULT;
  lc.batch_size = batch;
  lc.device = dev;
  DT_CHECK(dt_sampler_create(dt_dataset_length(data), &sc, &sampler));
  DT_CHECK_GOTO(dt_loader_create(data, sampler, &lc, &loader), free_sampler);
  DT_CHECK_GOTO(dt_loader_start_epoch(loader, 0), free_loader);

  dt_module_train(model, 0);
  dt_no_grad_begin();
  for (;;) {
    DT_CHECK_GOTO(dt_loader_next(loader, &x, &y), free_batch);
    if (x == NULL)
      break;
    DT_CHECK_GOTO(dt_module_call(model, x, &logits), free_batch);
    DT_CHECK_GOTO(dt_op_cross_entropy(logits, y, DT_REDUCTION_SUM, IGNORE_INDEX, &batch_loss),
                  free_batch);
    double v;
    DT_CHECK_GOTO(dt_tensor_item(batch_loss, 0, &v), free_batch);
    loss_sum += v;
    DT_CHECK_GOTO(count_correct(logits, y, &correct), free_batch);
    seen += dt_tensor_dim(y, 0);
    dt_tensor_release(batch_loss);
    dt_tensor_release(logits);
    dt_tensor_release(x);
    dt_tensor_release(y);
    x = y = logits = batch_loss = NULL;
  }
  *loss = seen ? loss_sum / (double)seen : 0.0;
  *accuracy = seen ? (double)correct / (double)seen : 0.0;
free_batch:
  dt_tensor_release(batch_loss);
  dt_tensor_release(logits);
  dt_tensor_release(x);
  dt_tensor_release(y);
  dt_no_grad_end();
  dt_module_train(model, was_training);
free_loader:
  dt_loader_destroy(loader);
free_sampler:
  dt_sampler_destroy(sampler);
  return st;
}

static void log_header(FILE *log, const dt_train_config *c, train_state *s) {
  char dev[32];
  dt_device_format(s->dev, dev, sizeof dev);
  fprintf(log,
          "dtrain train: model %s (%lld parameters) data %s (%lld train, %lld test) device %s "
          "threads %d\n",
          c->model, (long long)dt_module_parameter_count(s->model), c->data,
          (long long)dt_dataset_length(s->train_set), (long long)dt_dataset_length(s->test_set),
          dev, dt_cpu_num_threads());
  fprintf(log,
          "dtrain train: epochs %d batch %d accum %d optimizer %s lr %g schedule %s warmup %d "
          "seed %llu\n",
          c->epochs, c->batch, c->accum, c->optimizer, c->lr, c->schedule, c->warmup,
          (unsigned long long)c->seed);
  fflush(log);
}

dt_status dt_train_run(const dt_train_config *cfg, FILE *log, dt_train_result *out) {
  dt_status st;
  train_state s;
  dt_train_result r;
  memset(&s, 0, sizeof s);
  memset(&r, 0, sizeof r);
  double start = now_seconds();

  DT_CHECK(check_config(cfg));
  DT_CHECK_GOTO(state_create(cfg, &s), done);
  if (log)
    log_header(log, cfg, &s);

  for (int epoch = 1; epoch <= cfg->epochs; epoch++) {
    double t0 = now_seconds();
    DT_CHECK_GOTO(train_epoch(cfg, &s, epoch, log, &r.train_loss), done);
    DT_CHECK_GOTO(dt_train_evaluate(s.model, s.test_set, cfg->eval_batch, s.dev, &r.test_loss,
                                    &r.test_accuracy),
                  done);
    r.epochs = epoch;
    if (log) {
      fprintf(log, "epoch %d train_loss=%.4f test_loss=%.4f test_accuracy=%.4f time=%.1fs\n", epoch,
              r.train_loss, r.test_loss, r.test_accuracy, now_seconds() - t0);
      fflush(log);
    }
  }
  r.optimizer_steps = dt_optim_step_count(s.opt);
  r.seconds = now_seconds() - start;
  if (log) {
    fprintf(log, "test_accuracy=%.4f\n", r.test_accuracy);
    fflush(log);
  }
  if (out)
    *out = r;
done:
  state_destroy(&s);
  return st;
}
