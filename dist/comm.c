/* Backend-independent communicator: checks, work handles, the
 * communication thread and the watchdog. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#ifdef __linux__
#include <sched.h>
#include <sys/prctl.h>
/* Linux's SCHED_BATCH (<sched.h> names it only with _GNU_SOURCE). */
#ifdef SCHED_BATCH
#define DT_SCHED_BATCH SCHED_BATCH
#else
#define DT_SCHED_BATCH 3
#endif
#endif

#include "core/env.h"
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
  /* Stream backends: orders enqueues (seq order = queue order) without
   * holding `mu` while the transport runs, so that an enqueue blocked in
   * the transport never stalls the watchdog. */
  pthread_mutex_t submit_mu;
  int64_t
      enqueue_since_us; /* atomic: when the enqueue in progress began (dt_comm_now, µs), 0 = none */
  uint64_t enqueue_seq; /* atomic: its sequence number */
  int blocked_reported; /* watchdog only */
  int host_waiters;     /* atomic: threads blocked in host_wait on a queued work */
  int broken;           /* atomic */
  char broken_why[256];
  dt_comm_staging staging; /* host copies of device tensors (host backends) */
};

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
    if (w->be != NULL && w->be->work_free != NULL)
      w->be->work_free(w);
    if (w->dev_ops != NULL) {
      if (w->own_ready)
        w->dev_ops->event_destroy(w->own_ready);
      if (w->done_ev)
        w->dev_ops->event_destroy(w->done_ev);
    }
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
  if (w->done) { /* a stream work seen complete by a waiter and the watchdog */
    pthread_mutex_unlock(&w->mu);
    return;
  }
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

/* ---- agreement ---- */

void dt_comm_signature(const dt_work *w, int64_t sig[DT_SIG_N]) {
  sig[DT_SIG_SEQ] = (int64_t)w->seq;
  sig[DT_SIG_KIND] = w->kind;
  sig[DT_SIG_ROOT] = w->root;
  sig[DT_SIG_BYTES] = (int64_t)w->bytes;
  sig[DT_SIG_DTYPE] = w->dtype;
}

dt_status dt_comm_signatures_agree(const int64_t lo[DT_SIG_N], const int64_t hi[DT_SIG_N]) {
  int same = 1;
  for (int i = 0; i < DT_SIG_N; i++)
    same = same && lo[i] == hi[i];
  if (same)
    return DT_OK;
  return DT_ERROR(DT_ERR_DIST_MISMATCH,
                  "the ranks are not at the same collective: sequence numbers %lld..%lld, kinds "
                  "%lld..%lld, roots %lld..%lld, sizes %lld..%lld bytes, element types "
                  "%lld..%lld over the ranks: they ran different numbers of steps (uneven data, "
                  "another --max-steps or --accum) or with another batch size, model or "
                  "--grad-compress; every rank must run the same collectives",
                  (long long)lo[DT_SIG_SEQ], (long long)hi[DT_SIG_SEQ], (long long)lo[DT_SIG_KIND],
                  (long long)hi[DT_SIG_KIND], (long long)lo[DT_SIG_ROOT],
                  (long long)hi[DT_SIG_ROOT], (long long)lo[DT_SIG_BYTES],
                  (long long)hi[DT_SIG_BYTES], (long long)lo[DT_SIG_DTYPE],
                  (long long)hi[DT_SIG_DTYPE]);
}

/* ---- the communication thread ---- */

dt_status dt_comm_event_wait(const dt_backend_ops *ops, dt_event *ev, dt_work *w, double deadline) {
  if (ops->event_query == NULL)
    return ops->event_synchronize(ev);
  for (long polls = 0;; polls++) {
    int done = 0;
    DT_CHECK(ops->event_query(ev, &done));
    if (done)
      return DT_OK;
    if (dt_comm_now() > deadline) {
      w->device_stuck = 1;
      w->leaked = 1;
      return DT_ERR_TIMEOUT;
    }
    struct timespec pause = {0, polls < 100 ? 20000L : 500000L};
    nanosleep(&pause, NULL);
  }
}

static void run_one(dt_comm *c, dt_work *w) {
  char what[256];
  pthread_mutex_lock(&w->mu); /* dt_work_times may read it meanwhile */
  w->started_s = dt_comm_now();
  pthread_mutex_unlock(&w->mu);
  if (__atomic_load_n(&c->broken, __ATOMIC_ACQUIRE)) {
    describe_work(w, what, sizeof what);
    dt_status st =
        DT_ERROR(DT_ERR_STATE, "%s not run: the communicator is broken (%s)", what, c->broken_why);
    work_complete(w, st, dt_last_error());
    return;
  }
  dt_status st = DT_OK;
  double deadline = w->started_s + c->cfg.timeout_s;
  if (w->dev_ops != NULL) {
    st = dt_comm_staged_run(&c->staging, c->be, c->impl, w, deadline);
  } else {
    if (w->ready != NULL && w->in != NULL) {
      const dt_backend_ops *ops = NULL;
      st = dt_backend_get(dt_tensor_device(w->in), &ops);
      if (st == DT_OK)
        st = dt_comm_event_wait(ops, w->ready, w, deadline);
    }
    if (st == DT_OK)
      st = c->be->run(c->impl, w, deadline);
  }
  if (st == DT_ERR_TIMEOUT) {
    describe_work(w, what, sizeof what);
    /* Waiting for the device (its input's ready event, a staging copy) is
     * not waiting for the peers: say which. */
    const char *late = w->device_stuck ? "was not ready on the device" : "did not complete";
    const char *cause = w->device_stuck
                            ? "the device's stream is stuck (a hung kernel, or a failed GPU: "
                              "nvidia-smi, rerun with CUDA_LAUNCH_BLOCKING=1)"
                            : "a peer is stuck, dead or submitting collectives in a different "
                              "order";
    fprintf(stderr, "dtrain: rank %d: %s %s within %g s; %s\n", c->rank, what, late,
            c->cfg.timeout_s,
            c->cfg.abort_on_timeout ? "aborting the job" : "failing it (abort_on_timeout off)");
    fflush(stderr);
    if (c->cfg.abort_on_timeout)
      c->be->abort_job(c->impl, DT_COMM_WATCHDOG_EXIT_CODE);
    snprintf(c->broken_why, sizeof c->broken_why, "collective #%llu timed out after %g s",
             (unsigned long long)w->seq, c->cfg.timeout_s);
    __atomic_store_n(&c->broken, 1, __ATOMIC_RELEASE);
    st = DT_ERROR(DT_ERR_TIMEOUT,
                  "rank %d: %s %s within %g s: %s (raise --comm-timeout if it is only slow)",
                  c->rank, what, late, c->cfg.timeout_s, cause);
  } else if (st != DT_OK && w->peer_lost && c->cfg.abort_on_timeout) {
    /* A peer's process is gone: no later collective can complete. End the
     * job with a status the launcher's --max-restarts restarts on. */
    describe_work(w, what, sizeof what);
    fprintf(stderr, "dtrain: rank %d: %s failed: %s; aborting the job\n", c->rank, what,
            dt_last_error());
    fflush(stderr);
    c->be->abort_job(c->impl, DT_COMM_PEER_LOST_EXIT_CODE);
  } else if (st != DT_OK) {
    /* This rank did not take its part (staging, MPI, a mismatch): its next
     * collective would pair with the peers' current one, so fail every
     * later one at once instead. */
    snprintf(c->broken_why, sizeof c->broken_why, "collective #%llu failed: %s",
             (unsigned long long)w->seq, dt_last_error());
    __atomic_store_n(&c->broken, 1, __ATOMIC_RELEASE);
  }
  work_complete(w, st, st == DT_OK ? "" : dt_last_error());
}

/* Starts c's thread. `batch` (the host backends' communication thread,
 * which polls while the ranks compute): Linux's SCHED_BATCH, set before it
 * runs. The thread keeps its fair share of the core (nice 0), but its
 * wake-ups do not preempt the computation running there: it runs when the
 * computation blocks (a wait for its result) or at the end of a time
 * slice. Measured on 2 busy cores (2 ranks of 1 thread, docs/decisions.md).
 * Where the policy is refused, an ordinary thread. The thread may start
 * before the policy is set: a few of its first microseconds as an ordinary
 * thread change nothing. */
static int start_thread(dt_comm *c, void *(*fn)(void *), int batch) {
  int rc = pthread_create(&c->thread, NULL, fn, c);
#ifdef __linux__
  if (rc == 0 && batch) { /* glibc's thread attributes take no SCHED_BATCH */
    struct sched_param prio = {0};
    pthread_setschedparam(c->thread, DT_SCHED_BATCH, &prio);
  }
#else
  (void)batch;
#endif
  return rc;
}

static void *comm_thread_main(void *arg) {
  dt_comm *c = arg;
#ifdef __linux__
  /* The host backends poll with sleeps of tens of microseconds: Linux's
   * default timer slack (50 us) would stretch each to several times that. */
  prctl(PR_SET_TIMERSLACK, 1000UL, 0, 0, 0);
#endif
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

/* ---- the watchdog of stream backends ---- */

/* Pops every work still in flight and fails it with `st`. */
static void fail_in_flight(dt_comm *c, dt_status st, const char *msg) {
  pthread_mutex_lock(&c->mu);
  dt_work *w = c->head;
  c->head = c->tail = NULL;
  pthread_mutex_unlock(&c->mu);
  while (w != NULL) {
    dt_work *next = w->next;
    work_complete(w, st, msg);
    dt_work_release(w); /* the queue's reference */
    w = next;
  }
}

/* Waits at most `seconds` for `mu`; 1 when taken. */
static int lock_within(pthread_mutex_t *mu, double seconds) {
  struct timespec until;
  clock_gettime(CLOCK_REALTIME, &until); /* pthread_mutex_timedlock's clock */
  double t = (double)until.tv_sec + 1e-9 * (double)until.tv_nsec + seconds;
  until = abs_monotonic(t); /* only splits t into seconds and nanoseconds */
  return pthread_mutex_timedlock(mu, &until) == 0;
}

/* Aborts a stream backend's transport (ncclCommAbort), not while an
 * enqueue runs: the abort frees what it uses. An enqueue wedged in the
 * transport past the deadline leaves the transport as it is. */
static void abort_transport(dt_comm *c) {
  if (c->be->abort_comm && lock_within(&c->submit_mu, c->cfg.timeout_s)) {
    c->be->abort_comm(c->impl);
    pthread_mutex_unlock(&c->submit_mu);
  }
}

/* A device collective is stuck past its deadline (st DT_ERR_TIMEOUT) or
 * the transport failed: name the collective, abort the transport and,
 * with abort_on_timeout, the job. */
static void stream_failure(dt_comm *c, dt_work *w, dt_status st) {
  char what[256], why[768];
  describe_work(w, what, sizeof what);
  if (st == DT_ERR_TIMEOUT)
    snprintf(why, sizeof why, "did not complete within %g s on the device", c->cfg.timeout_s);
  else
    snprintf(why, sizeof why, "failed: %s", dt_last_error());
  fprintf(stderr, "dtrain: rank %d: %s %s; aborting the %s communicator%s\n", c->rank, what, why,
          c->be->name, c->cfg.abort_on_timeout ? " and the job" : " (abort_on_timeout off)");
  fflush(stderr);
  abort_transport(c); /* an enqueue wedged past the deadline: the job ends below */
  if (c->cfg.abort_on_timeout)
    c->be->abort_job(c->impl, DT_COMM_WATCHDOG_EXIT_CODE);
  pthread_mutex_lock(&c->mu);
  if (!__atomic_load_n(&c->broken, __ATOMIC_ACQUIRE)) {
    snprintf(c->broken_why, sizeof c->broken_why, "collective #%llu %s", (unsigned long long)w->seq,
             st == DT_ERR_TIMEOUT ? "timed out" : "failed on the device");
    __atomic_store_n(&c->broken, 1, __ATOMIC_RELEASE);
  }
  pthread_mutex_unlock(&c->mu);
  dt_status err = DT_ERROR(st == DT_ERR_TIMEOUT ? DT_ERR_TIMEOUT : st,
                           "rank %d: %s %s: the %s communicator was aborted (a peer is stuck, "
                           "dead or submitting collectives in a different order; raise "
                           "--comm-timeout if it is only slow)",
                           c->rank, what, why, c->be->name);
  fail_in_flight(c, err, dt_last_error());
}

/* Polls the oldest enqueued work until it completes, fails or passes its
 * deadline; the host never waits on the device here. */
/* An enqueue blocked in the transport (a launch queue full behind a stuck
 * NCCL kernel, say) past the deadline: name it and end the job. */
static void check_blocked_enqueue(dt_comm *c) {
  int64_t since_us = __atomic_load_n(&c->enqueue_since_us, __ATOMIC_ACQUIRE);
  if (since_us == 0 || dt_comm_now() <= 1e-6 * (double)since_us + c->cfg.timeout_s) {
    c->blocked_reported = 0;
    return;
  }
  if (c->blocked_reported)
    return;
  c->blocked_reported = 1;
  fprintf(stderr,
          "dtrain: rank %d: submitting collective #%llu to the %s communicator blocked the host "
          "for more than %g s; %s\n",
          c->rank, (unsigned long long)__atomic_load_n(&c->enqueue_seq, __ATOMIC_ACQUIRE),
          c->be->name, c->cfg.timeout_s,
          c->cfg.abort_on_timeout ? "aborting the job" : "still waiting (abort_on_timeout off)");
  fflush(stderr);
  if (c->cfg.abort_on_timeout)
    c->be->abort_job(c->impl, DT_COMM_WATCHDOG_EXIT_CODE);
}

static void *watchdog_main(void *arg) {
  dt_comm *c = arg;
  /* Idle, it still wakes every few milliseconds to watch the enqueue in
   * progress (which does not hold `mu`). */
  double idle_poll = c->cfg.timeout_s / 4 < 0.05 ? c->cfg.timeout_s / 4 : 0.05;
  for (;;) {
    pthread_mutex_lock(&c->mu);
    while (c->head == NULL && !c->stop) {
      struct timespec until = abs_monotonic(dt_comm_now() + idle_poll);
      pthread_cond_timedwait(&c->cv, &c->mu, &until);
      pthread_mutex_unlock(&c->mu);
      check_blocked_enqueue(c);
      pthread_mutex_lock(&c->mu);
    }
    dt_work *w = c->head;
    pthread_mutex_unlock(&c->mu);
    if (w == NULL)
      break; /* stop requested and nothing in flight */
    int done = 0;
    dt_status st = c->be->check_async(c->impl);
    if (st == DT_OK)
      st = c->be->query(c->impl, w, &done);
    if (st != DT_OK) {
      stream_failure(c, w, st);
      continue;
    }
    if (done) {
      pthread_mutex_lock(&c->mu);
      c->head = w->next;
      if (c->head == NULL)
        c->tail = NULL;
      pthread_mutex_unlock(&c->mu);
      work_complete(w, DT_OK, "");
      dt_work_release(w);
      continue;
    }
    if (dt_comm_now() > w->started_s + c->cfg.timeout_s) {
      stream_failure(c, w, DT_ERR_TIMEOUT);
      continue;
    }
    check_blocked_enqueue(c);
    struct timespec pause = {0, 500000L}; /* 0.5 ms: event queries are cheap */
    nanosleep(&pause, NULL);
  }
  return NULL;
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
  init_monotonic_cond(&c->cv);
  int rc = start_thread(c, be->enqueue ? watchdog_main : comm_thread_main, be->enqueue == NULL);
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
  int broken = __atomic_load_n(&c->broken, __ATOMIC_ACQUIRE);
  dt_comm_staging_free(&c->staging, broken);
  c->be->destroy(c->impl, broken);
  pthread_mutex_destroy(&c->submit_mu);
  pthread_mutex_destroy(&c->mu);
  pthread_cond_destroy(&c->cv);
  free(c);
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
  abort_transport(c); /* one wedged in an enqueue is the watchdog's to report */
}

int dt_comm_rank(const dt_comm *c) { return c->rank; }
int dt_comm_size(const dt_comm *c) { return c->size; }
const char *dt_comm_backend_name(const dt_comm *c) { return c->be->name; }
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
  init_monotonic_cond(&w->cv);
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

/* ---- waiting ---- */

/* Stream works: asks the backend whether the device finished. */
static void poll_stream_work(dt_work *w) {
  int done = 0;
  dt_comm *c = w->comm;
  dt_status st = c->be->query(c->impl, w, &done);
  if (st != DT_OK)
    work_complete(w, st, dt_last_error()); /* the watchdog reports and aborts */
  else if (done)
    work_complete(w, DT_OK, "");
}

int dt_work_test(dt_work *w) {
  pthread_mutex_lock(&w->mu);
  int done = w->done;
  pthread_mutex_unlock(&w->mu);
  if (!done && w->on_stream) {
    poll_stream_work(w);
    pthread_mutex_lock(&w->mu);
    done = w->done;
    pthread_mutex_unlock(&w->mu);
  }
  return done;
}

static dt_status timeout_error(dt_work *w, double timeout_s) {
  char what[256];
  describe_work(w, what, sizeof what);
  return DT_ERROR(DT_ERR_TIMEOUT,
                  "waiting for %s: not complete after %g s (it keeps running under the "
                  "watchdog's %g s deadline)",
                  what, timeout_s, w->comm->cfg.timeout_s);
}

/* Waits for the host-side completion of `w` (for stream works: the device's). */
static dt_status host_wait(dt_work *w, double timeout_s) {
  char what[256];
  if (w->on_stream) {
    double until = timeout_s > 0 ? dt_comm_now() + timeout_s : 0;
    for (long polls = 0; !dt_work_test(w); polls++) {
      if (until > 0 && dt_comm_now() > until)
        return timeout_error(w, timeout_s);
      struct timespec pause = {0, polls < 100 ? 20000L : 500000L};
      nanosleep(&pause, NULL);
    }
  }
  int *waiters = &w->comm->host_waiters;
  pthread_mutex_lock(&w->mu);
  if (!w->done)
    __atomic_add_fetch(waiters, 1, __ATOMIC_RELAXED);
  else
    waiters = NULL;
  if (timeout_s > 0) {
    struct timespec until = abs_monotonic(dt_comm_now() + timeout_s);
    while (!w->done) {
      if (pthread_cond_timedwait(&w->cv, &w->mu, &until) == ETIMEDOUT && !w->done) {
        pthread_mutex_unlock(&w->mu);
        __atomic_sub_fetch(waiters, 1, __ATOMIC_RELAXED);
        return timeout_error(w, timeout_s);
      }
    }
  } else {
    while (!w->done)
      pthread_cond_wait(&w->cv, &w->mu);
  }
  dt_status st = w->status;
  pthread_mutex_unlock(&w->mu);
  if (waiters != NULL)
    __atomic_sub_fetch(waiters, 1, __ATOMIC_RELAXED);
  if (st != DT_OK) {
    describe_work(w, what, sizeof what);
    return DT_ERROR(st, "%s failed: %s", what, w->error);
  }
  return DT_OK;
}

dt_status dt_work_wait(dt_work *w, double timeout_s) {
  DT_CHECK(host_wait(w, timeout_s));
  /* Host-staged: the copy back to the device was enqueued; wait for it. */
  if (w->done_ev != NULL && !w->on_stream)
    return w->dev_ops->event_synchronize(w->done_ev);
  return DT_OK;
}

dt_status dt_work_wait_stream(dt_work *w, dt_stream *s) {
  if (w->dev_ops == NULL)
    return host_wait(w, 0);
  if (s == NULL)
    s = w->dev_ops->stream(w->dev, DT_STREAM_COMPUTE);
  if (w->on_stream) {
    pthread_mutex_lock(&w->mu);
    int failed = w->done && w->status != DT_OK;
    pthread_mutex_unlock(&w->mu);
    if (failed)
      return host_wait(w, 0); /* returns the work's error */
    if (w->be->wait_stream != NULL)
      return w->be->wait_stream(w->comm->impl, w, s);
    return w->dev_ops->stream_wait_event(s, w->done_ev);
  }
  DT_CHECK(host_wait(w, 0));
  return w->dev_ops->stream_wait_event(s, w->done_ev);
}

dt_status dt_work_device_times(dt_work *w, double *start_ms, double *end_ms, double *waited_ms) {
  if (!w->on_stream || w->be->device_times == NULL)
    return DT_ERROR(DT_ERR_UNSUPPORTED,
                    "device times of a %s collective: only stream backends (nccl) time their "
                    "collectives on the device",
                    w->be->name);
  DT_CHECK(host_wait(w, 0));
  return w->be->device_times(w->comm->impl, w, start_ms, end_ms, waited_ms);
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

/* ---- backend choice ---- */

const char *dt_comm_backend_choice_name(dt_comm_backend_choice b) {
  switch (b) {
    case DT_COMM_BACKEND_AUTO: return "auto";
    case DT_COMM_BACKEND_MPI: return "mpi";
    case DT_COMM_BACKEND_NCCL: return "nccl";
  }
  return "unknown";
}

dt_status dt_comm_backend_parse(const char *s, dt_comm_backend_choice *out) {
  static const dt_comm_backend_choice all[] = {DT_COMM_BACKEND_AUTO, DT_COMM_BACKEND_MPI,
                                               DT_COMM_BACKEND_NCCL};
  for (size_t i = 0; s != NULL && i < sizeof all / sizeof all[0]; i++)
    if (strcmp(s, dt_comm_backend_choice_name(all[i])) == 0) {
      *out = all[i];
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
