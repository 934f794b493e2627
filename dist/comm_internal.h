/* Communicator internals: the backend vtable and the work record.
 *
 * comm.c owns what every backend shares: argument checks, sequence numbers,
 * work handles, the communication thread (a FIFO of works run one at a
 * time), the watchdog message and the broken state. A backend provides
 * `run`, which executes one collective to completion on the communication
 * thread and must give up at `deadline` (dt_comm_now() time) with
 * DT_ERR_TIMEOUT. A backend that enqueues on device streams (nccl) will add
 * an `enqueue` entry used instead of the thread.
 */
#ifndef DT_DIST_COMM_INTERNAL_H
#define DT_DIST_COMM_INTERNAL_H

#include <pthread.h>
#include <stddef.h>

#include "dist/comm.h"

#ifdef __cplusplus
extern "C" {
#endif

struct dt_work {
  int refcount; /* atomic: the caller's reference + the queue's */
  dt_comm *comm;
  dt_coll_kind kind;
  dt_reduce_op op;
  dt_tensor *in;  /* retained; allreduce/broadcast: in == out */
  dt_tensor *out; /* retained */
  int root;
  int bucket;
  dt_event *ready;
  uint64_t seq;
  int64_t count;   /* elements per rank (in's numel; reduce_scatter: out's) */
  size_t elem;     /* element size in bytes */
  size_t bytes;    /* bytes this rank contributes */
  struct dt_work *next;

  pthread_mutex_t mu;
  pthread_cond_t cv;
  int done;
  /* Set by a backend that gave up while the transport may still touch the
   * buffers (a stuck MPI request): the tensors are then never released. */
  int leaked;
  dt_status status;
  char error[1024];
  double submitted_s, started_s, completed_s;
};

typedef struct dt_comm_backend {
  const char *name;
  int host_memory; /* buffers must be cpu tensors */
  /* Runs `w` to completion on the communication thread; DT_ERR_TIMEOUT once
   * dt_comm_now() passes `deadline`. */
  dt_status (*run)(void *impl, dt_work *w, double deadline);
  /* Ends the whole job after a watchdog timeout. Does not return. */
  void (*abort_job)(void *impl, int code);
  /* Frees impl. `broken`: a collective may be stuck inside the transport,
   * so release only what it cannot touch. */
  void (*destroy)(void *impl, int broken);
} dt_comm_backend;

/* Creates a communicator over a backend and starts its thread. `peers`
 * describes the group for watchdog messages ("ranks 0-3"). Takes ownership
 * of impl (destroyed on failure too). */
dt_status dt_comm_create_with_backend(const dt_comm_backend *be, void *impl, int rank, int size,
                                      const char *peers, const dt_comm_config *cfg,
                                      dt_comm **out);

#ifdef __cplusplus
}
#endif
#endif
