/* Backend-independent communicator: checks, work handles, the
 * communication thread and the watchdog. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "dist/comm_internal.h"

struct dt_comm {
  const dt_comm_backend *be;
  void *impl;
  int rank, size;
  char peers[96];
  dt_comm_config cfg;

  pthread_mutex_t mu;
  pthread_cond_t cv;
  dt_work *head, *tail; /* FIFO of submitted, not yet started works */
  int stop;
  int thread_started;
  pthread_t thread;
  uint64_t seq;
  int broken; /* atomic */
  char broken_why[256];
};

double dt_comm_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

const char *dt_coll_kind_name(dt_coll_kind k) {
  switch (k) {
  case DT_COLL_ALLREDUCE:
    return "allreduce";
  case DT_COLL_BROADCAST:
    return "broadcast";
  case DT_COLL_ALLGATHER:
    return "allgather";
  case DT_COLL_REDUCE_SCATTER:
    return "reduce_scatter";
  case DT_COLL_BARRIER:
    return "barrier";
  }
  return "unknown collective";
}

static void init_monotonic_cond(pthread_cond_t *cv) {
  pthread_condattr_t attr;
  pthread_condattr_init(&attr);
  pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
  pthread_cond_init(cv, &attr);
  pthread_condattr_destroy(&attr);
}

static struct timespec abs_monotonic(double t) {
  struct timespec ts;
  ts.tv_sec = (time_t)t;
  ts.tv_nsec = (long)((t - (double)ts.tv_sec) * 1e9);
  if (ts.tv_nsec >= 1000000000L) {
    ts.tv_sec++;
    ts.tv_nsec -= 1000000000L;
  }
  return ts;
}

/* ---- work records ---- */

static void work_free(dt_work *w) {
  if (!w->leaked) {
    dt_tensor_release(w->in);
    dt_tensor_release(w->out);
    pthread_mutex_destroy(&w->mu);
    pthread_cond_destroy(&w->cv);
    free(w);
  }
}

void dt_work_release(dt_work *w) {
  if (w != NULL && __atomic_sub_fetch(&w->refcount, 1, __ATOMIC_ACQ_REL) == 0)
    work_free(w);
}

static void work_complete(dt_work *w, dt_status st, const char *msg) {
  pthread_mutex_lock(&w->mu);
  w->status = st;
  if (st != DT_OK)
    snprintf(w->error, sizeof w->error, "%s", msg);
  w->completed_s = dt_comm_now();
  w->done = 1;
  pthread_cond_broadcast(&w->cv);
  pthread_mutex_unlock(&w->mu);
}

static void describe_work(const dt_work *w, char *buf, size_t cap) {
  char bucket[32] = "";
  if (w->bucket >= 0)
    snprintf(bucket, sizeof bucket, ", bucket %d", w->bucket);
  snprintf(buf, cap, "collective #%llu (%s%s, %zu bytes, peers %s)", (unsigned long long)w->seq,
           dt_coll_kind_name(w->kind), bucket, w->bytes, w->comm->peers);
}

/* ---- the communication thread ---- */

static void run_one(dt_comm *c, dt_work *w) {
  char what[256];
  w->started_s = dt_comm_now();
  if (__atomic_load_n(&c->broken, __ATOMIC_ACQUIRE)) {
    describe_work(w, what, sizeof what);
    dt_status st = DT_ERROR(DT_ERR_STATE, "%s not run: the communicator is broken (%s)", what,
                            c->broken_why);
    work_complete(w, st, dt_last_error());
    return;
  }
  dt_status st = DT_OK;
  if (w->ready != NULL) {
    const dt_backend_ops *ops = NULL;
    st = dt_backend_get(dt_tensor_device(w->in), &ops);
    if (st == DT_OK)
      st = ops->event_synchronize(w->ready);
  }
  if (st == DT_OK)
    st = c->be->run(c->impl, w, w->started_s + c->cfg.timeout_s);
  if (st == DT_ERR_TIMEOUT) {
    describe_work(w, what, sizeof what);
    fprintf(stderr, "dtrain: rank %d: %s did not complete within %g s; %s\n", c->rank, what,
            c->cfg.timeout_s,
            c->cfg.abort_on_timeout ? "aborting the job" : "failing it (abort_on_timeout off)");
    fflush(stderr);
    if (c->cfg.abort_on_timeout)
      c->be->abort_job(c->impl, DT_COMM_WATCHDOG_EXIT_CODE);
    snprintf(c->broken_why, sizeof c->broken_why, "collective #%llu timed out after %g s",
             (unsigned long long)w->seq, c->cfg.timeout_s);
    __atomic_store_n(&c->broken, 1, __ATOMIC_RELEASE);
    st = DT_ERROR(DT_ERR_TIMEOUT,
                  "rank %d: %s did not complete within %g s: a peer is stuck, dead or "
                  "submitting collectives in a different order (raise --comm-timeout if "
                  "it is only slow)",
                  c->rank, what, c->cfg.timeout_s);
  }
  work_complete(w, st, st == DT_OK ? "" : dt_last_error());
}

static void *comm_thread_main(void *arg) {
  dt_comm *c = arg;
  for (;;) {
    pthread_mutex_lock(&c->mu);
    while (c->head == NULL && !c->stop)
      pthread_cond_wait(&c->cv, &c->mu);
    dt_work *w = c->head;
    if (w == NULL) { /* stop requested and the queue is drained */
      pthread_mutex_unlock(&c->mu);
      break;
    }
    c->head = w->next;
    if (c->head == NULL)
      c->tail = NULL;
    pthread_mutex_unlock(&c->mu);
    run_one(c, w);
    dt_work_release(w); /* the queue's reference */
  }
  return NULL;
}

dt_status dt_comm_create_with_backend(const dt_comm_backend *be, void *impl, int rank, int size,
                                      const char *peers, const dt_comm_config *cfg,
                                      dt_comm **out) {
  dt_comm_config cc = cfg ? *cfg : DT_COMM_CONFIG_DEFAULT;
  *out = NULL;
  if (!(cc.timeout_s > 0)) {
    be->destroy(impl, 0);
    return DT_ERROR(DT_ERR_INVALID_ARG,
                    "communicator timeout %g s: must be > 0 (default 300; --comm-timeout)",
                    cc.timeout_s);
  }
  dt_comm *c = calloc(1, sizeof *c);
  if (c == NULL) {
    be->destroy(impl, 0);
    return DT_ERROR(DT_ERR_OOM, "creating a %s communicator: out of host memory", be->name);
  }
  c->be = be;
  c->impl = impl;
  c->rank = rank;
  c->size = size;
  c->cfg = cc;
  snprintf(c->peers, sizeof c->peers, "%s", peers);
  pthread_mutex_init(&c->mu, NULL);
  pthread_cond_init(&c->cv, NULL);
  int rc = pthread_create(&c->thread, NULL, comm_thread_main, c);
  if (rc != 0) {
    dt_comm_destroy(c);
    return DT_ERROR(DT_ERR_INTERNAL, "starting the %s communication thread: %s", be->name,
                    strerror(rc));
  }
  c->thread_started = 1;
  *out = c;
  return DT_OK;
}

void dt_comm_destroy(dt_comm *c) {
  if (c == NULL)
    return;
  if (c->thread_started) {
    pthread_mutex_lock(&c->mu);
    c->stop = 1;
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
    pthread_join(c->thread, NULL);
  }
  c->be->destroy(c->impl, __atomic_load_n(&c->broken, __ATOMIC_ACQUIRE));
  pthread_mutex_destroy(&c->mu);
  pthread_cond_destroy(&c->cv);
  free(c);
}

int dt_comm_rank(const dt_comm *c) { return c->rank; }
int dt_comm_size(const dt_comm *c) { return c->size; }
const char *dt_comm_backend_name(const dt_comm *c) { return c->be->name; }
const dt_comm_config *dt_comm_get_config(const dt_comm *c) { return &c->cfg; }
uint64_t dt_comm_seq(const dt_comm *c) {
  return __atomic_load_n(&c->seq, __ATOMIC_ACQUIRE);
}
int dt_comm_is_broken(const dt_comm *c) { return __atomic_load_n(&c->broken, __ATOMIC_ACQUIRE); }

/* ---- submission ---- */

static dt_status check_buffer(const dt_comm *c, const char *what, const char *role,
                              const dt_tensor *t) {
  char d[160];
  if (t == NULL)
    return DT_ERROR(DT_ERR_INVALID_ARG, "%s on the %s communicator: %s tensor is NULL", what,
                    c->be->name, role);
  if (!dt_tensor_is_contiguous(t))
    return DT_ERROR(DT_ERR_INVALID_ARG,
                    "%s on the %s communicator: %s tensor %s is not contiguous (pass "
                    "dt_tensor_contiguous() of it)",
                    what, c->be->name, role, dt_tensor_describe(t, d, sizeof d));
  if (c->be->host_memory && dt_tensor_device(t).type != DT_DEVICE_CPU)
    return DT_ERROR(DT_ERR_DEVICE_MISMATCH,
                    "%s on the %s communicator: %s tensor %s is not in host memory (the %s "
                    "backend reduces cpu tensors; use the nccl backend for cuda)",
                    what, c->be->name, role, dt_tensor_describe(t, d, sizeof d), c->be->name);
  return DT_OK;
}

static dt_status submit(dt_comm *c, dt_coll_kind kind, dt_reduce_op op, dt_tensor *in,
                        dt_tensor *out, int root, int64_t count, const dt_coll_opts *opts,
                        dt_work **out_work) {
  if (out_work == NULL)
    return DT_ERROR(DT_ERR_INVALID_ARG, "%s: out work pointer is NULL", dt_coll_kind_name(kind));
  *out_work = NULL;
  if (__atomic_load_n(&c->broken, __ATOMIC_ACQUIRE))
    return DT_ERROR(DT_ERR_STATE,
                    "%s on the %s communicator of rank %d: the communicator is broken (%s); "
                    "create a new job",
                    dt_coll_kind_name(kind), c->be->name, c->rank, c->broken_why);
  dt_work *w = calloc(1, sizeof *w);
  if (w == NULL)
    return DT_ERROR(DT_ERR_OOM, "%s: out of host memory for a work record",
                    dt_coll_kind_name(kind));
  w->refcount = 2; /* caller + queue */
  w->comm = c;
  w->kind = kind;
  w->op = op;
  w->in = in ? dt_tensor_retain(in) : NULL;
  w->out = out ? dt_tensor_retain(out) : NULL;
  w->root = root;
  w->bucket = opts ? opts->bucket : -1;
  w->ready = opts ? opts->ready : NULL;
  w->count = count;
  w->elem = in ? dt_dtype_size(dt_tensor_dtype(in)) : 0;
  w->bytes = (size_t)count * w->elem;
  pthread_mutex_init(&w->mu, NULL);
  init_monotonic_cond(&w->cv);
  w->submitted_s = dt_comm_now();
  pthread_mutex_lock(&c->mu);
  w->seq = ++c->seq;
  if (c->tail)
    c->tail->next = w;
  else
    c->head = w;
  c->tail = w;
  pthread_cond_signal(&c->cv);
  pthread_mutex_unlock(&c->mu);
  *out_work = w;
  return DT_OK;
}

dt_status dt_comm_allreduce(dt_comm *c, dt_tensor *t, dt_reduce_op op, const dt_coll_opts *opts,
                            dt_work **out) {
  DT_CHECK(check_buffer(c, "allreduce", "the", t));
  if (dt_tensor_dtype(t) != DT_DTYPE_F32)
    return DT_ERROR(DT_ERR_DTYPE, "allreduce on the %s communicator: tensor is %s, expected f32",
                    c->be->name, dt_dtype_name(dt_tensor_dtype(t)));
  return submit(c, DT_COLL_ALLREDUCE, op, t, t, 0, dt_tensor_numel(t), opts, out);
}

dt_status dt_comm_broadcast(dt_comm *c, dt_tensor *t, int root, const dt_coll_opts *opts,
                            dt_work **out) {
  DT_CHECK(check_buffer(c, "broadcast", "the", t));
  if (root < 0 || root >= c->size)
    return DT_ERROR(DT_ERR_INVALID_ARG, "broadcast: root %d is outside the group of %d ranks",
                    root, c->size);
  return submit(c, DT_COLL_BROADCAST, DT_REDUCE_SUM, t, t, root, dt_tensor_numel(t), opts, out);
}

dt_status dt_comm_allgather(dt_comm *c, dt_tensor *in, dt_tensor *out, const dt_coll_opts *opts,
                            dt_work **out_work) {
  DT_CHECK(check_buffer(c, "allgather", "input", in));
  DT_CHECK(check_buffer(c, "allgather", "output", out));
  if (dt_tensor_dtype(in) != dt_tensor_dtype(out))
    return DT_ERROR(DT_ERR_DTYPE, "allgather: input is %s but output is %s",
                    dt_dtype_name(dt_tensor_dtype(in)), dt_dtype_name(dt_tensor_dtype(out)));
  if (dt_tensor_numel(out) != dt_tensor_numel(in) * c->size)
    return DT_ERROR(DT_ERR_SHAPE,
                    "allgather: output has %lld elements, expected %d ranks x %lld input "
                    "elements",
                    (long long)dt_tensor_numel(out), c->size, (long long)dt_tensor_numel(in));
  return submit(c, DT_COLL_ALLGATHER, DT_REDUCE_SUM, in, out, 0, dt_tensor_numel(in), opts,
                out_work);
}

dt_status dt_comm_reduce_scatter(dt_comm *c, dt_tensor *in, dt_tensor *out, dt_reduce_op op,
                                 const dt_coll_opts *opts, dt_work **out_work) {
  DT_CHECK(check_buffer(c, "reduce_scatter", "input", in));
  DT_CHECK(check_buffer(c, "reduce_scatter", "output", out));
  if (dt_tensor_dtype(in) != DT_DTYPE_F32 || dt_tensor_dtype(out) != DT_DTYPE_F32)
    return DT_ERROR(DT_ERR_DTYPE, "reduce_scatter: input %s, output %s: both must be f32",
                    dt_dtype_name(dt_tensor_dtype(in)), dt_dtype_name(dt_tensor_dtype(out)));
  if (dt_tensor_numel(in) != dt_tensor_numel(out) * c->size)
    return DT_ERROR(DT_ERR_SHAPE,
                    "reduce_scatter: input has %lld elements, expected %d ranks x %lld output "
                    "elements",
                    (long long)dt_tensor_numel(in), c->size, (long long)dt_tensor_numel(out));
  return submit(c, DT_COLL_REDUCE_SCATTER, op, in, out, 0, dt_tensor_numel(out), opts,
                out_work);
}

dt_status dt_comm_barrier(dt_comm *c, const dt_coll_opts *opts, dt_work **out) {
  return submit(c, DT_COLL_BARRIER, DT_REDUCE_SUM, NULL, NULL, 0, 0, opts, out);
}

/* ---- waiting ---- */

dt_status dt_work_wait(dt_work *w, double timeout_s) {
  char what[256];
  pthread_mutex_lock(&w->mu);
  if (timeout_s > 0) {
    struct timespec until = abs_monotonic(dt_comm_now() + timeout_s);
    while (!w->done) {
      if (pthread_cond_timedwait(&w->cv, &w->mu, &until) == ETIMEDOUT && !w->done) {
        pthread_mutex_unlock(&w->mu);
        describe_work(w, what, sizeof what);
        return DT_ERROR(DT_ERR_TIMEOUT,
                        "waiting for %s: not complete after %g s (it keeps running under the "
                        "watchdog's %g s deadline)",
                        what, timeout_s, w->comm->cfg.timeout_s);
      }
    }
  } else {
    while (!w->done)
      pthread_cond_wait(&w->cv, &w->mu);
  }
  dt_status st = w->status;
  pthread_mutex_unlock(&w->mu);
  if (st != DT_OK) {
    describe_work(w, what, sizeof what);
    return DT_ERROR(st, "%s failed: %s", what, w->error);
  }
  return DT_OK;
}

int dt_work_test(dt_work *w) {
  pthread_mutex_lock(&w->mu);
  int done = w->done;
  pthread_mutex_unlock(&w->mu);
  return done;
}

uint64_t dt_work_seq(const dt_work *w) { return w->seq; }

void dt_work_times(const dt_work *w, double *submitted, double *started, double *completed) {
  dt_work *mw = (dt_work *)w;
  pthread_mutex_lock(&mw->mu);
  if (submitted)
    *submitted = w->submitted_s;
  if (started)
    *started = w->started_s;
  if (completed)
    *completed = w->done ? w->completed_s : 0.0;
  pthread_mutex_unlock(&mw->mu);
}

static dt_status wait_release(dt_status submitted, dt_work **w) {
  if (submitted != DT_OK)
    return submitted;
  dt_status st = dt_work_wait(*w, 0);
  dt_work_release(*w);
  return st;
}

dt_status dt_comm_allreduce_sync(dt_comm *c, dt_tensor *t, dt_reduce_op op) {
  dt_work *w = NULL;
  dt_status st = dt_comm_allreduce(c, t, op, NULL, &w);
  return wait_release(st, &w);
}

dt_status dt_comm_broadcast_sync(dt_comm *c, dt_tensor *t, int root) {
  dt_work *w = NULL;
  dt_status st = dt_comm_broadcast(c, t, root, NULL, &w);
  return wait_release(st, &w);
}

dt_status dt_comm_allgather_sync(dt_comm *c, dt_tensor *in, dt_tensor *out) {
  dt_work *w = NULL;
  dt_status st = dt_comm_allgather(c, in, out, NULL, &w);
  return wait_release(st, &w);
}

dt_status dt_comm_barrier_sync(dt_comm *c) {
  dt_work *w = NULL;
  dt_status st = dt_comm_barrier(c, NULL, &w);
  return wait_release(st, &w);
}
