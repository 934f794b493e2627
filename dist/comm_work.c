/* Work records of the communicator: their lifetime, description and
 * signature (the ranks' agreement on a collective), and the waits on
 * them. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "dist/comm_state_internal.h"

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

void dt_comm_work_complete(dt_work *w, dt_status st, const char *msg) {
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

void dt_comm_describe_work(const dt_work *w, char *buf, size_t cap) {
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

/* ---- waiting ---- */

/* Stream works: asks the backend whether the device finished. */
static void poll_stream_work(dt_work *w) {
  int done = 0;
  dt_comm *c = w->comm;
  dt_status st = c->be->query(c->impl, w, &done);
  if (st != DT_OK)
    dt_comm_work_complete(w, st, dt_last_error()); /* the watchdog reports and aborts */
  else if (done)
    dt_comm_work_complete(w, DT_OK, "");
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
  dt_comm_describe_work(w, what, sizeof what);
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
    struct timespec until = dt_comm_abs_monotonic(dt_comm_now() + timeout_s);
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
    dt_comm_describe_work(w, what, sizeof what);
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
