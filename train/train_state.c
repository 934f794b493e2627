/* Setting a training run up and tearing it down (train/train_state_internal.h):
 * the device, the task, the data, the plan of steps, the replicas and the
 * run directory. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "core/backend.h"
#include "core/cpu.h"
#include "core/nn.h"
#include "dist/comm.h"
#include "dist/dp.h"
#include "train/train_state_internal.h"

/* The data side of the run: both splits, the sampler, the loader. */
static void data_destroy(train_state *s) {
  dt_loader_destroy(s->loader);
  dt_sampler_destroy(s->sampler);
  dt_dataset_destroy(s->test_set);
  dt_dataset_destroy(s->train_set);
}

void dt_train_state_destroy(train_state *s) {
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
  /* Under `max_memory` the update waits for the ranks' agreement that no
   * rank ran out of memory in the step (train/train_oom.c): not per bucket. */
  co.update_per_bucket = c->update_per_bucket && c->max_memory_mib <= 0;
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

/* SyncBatchNorm's sum across the ranks (dt_sum_across): a blocking
 * allreduce on the DDP communicator, in the same order on every rank (the
 * BatchNorms' order in forward and backward). */
static dt_status sum_over_ranks(dt_tensor *t, void *comm) {
  dt_work *w = NULL;
  DT_CHECK(dt_comm_allreduce(comm, t, DT_REDUCE_SUM, NULL, &w));
  dt_status st = dt_work_wait(w, 0);
  dt_work_release(w);
  return st;
}

/* One process (world 1) or one DDP rank: the replica, connected to the
 * other ranks. */
static dt_status build_replica(const dt_train_config *c, train_state *s) {
  dt_module *model = NULL;
  dt_optimizer_spec os = optimizer_spec(c);
  DT_CHECK(dt_train_build_model(s->task, c->seed, c->recompute, c->init_path, &model));
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
  if (c->sync_bn && s->world > 1) {
    const dt_sum_across across = {sum_over_ranks, s->comm};
    dt_nn_batch_norm_set_sync(s->model, &across);
  }
  return DT_OK;
}

typedef struct model_source {
  const dt_task *task;
  uint64_t seed;
  bool recompute;
  const char *init_path;
} model_source;

/* Runs on the replica's thread (dist/dp.c has set its CPU thread count). */
static dt_status build_dp_model(void *user, int replica, dt_module **out) {
  (void)replica;
  const model_source *src = user;
  return dt_train_build_model(src->task, src->seed, src->recompute, src->init_path, out);
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
  model_source src = {s->task, c->seed, c->recompute, c->init_path};
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
  /* A group longer than the epoch would be cut at the epoch's end: every
   * optimizer step would see fewer micro-batches than asked, silently. */
  if (c->accum > s->batches_per_epoch)
    return DT_ERROR(DT_ERR_INVALID_ARG,
                    "`accum` %d micro-batches per optimizer step is more than an epoch holds "
                    "(%lld micro-batches of `batch` %d on this rank): use `accum` of at most %lld",
                    c->accum, (long long)s->batches_per_epoch, c->batch,
                    (long long)s->batches_per_epoch);
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
                         dt_train_schedule_name(c->schedule), (long long)ls->total_steps, c->warmup,
                         (double)c->min_lr, (double)c->gamma);
  return DT_OK;
}

/* The image folder's splits train and val in the task's input shape
 * unless `image` says otherwise. */
static dt_status image_folder_open(const dt_train_config *c, train_state *s) {
  dt_image_folder_config ic = c->image;
  const dt_task *t = s->task;
  if (ic.channels == 0)
    ic.channels = (int)t->input_shape[0];
  if (ic.size == 0)
    ic.size = (int)t->input_shape[1];
  if (!(ic.std[0] > 0.0f)) { /* no normalisation given: ImageNet's, or the grey data set's */
    dt_image_folder_config rgb = DT_IMAGE_FOLDER_CONFIG_DEFAULT;
    for (int k = 0; k < 3; k++) {
      ic.mean[k] = ic.channels == 3 || t->n_data < 1 ? rgb.mean[k] : t->data[0].mean;
      ic.std[k] = ic.channels == 3 || t->n_data < 1 ? rgb.std[k] : t->data[0].std;
    }
  }
  ic.seed = c->seed;
  if (t->any_image_size) { /* the model is built for the folder's images */
    s->task_ctx.input_shape[0] = ic.channels;
    s->task_ctx.input_shape[1] = s->task_ctx.input_shape[2] = ic.size;
  }
  DT_CHECK(dt_dataset_image_folder(c->image_folder, "train", &ic, &s->train_set));
  DT_CHECK(dt_dataset_image_folder(c->image_folder, "val", &ic, &s->test_set));
  int n_train = dt_dataset_num_classes(s->train_set), n_val = dt_dataset_num_classes(s->test_set);
  for (int k = 0; k < n_train || k < n_val; k++) {
    const char *a = dt_image_folder_class_name(s->train_set, k);
    const char *b = dt_image_folder_class_name(s->test_set, k);
    if (!a || !b || strcmp(a, b) != 0)
      return DT_ERROR(DT_ERR_FORMAT,
                      "image folder %s: class %d is %s in train/ but %s in val/: both splits "
                      "need the same class folders",
                      c->image_folder, k, a ? a : "(none)", b ? b : "(none)");
  }
  if (t->any_image_size)
    s->task_ctx.num_classes = n_train;
  s->image_cfg = ic;
  if (n_train > t->num_classes)
    return DT_ERROR(DT_ERR_SHAPE, "image folder %s has %d classes, but model %s has %d outputs",
                    c->image_folder, n_train, t->name, t->num_classes);
  s->folder_data.num_classes = n_train;
  return DT_OK;
}

/* The task's data set from its folder, checked against the task's input;
 * this rank's shuffled shard; the background loader. */
static dt_status data_create(const dt_train_config *c, train_state *s) {
  char folder[4096];
  const char *where = NULL; /* no data_dir: a data set of the caller's own (in memory) */
  if (c->image_folder) {
    DT_CHECK(image_folder_open(c, s));
  } else {
    if (c->data_dir) {
      DT_CHECK(data_folder(c, s->data->name, folder, sizeof folder));
      where = folder;
    }
    DT_CHECK(s->data->open(s->task, s->data, where, "train", &s->train_set));
    DT_CHECK(s->data->open(s->task, s->data, where, s->task->eval_split, &s->test_set));
  }
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
  lc.workers = c->workers;
  /* dp over GPUs: batches stay in host memory and each replica copies its
   * slice to its own GPU (none of them gathers or scatters for the rest). */
  lc.device = is_dp_mode(c) && s->dev.type != DT_DEVICE_CPU ? DT_CPU : s->dev;
  DT_CHECK(dt_loader_create(s->train_set, s->sampler, &lc, &s->loader));

  return DT_OK;
}

dt_status dt_train_state_create(const dt_train_config *c, train_state *s) {
  const dt_backend_ops *backend = NULL;
  memset(s, 0, sizeof *s);
  s->hooks = &c->hooks;
  s->rank = c->pg ? dt_pg_rank(c->pg) : 0;
  s->world = c->pg ? dt_pg_world_size(c->pg) : 1;

  if (is_dp_mode(c) && s->world > 1)
    return DT_ERROR(DT_ERR_INVALID_ARG,
                    "`mode` dp runs one process over the devices of `devices`, but this process "
                    "is one of %d ranks: use `mode` dp without mpirun, or DDP (the default "
                    "mode) with one rank per device",
                    s->world);
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
  s->task_ctx.zero_init_residual = c->zero_init_residual;
  s->task_ctx.channels_last = c->channels_last;
  s->task = &s->task_ctx;
  s->data = c->data ? c->data : &s->task->data[0];
  if (c->image_folder) {
    s->folder_data = (dt_task_data){.name = c->image_folder};
    s->data = &s->folder_data;
  }
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
  if (c->sync_bn && is_dp_mode(c))
    return DT_ERROR(DT_ERR_UNSUPPORTED,
                    "`sync_bn` with `mode` dp: SyncBatchNorm synchronises DDP ranks; use DDP "
                    "(one process per device)");
  if (s->step.scaler && is_dp_mode(c))
    return DT_ERROR(DT_ERR_UNSUPPORTED,
                    "`precision` fp16 with `mode` dp: the replicas would share one GradScaler; "
                    "use DDP (one process per device) or `precision` bf16");
  return is_dp_mode(c) ? build_dp(c, s) : build_replica(c, s);
}

/* The run directory, and the resumed state in every replica. */
dt_status dt_train_state_open_checkpoints(const dt_train_config *c, train_state *s, FILE **log) {
  dt_train_ckpt_run run = {.cfg = c,
                           .comm = s->comm,
                           .dev = s->dev,
                           .rank = s->rank,
                           .world = s->world,
                           .train_samples = dt_dataset_length(s->train_set),
                           .batches_per_epoch = s->batches_per_epoch,
                           .schedule = &s->schedule,
                           .context = s->task->max_context > 0 ? s->task->input_shape[0] : 0,
                           .scaler = s->step.scaler,
                           .image = c->image_folder ? &s->image_cfg : NULL,
                           .image_classes = s->folder_data.num_classes};
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

/* "nccl", "mpi", or "mpi (host-staged)" for device tensors over mpi. */
const char *dt_train_comm_description(const train_state *s) {
  const char *name = dt_comm_backend_name(s->comm);
  if (s->dev.type != DT_DEVICE_CPU && !dt_comm_is_nccl(s->comm))
    return "mpi (host-staged)";
  return name;
}
