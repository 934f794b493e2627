/* Communicators: asynchronous collectives over a group of ranks.
 *
 *   dt_comm_config cc = DT_COMM_CONFIG_DEFAULT;
 *   cc.timeout_s = 60;
 *   dt_comm *comm;
 *   dt_comm_create_for_pg(pg, &cc, &comm);   // mpi, or local(1) for a single process
 *   dt_work *w;
 *   dt_comm_allreduce(comm, grads, DT_REDUCE_AVG, NULL, &w);
 *   ... overlap other work ...
 *   dt_status st = dt_work_wait(w, 0);        // 0: no extra deadline of the caller
 *   dt_work_release(w);
 *   dt_comm_destroy(comm);
 *
 * Every collective is asynchronous and returns a work handle (one reference
 * for the caller). Collectives run in submission order; every rank must
 * submit the same collectives in the same order (MPI semantics). Buffers are
 * dt_tensors (contiguous; the communicator retains them until the work
 * completes), so the caller stays backend-agnostic: the device inside the
 * tensor tells a backend where the data lives.
 *
 * Backends:
 *   mpi    host memory. A dedicated communication thread per communicator
 *          runs the queued collectives (nonblocking MPI calls, polled), so
 *          they overlap the caller's backward pass.
 *
 * Shared memory. When every rank of an mpi communicator is on one node
 * (and cfg.shm, DT_COMM_SHM, is on), its collectives do not go through MPI
 * messages: the ranks map one shared segment (made at creation, its name
 * unlinked before creation returns, so nothing is left in /dev/shm however
 * a rank ends), each reduces its 1/W slice reading every rank's staged
 * data directly and publishes the result there, in pipelined chunks; the
 * communication thread sleeps on a futex in the segment while it waits.
 * An all-reduce of a buffer the ranks share (dt_comm_shared_buffer: DDP
 * keeps its gradients there) skips the staging: each rank reduces its
 * slice reading every rank's data where it lies and copies the others'
 * results from their buffers.
 * Results are those of the MPI path bit for bit for f32 on two ranks and
 * for 16-bit data on any number (sums in rank order; MPI's f32 ring sums
 * 3+ ranks in ring order). A peer whose process dies fails the collective
 * with DT_ERR_STATE naming it; the deadline and watchdog are unchanged.
 * Ranks on several nodes keep the MPI path.
 *   local  N participants that are threads of one process (data-parallel
 *          replicas), shared-memory reduction. Each participant also has a
 *          communication thread. Sums are taken in rank order, so every
 *          participant gets bitwise identical results.
 *   nccl   device memory (cuda tensors; dist/comm_nccl.c, built with CUDA
 *          only). Collectives are enqueued on the device's communication
 *          stream (DT_STREAM_COMM) from the submitting thread: the comm
 *          stream waits on the `ready` event, runs the NCCL kernel, records
 *          a completion event. The host never blocks; the communication
 *          thread is the watchdog (event queries, ncclCommGetAsyncError).
 *
 * Host-staged device tensors. mpi and local also take tensors of a device
 * whose backend has streams, events and asynchronous copies (cuda): on the
 * communication thread, the device's comm stream waits on `ready`, copies
 * the data into page-locked host memory (backend host_alloc), the host
 * reduces it, and the comm stream copies it back and records the work's
 * completion event. This is the fallback where NCCL is absent or refuses
 * (two ranks on one GPU). It uses only the dt_backend_ops table, so a
 * stand-in device backend exercises it without a GPU.
 *
 * Device readiness. For a device tensor, `ready` NULL means "ready in the
 * order of the device's compute stream at submission": the communicator
 * records its own event there (PyTorch's current-stream rule).
 *
 * Completion, for device tensors:
 *   dt_work_wait        blocks the host until the result is in the tensor.
 *   dt_work_wait_stream makes a device stream wait for the result without
 *                       blocking the host (nccl); host-staged works first
 *                       wait on the host for the staging to finish. This is
 *                       what DDP uses before the optimizer step.
 *   dt_work_test        never blocks (nccl: cudaEventQuery).
 * For host tensors all three are the host wait / test they always were.
 *
 * Watchdog: each collective has a deadline (cfg.timeout_s from the moment it
 * starts on the communication thread). Past it the rank prints
 *   dtrain: rank R: collective #SEQ (allreduce, bucket B, N bytes, peers P)
 *   in PHASE did not complete within T s: rank Q (pid N, stopped, last in
 *   PHASE', its last completed collective #SEQ') did not arrive; aborting
 *   the job
 * (PHASE: what the rank named with dt_pg_set_phase; for mpi and nccl
 * communicators the ranks of this host that did not arrive, or those that
 * did but are stopped or gone, from the process group's progress table:
 * process_group_internal.h) to stderr and, with cfg.abort_on_timeout, ends
 * the whole job (MPI_Abort;
 * abort() for the local backend). Without it the work fails with
 * DT_ERR_TIMEOUT and the communicator is broken: every later collective
 * fails at once (nobody hangs). The job's exit status after a watchdog abort
 * is DT_COMM_WATCHDOG_EXIT_CODE (MPI_Abort's error code; local: SIGABRT).
 */
#ifndef DT_DIST_COMM_H
#define DT_DIST_COMM_H

#include <stdbool.h>
#include <stdint.h>

#include "core/backend.h"
#include "core/status.h"
#include "core/tensor.h"
#include "dist/process_group.h"

#ifdef __cplusplus
extern "C" {
#endif

#define DT_COMM_WATCHDOG_EXIT_CODE 70 /* EX_SOFTWARE; distinct from timeout(1)'s 124 */
/* The exit status of a job ended by a rank that found a peer's process
 * gone (the shared-memory transport sees it at once, before mpirun may):
 * like the watchdog's, a restart from the last checkpoint can help. */
#define DT_COMM_PEER_LOST_EXIT_CODE 69 /* EX_UNAVAILABLE */

typedef enum dt_reduce_op {
  DT_REDUCE_SUM = 0,
  DT_REDUCE_AVG = 1, /* sum / world size */
} dt_reduce_op;

typedef enum dt_coll_kind {
  DT_COLL_ALLREDUCE = 0,
  DT_COLL_BROADCAST,
  DT_COLL_ALLGATHER,
  DT_COLL_REDUCE_SCATTER,
  DT_COLL_BARRIER,
} dt_coll_kind;
const char *dt_coll_kind_name(dt_coll_kind k);

/* Which communicator dt_comm_create_for_device builds for device tensors. */
typedef enum dt_comm_backend_choice {
  DT_COMM_BACKEND_AUTO = 0, /* cuda: nccl, falling back to host-staged mpi with a note */
  DT_COMM_BACKEND_MPI = 1,  /* host memory (device tensors host-staged); dp: local */
  DT_COMM_BACKEND_NCCL = 2, /* nccl or a clear error */
} dt_comm_backend_choice;
const char *dt_comm_backend_choice_name(dt_comm_backend_choice b); /* "auto", "mpi", "nccl" */
/* Parses "auto", "mpi" or "nccl"; DT_ERR_INVALID_ARG otherwise. */
dt_status dt_comm_backend_parse(const char *s, dt_comm_backend_choice *out);

typedef struct dt_comm_config {
  double timeout_s;               /* per-collective deadline (> 0); default 300 */
  int abort_on_timeout;           /* 1: print and end the job; 0: DT_ERR_TIMEOUT */
  dt_comm_backend_choice backend; /* for dt_comm_create_for_device / dp; default auto */
  /* mpi: 1 runs the host collectives through a shared-memory segment when
   * every rank is on one node (see "Shared memory" above); 0 keeps MPI's
   * point-to-point path. Default 1. */
  int shm;
} dt_comm_config;
#define DT_COMM_CONFIG_DEFAULT ((dt_comm_config){300.0, 1, DT_COMM_BACKEND_AUTO, 1})

/* Applies the environment to *cfg: DT_COMM_BACKEND=auto|mpi|nccl and
 * DT_COMM_SHM=1|0. The only place dist/ reads them. DT_ERR_INVALID_ARG
 * (with the value) when malformed. */
dt_status dt_comm_config_from_env(dt_comm_config *cfg);

/* Optional per-collective settings (NULL = all defaults). */
typedef struct dt_coll_opts {
  /* The data is complete once this event (recorded on the producer's
   * stream) has completed; host backends synchronise on it before reading,
   * nccl makes its comm stream wait on it. NULL: the data is ready now. */
  dt_event *ready;
  int bucket; /* DDP bucket index for the watchdog message, -1 none */
} dt_coll_opts;
#define DT_COLL_OPTS_DEFAULT ((dt_coll_opts){NULL, -1})

typedef struct dt_comm dt_comm;
typedef struct dt_work dt_work;

/* ---- creation ---- */
/* An mpi communicator over all ranks of `pg` (which must use MPI and
 * outlive the communicator). Collective: every rank calls it. */
dt_status dt_comm_create_mpi(dt_pg *pg, const dt_comm_config *cfg, dt_comm **out);

/* A local group of `size` participants (threads of this process). The group
 * is reference-counted by its communicators; release the creator's
 * reference with dt_local_group_release. */
typedef struct dt_local_group dt_local_group;
dt_status dt_local_group_create(int size, dt_local_group **out);
void dt_local_group_release(dt_local_group *g); /* NULL is a no-op */
/* Participant `rank` of the group. Call once per rank (any thread). */
dt_status dt_comm_create_local(dt_local_group *g, int rank, const dt_comm_config *cfg,
                               dt_comm **out);

/* mpi when pg uses MPI, else a local group of one (a trivial communicator,
 * so the same DDP code runs in a single process). */
dt_status dt_comm_create_for_pg(dt_pg *pg, const dt_comm_config *cfg, dt_comm **out);

/* ---- device communicators ---- */

/* The device this rank should use: cuda:<local_rank> relative to the
 * visible set (CUDA_VISIBLE_DEVICES); with one visible GPU every rank of
 * the host takes cuda:0 (per-rank binding by the launcher, or ranks
 * sharing one GPU). DT_ERR_NO_DEVICE when there are fewer visible GPUs
 * than ranks on this host (more than one, but not enough), naming both. */
dt_status dt_comm_pick_device(const dt_pg *pg, dt_device *out);

/* 1 when this build has the nccl backend (built with CUDA and NCCL). */
int dt_nccl_built(void);
/* ncclGetVersion (e.g. 22805), 0 when not built. */
int dt_nccl_version(void);

/* An nccl communicator over all ranks of `pg` on GPU `dev` (cuda:N, N
 * relative to CUDA_VISIBLE_DEVICES). Collective. Rank 0 creates the
 * unique id and broadcasts it over MPI (no MPI needed for a single
 * process); then ncclCommInitRank. Before that, every rank's GPU PCI bus id
 * is gathered: ranks sharing a GPU fail on every rank with
 * DT_ERR_UNSUPPORTED naming them (NCCL refuses duplicate GPUs; use the
 * host-staged mpi backend). Every rank gets the same status. Without
 * CUDA/NCCL in the build: DT_ERR_UNSUPPORTED saying so. */
dt_status dt_comm_create_nccl(dt_pg *pg, dt_device dev, const dt_comm_config *cfg, dt_comm **out);

/* The communicator for tensors on `dev`, by cfg->backend:
 *   cpu devices: mpi under a launcher, else a local group of one
 *                (dt_comm_create_for_pg);
 *   cuda, auto:  nccl; when nccl is not built, or refuses (shared GPU,
 *                init failure agreed by all ranks), prints
 *                "dtrain: rank R: <why>; using the host-staged mpi backend"
 *                and returns the host-staged one;
 *   cuda, mpi:   host-staged over mpi (local group of one without MPI);
 *   cuda, nccl:  nccl or its error.
 * Collective. */
dt_status dt_comm_create_for_device(dt_pg *pg, dt_device dev, const dt_comm_config *cfg,
                                    dt_comm **out);

/* An NCCL clique for data-parallel threads of one process
 * (ncclCommInitAll over `n` distinct GPUs). Reference-counted by its
 * communicators; release the creator's reference. */
typedef struct dt_nccl_clique dt_nccl_clique;
dt_status dt_nccl_clique_create(const dt_device *devices, int n, dt_nccl_clique **out);
void dt_nccl_clique_release(dt_nccl_clique *q); /* NULL is a no-op */
/* Participant `rank`'s communicator (its GPU is devices[rank]). */
dt_status dt_comm_create_nccl_clique(dt_nccl_clique *q, int rank, const dt_comm_config *cfg,
                                     dt_comm **out);

/* Waits for the queued collectives, stops the communication thread and
 * frees the communicator. NULL is a no-op. */
void dt_comm_destroy(dt_comm *c);

/* For error paths, before dt_comm_destroy: this rank is giving up (it
 * failed, or it cannot trust its peers), so the shutdown must not wait
 * for them. The communicator becomes broken (every later collective fails
 * at once) and its transport is aborted now: nccl calls ncclCommAbort,
 * never ncclCommDestroy, which can block on peers that died or stopped;
 * host backends then free only what a stuck request cannot touch.
 * Collectives in flight fail or finish within the watchdog's deadline.
 * NULL is a no-op; idempotent. */
void dt_comm_abort(dt_comm *c, const char *why);

int dt_comm_rank(const dt_comm *c);
int dt_comm_size(const dt_comm *c);
const char *dt_comm_backend_name(const dt_comm *c); /* "mpi", "local", "nccl" */
/* Whether c reduces device memory over NCCL (false for NULL). */
bool dt_comm_is_nccl(const dt_comm *c);
/* How the host collectives travel: "shm" for an mpi communicator on the
 * shared-memory transport, else the backend's name ("mpi", ...). */
const char *dt_comm_transport(const dt_comm *c);
/* A flat CPU tensor of `numel` elements of `dtype` (contents undefined)
 * in memory every rank of the communicator maps, one such buffer per rank.
 * Collective: every rank calls it with the same size, on the thread that
 * submits collectives. An all-reduce of all of such a tensor, or of a view
 * of it at the same offset on every rank, then reads the peers' data where
 * it lies and copies each result from the rank that reduced it, without
 * the staging copies (DDP keeps its gradients there). The results are
 * those of the staged path bit for bit. *out is NULL, with DT_OK, when the
 * communicator has no such memory: a backend other than mpi on its
 * shared-memory transport, one rank, or a segment some rank could not
 * make (rank 0 says why). The memory stays valid while any tensor over it
 * lives, after the communicator is destroyed too. */
dt_status dt_comm_shared_buffer(dt_comm *c, int64_t numel, dt_dtype dtype, dt_tensor **out);
const dt_comm_config *dt_comm_get_config(const dt_comm *c);
/* Number of collectives submitted so far (the next one gets this + 1). */
uint64_t dt_comm_seq(const dt_comm *c);
/* 1 after a collective timed out without aborting. */
int dt_comm_is_broken(const dt_comm *c);

/* ---- collectives ----
 * Tensors must be contiguous and on a device the backend serves (cpu, or a
 * device with streams and events host-staged, for mpi and local; the
 * communicator's own GPU for nccl). Shape/dtype errors are DT_ERR_SHAPE / DT_ERR_DTYPE at
 * submission; a disagreement between ranks that a backend can detect
 * (local: kind, size, root) fails the work with DT_ERR_DIST_MISMATCH. */

/* In place: t = op over ranks of t. f32, f16 or bf16.
 *
 * 16-bit data (the DDP reducer's --grad-compress) moves as 2-byte elements
 * and is reduced as follows. mpi and local: every rank's values are
 * converted to f32 and summed in rank order in f32 (AVG: then divided by
 * the world size in f32), and the result is rounded once to the 16-bit
 * type, to nearest even; every rank gets the same bits. On mpi this is a
 * reduce-scatter of our own (MPI_Ialltoallv of 2-byte elements, each rank
 * sums its slice) followed by MPI_Iallgatherv: MPI has no bf16 type, and a
 * user-defined MPI_Op would round after every pairwise step in an order
 * MPI chooses. nccl: ncclFloat16 / ncclBfloat16 with NCCL's own
 * reduction, which rounds to the 16-bit type at each step of its ring or
 * tree (ncclAvg divides as NCCL does), so the last bits can differ from
 * the host backends'. f16 overflow: a value or result of magnitude 65520 or
 * more (the largest f16 is 65504) is inf, and inf or NaN inputs give inf
 * or NaN; a GradScaler sees it as an overflow and skips the step. */
dt_status dt_comm_allreduce(dt_comm *c, dt_tensor *t, dt_reduce_op op, const dt_coll_opts *opts,
                            dt_work **out);
/* In place: t = root's t. Any dtype (bytes). */
dt_status dt_comm_broadcast(dt_comm *c, dt_tensor *t, int root, const dt_coll_opts *opts,
                            dt_work **out);
/* out (size * numel(in)) = concatenation of every rank's in, in rank order.
 * Same dtype; any dtype. */
dt_status dt_comm_allgather(dt_comm *c, dt_tensor *in, dt_tensor *out, const dt_coll_opts *opts,
                            dt_work **out_work);
/* in (size * n); out (n) = op over ranks of this rank's slice
 * in[rank*n : (rank+1)*n]. Both f32, or both f16 or bf16 (reduced as
 * dt_comm_allreduce reduces them). */
dt_status dt_comm_reduce_scatter(dt_comm *c, dt_tensor *in, dt_tensor *out, dt_reduce_op op,
                                 const dt_coll_opts *opts, dt_work **out_work);
dt_status dt_comm_barrier(dt_comm *c, const dt_coll_opts *opts, dt_work **out);

/* ---- work handles ---- */
/* Waits until the work completes and returns its status (the error message
 * is copied to this thread). timeout_s > 0 bounds the wait: DT_ERR_TIMEOUT
 * if the work is still running then (the work itself keeps running under
 * the communicator's watchdog); timeout_s <= 0 waits for completion, which
 * the watchdog bounds. */
dt_status dt_work_wait(dt_work *w, double timeout_s);
/* Makes device stream `s` wait for the work (see "Completion" above): nccl
 * works enqueue a wait on their completion event and return at once (an
 * error status only if the work is already known to have failed);
 * host-staged works wait on the host (like dt_work_wait(w, 0)) and then
 * enqueue the wait; host works are dt_work_wait(w, 0). `s` NULL: the
 * compute stream of the work's device. */
dt_status dt_work_wait_stream(dt_work *w, dt_stream *s);
/* 1 when complete (successfully or not), else 0. Never blocks. */
int dt_work_test(dt_work *w);
/* Device-side times of a work that ran on a device stream, in
 * milliseconds since the communicator was created, on the device clock:
 * start and end of the collective on the communication stream, and where
 * the stream given to dt_work_wait_stream stood when it was called (for
 * DDP: the end of backward on the compute stream; -1 if never called).
 * Blocks until those points have executed. DT_ERR_UNSUPPORTED for
 * backends without device timing (host ones, host-staged). */
dt_status dt_work_device_times(dt_work *w, double *start_ms, double *end_ms, double *waited_ms);
uint64_t dt_work_seq(const dt_work *w);
/* Monotonic times in seconds (dt_comm_now()): submitted, started on the
 * communication thread, completed; 0 when not reached yet. */
void dt_work_times(const dt_work *w, double *submitted, double *started, double *completed);
void dt_work_release(dt_work *w); /* NULL is a no-op */

/* Submits and waits: convenience for setup-time collectives. */
dt_status dt_comm_allreduce_sync(dt_comm *c, dt_tensor *t, dt_reduce_op op);
dt_status dt_comm_broadcast_sync(dt_comm *c, dt_tensor *t, int root);
dt_status dt_comm_allgather_sync(dt_comm *c, dt_tensor *in, dt_tensor *out);
dt_status dt_comm_barrier_sync(dt_comm *c);

/* CLOCK_MONOTONIC in seconds. */
double dt_comm_now(void);

#ifdef __cplusplus
}
#endif
#endif
