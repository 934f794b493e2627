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
#include "launch/observe.h"
#include "launch/threads.h"
#include "train/train_checkpoint.h"
#include "train/train_lm.h"

/* Fields not named are 0, false or NULL. */
dt_train_config dt_train_config_default(void) {
  return (dt_train_config){.model = "lenet",
                           .data = "fashion-mnist",
                           .data_dir = "data",
                           .device = "cpu",
                           .optimizer = "sgd",
                           .schedule = "cosine",
                           .epochs = 1,
                           .batch = 64,
                           .lr = 0.05f,
                           .momentum = 0.9f,
                           .gamma = 0.1f,
                           .accum = 1,
                           .log_interval = 100,
                           .eval_batch = 1000,
                           .mode = "ddp",
                           .comm_timeout = 300.0,
                           .bucket_cap_mb = 25.0f,
                           .first_bucket_mb = 0.125f,
                           .bucket_update = "each",
                           .grad_compress = "none",
                           .log_prefix = "",
                           .beta2 = 0.999f,
                           .sample = DT_SAMPLE_CONFIG_DEFAULT,
                           .observe = DT_OBSERVE_CONFIG_DEFAULT};
}

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
  bool stopped;          /* a stop was requested (SIGTERM/SIGUSR1): saved, ending */
  dt_step_stats stats;   /* the gradient norm for the metrics */
  dt_grad_scaler scaler; /* --precision fp16: the step's (step.scaler) */
  const char *precision; /* --precision (NULL: the device's default): the MFU's peak */
  dt_observer *obs;      /* progress, metrics, trace (launch/observe.h) */
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

static bool is_dp_mode(const dt_train_config *c) { return c->mode && !strcmp(c->mode, "dp"); }

static dt_status check_config(const dt_train_config *c) {
  if (!c->model || !c->data || !c->data_dir || !c->device || !c->optimizer || !c->schedule ||
      !c->mode)
    return DT_ERROR(DT_ERR_INVALID_ARG,
                    "model, data, data_dir, device, optimizer, schedule and mode "
                    "must all be set (start from dt_train_config_default())");
  if (c->epochs < 1 || c->batch < 1 || c->accum < 1 || c->eval_batch < 1)
    return DT_ERROR(DT_ERR_INVALID_ARG,
                    "epochs (%d), batch (%d), accum (%d) and eval_batch (%d) must be >= 1",
                    c->epochs, c->batch, c->accum, c->eval_batch);
  if (c->warmup < 0 || c->step_size < 0 || c->log_interval < 0 || c->max_steps < 0 ||
      c->threads < 0 || c->ctx < 0 || c->val_every < 0 || c->val_batches < 0)
    return DT_ERROR(DT_ERR_INVALID_ARG,
                    "warmup, step_size, log_interval, max_steps, threads, ctx, val_every and "
                    "val_batches must be >= 0");
  if (c->threads > DT_CPU_MAX_THREADS)
    return DT_ERROR(DT_ERR_INVALID_ARG, "threads %d: at most %d CPU threads (0 = all cores)",
                    c->threads, DT_CPU_MAX_THREADS);
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
  if (strcmp(c->mode, "ddp") && strcmp(c->mode, "dp"))
    return DT_ERROR(DT_ERR_INVALID_ARG, "unknown mode '%s': expected ddp or dp", c->mode);
  if (c->zero < 0 || c->zero > 2)
    return DT_ERROR(DT_ERR_INVALID_ARG, "zero stage %d: expected 0, 1 or 2", c->zero);
  dt_dtype compress;
  DT_CHECK(dt_ddp_grad_compress_parse(c->grad_compress, &compress));
  if (!(c->comm_timeout > 0) || !(c->bucket_cap_mb > 0) || !(c->first_bucket_mb > 0))
    return DT_ERROR(DT_ERR_INVALID_ARG,
                    "comm_timeout (%g s), bucket_cap_mb (%g) and first_bucket_mb (%g) must be "
                    "> 0",
                    c->comm_timeout, c->bucket_cap_mb, c->first_bucket_mb);
  int world = c->pg ? dt_pg_world_size(c->pg) : 1;
  if (is_dp_mode(c) && world > 1)
    return DT_ERROR(DT_ERR_INVALID_ARG,
                    "--mode dp runs one process over the devices of --devices, but this process "
                    "is one of %d ranks: use --mode dp without mpirun, or DDP (the default "
                    "mode) with one rank per device",
                    world);
  if (is_dp_mode(c) && (!c->devices || !c->devices[0]))
    return DT_ERROR(DT_ERR_INVALID_ARG,
                    "--mode dp needs the replicas' devices: --devices cpu:0,cpu:1,...");
  if (!is_dp_mode(c) && c->devices && c->devices[0])
    return DT_ERROR(DT_ERR_INVALID_ARG,
                    "--devices '%s' is for --mode dp (one process, one replica per device); "
                    "for DDP give one --device per rank (default: cpu, or cuda:<local rank>)",
                    c->devices);
  return DT_OK;
}

/* data_dir/data must be a folder; say where we looked and how to fix it. */
static dt_status data_folder(const dt_train_config *c, char *path, size_t cap) {
  size_t n = strlen(c->data_dir);
  const char *sep = (n > 0 && c->data_dir[n - 1] == '/') ? "" : "/";
  if ((size_t)snprintf(path, cap, "%s%s%s", c->data_dir, sep, c->data) >= cap)
    return DT_ERROR(DT_ERR_INVALID_ARG, "data path too long: %s%s%s", c->data_dir, sep, c->data);
  struct stat st;
  if (stat(path, &st) == 0 && !S_ISDIR(st.st_mode))
    return DT_ERROR(DT_ERR_IO,
                    "data set folder %s is not a directory (data dir '%s', data set '%s')", path,
                    c->data_dir, c->data);
  if (stat(path, &st) != 0 && errno != ENOENT)
    return DT_ERROR(DT_ERR_IO, "data set folder %s: %s (data dir '%s', data set '%s')", path,
                    strerror(errno), c->data_dir, c->data);
  if (stat(path, &st) != 0)
    return DT_ERROR(DT_ERR_IO,
                    "data set folder %s not found (data dir '%s', data set '%s'): run "
                    "tools/setup.sh to fetch the data sets, or point --data-dir (or DT_DATA_DIR) "
                    "at a folder that holds %s/",
                    path, c->data_dir, c->data, c->data);
  return DT_OK;
}

/* The communicator backend applies to the device: nccl with cpu tensors is
 * a mistake even in a single process, where no communicator is made. */
static dt_status check_comm_backend(const dt_train_config *c, dt_device dev) {
  dt_comm_config cc = DT_COMM_CONFIG_DEFAULT;
  DT_CHECK(dt_train_comm_config(c->comm_backend, &cc));
  if (cc.backend == DT_COMM_BACKEND_NCCL && dev.type == DT_DEVICE_CPU)
    return DT_ERROR(DT_ERR_INVALID_ARG,
                    "communication backend nccl (--comm-backend or DT_COMM_BACKEND) with device "
                    "%s: NCCL reduces GPU memory; train on cuda devices, or use auto or mpi",
                    c->device);
  return DT_OK;
}

static dt_train_comm_options comm_options(const dt_train_config *c) {
  dt_train_comm_options co = {c->comm_backend, c->comm_timeout, c->first_bucket_mb,
                              c->bucket_cap_mb, c->allow_unused};
  co.zero_stage = c->zero;
  co.split_bucket_mb = c->split_bucket_mb;
  co.update_per_bucket = dt_train_update_per_bucket(c->bucket_update);
  dt_ddp_grad_compress_parse(c->grad_compress, &co.grad_compress); /* checked at the start */
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
  dt_device devs[DT_TRAIN_MAX_DEVICES];
  int n = 0;
  DT_CHECK(dt_train_parse_devices(c->devices, devs, DT_TRAIN_MAX_DEVICES, &n));
  if (c->batch < n)
    return DT_ERROR(DT_ERR_INVALID_ARG,
                    "--mode dp splits each micro-batch across the %d devices of --devices: "
                    "--batch %d is too small (use --batch >= %d)",
                    n, c->batch, n);
  dt_dp_config cfg = DT_DP_CONFIG_DEFAULT;
  /* Replicas run their kernels side by side: --threads each, or (0) this
   * thread's count (cores, or DT_NUM_THREADS) shared out by dist/dp.c. */
  cfg.threads_per_replica = c->threads;
  cfg.comm.timeout_s = c->comm_timeout;
  DT_CHECK(dt_train_comm_config(c->comm_backend, &cfg.comm));
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
                    c->data, format_shape(shape, ndim, have, sizeof have), t->name,
                    format_shape(t->input_shape, t->input_ndim, want, sizeof want));
  dt_dtype given = dt_dataset_layout(s->train_set)->input_dtype;
  if (t->input_dtype != given)
    return DT_ERROR(DT_ERR_UNSUPPORTED, "model %s takes %s inputs, but data set %s gives %s",
                    t->name, dt_dtype_name(t->input_dtype), c->data, dt_dtype_name(given));
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
  ls->decay = !strcmp(c->schedule, "cosine") ? DT_LR_DECAY_COSINE
              : !strcmp(c->schedule, "step") ? DT_LR_DECAY_STEP
                                             : DT_LR_DECAY_CONSTANT;
  /* --min-lr above --lr, --gamma 0, a warm-up as long as the run: refused
   * here rather than trained on silently. */
  dt_status st = dt_lr_schedule_check(ls);
  if (st != DT_OK)
    return dt_error_wrap(st,
                         "--schedule %s over %lld optimizer steps (--warmup %d, --min-lr %g, "
                         "--gamma %g)",
                         c->schedule, (long long)ls->total_steps, c->warmup, (double)c->min_lr,
                         (double)c->gamma);
  return DT_OK;
}

/* The task's data set from its folder, checked against the task's input;
 * this rank's shuffled shard; the background loader. */
static dt_status data_create(const dt_train_config *c, train_state *s) {
  char folder[4096];
  DT_CHECK(data_folder(c, folder, sizeof folder));

  DT_CHECK(s->data->open(s->task, s->data, folder, "train", &s->train_set));
  DT_CHECK(s->data->open(s->task, s->data, folder, s->task->eval_split, &s->test_set));
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
  s->rank = c->pg ? dt_pg_rank(c->pg) : 0;
  s->world = c->pg ? dt_pg_world_size(c->pg) : 1;

  /* Cheap checks first: the device(s), the task, then the data folder. */
  if (is_dp_mode(c)) {
    dt_device devs[DT_TRAIN_MAX_DEVICES];
    int n = 0;
    DT_CHECK(dt_train_parse_devices(c->devices, devs, DT_TRAIN_MAX_DEVICES, &n));
    s->dev = devs[0];
  } else {
    DT_CHECK(dt_train_rank_device(c->device, c->pg, &s->dev));
  }
  DT_CHECK(dt_backend_get(s->dev, &backend));
  DT_CHECK(check_comm_backend(c, s->dev));
  if (c->threads > 0)
    dt_cpu_set_num_threads(c->threads);
  const dt_task *found = NULL;
  DT_CHECK(dt_task_find(c->model, &found));
  s->task_ctx = *found;
  if (c->ctx > 0)
    DT_CHECK(dt_task_with_context(found, c->ctx, &s->task_ctx));
  s->task = &s->task_ctx;
  DT_CHECK(dt_task_find_data(s->task, c->data, &s->data));
  DT_CHECK(data_create(c, s));
  DT_CHECK(plan_steps(c, s));
  s->step = DT_STEP_CONFIG_DEFAULT;
  s->step.loss = s->task->loss;
  s->step.clip = c->clip;
  s->step.schedule = &s->schedule;
  s->step.stats = is_dp_mode(c) ? NULL : &s->stats; /* dp's replicas would race on it */
  DT_CHECK(dt_train_precision_setup(c->precision, c->debug_overflow, s->dev, s->rank, &s->step,
                                    &s->scaler));
  s->precision = c->precision;
  DT_CHECK(dt_train_rounding_setup(c->stochastic_rounding, c->seed, &s->step));
  if (s->step.scaler && is_dp_mode(c))
    return DT_ERROR(DT_ERR_UNSUPPORTED,
                    "--precision fp16 with --mode dp: the replicas would share one GradScaler; "
                    "use DDP (one process per device) or --precision bf16");
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
                  "training diverged: loss is %s at epoch %d step %lld; lower --lr, add "
                  "--warmup or set --clip",
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
                      "--mode dp: a micro-batch of %lld samples cannot be split across %d "
                      "replicas (the last batch of the epoch is smaller: use --max-steps or a "
                      "--batch that leaves a larger remainder)",
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
  return dt_observer_step_end(s->obs, s->ddp);
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
  double mfu = dt_train_throughput_text(s->task, s->dev, s->precision, devices, samples_per_s, rate,
                                        sizeof rate);
  snprintf(extra, sizeof extra, " optimizer-state %.2f MiB grads %.2f MiB%s",
           mib(rm.optimizer_state), mib(rm.gradients), in_flight);
  dt_observe_interval iv = {epoch,         b,    batches, loss, dt_optim_lr(s->opt),
                            samples_per_s, rate, extra,   mfu};
  return dt_observer_interval(s->obs, &iv);
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
    dt_observe_eval ev = {0, s->task->eval_split, NAN, loss, metric};
    DT_CHECK(dt_observer_eval_end(s->obs, &ev));
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
  dt_observer_epoch_begin(s->obs, epoch, batches);
  for (int64_t b = first; b < batches && !s->stopped; b++) {
    DT_CHECK_GOTO(dt_loader_next(s->loader, &x, &y), st, fail);
    if (x == NULL)
      break;
    int64_t pos = b % c->accum;
    if (pos == 0) {
      int64_t left = batches - b;
      group = (int)(left < c->accum ? left : c->accum);
      dt_observer_step_begin(s->obs, b, group);
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
      DT_CHECK_GOTO(dt_train_ckpt_after_step(s->ck, &s->pos, &s->stopped), st, fail);
      double aside = 0.0;
      DT_CHECK_GOTO(after_step(c, s, log, &aside), st, fail);
      interval_start += aside;
    }
    done_batches++;
    interval_batches++;
    dt_observer_tick(s->obs, b + 1, samples);

    bool last = (b + 1 == batches) || s->stopped;
    bool log_now = dt_observer_interval_due(s->obs, b + 1);
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
  dt_observer_eval_begin(s->obs);
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
  if (s->dev.type != DT_DEVICE_CPU && strcmp(name, "nccl") != 0)
    return "mpi (host-staged)";
  return name;
}

static void log_header(FILE *log, const dt_train_config *c, train_state *s) {
  char dev[32];
  dt_device_format(s->dev, dev, sizeof dev);
  log_line(log, c,
           "dtrain train: model %s (%lld parameters) data %s (%lld train, %lld test) device %s "
           "threads %d%s\n",
           c->model, (long long)dt_module_parameter_count(s->model), c->data,
           (long long)dt_dataset_length(s->train_set), (long long)dt_dataset_length(s->test_set),
           s->dp ? c->devices : dev, dt_cpu_num_threads(), dt_threads_note());
  if (s->dp) {
    log_line(log, c,
             "dtrain train: mode dp: %d replicas (one thread each), batch %d split across them "
             "(global batch %d), zero %d, grad-compress %s\n",
             s->n_replicas, c->batch, c->batch, c->zero, c->grad_compress);
  } else if (s->world > 1) {
    char who[256];
    log_line(log, c,
             "dtrain train: ddp world %d (%s): per-rank batch %d, global batch %d; buckets %d "
             "(first %g MiB, then %g MiB) over %s, comm timeout %g s, zero %d, grad-compress %s\n",
             s->world, dt_pg_describe(c->pg, who, sizeof who), c->batch, s->world * c->batch,
             dt_ddp_num_buckets(s->ddp), c->first_bucket_mb, c->bucket_cap_mb, comm_description(s),
             c->comm_timeout, c->zero, c->grad_compress);
  }
  log_line(log, c,
           "dtrain train: epochs %d batch %d (global %d) accum %d optimizer %s lr %g schedule %s "
           "warmup %d seed %llu\n",
           c->epochs, c->batch, s->world * c->batch, c->accum, c->optimizer, c->lr, c->schedule,
           c->warmup, (unsigned long long)c->seed);
}

/* The run's progress display, metrics, trace and status file. */
static dt_status observe(const dt_train_config *c, train_state *s, FILE *log, FILE *console) {
  dt_observe_config oc = c->observe;
  oc.log_interval = c->log_interval;
  oc.log_file = dt_train_ckpt_log_file(s->ck);
  char metrics[4200];
  if (!oc.metrics_path && s->ck) { /* a run directory keeps its metrics */
    snprintf(metrics, sizeof metrics, "%s/metrics.jsonl", dt_train_ckpt_run_dir(s->ck));
    oc.metrics_path = metrics;
  }
  DT_CHECK(dt_observer_create(&oc, s->rank, s->dev, log, console, c->log_prefix, s->pos.step > 0,
                              &s->obs));
  dt_device devs[DT_TRAIN_MAX_DEVICES];
  int n = 0;
  if (s->dp)
    DT_CHECK(dt_train_parse_devices(c->devices, devs, DT_TRAIN_MAX_DEVICES, &n));
  char dev[32];
  dt_device_format(s->dev, dev, sizeof dev);
  const dt_task *t = s->task;
  int64_t tokens = t->input_dtype == DT_DTYPE_I32 || t->input_dtype == DT_DTYPE_I64;
  for (int i = 0; tokens && i < t->input_ndim; i++)
    tokens *= t->input_shape[i]; /* token ids: tokens/s */
  dt_observe_run run = {c->model,
                        c->data,
                        s->dp ? c->devices : dev,
                        s->comm ? comm_description(s) : "none",
                        t->metric ? t->metric_name : NULL,
                        s->dev,
                        s->dp ? devs : NULL,
                        n,
                        s->comm,
                        s->world,
                        c->batch,
                        c->accum,
                        c->epochs,
                        dt_cpu_num_threads(),
                        s->total_steps,
                        s->steps_per_epoch,
                        tokens,
                        s->dp ? NULL : &s->stats,
                        s->pos.step,
                        s->step.scaler};
  return dt_observer_start(s->obs, &run);
}

dt_status dt_train_run(const dt_train_config *cfg, FILE *log, dt_train_result *out) {
  dt_status st;
  train_state s;
  dt_train_result r;
  memset(&s, 0, sizeof s);
  memset(&r, 0, sizeof r);
  double start = now_seconds();

  DT_CHECK(check_config(cfg));
  DT_CHECK_GOTO(state_create(cfg, &s), st, done);
  FILE *console = log; /* before train.log joins it */
  DT_CHECK_GOTO(checkpoint_open(cfg, &s, &log), st, done);
  if (!cfg->observe.quiet) {
    log_header(log, cfg, &s);
    dt_train_log_flops(log, cfg->log_prefix ? cfg->log_prefix : "", s.task, s.dev, s.precision);
  }
  DT_CHECK_GOTO(observe(cfg, &s, log, console), st, done);

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
                    "no longer finite); lower --lr or --weight-decay, add --warmup or set --clip",
                    r.test_loss, epoch);
      goto done;
    }
    r.epochs = epoch;
    dt_observe_eval ev = {epoch, split, r.train_loss, r.test_loss, r.test_accuracy};
    DT_CHECK_GOTO(dt_observer_eval_end(s.obs, &ev), st, done);
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
  r.stopped_by_signal = dt_train_ckpt_stop_signal(s.ck);
  r.seconds = now_seconds() - start;
  r.result = s.task->result == DT_TASK_RESULT_LOSS ? r.test_loss : r.test_accuracy;
  char name[64];
  if (r.stopped_by_signal)
    log_line(log, cfg,
             "dtrain train: stopped by %s after optimizer step %lld; checkpoint %s saved; "
             "continue with --resume auto (and the same --run-dir)\n",
             r.stopped_by_signal == SIGUSR1 ? "SIGUSR1" : "SIGTERM", (long long)s.pos.step,
             dt_train_ckpt_last_saved(s.ck));
  else
    log_line(log, cfg, "%s=%.4f\n", dt_train_result_name(s.task, name, sizeof name), r.result);
  if (out)
    *out = r;
done:;
  dt_observer *obs = s.obs;
  if (st != DT_OK) /* peers may be dead or stuck: do not wait for them (ncclCommAbort) */
    dt_comm_abort(s.comm, "the training run failed");
  dt_train_ckpt_close(s.ck, &log);
  state_destroy(&s); /* the loader's thread stops before the trace closes */
  return dt_observer_destroy(obs, st);
}
