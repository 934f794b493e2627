/* Single-process data parallelism: replica threads driven in lock step by
 * the caller, gradients reduced by DDP over the local communicator (cpu;
 * cuda host-staged) or an NCCL clique (cuda). */
#include "dist/dp.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/backend.h"
#include "core/cpu.h"
#include "core/ops.h"

typedef enum dp_task {
  DP_TASK_NONE = 0,
  DP_TASK_BUILD, /* model, arena, optimizer */
  DP_TASK_DDP,   /* DDP reducer (collective over the replicas) */
  DP_TASK_FWD_BWD,
  DP_TASK_STEP,
  DP_TASK_CLIP,
  DP_TASK_EXIT,
} dp_task;

typedef struct dp_replica {
  dt_dp *dp;
  int index;
  dt_device device;
  pthread_t thread;
  int thread_started;
  dt_module *model;
  dt_param_arena *arena;
  dt_optimizer *optim;
  dt_comm *comm;
  dt_ddp *ddp;
  /* per task */
  dt_status status;
  char error[1024];
  double loss;    /* unscaled mean over this replica's samples */
  int64_t lo, hi; /* sample range of the current batch */
  double norm;
} dp_replica;

struct dt_dp {
  int n;
  dp_replica *replicas;
  dt_local_group *group;  /* cpu, or cuda host-staged */
  dt_nccl_clique *clique; /* cuda over nccl */
  dt_dp_config cfg;
  int threads; /* CPU threads per replica thread, resolved at creation */

  pthread_mutex_t mu;
  pthread_cond_t cv;
  unsigned long task_gen; /* bumped per dispatched task */
  dp_task task;
  int n_done;

  /* task arguments */
  dt_dp_model_fn model_fn;
  void *model_user;
  dt_dp_optim_fn optim_fn;
  void *optim_user;
  dt_tensor *inputs, *labels;
  int64_t batch;
  float loss_scale;
  int sync;
  float max_norm;
};

static dt_status to_replica(dt_tensor *t, int64_t lo, int64_t hi, dt_device dev, dt_tensor **out) {
  dt_tensor *s = NULL;
  DT_CHECK(dt_tensor_slice(t, lo, hi, &s));
  if (dt_device_equal(dt_tensor_device(s), dev)) {
    *out = s;
    return DT_OK;
  }
  dt_status st = dt_tensor_to_device(s, dev, out);
  dt_tensor_release(s);
  return st;
}

static dt_status replica_build(dp_replica *r) {
  dt_dp *dp = r->dp;
  DT_CHECK(dp->model_fn(dp->model_user, r->index, &r->model));
  DT_CHECK(dt_module_to(r->model, r->device));
  DT_CHECK(dt_param_arena_create(r->model, &r->arena));
  return dp->optim_fn(dp->optim_user, r->index, r->arena, &r->optim);
}

static dt_status replica_forward_backward(dp_replica *r) {
  dt_dp *dp = r->dp;
  dt_tensor *x = NULL, *y = NULL, *logits = NULL, *loss = NULL, *scaled = NULL;
  dt_status st = DT_OK;
  int no_sync = !dp->sync;
  if (no_sync)
    DT_CHECK(dt_ddp_no_sync_begin(r->ddp));
  DT_CHECK_GOTO(to_replica(dp->inputs, r->lo, r->hi, r->device, &x), st, release);
  DT_CHECK_GOTO(to_replica(dp->labels, r->lo, r->hi, r->device, &y), st, release);
  DT_CHECK_GOTO(dt_module_call(r->model, x, &logits), st, release);
  DT_CHECK_GOTO(dt_op_cross_entropy(logits, y, DT_REDUCTION_MEAN, dp->cfg.ignore_index, &loss), st,
                release);
  DT_CHECK_GOTO(dt_tensor_item(loss, 0, &r->loss), st, release);
  /* Weight n*b_r/B makes the average over replicas the global mean. */
  float weight =
      (float)((double)dp->n * (double)(r->hi - r->lo) / (double)dp->batch) * dp->loss_scale;
  if (weight != 1.0f)
    DT_CHECK_GOTO(dt_op_scale(loss, weight, &scaled), st, release);
  DT_CHECK_GOTO(dt_backward(scaled ? scaled : loss, NULL), st, release);

release:
  if (no_sync) {
    dt_status end = dt_ddp_no_sync_end(r->ddp);
    if (st == DT_OK)
      st = end;
  }
  /* Even after a failed backward, a synchronised pass must finish: the other
   * replicas wait for this one's buckets. */
  if (!no_sync && r->ddp != NULL) {
    dt_status fin = dt_ddp_finish_backward(r->ddp);
    if (st == DT_OK)
      st = fin;
  }
  dt_tensor_release(scaled);
  dt_tensor_release(loss);
  dt_tensor_release(logits);
  dt_tensor_release(y);
  dt_tensor_release(x);
  return st;
}

static dt_status replica_run(dp_replica *r, dp_task task) {
  dt_dp *dp = r->dp;
  switch (task) {
    case DP_TASK_BUILD: return replica_build(r);
    case DP_TASK_DDP: return dt_ddp_create(r->model, r->arena, r->comm, &dp->cfg.ddp, &r->ddp);
    case DP_TASK_FWD_BWD: return replica_forward_backward(r);
    case DP_TASK_STEP: DT_CHECK(dt_optim_step(r->optim)); return dt_optim_zero_grad(r->optim);
    case DP_TASK_CLIP: return dt_clip_grad_norm(r->arena, dp->max_norm, &r->norm);
    case DP_TASK_NONE:
    case DP_TASK_EXIT: return DT_OK;
  }
  return DT_ERROR(DT_ERR_INTERNAL, "unknown data-parallel task %d", (int)task);
}

static void *replica_thread(void *arg) {
  dp_replica *r = arg;
  dt_dp *dp = r->dp;
  unsigned long seen = 0;
  /* Per-thread setting (OpenMP's ICV): it must be made on this thread. */
  dt_cpu_set_num_threads(dp->threads);
  for (;;) {
    pthread_mutex_lock(&dp->mu);
    while (dp->task_gen == seen)
      pthread_cond_wait(&dp->cv, &dp->mu);
    seen = dp->task_gen;
    dp_task task = dp->task;
    pthread_mutex_unlock(&dp->mu);
    if (task == DP_TASK_EXIT)
      break;
    dt_clear_error();
    r->status = replica_run(r, task);
    snprintf(r->error, sizeof r->error, "%s", r->status == DT_OK ? "" : dt_last_error());
    pthread_mutex_lock(&dp->mu);
    dp->n_done++;
    pthread_cond_broadcast(&dp->cv);
    pthread_mutex_unlock(&dp->mu);
  }
  return NULL;
}

/* Runs `task` on every replica thread and waits for all of them. */
static dt_status run_all(dt_dp *dp, dp_task task, const char *what) {
  pthread_mutex_lock(&dp->mu);
  dp->task = task;
  dp->n_done = 0;
  dp->task_gen++;
  pthread_cond_broadcast(&dp->cv);
  while (dp->n_done < dp->n && task != DP_TASK_EXIT)
    pthread_cond_wait(&dp->cv, &dp->mu);
  pthread_mutex_unlock(&dp->mu);
  if (task == DP_TASK_EXIT)
    return DT_OK;
  for (int i = 0; i < dp->n; i++) {
    dp_replica *r = &dp->replicas[i];
    if (r->status != DT_OK) {
      char dev[32];
      return DT_ERROR(r->status, "data-parallel %s: replica %d (%s): %s", what, i,
                      dt_device_format(r->device, dev, sizeof dev), r->error);
    }
  }
  return DT_OK;
}

static dt_status check_devices(const dt_device *devices, int n) {
  char a[32], b[32];
  for (int i = 0; i < n; i++) {
    if (devices[i].type != devices[0].type)
      return DT_ERROR(DT_ERR_INVALID_ARG,
                      "data-parallel mode: %s and %s are of different types: use all cpu or all "
                      "cuda devices",
                      dt_device_format(devices[0], a, sizeof a),
                      dt_device_format(devices[i], b, sizeof b));
    const dt_backend_ops *ops = NULL;
    DT_CHECK(dt_backend_get(devices[i], &ops));
    for (int j = 0; j < i; j++)
      if (dt_device_equal(devices[i], devices[j]))
        return DT_ERROR(DT_ERR_INVALID_ARG,
                        "data-parallel mode: device %s is listed twice; give each replica its "
                        "own device",
                        dt_device_format(devices[i], a, sizeof a));
  }
  return DT_OK;
}

/* cpu: a local group. cuda: an NCCL clique (ncclCommInitAll), or by
 * choice or fallback a local group that host-stages the gradients. */
static dt_status create_group(dt_dp *dp, const dt_device *devices, int n) {
  dt_comm_backend_choice choice = dp->cfg.comm.backend;
  if (devices[0].type == DT_DEVICE_CUDA && choice != DT_COMM_BACKEND_MPI) {
    dt_status st = dt_nccl_clique_create(devices, n, &dp->clique);
    if (st == DT_OK || choice == DT_COMM_BACKEND_NCCL)
      return st;
    fprintf(stderr,
            "dtrain: data-parallel mode: nccl unavailable: %s; reducing through host "
            "memory instead\n",
            dt_last_error());
  } else if (devices[0].type == DT_DEVICE_CPU && choice == DT_COMM_BACKEND_NCCL) {
    return DT_ERROR(DT_ERR_INVALID_ARG,
                    "data-parallel mode: the nccl backend reduces GPU memory; with cpu devices "
                    "use auto or mpi");
  }
  return dt_local_group_create(n, &dp->group);
}

dt_status dt_dp_create(const dt_device *devices, int n_devices, dt_dp_model_fn model_fn,
                       void *model_user, dt_dp_optim_fn optim_fn, void *optim_user,
                       const dt_dp_config *cfg, dt_dp **out) {
  if (out == NULL || devices == NULL || model_fn == NULL || optim_fn == NULL || n_devices < 1)
    return DT_ERROR(DT_ERR_INVALID_ARG,
                    "data-parallel mode: devices, model and optimizer builders and out are "
                    "required, with at least one device (got %d)",
                    n_devices);
  *out = NULL;
  if (cfg != NULL && cfg->threads_per_replica < 0)
    return DT_ERROR(DT_ERR_INVALID_ARG,
                    "data-parallel mode: threads_per_replica is %d: give a count >= 1, or 0 to "
                    "share the calling thread's count among the replicas",
                    cfg->threads_per_replica);
  DT_CHECK(check_devices(devices, n_devices));
  dt_dp *dp = calloc(1, sizeof *dp);
  if (dp == NULL)
    return DT_ERROR(DT_ERR_OOM, "data-parallel mode: out of host memory");
  dp->cfg = cfg ? *cfg : DT_DP_CONFIG_DEFAULT;
  dp->n = n_devices;
  dp->threads = dp->cfg.threads_per_replica > 0 ? dp->cfg.threads_per_replica
                                                : dt_cpu_num_threads() / n_devices;
  if (dp->threads < 1)
    dp->threads = 1;
  pthread_mutex_init(&dp->mu, NULL);
  pthread_cond_init(&dp->cv, NULL);
  dt_status st = DT_OK;
  dp->replicas = calloc((size_t)n_devices, sizeof *dp->replicas);
  if (dp->replicas == NULL) {
    st = DT_ERROR(DT_ERR_OOM, "data-parallel mode: out of host memory for %d replicas", n_devices);
    goto destroy_dp;
  }
  DT_CHECK_GOTO(create_group(dp, devices, n_devices), st, destroy_dp);
  for (int i = 0; i < n_devices; i++) {
    dp_replica *r = &dp->replicas[i];
    r->dp = dp;
    r->index = i;
    r->device = devices[i];
    if (dp->clique != NULL)
      DT_CHECK_GOTO(dt_comm_create_nccl_clique(dp->clique, i, &dp->cfg.comm, &r->comm), st,
                    destroy_dp);
    else
      DT_CHECK_GOTO(dt_comm_create_local(dp->group, i, &dp->cfg.comm, &r->comm), st, destroy_dp);
    int rc = pthread_create(&r->thread, NULL, replica_thread, r);
    if (rc != 0) {
      st = DT_ERROR(DT_ERR_INTERNAL, "data-parallel mode: starting replica thread %d: %s", i,
                    strerror(rc));
      goto destroy_dp;
    }
    r->thread_started = 1;
  }
  dp->model_fn = model_fn;
  dp->model_user = model_user;
  dp->optim_fn = optim_fn;
  dp->optim_user = optim_user;
  /* Build everything local first: the DDP step is collective, so it must
   * start on every replica or on none. */
  DT_CHECK_GOTO(run_all(dp, DP_TASK_BUILD, "building the replicas"), st, destroy_dp);
  DT_CHECK_GOTO(run_all(dp, DP_TASK_DDP, "creating the reducers"), st, destroy_dp);
  dp->model_fn = NULL;
  dp->optim_fn = NULL;
  *out = dp;
  return DT_OK;

destroy_dp:
  dt_dp_destroy(dp);
  return st;
}

void dt_dp_destroy(dt_dp *dp) {
  if (dp == NULL)
    return;
  int any_thread = 0;
  for (int i = 0; dp->replicas && i < dp->n; i++)
    any_thread |= dp->replicas[i].thread_started;
  if (any_thread)
    run_all(dp, DP_TASK_EXIT, "stopping");
  for (int i = 0; dp->replicas && i < dp->n; i++) {
    dp_replica *r = &dp->replicas[i];
    if (r->thread_started)
      pthread_join(r->thread, NULL);
  }
  for (int i = dp->replicas ? dp->n - 1 : -1; i >= 0; i--) {
    dp_replica *r = &dp->replicas[i];
    dt_ddp_destroy(r->ddp);
    dt_comm_destroy(r->comm);
    dt_optim_destroy(r->optim);
    dt_param_arena_destroy(r->arena);
    dt_module_destroy(r->model);
  }
  dt_local_group_release(dp->group);
  dt_nccl_clique_release(dp->clique);
  pthread_mutex_destroy(&dp->mu);
  pthread_cond_destroy(&dp->cv);
  free(dp->replicas);
  free(dp);
}

int dt_dp_num_replicas(const dt_dp *dp) { return dp->n; }

dt_status dt_dp_forward_backward(dt_dp *dp, dt_tensor *inputs, dt_tensor *labels, float loss_scale,
                                 int sync, double *loss) {
  if (inputs == NULL || labels == NULL)
    return DT_ERROR(DT_ERR_INVALID_ARG, "data-parallel step: inputs or labels is NULL");
  int64_t b = dt_tensor_ndim(inputs) > 0 ? dt_tensor_dim(inputs, 0) : 0;
  if (dt_tensor_ndim(labels) != 1 || dt_tensor_dim(labels, 0) != b)
    return DT_ERROR(DT_ERR_SHAPE, "data-parallel step: labels must be (B) for inputs of batch %lld",
                    (long long)b);
  if (b < dp->n)
    return DT_ERROR(DT_ERR_INVALID_ARG,
                    "data-parallel step: batch of %lld samples for %d replicas: every replica "
                    "needs at least one (use a batch >= %d)",
                    (long long)b, dp->n, dp->n);
  dp->inputs = inputs;
  dp->labels = labels;
  dp->batch = b;
  dp->loss_scale = loss_scale;
  dp->sync = sync;
  for (int i = 0; i < dp->n; i++) {
    dp->replicas[i].lo = b * i / dp->n;
    dp->replicas[i].hi = b * (i + 1) / dp->n;
  }
  dt_status st = run_all(dp, DP_TASK_FWD_BWD, "forward/backward");
  dp->inputs = dp->labels = NULL;
  if (st == DT_OK && loss != NULL) {
    double sum = 0;
    for (int i = 0; i < dp->n; i++)
      sum += dp->replicas[i].loss * (double)(dp->replicas[i].hi - dp->replicas[i].lo);
    *loss = sum / (double)b;
  }
  return st;
}

dt_status dt_dp_optimizer_step(dt_dp *dp) { return run_all(dp, DP_TASK_STEP, "optimizer step"); }

dt_status dt_dp_step(dt_dp *dp, dt_tensor *inputs, dt_tensor *labels, double *loss) {
  DT_CHECK(dt_dp_forward_backward(dp, inputs, labels, 1.0f, 1, loss));
  return dt_dp_optimizer_step(dp);
}

dt_status dt_dp_clip_grad_norm(dt_dp *dp, float max_norm, double *norm) {
  dp->max_norm = max_norm;
  DT_CHECK(run_all(dp, DP_TASK_CLIP, "gradient clipping"));
  if (norm)
    *norm = dp->replicas[0].norm;
  return DT_OK;
}

void dt_dp_set_lr(dt_dp *dp, float lr) {
  for (int i = 0; i < dp->n; i++)
    dt_optim_set_lr(dp->replicas[i].optim, lr);
}

dt_module *dt_dp_replica_model(const dt_dp *dp, int i) { return dp->replicas[i].model; }
dt_param_arena *dt_dp_replica_arena(const dt_dp *dp, int i) { return dp->replicas[i].arena; }
dt_optimizer *dt_dp_replica_optimizer(const dt_dp *dp, int i) { return dp->replicas[i].optim; }
dt_ddp *dt_dp_replica_ddp(const dt_dp *dp, int i) { return dp->replicas[i].ddp; }
dt_device dt_dp_replica_device(const dt_dp *dp, int i) { return dp->replicas[i].device; }
