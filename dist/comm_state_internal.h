/* The communicator's own state, shared by the files that make it up
 * (internal to comm*.c; the backends see only comm_internal.h):
 *   comm.c         the front end: creation, argument checks, submission,
 *                  the collectives and the backend choice;
 *   comm_work.c    work records: lifetime, description, the ranks'
 *                  signatures of them, and the waits on them;
 *   comm_thread.c  the communication thread of host backends and the
 *                  watchdog of stream backends. */
#ifndef DT_DIST_COMM_STATE_INTERNAL_H
#define DT_DIST_COMM_STATE_INTERNAL_H

#include <pthread.h>
#include <stdint.h>
#include <time.h>

#include "dist/comm_internal.h"

#ifdef __cplusplus
extern "C" {
#endif

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
  /* The group every rank of which this communicator spans (mpi, nccl),
   * else NULL; `publishes`: its collectives go into pg's progress table. */
  dt_pg *pg;
  int publishes;
};

/* A condition variable timed on CLOCK_MONOTONIC (dt_comm_now's clock). */
void dt_comm_init_monotonic_cond(pthread_cond_t *cv);
/* dt_comm_now() time t as an absolute timespec for the timed waits. */
struct timespec dt_comm_abs_monotonic(double t);

/* ---- work records (comm_work.c) ---- */

/* Completes `w` with `st` (and `msg` when it failed) and wakes its waiters;
 * a work already complete stays as it is. */
void dt_comm_work_complete(dt_work *w, dt_status st, const char *msg);
/* "collective #seq (kind, bucket b, n bytes, peers ...)" into buf. */
void dt_comm_describe_work(const dt_work *w, char *buf, size_t cap);

/* Publishes collective `seq` as begun (entered) or completed in the
 * group's progress table, when this communicator is the one that does. */
void dt_comm_note_entered(dt_comm *c, uint64_t seq);
void dt_comm_note_completed(dt_comm *c, uint64_t seq);

/* ---- threads (comm_thread.c) ---- */

/* Starts c's thread: the communication thread of a host backend, or the
 * watchdog of a stream backend (be->enqueue set). pthread_create's code. */
int dt_comm_start_thread(dt_comm *c);
/* Aborts a stream backend's transport (ncclCommAbort), not while an
 * enqueue runs: the abort frees what it uses. An enqueue wedged in the
 * transport past the deadline leaves the transport as it is. */
void dt_comm_abort_transport(dt_comm *c);

#ifdef __cplusplus
}
#endif
#endif
