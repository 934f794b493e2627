/* The communicator's threads: the communication thread that runs a host
 * backend's collectives one at a time, and the watchdog that polls a
 * stream backend's enqueued collectives against their deadlines. */
#include <stdio.h>
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

#include "dist/comm_state_internal.h"
#include "dist/process_group_internal.h"

void dt_comm_init_monotonic_cond(pthread_cond_t *cv) {
  pthread_condattr_t attr;
  pthread_condattr_init(&attr);
  pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
  pthread_cond_init(cv, &attr);
  pthread_condattr_destroy(&attr);
}

struct timespec dt_comm_abs_monotonic(double t) {
  struct timespec ts;
  ts.tv_sec = (time_t)t;
  ts.tv_nsec = (long)((t - (double)ts.tv_sec) * 1e9);
  if (ts.tv_nsec >= 1000000000L) {
    ts.tv_sec++;
    ts.tv_nsec -= 1000000000L;
  }
  return ts;
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

/* " in PHASE" (this rank's phase, when it named one) into phase, and into
 * behind who keeps collective w waiting: the ranks of this host that did
 * not arrive (the group's progress table), "" when not known. */
static void describe_stall(const dt_comm *c, const dt_work *w, char *phase, size_t phase_cap,
                           char *behind, size_t behind_cap) {
  char name[128];
  dt_pg_phase(c->pg, name, sizeof name);
  snprintf(phase, phase_cap, "%s%s", name[0] ? " in " : "", name);
  behind[0] = '\0';
  /* Only the collectives the table holds compare; a stuck device is this
   * rank's own. */
  if (c->publishes && !w->device_stuck)
    dt_pg_describe_behind(c->pg, 0, w->seq, behind, behind_cap);
}

static void run_one(dt_comm *c, dt_work *w) {
  char what[256];
  pthread_mutex_lock(&w->mu); /* dt_work_times may read it meanwhile */
  w->started_s = dt_comm_now();
  pthread_mutex_unlock(&w->mu);
  dt_comm_note_entered(c, w->seq);
  if (__atomic_load_n(&c->broken, __ATOMIC_ACQUIRE)) {
    dt_comm_describe_work(w, what, sizeof what);
    dt_status st =
        DT_ERROR(DT_ERR_STATE, "%s not run: the communicator is broken (%s)", what, c->broken_why);
    dt_comm_work_complete(w, st, dt_last_error());
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
    dt_comm_describe_work(w, what, sizeof what);
    /* Waiting for the device (its input's ready event, a staging copy) is
     * not waiting for the peers: say which. */
    const char *late = w->device_stuck ? "was not ready on the device" : "did not complete";
    const char *cause = w->device_stuck
                            ? "the device's stream is stuck (a hung kernel, or a failed GPU: "
                              "nvidia-smi, rerun with CUDA_LAUNCH_BLOCKING=1)"
                            : "a peer is stuck, dead or submitting collectives in a different "
                              "order";
    char phase[160], behind[1024] = "";
    describe_stall(c, w, phase, sizeof phase, behind, sizeof behind);
    fprintf(stderr, "dtrain: rank %d: %s%s %s within %g s%s%s; %s\n", c->rank, what, phase, late,
            c->cfg.timeout_s, behind[0] ? ": " : "", behind,
            c->cfg.abort_on_timeout ? "aborting the job" : "failing it (abort_on_timeout off)");
    fflush(stderr);
    if (c->cfg.abort_on_timeout)
      c->be->abort_job(c->impl, DT_COMM_WATCHDOG_EXIT_CODE);
    snprintf(c->broken_why, sizeof c->broken_why, "collective #%llu timed out after %g s",
             (unsigned long long)w->seq, c->cfg.timeout_s);
    __atomic_store_n(&c->broken, 1, __ATOMIC_RELEASE);
    st = DT_ERROR(DT_ERR_TIMEOUT,
                  "rank %d: %s%s %s within %g s: %s%s%s (raise --comm-timeout if it is only slow)",
                  c->rank, what, phase, late, c->cfg.timeout_s, cause, behind[0] ? "; " : "",
                  behind);
  } else if (st != DT_OK && w->peer_lost && c->cfg.abort_on_timeout) {
    /* A peer's process is gone: no later collective can complete. End the
     * job with a status the launcher's --max-restarts restarts on. */
    dt_comm_describe_work(w, what, sizeof what);
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
  if (st == DT_OK)
    dt_comm_note_completed(c, w->seq);
  dt_comm_work_complete(w, st, st == DT_OK ? "" : dt_last_error());
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
    dt_comm_work_complete(w, st, msg);
    dt_work_release(w); /* the queue's reference */
    w = next;
  }
}

/* Waits at most `seconds` for `mu`; 1 when taken. */
static int lock_within(pthread_mutex_t *mu, double seconds) {
  struct timespec until;
  clock_gettime(CLOCK_REALTIME, &until); /* pthread_mutex_timedlock's clock */
  double t = (double)until.tv_sec + 1e-9 * (double)until.tv_nsec + seconds;
  until = dt_comm_abs_monotonic(t); /* only splits t into seconds and nanoseconds */
  return pthread_mutex_timedlock(mu, &until) == 0;
}

/* Aborts a stream backend's transport (ncclCommAbort), not while an
 * enqueue runs: the abort frees what it uses. An enqueue wedged in the
 * transport past the deadline leaves the transport as it is. */
void dt_comm_abort_transport(dt_comm *c) {
  if (c->be->abort_comm && lock_within(&c->submit_mu, c->cfg.timeout_s)) {
    c->be->abort_comm(c->impl);
    pthread_mutex_unlock(&c->submit_mu);
  }
}

/* A device collective is stuck past its deadline (st DT_ERR_TIMEOUT) or
 * the transport failed: name the collective, abort the transport and,
 * with abort_on_timeout, the job. */
static void stream_failure(dt_comm *c, dt_work *w, dt_status st) {
  char what[256], why[768], phase[160], behind[1024];
  dt_comm_describe_work(w, what, sizeof what);
  describe_stall(c, w, phase, sizeof phase, behind, sizeof behind);
  if (st == DT_ERR_TIMEOUT)
    snprintf(why, sizeof why, "did not complete within %g s on the device%s%s", c->cfg.timeout_s,
             behind[0] ? ": " : "", behind);
  else
    snprintf(why, sizeof why, "failed: %s", dt_last_error());
  fprintf(stderr, "dtrain: rank %d: %s%s %s; aborting the %s communicator%s\n", c->rank, what,
          phase, why, c->be->name,
          c->cfg.abort_on_timeout ? " and the job" : " (abort_on_timeout off)");
  fflush(stderr);
  dt_comm_abort_transport(c); /* an enqueue wedged past the deadline: the job ends below */
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

/* Polls the oldest enqueued work until it completes, fails or passes its
 * deadline; the host never waits on the device here. */
static void *watchdog_main(void *arg) {
  dt_comm *c = arg;
  /* Idle, it still wakes every few milliseconds to watch the enqueue in
   * progress (which does not hold `mu`). */
  double idle_poll = c->cfg.timeout_s / 4 < 0.05 ? c->cfg.timeout_s / 4 : 0.05;
  for (;;) {
    pthread_mutex_lock(&c->mu);
    while (c->head == NULL && !c->stop) {
      struct timespec until = dt_comm_abs_monotonic(dt_comm_now() + idle_poll);
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
      dt_comm_note_completed(c, w->seq);
      dt_comm_work_complete(w, DT_OK, "");
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

int dt_comm_start_thread(dt_comm *c) {
  return start_thread(c, c->be->enqueue ? watchdog_main : comm_thread_main, c->be->enqueue == NULL);
}
