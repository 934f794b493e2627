#include "train/train_loop.h"

#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "core/autograd.h"
#include "core/backend.h"
#include "core/cpu.h"
#include "core/memory.h"
#include "core/ops.h"
#include "core/step.h"
#include "dist/dp.h"
#include "train/train_checkpoint.h"
#include "train/train_lm.h"

/* Everything one run owns, released in reverse order by state_destroy. */
typedef struct train_state {
  const dt_task *task; /* &task_ctx */
  dt_task task_ctx;    /* the table's, at the run's context (--ctx) */
  const dt_task_data *data;
  dt_device dev;
  dt_dataset *train_set;
  dt_dataset *test_set;
  dt_sampler *sampler;
  dt_loader *loader;
  dt_lr_schedule schedule;
  dt_step_config step;       /* the task's loss, clipping, the schedule */
  int64_t batches_per_epoch; /* micro-batches in a whole epoch */
  int64_t steps_per_epoch;   /* optimizer steps in a whole epoch */
  int64_t total_steps;       /* optimizer steps in the run */
  /* One replica (single process, DDP rank), or dp's replicas. */
  dt_replica *replica;
  dt_dp *dp;
  int n_replicas;
  /* Borrowed from the replica (dp: replica 0's). */
  dt_module *model;
  dt_optimizer *opt;
  dt_comm *comm; /* DDP (world > 1) */
  dt_ddp *ddp;
  int rank, world;
  double first_loss;     /* the run's first micro-batch loss (0 = not yet, -1 = none) */
  dt_train_ckpt *ck;     /* run directory and checkpoints, NULL = none */
  dt_train_position pos; /* after the last optimizer step (or the resumed one) */
  bool stopped;          /* a stop was requested (should_stop): saved, ending */
  int stop_code;         /* should_stop's answer (the largest over the ranks) */
  dt_step_stats stats;   /* the gradient norm for the metrics */
  dt_grad_scaler scaler; /* --precision fp16: the step's (step.scaler) */
  dt_precision precision; /* the run's (the device's default resolved): the MFU's peak */
  const dt_train_hooks *hooks; /* the configuration's */
  bool started;                /* hooks->start was called: finish is due */
  dt_mfu_cache mfu;            /* the CPU roof, measured once per run */
} train_state;

static double now_seconds(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static double mib(size_t bytes) { return (double)bytes / DT_MIB; }

/* The data side of the run: both splits, the sampler, the loader. */
static void data_destroy(train_state *s) {
  dt_loader_destroy(s->loader);
  dt_sampler_destroy(s->sampler);
  dt_dataset_destroy(s->test_set);
  dt_dataset_destroy(s->train_set);
}

static void state_destroy(train_state *s) {
  dt_dp_destroy(s->dp);
  dt_replica_destroy(s->replica);
  data_destroy(s);
  memset(s, 0, sizeof *s);
}

static bool is_dp_mode(const dt_train_config *c) { return c->mode == DT_TRAIN_MODE_DP; }

/* data_dir/data must be a folder; say where we looked and how to fix it. */
static dt_status data_folder(const dt_train_config *c, const char *data, char *path, size_t cap) {
  size_t n = strlen(c->data_dir);
  const char *sep = (n > 0 && c->data_dir[n - 1] == '/') ? "" : "/";
  if ((size_t)snprintf(path, cap, "%s%s%s", c->data_dir, sep, data) >= cap)
    return DT_ERROR(DT_ERR_INVALID_ARG, "data path too long: %s%s%s", c->data_dir, sep, data);
  struct stat st;
  if (stat(path, &st) == 0 && !S_ISDIR(st.st_mode))
    return DT_ERROR(DT_ERR_IO,
                    "data set folder %s is not a directory (data dir '%s', data set '%s')", path,
                    c->data_dir, data);
  if (stat(path, &st) != 0 && errno != ENOENT)
    return DT_ERROR(DT_ERR_IO, "data set folder %s: %s (data dir '%s', data set '%s')", path,
                    strerror(errno), c->data_dir, data);
  if (stat(path, &st) != 0)
    return DT_ERROR(DT_ERR_IO,
                    "data set folder %s not found (data dir '%s', data set '%s'): run "
                    "tools/setup.sh to fetch the data sets, or point `data_dir` (or DT_DATA_DIR) "
                    "at a folder that holds %s/",
                    path, c->data_dir, data, data);
  return DT_OK;
}

/* The communicator backend applies to the device: nccl with cpu tensors is
 * a mistake even in a single process, where no communicator is made. */
static dt_status check_comm_backend(const dt_train_config *c, dt_device dev) {
  char name[32];
  if (c->comm_backend == DT_COMM_BACKEND_NCCL && dev.type == DT_DEVICE_CPU)
    return DT_ERROR(DT_ERR_INVALID_ARG,
                    "communication backend nccl (`comm_backend` or DT_COMM_BACKEND) with device "
                    "%s: NCCL reduces GPU memory; train on cuda devices, or use auto or mpi",
                    dt_train_device_text(c->device, name, sizeof name));
  return DT_OK;
}

static dt_train_comm_options comm_options(const dt_train_config *c) {
  dt_train_comm_options co = {c->comm_backend, c->comm_timeout, c->first_bucket_mb,
                              c->bucket_cap_mb, c->allow_unused};
  co.zero_stage = c->zero;
  co.split_bucket_mb = c->split_bucket_mb;
  co.update_per_bucket = c->update_per_bucket;
  co.grad_compress = c->grad_compress;
  return co;
}

static dt_optimizer_spec optimizer_spec(const dt_train_config *c) {
  return (dt_optimizer_spec){c->optimizer, c->lr,    c->momentum,           c->weight_decay,
                             c->nesterov,  c->beta2, c->decay_matrices_only};
}

static const char *format_shape(const int64_t *shape, int ndim, char *buf, size_t cap) {
  size_t used = (size_t)snprintf(buf, cap, "(");
  for (int i = 0; i < ndim && used < cap; i++)
    used += (size_t)snprintf(buf + used, cap - used, "%s%lld", i ? ", " : "", (long long)shape[i]);
  if (used < cap)
    snprintf(buf + used, cap - used, ")");
  return buf;
}

/* "data train: 60000 samples, f32(1, 28, 28) -> i32(), fingerprint ..." for
 * the ranks to compare: the fingerprint hashes up to 256 evenly spaced
 * samples (inputs and targets), which tells other files of the same size
 * apart without reading the whole set. */
static dt_status describe_data(const char *split, const dt_dataset *d, char *buf, size_t cap) {
  const dt_sample_layout *l = dt_dataset_layout(d);
  int64_t n = dt_dataset_length(d), in_numel = 1, t_numel = 1;
  char in_shape[96], t_shape[96];
  format_shape(l->input_shape, l->input_ndim, in_shape, sizeof in_shape);
  format_shape(l->target_shape, l->target_ndim, t_shape, sizeof t_shape);
  for (int i = 0; i < l->input_ndim; i++)
    in_numel *= l->input_shape[i];
  for (int i = 0; i < l->target_ndim; i++)
    t_numel *= l->target_shape[i];
  size_t in_bytes = (size_t)in_numel * dt_dtype_size(l->input_dtype);
  size_t t_bytes = (size_t)t_numel * dt_dtype_size(l->target_dtype);
  unsigned char *sample = malloc(in_bytes + t_bytes);
  if (!sample)
    return DT_ERROR(DT_ERR_OOM, "describing the %s set: out of host memory", split);
  uint64_t h = 1469598103934665603ull;
  int64_t probes = n < 256 ? n : 256;
  dt_status st = DT_OK;
  for (int64_t k = 0; k < probes && st == DT_OK; k++) {
    st = dt_dataset_get_sample(d, k * n / probes, sample, sample + in_bytes);
    for (size_t i = 0; st == DT_OK && i < in_bytes + t_bytes; i++)
      h = (h ^ sample[i]) * 1099511628211ull;
  }
  free(sample);
  snprintf(buf, cap, "data %s: %lld samples, %s%s -> %s%s, fingerprint %016llx\n", split,
           (long long)n, dt_dtype_name(l->input_dtype), in_shape, dt_dtype_name(l->target_dtype),
           t_shape, (unsigned long long)h);
  return st;
}

/* What the ranks of a DDP job compare before the first step (into buf). */
static dt_status agreement_text(const dt_train_config *c, const train_state *s, char *buf,
                                size_t cap) {
  char train[256], test[256];
  DT_CHECK(describe_data("train", s->train_set, train, sizeof train));
  DT_CHECK(describe_data("test", s->test_set, test, sizeof test));
  /* The same data and flags give the same plan; this line also catches a
   * loader that would shard differently (uneven inputs are refused up front). */
  snprintf(buf, cap,
           "%s%s%splan: %lld micro-batches per epoch, %lld optimizer steps per epoch, %lld in "
           "all\n",
           c->agreed_config ? c->agreed_config : "", train, test, (long long)s->batches_per_epoch,
           (long long)s->steps_per_epoch, (long long)s->total_steps);
  return DT_OK;
}

/* One process (world 1) or one DDP rank: the replica, connected to the
 * other ranks. */
static dt_status build_replica(const dt_train_config *c, train_state *s) {
  dt_module *model = NULL;
  dt_optimizer_spec os = optimizer_spec(c);
  DT_CHECK(s->task->build(s->task, c->seed, &model));
  DT_CHECK(
      dt_replica_create(model, s->dev, 0, dt_train_optimizer_create, &os, &s->step, &s->replica));
  if (s->world > 1) {
    char agree[16384];
    DT_CHECK(agreement_text(c, s, agree, sizeof agree));
    dt_train_comm_options co = comm_options(c);
    co.agree_text = agree;
    DT_CHECK(dt_train_connect(s->replica, c->pg, &co));
  }
  s->model = dt_replica_model(s->replica);
  s->opt = dt_replica_optimizer(s->replica);
  s->comm = dt_replica_comm(s->replica);
  s->ddp = dt_replica_ddp(s->replica);
  return DT_OK;
}

typedef struct model_source {
  const dt_task *task;
  uint64_t seed;
} model_source;

/* Runs on the replica's thread (dist/dp.c has set its CPU thread count). */
static dt_status build_dp_model(void *user, int replica, dt_module **out) {
  (void)replica;
  const model_source *src = user;
  return src->task->build(src->task, src->seed, out);
}

/* Data-parallel mode: one replica per device of --devices (dist/dp.h). */
static dt_status build_dp(const dt_train_config *c, train_state *s) {
  const dt_device *devs = c->devices;
  int n = c->n_devices;
  dt_dp_config cfg = DT_DP_CONFIG_DEFAULT;
  /* Replicas run their kernels side by side: --threads each, or (0) this
   * thread's count (cores, or DT_NUM_THREADS) shared out by dist/dp.c. */
  cfg.threads_per_replica = c->threads;
  cfg.comm.timeout_s = c->comm_timeout;
  DT_CHECK(dt_comm_config_from_env(&cfg.comm));
  cfg.comm.backend = c->comm_backend;
  dt_train_comm_options co = comm_options(c);
  cfg.ddp = dt_train_ddp_config(&co);
  cfg.step = s->step;
  /* The builders only read their arguments, during the call. */
  model_source src = {s->task, c->seed};
  dt_optimizer_spec os = optimizer_spec(c);
  DT_CHECK(
      dt_dp_create(devs, n, build_dp_model, &src, dt_train_optimizer_create, &os, &cfg, &s->dp));
  s->n_replicas = n;
  dt_replica *first = dt_dp_replica(s->dp, 0);
  s->dev = dt_replica_device(first);
  s->model = dt_replica_model(first);
  s->opt = dt_replica_optimizer(first);
  return DT_OK;
}

/* "(1, 28, 28)" */

/* The data set must give what the task's model takes. */
static dt_status check_task_input(const dt_train_config *c, const train_state *s) {
  const dt_task *t = s->task;
  int ndim = dt_dataset_input_ndim(s->train_set);
  const int64_t *shape = dt_dataset_input_shape(s->train_set);
  bool same = ndim == t->input_ndim;
  for (int i = 0; same && i < ndim; i++)
    same = shape[i] == t->input_shape[i];
  char have[96], want[96];
  if (!same)
    return DT_ERROR(DT_ERR_SHAPE, "data set %s has samples of shape %s, but model %s takes %s",
                    s->data->name, format_shape(shape, ndim, have, sizeof have), t->name,
                    format_shape(t->input_shape, t->input_ndim, want, sizeof want));
  dt_dtype given = dt_dataset_layout(s->train_set)->input_dtype;
  if (t->input_dtype != given)
    return DT_ERROR(DT_ERR_UNSUPPORTED, "model %s takes %s inputs, but data set %s gives %s",
                    t->name, dt_dtype_name(t->input_dtype), s->data->name, dt_dtype_name(given));
  return DT_OK;
}

/* The run's length in optimizer steps and the LR schedule over it. */
static dt_status plan_steps(const dt_train_config *c, train_state *s) {
  s->batches_per_epoch = dt_loader_num_batches(s->loader);
  s->steps_per_epoch = (s->batches_per_epoch + c->accum - 1) / c->accum;
  s->total_steps = (int64_t)c->epochs * s->steps_per_epoch;
  if (c->max_steps > 0 && c->max_steps < s->total_steps)
    s->total_steps = c->max_steps;

  dt_lr_schedule *ls = &s->schedule;
  *ls = DT_LR_SCHEDULE_DEFAULT;
  ls->base_lr = c->lr;
  ls->warmup_steps = c->warmup;
  ls->total_steps = s->total_steps;
  ls->min_lr = c->min_lr;
  ls->step_size = c->step_size > 0 ? c->step_size : s->steps_per_epoch;
  ls->gamma = c->gamma;
  ls->decay = c->schedule;
  /* --min-lr above --lr, --gamma 0, a warm-up as long as the run: refused
   * here rather than trained on silently. */
  dt_status st = dt_lr_schedule_check(ls);
  if (st != DT_OK)
    return dt_error_wrap(st,
                         "`schedule` %s over %lld optimizer steps (`warmup` %d, `min_lr` %g, "
                         "`gamma` %g)",
                         dt_train_schedule_name(c->schedule), (long long)ls->total_steps, c->warmup, (double)c->min_lr,
                         (double)c->gamma);
  return DT_OK;
}

/* The task's data set from its folder, checked against the task's input;
 * this rank's shuffled shard; the background loader. */
static dt_status data_create(const dt_train_config *c, train_state *s) {
  char folder[4096];
  const char *where = NULL; /* no data_dir: a data set of the caller's own (in memory) */
  if (c->data_dir) {
    DT_CHECK(data_folder(c, s->data->name, folder, sizeof folder));
    where = folder;
  }

  DT_CHECK(s->data->open(s->task, s->data, where, "train", &s->train_set));
  DT_CHECK(s->data->open(s->task, s->data, where, s->task->eval_split, &s->test_set));
  DT_CHECK(check_task_input(c, s));

  dt_sampler_config sc = DT_SAMPLER_CONFIG_DEFAULT;
  sc.shuffle = 1;
  sc.seed = c->seed;
  sc.num_replicas = s->world; /* DistributedSampler: pads the last shard */
  sc.rank = s->rank;
  sc.drop_last = 0;
  DT_CHECK(dt_sampler_create(dt_dataset_length(s->train_set), &sc, &s->sampler));
  dt_loader_config lc = DT_LOADER_CONFIG_DEFAULT;
  lc.batch_size = c->batch;
  lc.drop_last = 0;
  /* dp over GPUs: batches stay in host memory and each replica copies its
   * slice to its own GPU (none of them gathers or scatters for the rest). */
  lc.device = is_dp_mode(c) && s->dev.type != DT_DEVICE_CPU ? DT_CPU : s->dev;
  DT_CHECK(dt_loader_create(s->train_set, s->sampler, &lc, &s->loader));

  return DT_OK;
}

static dt_status state_create(const dt_train_config *c, train_state *s) {
  const dt_backend_ops *backend = NULL;
  memset(s, 0, sizeof *s);
  s->hooks = &c->hooks;
  s->rank = c->pg ? dt_pg_rank(c->pg) : 0;
  s->world = c->pg ? dt_pg_world_size(c->pg) : 1;

  /* Cheap checks first: the device(s), the task, then the data folder. */
  if (is_dp_mode(c)) {
    s->dev = c->devices[0];
  } else {
    DT_CHECK(dt_train_rank_device(c->device, c->pg, &s->dev));
  }
  DT_CHECK(dt_backend_get(s->dev, &backend));
  DT_CHECK(check_comm_backend(c, s->dev));
  if (c->threads > 0)
    dt_cpu_set_num_threads(c->threads);
  s->task_ctx = *c->task;
  if (c->ctx > 0)
    DT_CHECK(dt_task_with_context(c->task, c->ctx, &s->task_ctx));
  s->task = &s->task_ctx;
  s->data = c->data ? c->data : &s->task->data[0];
  DT_CHECK(data_create(c, s));
  DT_CHECK(plan_steps(c, s));
  s->step = DT_STEP_CONFIG_DEFAULT;
  s->step.loss = s->task->loss;
  s->step.clip = c->clip;
  s->step.schedule = &s->schedule;
  s->step.stats = is_dp_mode(c) ? NULL : &s->stats; /* dp's replicas would race on it */
  DT_CHECK(dt_train_precision_setup(c->precision, c->debug_overflow_rank, c->debug_overflow_step,
                                    s->dev, s->rank, &s->step, &s->scaler));
  s->precision = dt_precision_resolve(c->precision, s->dev.type);
  DT_CHECK(dt_train_rounding_setup(c->stochastic_rounding, c->seed, &s->step));
  if (s->step.scaler && is_dp_mode(c))
    return DT_ERROR(DT_ERR_UNSUPPORTED,
                    "`precision` fp16 with `mode` dp: the replicas would share one GradScaler; "
                    "use DDP (one process per device) or `precision` bf16");
  return is_dp_mode(c) ? build_dp(c, s) : build_replica(c, s);
}

/* The run directory, and the resumed state in every replica. */
static dt_status checkpoint_open(const dt_train_config *c, train_state *s, FILE **log) {
  dt_train_ckpt_run run = {.cfg = c,
                           .comm = s->comm,
                           .dev = s->dev,
                           .rank = s->rank,
                           .world = s->world,
                           .train_samples = dt_dataset_length(s->train_set),
                           .batches_per_epoch = s->batches_per_epoch,
                           .schedule = &s->schedule,
                           .context = s->task->max_context > 0 ? s->task->input_shape[0] : 0,
                           .scaler = s->step.scaler};
  run.n_replicas = s->dp ? s->n_replicas : 1;
  for (int i = 0; i < run.n_replicas; i++) {
    dt_replica *r = s->dp ? dt_dp_replica(s->dp, i) : s->replica;
    run.models[i] = dt_replica_model(r);
    run.opts[i] = dt_replica_optimizer(r);
  }
  DT_CHECK(dt_train_ckpt_open(&run, log, &s->pos, &s->ck));
  if (s->pos.step > 0)
    s->first_loss = s->pos.first_loss;
  return DT_OK;
}

/* Sums vals[0..n) over the ranks (in f32: counts up to 2^24 are exact), on
 * the rank's device: an nccl communicator reduces GPU memory only. */
static dt_status allreduce_sums(train_state *s, double *vals, int n) {
  if (s->world <= 1)
    return DT_OK;
  float buf[8];
  int64_t shape = n;
  dt_tensor *t = NULL;
  for (int i = 0; i < n; i++)
    buf[i] = (float)vals[i];
  DT_CHECK(dt_tensor_from_host(buf, &shape, 1, DT_DTYPE_F32, s->dev, &t));
  dt_status st = dt_comm_allreduce_sync(s->comm, t, DT_REDUCE_SUM);
  if (st == DT_OK)
    st = dt_tensor_to_host(t, buf, (size_t)n * sizeof *buf);
  dt_tensor_release(t);
  DT_CHECK(st);
  for (int i = 0; i < n; i++)
    vals[i] = buf[i];
  return DT_OK;
}

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

/* One micro-batch through the training step, its loss scaled by
 * 1/group; sync ends the accumulation group (the gradients are reduced). */
static dt_status micro_batch(train_state *s, dt_tensor *x, dt_tensor *y, int group, bool sync,
                             dt_tensor **loss_sum, double *host_loss_sum) {
  float scale = 1.0f / (float)group;
  if (s->dp) {
    if (dt_tensor_dim(x, 0) < s->n_replicas)
      return DT_ERROR(DT_ERR_INVALID_ARG,
                      "`mode` dp: a micro-batch of %lld samples cannot be split across %d "
                      "replicas (the last batch of the epoch is smaller: use `max_steps` or a "
                      "`batch` that leaves a larger remainder)",
                      (long long)dt_tensor_dim(x, 0), s->n_replicas);
    double loss = 0.0;
    DT_CHECK(dt_dp_forward_backward(s->dp, x, y, scale, sync, &loss));
    *host_loss_sum += loss;
    return DT_OK;
  }
  dt_tensor *loss = NULL;
  DT_CHECK(dt_step_forward_backward(dt_replica_step(s->replica), x, y, scale, sync, &loss));
  return accumulate_loss(loss, loss_sum);
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
    dt_train_eval ev = {0, s->task->eval_split, NAN, loss, metric};
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
 * DDP; every rank has the hook or none does). This rank's answer is the
 * stop code, -1 where only another rank asked. */
static dt_status agree_stop(train_state *s) {
  if (!s->hooks->should_stop)
    return DT_OK;
  int code = s->hooks->should_stop(s->hooks->user);
  double any = code != 0;
  DT_CHECK(allreduce_sums(s, &any, 1));
  if (any > 0) {
    s->stopped = true;
    s->stop_code = code != 0 ? code : -1;
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
      if (s->hooks->step_begin)
        s->hooks->step_begin(s->hooks->user, b, group);
    }
    bool sync = (pos == group - 1);
    int64_t samples = dt_tensor_dim(x, 0);
    interval_samples += samples;
    DT_CHECK_GOTO(micro_batch(s, x, y, group, sync, &loss_sum, &host_loss_sum), st, fail);
    if (s->first_loss == 0.0 && epoch == 1 && b == 0) { /* one sync in the run */
      double first = host_loss_sum;
      if (loss_sum)
        DT_CHECK_GOTO(dt_tensor_item(loss_sum, 0, &first), st, fail);
      s->first_loss = isfinite(first) && first > 0 ? first : -1.0;
    }
    dt_tensor_release(x);
    dt_tensor_release(y);
    x = y = NULL;
    if (sync) {
      DT_CHECK_GOTO(optimizer_step(s), st, fail);
      s->pos = (dt_train_position){run_steps(s), epoch - 1, b + 1, s->first_loss};
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
    bool log_now = interval_due(c, s, b + 1);
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
  DT_CHECK_GOTO(allreduce_sums(s, totals, 2), st, fail);
  *mean_loss = totals[1] > 0 ? totals[0] / totals[1] : 0.0;
  return DT_OK;
fail:
  dt_tensor_release(x);
  dt_tensor_release(y);
  dt_tensor_release(loss_sum);
  return st;
}

/* Test loss and metric over the first `first` samples of the test (or
 * validation) set, 0 = all of it: each rank its shard. */
static dt_status evaluate_first(const dt_train_config *c, train_state *s, int64_t first,
                                double *loss, double *metric) {
  if (s->hooks->eval_begin)
    s->hooks->eval_begin(s->hooks->user);
  double sums[3] = {0, 0, 0};
  int64_t count = 0;
  DT_CHECK(dt_train_evaluate_first(s->task, s->model, s->test_set, first, c->eval_batch, s->dev,
                                   s->rank, s->world, &sums[0], &sums[1], &count));
  sums[2] = (double)count;
  DT_CHECK(allreduce_sums(s, sums, 3));
  *loss = sums[2] > 0 ? sums[0] / sums[2] : 0.0;
  *metric = sums[2] > 0 ? sums[1] / sums[2] : 0.0;
  return DT_OK;
}

static dt_status evaluate(const dt_train_config *c, train_state *s, double *loss, double *metric) {
  return evaluate_first(c, s, 0, loss, metric);
}

/* "nccl", "mpi", or "mpi (host-staged)" for device tensors over mpi. */
static const char *comm_description(const train_state *s) {
  const char *name = dt_comm_backend_name(s->comm);
  if (s->dev.type != DT_DEVICE_CPU && !dt_comm_is_nccl(s->comm))
    return "mpi (host-staged)";
  return name;
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
             dt_ddp_num_buckets(s->ddp), c->first_bucket_mb, c->bucket_cap_mb, comm_description(s),
             c->comm_timeout, c->zero, compress);
  }
  log_line(log, c,
           "dtrain train: epochs %d batch %d (global %d) accum %d optimizer %s lr %g schedule %s "
           "warmup %d seed %llu\n",
           c->epochs, c->batch, s->world * c->batch, c->accum, dt_train_optimizer_name(c->optimizer),
           c->lr, dt_train_schedule_name(c->schedule), c->warmup, (unsigned long long)c->seed);
}

/* The hooks' start: the run's facts (what the progress display, metrics,
 * trace and status file show). */
static dt_status hooks_start(const dt_train_config *c, train_state *s, FILE *log, FILE *console) {
  s->started = true;
  if (!s->hooks->start)
    return DT_OK;
  char dev[32], devs[DT_TRAIN_MAX_DEVICES * 12];
  dt_device_format(s->dev, dev, sizeof dev);
  dt_train_devices_text(c->devices, s->dp ? c->n_devices : 0, devs, sizeof devs);
  const dt_task *t = s->task;
  int64_t tokens = t->input_dtype == DT_DTYPE_I32 || t->input_dtype == DT_DTYPE_I64;
  for (int i = 0; tokens && i < t->input_ndim; i++)
    tokens *= t->input_shape[i]; /* token ids: tokens/s */
  dt_train_run_info run = {
      .model = t->name,
      .data = s->data->name,
      .device_name = s->dp ? devs : dev,
      .comm_name = s->comm ? comm_description(s) : "none",
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

dt_status dt_train_run(const dt_train_config *cfg, FILE *log, dt_train_result *out) {
  dt_status st;
  train_state s;
  dt_train_result r;
  memset(&s, 0, sizeof s);
  memset(&r, 0, sizeof r);
  double start = now_seconds();

  DT_CHECK(dt_train_config_validate(cfg));
  DT_CHECK_GOTO(state_create(cfg, &s), st, done);
  FILE *console = log; /* before train.log joins it */
  DT_CHECK_GOTO(checkpoint_open(cfg, &s, &log), st, done);
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
    DT_CHECK_GOTO(train_epoch(cfg, &s, epoch, first, batches, log, &r.train_loss), st, done);
    if (s.stopped)
      break;
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
    dt_train_eval ev = {epoch, split, r.train_loss, r.test_loss, r.test_accuracy};
    if (s.hooks->eval_end)
      DT_CHECK_GOTO(s.hooks->eval_end(s.hooks->user, &ev), st, done);
    char metric[64] = "";
    if (s.task->metric)
      snprintf(metric, sizeof metric, " %s_%s=%.4f", split, s.task->metric_name, r.test_accuracy);
    log_line(log, cfg, "epoch %d train_loss=%.4f %s_loss=%.4f%s time=%.1fs\n", epoch, r.train_loss,
             split, r.test_loss, metric, now_seconds() - t0);
  }
  if (r.epochs == 0 && !s.stopped) /* resumed from the run's last step */
    DT_CHECK_GOTO(evaluate(cfg, &s, &r.test_loss, &r.test_accuracy), st, done);
  if (!s.stopped)
    DT_CHECK_GOTO(dt_train_log_sample(log, cfg, s.task, s.model, s.dev, 0), st, done);
  r.optimizer_steps = dt_optim_step_count(s.opt);
  r.schedule_steps = s.schedule.total_steps;
  r.final_lr = dt_optim_lr(s.opt);
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
done:;
  if (st != DT_OK) /* peers may be dead or stuck: do not wait for them (ncclCommAbort) */
    dt_comm_abort(s.comm, "the training run failed");
  dt_train_ckpt_close(s.ck, &log);
  bool started = s.started;
  state_destroy(&s); /* the loader's thread stops before the hooks' files close */
  if (started && cfg->hooks.finish)
    st = cfg->hooks.finish(cfg->hooks.user, st);
  return st;
}
