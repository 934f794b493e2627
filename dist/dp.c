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

typedef enum dp_task {
  DP_TASK_NONE = 0,
  DP_TASK_BUILD,   /* model, arena, optimizer */
  DP_TASK_CONNECT, /* DDP reducer (collective over the replicas) */
  DP_TASK_FWD_BWD,
  DP_TASK_UPDATE,
  DP_TASK_ZERO_GRAD,
  DP_TASK_EXIT,
} dp_task;

typedef struct dp_worker {
  dt_dp *dp;
  int index;
  dt_device device;
  pthread_t thread;
  bool thread_started;
  dt_comm *comm; /* until the replica takes it (DP_TASK_CONNECT) */
  dt_replica *replica;
  /* per task */
  dt_status status;
  char error[1024];
  double loss;    /* unscaled mean over this replica's samples */
  int64_t lo, hi; /* sample range of the current batch */
} dp_worker;

struct dt_dp {
  int n;
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
  dt_tensor *inputs, *targets;
  int64_t batch;
  float loss_scale;
  bool sync;

  dp_worker workers[]; /* n */
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

static dt_status worker_build(dp_worker *w) {
  dt_dp *dp = w->dp;
  dt_module *model = NULL;
  DT_CHECK(dp->model_fn(dp->model_user, w->index, &model));
  return dt_replica_create(model, w->device, w->index, dp->optim_fn, dp->optim_user, &dp->cfg.step,
                           &w->replica);
}

static dt_status worker_connect(dp_worker *w) {
  dt_comm *comm = w->comm;
  w->comm = NULL; /* the replica's now, also on failure */
  return dt_replica_connect(w->replica, comm, &w->dp->cfg.ddp);
}

static dt_status worker_forward_backward(dp_worker *w) {
  dt_dp *dp = w->dp;
  dt_tensor *x = NULL, *y = NULL, *loss = NULL;
  /* Weight n*b_r/B makes the average over replicas the global mean. */
  float weight =
      (float)((double)dp->n * (double)(w->hi - w->lo) / (double)dp->batch) * dp->loss_scale;
  dt_status st = to_replica(dp->inputs, w->lo, w->hi, w->device, &x);
  if (st == DT_OK)
    st = to_replica(dp->targets, w->lo, w->hi, w->device, &y);
  if (st == DT_OK)
    st = dt_step_forward_backward(dt_replica_step(w->replica), x, y, weight, dp->sync, &loss);
  else if (dp->sync) /* no slice, no step; the other replicas wait for this one's buckets */
    dt_ddp_finish_backward(dt_replica_ddp(w->replica));
  if (st == DT_OK)
    st = dt_tensor_item(loss, 0, &w->loss);
  dt_tensor_release(loss);
  dt_tensor_release(y);
  dt_tensor_release(x);
  return st;
}

static dt_status worker_run(dp_worker *w, dp_task task) {
  switch (task) {
    case DP_TASK_BUILD: return worker_build(w);
    case DP_TASK_CONNECT: return worker_connect(w);
    case DP_TASK_FWD_BWD: return worker_forward_backward(w);
    case DP_TASK_UPDATE: return dt_step_update(dt_replica_step(w->replica));
    case DP_TASK_ZERO_GRAD: return dt_optim_zero_grad(dt_replica_optimizer(w->replica));
    case DP_TASK_NONE:
    case DP_TASK_EXIT: return DT_OK;
  }
  return DT_ERROR(DT_ERR_INTERNAL, "unknown data-parallel task %d", (int)task);
}

static void *worker_thread(void *arg) {
  dp_worker *w = arg;
  dt_dp *dp = w->dp;
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
    w->status = worker_run(w, task);
    snprintf(w->error, sizeof w->error, "%s", w->status == DT_OK ? "" : dt_last_error());
    pthread_mutex_lock(&dp->mu);
    dp->n_done++;
    pthread_cond_broadcast(&dp->cv);
    pthread_mutex_unlock(&dp->mu);
  }
  return NULL;
}

/* Runs `task` on every worker thread and waits for all of them. */
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
    dp_worker *w = &dp->workers[i];
    if (w->status != DT_OK) {
      char dev[32];
      return DT_ERROR(w->status, "data-parallel %s: replica %d (%s): %s", what, i,
                      dt_device_format(w->device, dev, sizeof dev), w->error);
    }
  }
  return DT_OK;
}

/* Stops the threads, then frees each replica (and a communicator no replica
 * took), the last first. */
void dt_dp_destroy(dt_dp *dp) {
  if (dp == NULL)
    return;
  bool any_thread = false;
  for (int i = 0; i < dp->n; i++)
    any_thread |= dp->workers[i].thread_started;
  if (any_thread)
    run_all(dp, DP_TASK_EXIT, "stopping");
  for (int i = dp->n - 1; i >= 0; i--) {
    dp_worker *w = &dp->workers[i];
    if (w->thread_started)
      pthread_join(w->thread, NULL);
    dt_replica_destroy(w->replica);
    dt_comm_destroy(w->comm);
  }
  dt_local_group_release(dp->group);
  dt_nccl_clique_release(dp->clique);
  pthread_mutex_destroy(&dp->mu);
  pthread_cond_destroy(&dp->cv);
  free(dp);
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

/* A communicator per replica, then its thread. */
static dt_status start_workers(dt_dp *dp, const dt_device *devices) {
  for (int i = 0; i < dp->n; i++) {
    dp_worker *w = &dp->workers[i];
    w->dp = dp;
    w->index = i;
    w->device = devices[i];
    if (dp->clique != NULL)
      DT_CHECK(dt_comm_create_nccl_clique(dp->clique, i, &dp->cfg.comm, &w->comm));
    else
      DT_CHECK(dt_comm_create_local(dp->group, i, &dp->cfg.comm, &w->comm));
    int rc = pthread_create(&w->thread, NULL, worker_thread, w);
    if (rc != 0)
      return DT_ERROR(DT_ERR_INTERNAL, "data-parallel mode: starting replica thread %d: %s", i,
                      strerror(rc));
    w->thread_started = true;
  }
  return DT_OK;
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
  dt_dp_config c = cfg ? *cfg : DT_DP_CONFIG_DEFAULT;
  if (c.step.loss == NULL)
    return DT_ERROR(DT_ERR_INVALID_ARG,
                    "data-parallel mode: no loss: set dt_dp_config.step.loss (the task's loss, "
                    "models/tasks.h)");
  if (c.threads_per_replica < 0)
    return DT_ERROR(DT_ERR_INVALID_ARG,
                    "data-parallel mode: threads_per_replica is %d: give a count >= 1, or 0 to "
                    "share the calling thread's count among the replicas",
                    c.threads_per_replica);
  DT_CHECK(check_devices(devices, n_devices));
  dt_dp *dp = calloc(1, sizeof *dp + (size_t)n_devices * sizeof dp->workers[0]);
  if (dp == NULL)
    return DT_ERROR(DT_ERR_OOM, "data-parallel mode: out of host memory for %d replicas",
                    n_devices);
  dp->cfg = c;
  dp->n = n_devices;
  dp->threads =
      c.threads_per_replica > 0 ? c.threads_per_replica : dt_cpu_num_threads() / n_devices;
  if (dp->threads < 1)
    dp->threads = 1;
  pthread_mutex_init(&dp->mu, NULL);
  pthread_cond_init(&dp->cv, NULL);
  dt_status st = DT_OK;
  DT_CHECK_GOTO(create_group(dp, devices, n_devices), st, destroy_dp);
  DT_CHECK_GOTO(start_workers(dp, devices), st, destroy_dp);
  dp->model_fn = model_fn;
  dp->model_user = model_user;
  dp->optim_fn = optim_fn;
  dp->optim_user = optim_user;
  /* Build everything local first: the DDP step is collective, so it must
   * start on every replica or on none. */
  DT_CHECK_GOTO(run_all(dp, DP_TASK_BUILD, "building the replicas"), st, destroy_dp);
  DT_CHECK_GOTO(run_all(dp, DP_TASK_CONNECT, "creating the reducers"), st, destroy_dp);
  dp->model_fn = NULL;
  dp->optim_fn = NULL;
  *out = dp;
  return DT_OK;

destroy_dp:
  dt_dp_destroy(dp);
  return st;
}

int dt_dp_num_replicas(const dt_dp *dp) { return dp->n; }

dt_status dt_dp_forward_backward(dt_dp *dp, dt_tensor *inputs, dt_tensor *targets, float loss_scale,
                                 bool sync, double *loss) {
  if (inputs == NULL || targets == NULL)
    return DT_ERROR(DT_ERR_INVALID_ARG, "data-parallel step: inputs or targets is NULL");
  int64_t b = dt_tensor_ndim(inputs) > 0 ? dt_tensor_dim(inputs, 0) : 0;
  if (dt_tensor_ndim(targets) < 1 || dt_tensor_dim(targets, 0) != b)
    return DT_ERROR(DT_ERR_SHAPE,
                    "data-parallel step: targets must be (B, ...) for inputs of batch %lld",
                    (long long)b);
  if (b < dp->n)
    return DT_ERROR(DT_ERR_INVALID_ARG,
                    "data-parallel step: batch of %lld samples for %d replicas: every replica "
                    "needs at least one (use a batch >= %d)",
                    (long long)b, dp->n, dp->n);
  dp->inputs = inputs;
  dp->targets = targets;
  dp->batch = b;
  dp->loss_scale = loss_scale;
  dp->sync = sync;
  for (int i = 0; i < dp->n; i++) {
    dp->workers[i].lo = b * i / dp->n;
    dp->workers[i].hi = b * (i + 1) / dp->n;
  }
  dt_status st = run_all(dp, DP_TASK_FWD_BWD, "forward/backward");
  dp->inputs = dp->targets = NULL;
  if (st == DT_OK && loss != NULL) {
    double sum = 0;
    for (int i = 0; i < dp->n; i++)
      sum += dp->workers[i].loss * (double)(dp->workers[i].hi - dp->workers[i].lo);
    *loss = sum / (double)b;
  }
  return st;
}

dt_status dt_dp_optimizer_step(dt_dp *dp) { return run_all(dp, DP_TASK_UPDATE, "optimizer step"); }

dt_status dt_dp_zero_grad(dt_dp *dp) { return run_all(dp, DP_TASK_ZERO_GRAD, "zero_grad"); }

dt_status dt_dp_step(dt_dp *dp, dt_tensor *inputs, dt_tensor *targets, double *loss) {
  DT_CHECK(dt_dp_forward_backward(dp, inputs, targets, 1.0f, true, loss));
  return dt_dp_optimizer_step(dp);
}

dt_replica *dt_dp_replica(const dt_dp *dp, int i) { return dp->workers[i].replica; }
