/* Communicator internals: the backend vtable and the work record.
 *
 * comm.c, comm_work.c and comm_thread.c own what every backend shares:
 * argument checks, sequence numbers, work handles, the communication
 * thread (a FIFO of works run one at a time), the watchdog message and
 * the broken state. A backend provides
 * `run`, which executes one collective to completion on the communication
 * thread and must give up at `deadline` (dt_comm_now() time) with
 * DT_ERR_TIMEOUT. A backend that enqueues on device streams (nccl) sets
 * `enqueue` instead: submission enqueues on the caller's thread and the
 * communication thread becomes the watchdog, polling `query` and
 * `check_async` against each work's deadline.
 *
 * Device tensors on a host backend are staged by comm_staged.c around
 * `run` (w->in_data / w->out_data then point at page-locked host copies).
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
  dt_event *ready; /* opts.ready, or own_ready */
  /* Where the backend reads and writes: the tensors' data, or host copies
   * of it while a device tensor is staged. */
  void *in_data, *out_data;
  /* Device tensors (dev.type != cpu): the device's backend, an event the
   * communicator recorded on the compute stream when opts.ready was NULL,
   * and the completion event (recorded on the device's comm stream once
   * the result is in the tensor). All NULL for host tensors. */
  dt_device dev;
  const dt_backend_ops *dev_ops;
  dt_event *own_ready;
  dt_event *done_ev;
  int on_stream; /* enqueued by a stream backend (completion = done_ev) */
  const struct dt_comm_backend *be;
  void *backend_data; /* freed by be->work_free */
  uint64_t seq;
  int64_t count;  /* elements per rank (in's numel; reduce_scatter: out's) */
  dt_dtype dtype; /* in's element type (f32, or f16/bf16 for reductions) */
  size_t elem;    /* element size in bytes */
  size_t bytes;   /* bytes this rank contributes */
  struct dt_work *next;
  int peer_lost; /* set by the backend: a peer's process is gone (the job cannot go on) */

  pthread_mutex_t mu;
  pthread_cond_t cv;
  int done;
  /* Set by a backend that gave up while the transport may still touch the
   * buffers (a stuck MPI request): the tensors are then never released. */
  int leaked;
  /* Set with DT_ERR_TIMEOUT when the time ran out waiting for the device
   * (the input's ready event, a staging copy), not for the peers. */
  int device_stuck;
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

  /* Optional: DT_OK when the backend serves tensors on `dev` (nccl: its
   * own GPU only), checked at submission. */
  dt_status (*check_device)(void *impl, dt_device dev);

  /* ---- stream backends (nccl); NULL for host backends ---- */
  /* Enqueues `w` on the device's communication stream (waiting on
   * w->ready first) and records w->done_ev after it. Called on the
   * submitting thread, in sequence order. */
  dt_status (*enqueue)(void *impl, dt_work *w);
  /* *done = 1 once w->done_ev has completed; a status for a failed device. */
  dt_status (*query)(void *impl, dt_work *w, int *done);
  /* An error the transport raised asynchronously (ncclCommGetAsyncError),
   * with the message set; DT_OK when healthy. */
  dt_status (*check_async)(void *impl);
  /* Aborts the transport so nothing stays stuck on the device
   * (ncclCommAbort). Later calls on impl fail. */
  void (*abort_comm)(void *impl);
  /* Optional: dt_work_wait_stream for enqueued works (default: the
   * device backend's stream_wait_event on w->done_ev). */
  dt_status (*wait_stream)(void *impl, dt_work *w, dt_stream *s);
  /* Optional: dt_work_device_times. */
  dt_status (*device_times)(void *impl, dt_work *w, double *start_ms, double *end_ms,
                            double *waited_ms);
  /* Optional: frees w->backend_data (may run after the communicator is
   * destroyed: must not use impl). */
  void (*work_free)(dt_work *w);
  /* Optional: dt_comm_shared_buffer's memory (collective): *data NULL
   * when there is none; else release(ctx) lets go of it. */
  dt_status (*shared_buffer)(void *impl, size_t bytes, void **data, void (**release)(void *ctx),
                             void **ctx);
  /* Optional: dt_comm_transport (default: the backend's name). */
  const char *(*transport)(void *impl);
} dt_comm_backend;

/* ---- agreement on the collective (mpi, and its shared-memory transport) ----
 * Before data moves, the ranks compare what they are about to run:
 * sequence number, kind, root, size in bytes and element type. */
enum { DT_SIG_SEQ, DT_SIG_KIND, DT_SIG_ROOT, DT_SIG_BYTES, DT_SIG_DTYPE, DT_SIG_N };
/* sig[0..DT_SIG_N) of `w`. */
void dt_comm_signature(const dt_work *w, int64_t sig[DT_SIG_N]);
/* lo and hi: each value's range over the ranks. DT_OK when every range is
 * one value; else DT_ERR_DIST_MISMATCH naming the ranges and the likely
 * causes (the same message on every rank). */
dt_status dt_comm_signatures_agree(const int64_t lo[DT_SIG_N], const int64_t hi[DT_SIG_N]);

/* ---- 16-bit reductions on the host (mpi, local) ----
 * A reduction of f16/bf16 data converts each rank's values to f32, sums
 * them in rank order in f32, divides by the world size for an average,
 * and rounds the result once to the 16-bit type (nearest even; an f16
 * result of magnitude 65520 or more, past the largest f16 65504, becomes
 * inf, as does an inf or NaN input). Every rank gets the same bits
 * (comm_reduce.c). */

/* 1 for the types the reductions take: f32, f16, bf16. */
int dt_comm_is_reduce_dtype(dt_dtype t);
/* acc[0..n) = the sum in f32 over parts[0..nparts) in that order of their
 * elements [0, n) (of type t), divided by nparts when avg. */
void dt_comm_sum_f32(const void *const *parts, int nparts, dt_dtype t, int64_t n, int avg,
                     float *acc);
/* f32 parts only: dst[i] (and dst2[i] when dst2 is not NULL) = the sum of
 * parts[0..nparts)[i] in rank order, then (avg) / nparts: the bits of
 * dt_comm_sum_f32 + dt_comm_from_f32, in one pass. dst may be one of the
 * parts (element by element in place). */
void dt_comm_sum_f32_into(const float *const *parts, int nparts, int64_t n, int avg, float *dst,
                          float *dst2);
/* dst[0..n) = src[0..n) rounded to type t (nearest even; f32: a copy). */
void dt_comm_from_f32(const float *src, dt_dtype t, void *dst, int64_t n);
/* x[0..n) += y[0..n) (not overlapping), then (avg) x /= world: vectorised,
 * in place; the same bits as the scalar (x + y) / world (a power-of-two
 * world divides by multiplying with its exact reciprocal). */
void dt_comm_add_f32(float *x, const float *y, int64_t n, int avg, int world);
/* x[0..n) /= world, vectorised (the same bits as the scalar division). */
void dt_comm_scale_avg_f32(float *x, int64_t n, int world);
/* Chunk (in elements) of the f32 accumulators the host reductions use. */
#define DT_COMM_REDUCE_CHUNK 1024

/* 1 while a thread is blocked on the host waiting for one of c's works
 * (dt_work_wait and friends): a host backend's polling then need not spare
 * a core for computation and polls (yielding) without sleeping. */
int dt_comm_host_waiting(const dt_comm *c);

/* Waits on the host for `ev` (of backend `ops`) until `deadline`
 * (dt_comm_now() time): polls ops->event_query, sleeping a little between
 * polls; backends without it are synchronised. Past the deadline:
 * DT_ERR_TIMEOUT, and w->device_stuck and w->leaked are set (the device
 * may still write the buffers). */
dt_status dt_comm_event_wait(const dt_backend_ops *ops, dt_event *ev, dt_work *w, double deadline);

/* ---- host staging of device tensors (comm_staged.c) ---- */

/* Page-locked staging memory of one communicator, grown on demand. Used
 * only from the communication thread. */
typedef struct dt_comm_staging {
  const dt_backend_ops *ops; /* the device's backend (host_alloc, copy, events) */
  dt_device dev;
  void *buf;
  size_t cap;
  int pinned;       /* buf came from ops->host_alloc (else malloc) */
  dt_event *copied; /* device -> host copy complete */
} dt_comm_staging;

/* 1 when tensors on `dev` can be host-staged: a non-cpu device whose
 * backend has streams, events and copies. */
int dt_comm_can_stage(dt_device dev);
/* Runs `w` (a device-tensor work) on a host backend: comm stream waits on
 * w->ready, device -> staging copy, host `run` on the staging memory,
 * staging -> device copy, w->done_ev recorded on the comm stream. */
dt_status dt_comm_staged_run(dt_comm_staging *s, const dt_comm_backend *be, void *impl, dt_work *w,
                             double deadline);
/* Frees the staging memory (not when `broken`: a stuck request may still
 * write into it). */
void dt_comm_staging_free(dt_comm_staging *s, int broken);

/* Creates a communicator over a backend and starts its thread. `peers`
 * describes the group for watchdog messages ("ranks 0-3"). Takes ownership
 * of impl (destroyed on failure too). */
dt_status dt_comm_create_with_backend(const dt_comm_backend *be, void *impl, int rank, int size,
                                      const char *peers, const dt_comm_config *cfg, dt_comm **out);

/* The communicator spans every rank of `pg` (mpi, nccl): its watchdog
 * names its own phase and the ranks of this host that did not arrive,
 * from pg's progress table, which the first such communicator alive
 * publishes its collectives to. */
void dt_comm_attach_pg(dt_comm *c, dt_pg *pg);

#ifdef __cplusplus
}
#endif
#endif
