/* The communicator's front end: creation, argument checks, submission,
 * the collectives and the backend choice. Work records and the waits on
 * them are in comm_work.c, the communication thread and the watchdog in
 * comm_thread.c. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/env.h"
#include "dist/comm_state_internal.h"
#include "dist/process_group_internal.h"

double dt_comm_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

const char *dt_coll_kind_name(dt_coll_kind k) {
  switch (k) {
    case DT_COLL_ALLREDUCE: return "allreduce";
    case DT_COLL_BROADCAST: return "broadcast";
    case DT_COLL_ALLGATHER: return "allgather";
    case DT_COLL_REDUCE_SCATTER: return "reduce_scatter";
    case DT_COLL_BARRIER: return "barrier";
  }
  return "unknown collective";
}

dt_status dt_comm_create_with_backend(const dt_comm_backend *be, void *impl, int rank, int size,
                                      const char *peers, const dt_comm_config *cfg, dt_comm **out) {
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
  pthread_mutex_init(&c->submit_mu, NULL);
  dt_comm_init_monotonic_cond(&c->cv);
  int rc = dt_comm_start_thread(c);
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
  if (c->publishes)
    c->pg->progress_claimed = 0;
  int broken = __atomic_load_n(&c->broken, __ATOMIC_ACQUIRE);
  dt_comm_staging_free(&c->staging, broken);
  c->be->destroy(c->impl, broken);
  pthread_mutex_destroy(&c->submit_mu);
  pthread_mutex_destroy(&c->mu);
  pthread_cond_destroy(&c->cv);
  free(c);
}

void dt_comm_attach_pg(dt_comm *c, dt_pg *pg) {
  c->pg = pg;
  c->publishes = !pg->progress_claimed;
  pg->progress_claimed = 1;
}

void dt_comm_note_entered(dt_comm *c, uint64_t seq) {
  if (c->publishes)
    dt_pg_note_collective(c->pg, seq, 0);
}

void dt_comm_note_completed(dt_comm *c, uint64_t seq) {
  if (c->publishes)
    dt_pg_note_collective(c->pg, 0, seq);
}

void dt_comm_abort(dt_comm *c, const char *why) {
  if (c == NULL)
    return;
  pthread_mutex_lock(&c->mu);
  if (!__atomic_load_n(&c->broken, __ATOMIC_ACQUIRE))
    snprintf(c->broken_why, sizeof c->broken_why, "aborted on rank %d: %s", c->rank,
             why ? why : "an error");
  __atomic_store_n(&c->broken, 1, __ATOMIC_RELEASE);
  pthread_mutex_unlock(&c->mu);
  dt_comm_abort_transport(c); /* one wedged in an enqueue is the watchdog's to report */
}

int dt_comm_rank(const dt_comm *c) { return c->rank; }
int dt_comm_size(const dt_comm *c) { return c->size; }
const char *dt_comm_backend_name(const dt_comm *c) { return c->be->name; }
bool dt_comm_is_nccl(const dt_comm *c) { return c != NULL && strcmp(c->be->name, "nccl") == 0; }
const char *dt_comm_transport(const dt_comm *c) {
  return c->be->transport != NULL ? c->be->transport(c->impl) : c->be->name;
}
dt_status dt_comm_shared_buffer(dt_comm *c, int64_t numel, dt_dtype dtype, dt_tensor **out) {
  if (out != NULL)
    *out = NULL;
  if (c == NULL || out == NULL || numel < 0 || (int)dtype < 0 || dtype >= DT_DTYPE_COUNT)
    return DT_ERROR(DT_ERR_INVALID_ARG,
                    "a shared buffer: communicator or out is NULL, or %lld elements of dtype %d",
                    (long long)numel, (int)dtype);
  size_t bytes = 0;
  if (__builtin_mul_overflow((size_t)numel, dt_dtype_size(dtype), &bytes))
    return DT_ERROR(DT_ERR_INVALID_ARG, "a shared buffer of %lld %s elements: too large",
                    (long long)numel, dt_dtype_name(dtype));
  if (c->be->shared_buffer == NULL || c->size == 1 || numel == 0)
    return DT_OK;
  void *data = NULL, *ctx = NULL;
  void (*release)(void *) = NULL;
  DT_CHECK(c->be->shared_buffer(c->impl, bytes, &data, &release, &ctx));
  if (data == NULL)
    return DT_OK;
  dt_status st = dt_tensor_from_cpu_memory(data, bytes, &numel, 1, dtype, release, ctx, out);
  if (st != DT_OK && release != NULL)
    release(ctx);
  return st;
}

const dt_comm_config *dt_comm_get_config(const dt_comm *c) { return &c->cfg; }
uint64_t dt_comm_seq(const dt_comm *c) { return __atomic_load_n(&c->seq, __ATOMIC_ACQUIRE); }
int dt_comm_is_broken(const dt_comm *c) { return __atomic_load_n(&c->broken, __ATOMIC_ACQUIRE); }
int dt_comm_host_waiting(const dt_comm *c) {
  return __atomic_load_n(&c->host_waiters, __ATOMIC_RELAXED) > 0;
}

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
  dt_device dev = dt_tensor_device(t);
  if (c->be->host_memory && dev.type != DT_DEVICE_CPU && !dt_comm_can_stage(dev))
    return DT_ERROR(DT_ERR_DEVICE_MISMATCH,
                    "%s on the %s communicator: %s tensor %s is neither in host memory nor on "
                    "a device whose backend has streams, events and copies to stage it through",
                    what, c->be->name, role, dt_tensor_describe(t, d, sizeof d));
  if (!c->be->host_memory && dev.type == DT_DEVICE_CPU)
    return DT_ERROR(DT_ERR_DEVICE_MISMATCH,
                    "%s on the %s communicator: %s tensor %s is in host memory: the %s backend "
                    "reduces device tensors (use the mpi backend for cpu tensors)",
                    what, c->be->name, role, dt_tensor_describe(t, d, sizeof d), c->be->name);
  return DT_OK;
}

/* The input and output buffers of a collective that has both: each a
 * valid buffer (check_buffer), both on one device. */
static dt_status check_in_out(const dt_comm *c, const char *what, const dt_tensor *in,
                              const dt_tensor *out) {
  DT_CHECK(check_buffer(c, what, "input", in));
  DT_CHECK(check_buffer(c, what, "output", out));
  if (dt_device_equal(dt_tensor_device(in), dt_tensor_device(out)))
    return DT_OK;
  char a[32], b[32];
  return DT_ERROR(DT_ERR_DEVICE_MISMATCH,
                  "%s on the %s communicator: input on %s but output on %s: put both on one "
                  "device",
                  what, c->be->name, dt_device_format(dt_tensor_device(in), a, sizeof a),
                  dt_device_format(dt_tensor_device(out), b, sizeof b));
}

/* A collective between each rank's part and their concatenation: `whole`
 * holds c->size times the elements of `part`. */
static dt_status check_whole_of_parts(const dt_comm *c, const char *what, const char *whole_name,
                                      const dt_tensor *whole, const char *part_name,
                                      const dt_tensor *part) {
  if (dt_tensor_numel(whole) == dt_tensor_numel(part) * c->size)
    return DT_OK;
  return DT_ERROR(DT_ERR_SHAPE, "%s: %s has %lld elements, expected %d ranks x %lld %s elements",
                  what, whole_name, (long long)dt_tensor_numel(whole), c->size,
                  (long long)dt_tensor_numel(part), part_name);
}

/* Device tensors: the device's backend, the readiness event (recorded on
 * the compute stream when the caller gave none) and the completion event. */
static dt_status prepare_device_work(dt_work *w, const dt_coll_opts *opts) {
  const dt_backend_ops *ops = NULL;
  DT_CHECK(dt_backend_get(w->dev, &ops));
  w->dev_ops = ops;
  if (opts == NULL || opts->ready == NULL) {
    DT_CHECK(ops->event_create(w->dev, &w->own_ready));
    DT_CHECK(ops->event_record(w->own_ready, ops->stream(w->dev, DT_STREAM_COMPUTE)));
    w->ready = w->own_ready;
  }
  return ops->event_create(w->dev, &w->done_ev);
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
  if (in != NULL && c->be->check_device != NULL)
    DT_CHECK(c->be->check_device(c->impl, dt_tensor_device(in)));
  dt_work *w = calloc(1, sizeof *w);
  if (w == NULL)
    return DT_ERROR(DT_ERR_OOM, "%s: out of host memory for a work record",
                    dt_coll_kind_name(kind));
  w->refcount = 2; /* caller + queue */
  w->comm = c;
  w->be = c->be;
  w->kind = kind;
  w->op = op;
  w->in = in ? dt_tensor_retain(in) : NULL;
  w->out = out ? dt_tensor_retain(out) : NULL;
  w->in_data = in ? dt_tensor_data(in) : NULL;
  w->out_data = out ? dt_tensor_data(out) : NULL;
  w->dev = in ? dt_tensor_device(in) : DT_CPU;
  w->root = root;
  w->bucket = opts ? opts->bucket : -1;
  w->ready = opts ? opts->ready : NULL;
  w->count = count;
  w->dtype = in ? dt_tensor_dtype(in) : DT_DTYPE_U8;
  w->elem = in ? dt_dtype_size(w->dtype) : 0;
  w->bytes = (size_t)count * w->elem;
  pthread_mutex_init(&w->mu, NULL);
  dt_comm_init_monotonic_cond(&w->cv);
  w->submitted_s = dt_comm_now();
  dt_status st = DT_OK;
  if (w->dev.type != DT_DEVICE_CPU)
    st = prepare_device_work(w, opts);
  else if (c->be->enqueue != NULL && kind != DT_COLL_BARRIER)
    st = DT_ERROR(DT_ERR_INTERNAL, "%s backend got a host tensor", c->be->name);
  if (st != DT_OK) {
    st = dt_error_wrap(st, "submitting a %s on the %s communicator", dt_coll_kind_name(kind),
                       c->be->name);
    w->refcount = 1;
    dt_work_release(w);
    return st;
  }
  if (c->be->enqueue != NULL) {
    /* Enqueue in sequence order on the caller's thread, under submit_mu
     * only; the host does not wait for the device. */
    pthread_mutex_lock(&c->submit_mu);
    pthread_mutex_lock(&c->mu);
    w->seq = ++c->seq;
    pthread_mutex_unlock(&c->mu);
    w->on_stream = 1;
    w->started_s = w->submitted_s;
    dt_comm_note_entered(c, w->seq);
    __atomic_store_n(&c->enqueue_seq, w->seq, __ATOMIC_RELEASE);
    __atomic_store_n(&c->enqueue_since_us, (int64_t)(dt_comm_now() * 1e6) | 1, __ATOMIC_RELEASE);
    st = c->be->enqueue(c->impl, w);
    __atomic_store_n(&c->enqueue_since_us, 0, __ATOMIC_RELEASE);
    if (st != DT_OK) {
      pthread_mutex_lock(&c->mu);
      /* The ranks' collectives are out of step now: nobody may hang on it. */
      if (!__atomic_load_n(&c->broken, __ATOMIC_ACQUIRE))
        snprintf(c->broken_why, sizeof c->broken_why, "enqueueing collective #%llu failed: %s",
                 (unsigned long long)w->seq, dt_last_error());
      __atomic_store_n(&c->broken, 1, __ATOMIC_RELEASE);
      pthread_mutex_unlock(&c->mu);
      pthread_mutex_unlock(&c->submit_mu);
      st = dt_error_wrap(st, "rank %d: enqueueing %s #%llu on the %s communicator", c->rank,
                         dt_coll_kind_name(kind), (unsigned long long)w->seq, c->be->name);
      w->refcount = 1;
      dt_work_release(w);
      return st;
    }
    pthread_mutex_lock(&c->mu);
  } else {
    pthread_mutex_lock(&c->mu);
    w->seq = ++c->seq;
  }
  if (c->tail)
    c->tail->next = w;
  else
    c->head = w;
  c->tail = w;
  pthread_cond_signal(&c->cv);
  pthread_mutex_unlock(&c->mu);
  if (c->be->enqueue != NULL)
    pthread_mutex_unlock(&c->submit_mu); /* after the append: queue order = seq order */
  *out_work = w;
  return DT_OK;
}

dt_status dt_comm_allreduce(dt_comm *c, dt_tensor *t, dt_reduce_op op, const dt_coll_opts *opts,
                            dt_work **out) {
  DT_CHECK(check_buffer(c, "allreduce", "the", t));
  if (!dt_comm_is_reduce_dtype(dt_tensor_dtype(t)))
    return DT_ERROR(DT_ERR_DTYPE,
                    "allreduce on the %s communicator: tensor is %s, expected f32, f16 or bf16",
                    c->be->name, dt_dtype_name(dt_tensor_dtype(t)));
  return submit(c, DT_COLL_ALLREDUCE, op, t, t, 0, dt_tensor_numel(t), opts, out);
}

dt_status dt_comm_broadcast(dt_comm *c, dt_tensor *t, int root, const dt_coll_opts *opts,
                            dt_work **out) {
  DT_CHECK(check_buffer(c, "broadcast", "the", t));
  if (root < 0 || root >= c->size)
    return DT_ERROR(DT_ERR_INVALID_ARG, "broadcast: root %d is outside the group of %d ranks", root,
                    c->size);
  return submit(c, DT_COLL_BROADCAST, DT_REDUCE_SUM, t, t, root, dt_tensor_numel(t), opts, out);
}

dt_status dt_comm_allgather(dt_comm *c, dt_tensor *in, dt_tensor *out, const dt_coll_opts *opts,
                            dt_work **out_work) {
  DT_CHECK(check_in_out(c, "allgather", in, out));
  if (dt_tensor_dtype(in) != dt_tensor_dtype(out))
    return DT_ERROR(DT_ERR_DTYPE, "allgather: input is %s but output is %s",
                    dt_dtype_name(dt_tensor_dtype(in)), dt_dtype_name(dt_tensor_dtype(out)));
  DT_CHECK(check_whole_of_parts(c, "allgather", "output", out, "input", in));
  return submit(c, DT_COLL_ALLGATHER, DT_REDUCE_SUM, in, out, 0, dt_tensor_numel(in), opts,
                out_work);
}

dt_status dt_comm_reduce_scatter(dt_comm *c, dt_tensor *in, dt_tensor *out, dt_reduce_op op,
                                 const dt_coll_opts *opts, dt_work **out_work) {
  DT_CHECK(check_in_out(c, "reduce_scatter", in, out));
  if (!dt_comm_is_reduce_dtype(dt_tensor_dtype(in)) || dt_tensor_dtype(in) != dt_tensor_dtype(out))
    return DT_ERROR(DT_ERR_DTYPE,
                    "reduce_scatter: input %s, output %s: both must be f32, or both f16, or both "
                    "bf16",
                    dt_dtype_name(dt_tensor_dtype(in)), dt_dtype_name(dt_tensor_dtype(out)));
  DT_CHECK(check_whole_of_parts(c, "reduce_scatter", "input", in, "output", out));
  return submit(c, DT_COLL_REDUCE_SCATTER, op, in, out, 0, dt_tensor_numel(out), opts, out_work);
}

dt_status dt_comm_barrier(dt_comm *c, const dt_coll_opts *opts, dt_work **out) {
  return submit(c, DT_COLL_BARRIER, DT_REDUCE_SUM, NULL, NULL, 0, 0, opts, out);
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

/* ---- backend choice ---- */

/* The choices' names, indexed by the enum: the name and the parser read them. */
static const char *const backend_choice_names[] = {
    [DT_COMM_BACKEND_AUTO] = "auto",
    [DT_COMM_BACKEND_MPI] = "mpi",
    [DT_COMM_BACKEND_NCCL] = "nccl",
};
enum { BACKEND_CHOICES = sizeof backend_choice_names / sizeof backend_choice_names[0] };

const char *dt_comm_backend_choice_name(dt_comm_backend_choice b) {
  return (unsigned)b < BACKEND_CHOICES ? backend_choice_names[b] : "unknown";
}

dt_status dt_comm_backend_parse(const char *s, dt_comm_backend_choice *out) {
  for (int i = 0; s != NULL && i < BACKEND_CHOICES; i++)
    if (strcmp(s, backend_choice_names[i]) == 0) {
      *out = (dt_comm_backend_choice)i;
      return DT_OK;
    }
  return DT_ERROR(DT_ERR_INVALID_ARG,
                  "communication backend '%s': expected auto, mpi (host memory; GPU tensors "
                  "are staged through it) or nccl",
                  s ? s : "(null)");
}

dt_status dt_comm_config_from_env(dt_comm_config *cfg) {
  if (dt_env_is_set(DT_ENV_COMM_SHM)) {
    bool shm = cfg->shm != 0;
    DT_CHECK(dt_env_bool(DT_ENV_COMM_SHM, &shm));
    cfg->shm = shm;
  }
  if (!dt_env_is_set(DT_ENV_COMM_BACKEND))
    return DT_OK;
  /* The table's choices are auto|mpi|nccl, named as dt_comm_backend_parse
   * names them. */
  DT_CHECK(dt_env_check(DT_ENV_COMM_BACKEND));
  return dt_comm_backend_parse(dt_env_raw(DT_ENV_COMM_BACKEND), &cfg->backend);
}
