/* The nccl communicator backend (built with CUDA only; comm_nccl_stub.c
 * otherwise). Collectives are enqueued on the GPU's communication stream
 * from the submitting thread:
 *
 *   comm stream: wait(ready) -> [start] -> nccl kernel -> [end]
 *
 * `ready` was recorded on the compute stream by the producer (DDP: when a
 * bucket's gradients are complete); [start]/[end] are timing events; [end]
 * is the completion that waiters query (dt_work_test), synchronise on
 * (dt_work_wait) or make a stream wait on (dt_work_wait_stream). The host
 * never blocks here. comm_thread.c's watchdog polls `query` and `check_async`
 * (ncclCommGetAsyncError) and calls `abort_comm` (ncclCommAbort) on a
 * deadline or error.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda/cuda.h"
#include "dist/comm_internal.h"
#include "dist/guard.h"
#include "dist/mpi_util.h"
#include "dist/nccl_check.h"
#include "dist/process_group_internal.h"

/* ---- errors ---- */

static const char *nccl_advice(ncclResult_t r) {
  switch (r) {
    case ncclUnhandledCudaError:
      return "a CUDA call inside NCCL failed: an earlier kernel may have faulted (rerun with "
             "CUDA_LAUNCH_BLOCKING=1) or the GPU is in a bad state (nvidia-smi)";
    case ncclSystemError:
      return "a system call or the network failed: check NCCL_SOCKET_IFNAME / NCCL_IB_HCA, "
             "firewalls and shared memory (/dev/shm); rerun with NCCL_DEBUG=INFO";
    case ncclInvalidUsage:
      return "NCCL was called in a way it does not support (two ranks on one GPU need the "
             "host-staged mpi backend: DT_COMM_BACKEND=mpi)";
    case ncclRemoteError: return "a peer failed or exited: look at the other ranks' logs";
    case ncclInternalError:
      return "NCCL hit an internal error: rerun with NCCL_DEBUG=INFO and report it";
    default: return "rerun with NCCL_DEBUG=INFO for NCCL's own log";
  }
}

dt_status dt_nccl_fail(ncclResult_t r, ncclComm_t comm, int rank, int device, const char *stmt,
                       const char *func, const char *file, int line) {
  const char *last = ncclGetLastError(comm);
  dt_status s = r == ncclUnhandledCudaError                         ? DT_ERR_CUDA
                : r == ncclInvalidArgument || r == ncclInvalidUsage ? DT_ERR_INVALID_ARG
                                                                    : DT_ERR_NCCL;
  return dt_error_set(s, func, file, line,
                      "NCCL error %d (%s) on rank %d, cuda:%d in `%s` (%s:%d): last NCCL "
                      "error: %s: %s",
                      (int)r, ncclGetErrorString(r), rank, device, stmt, file, line,
                      last && last[0] ? last : "(none)", nccl_advice(r));
}

dt_status dt_nccl_cuda_fail(cudaError_t e, int rank, int device, const char *stmt, const char *func,
                            const char *file, int line) {
  return dt_error_set(e == cudaErrorMemoryAllocation ? DT_ERR_OOM : DT_ERR_CUDA, func, file, line,
                      "CUDA error %s (%s) on rank %d, cuda:%d in `%s` (%s:%d)", cudaGetErrorName(e),
                      cudaGetErrorString(e), rank, device, stmt, file, line);
}

int dt_nccl_built(void) { return 1; }

int dt_nccl_version(void) {
  int v = 0;
  return ncclGetVersion(&v) == ncclSuccess ? v : 0;
}

/* ---- the backend ---- */

struct dt_nccl_clique {
  int refcount; /* atomic: the creator + each communicator */
  int n;
  ncclComm_t *comms;
  dt_device *devs;
  unsigned char *taken;
  int broken; /* atomic: a member was aborted, so abort (not destroy) the rest */
};

/* The timing events of works, reused: creating two or three CUDA events
 * per collective costs driver calls on the training thread. A work's events
 * go back to the pool when the work is freed; the pool lives until its
 * communicator and every work handed events are gone (reference count). */
typedef struct nccl_work_events nccl_work_events;
typedef struct nccl_event_pool {
  int refcount; /* the communicator + each work holding events; under mu */
  pthread_mutex_t mu;
  nccl_work_events *free_list;
} nccl_event_pool;

typedef struct nccl_comm {
  ncclComm_t comm;
  nccl_event_pool *pool;
  dt_pg *pg;              /* NULL for a clique */
  dt_nccl_clique *clique; /* NULL for a process group */
  int rank, size;
  dt_device dev;
  cudaStream_t stream; /* the device's DT_STREAM_COMM */
  cudaEvent_t epoch;   /* timing origin, recorded at creation */
  float *barrier_buf;  /* one float: barriers are tiny all-reduces */
  int aborted;         /* atomic */
} nccl_comm;

struct nccl_work_events {
  cudaEvent_t start, end, waited;
  nccl_event_pool *pool;
  nccl_work_events *next;
};

static void event_pool_release(nccl_event_pool *p) {
  pthread_mutex_lock(&p->mu);
  int last = --p->refcount == 0;
  pthread_mutex_unlock(&p->mu);
  if (!last)
    return;
  while (p->free_list) {
    nccl_work_events *ev = p->free_list;
    p->free_list = ev->next;
    /* Destroying a pending event is legal: CUDA frees it once it fires. */
    cudaEventDestroy(ev->start);
    cudaEventDestroy(ev->end);
    if (ev->waited)
      cudaEventDestroy(ev->waited);
    free(ev);
  }
  pthread_mutex_destroy(&p->mu);
  free(p);
}

#define NC_CUDA(stmt) DT_NCCL_CUDA_CHECK(stmt, nc->rank, nc->dev.index)
#define NC_NCCL(stmt) DT_NCCL_CHECK(stmt, nc->comm, nc->rank, nc->dev.index)

static void nccl_work_free(dt_work *w) {
  nccl_work_events *ev = w->backend_data;
  if (ev == NULL)
    return;
  w->backend_data = NULL;
  /* Back to the pool: a later record overwrites the events' state, so a
   * pending one is fine to reuse once this work no longer reads it. */
  nccl_event_pool *p = ev->pool;
  pthread_mutex_lock(&p->mu);
  ev->next = p->free_list;
  p->free_list = ev;
  pthread_mutex_unlock(&p->mu);
  event_pool_release(p);
}

/* Events for a new work: from the pool, or created (on nc's device). */
static dt_status events_take(nccl_comm *nc, nccl_work_events **out) {
  nccl_event_pool *p = nc->pool;
  pthread_mutex_lock(&p->mu);
  nccl_work_events *ev = p->free_list;
  if (ev)
    p->free_list = ev->next;
  p->refcount++;
  pthread_mutex_unlock(&p->mu);
  if (!ev) {
    ev = calloc(1, sizeof *ev);
    if (ev == NULL || cudaEventCreate(&ev->start) != cudaSuccess ||
        cudaEventCreate(&ev->end) != cudaSuccess) {
      if (ev && ev->start)
        cudaEventDestroy(ev->start);
      free(ev);
      event_pool_release(p);
      return DT_ERROR(DT_ERR_CUDA,
                      "nccl: cannot create the timing events of a collective on "
                      "cuda:%d",
                      nc->dev.index);
    }
    ev->pool = p;
  }
  ev->next = NULL;
  *out = ev;
  return DT_OK;
}

static dt_status nccl_check_device(void *impl, dt_device dev) {
  nccl_comm *nc = impl;
  if (dt_device_equal(dev, nc->dev))
    return DT_OK;
  char a[32], b[32];
  return DT_ERROR(DT_ERR_DEVICE_MISMATCH,
                  "nccl communicator of rank %d serves %s but got a tensor on %s: move the "
                  "tensor, or use the communicator made for that device",
                  nc->rank, dt_device_format(nc->dev, a, sizeof a),
                  dt_device_format(dev, b, sizeof b));
}

/* The reductions' element types: NCCL reduces f16 and bf16 natively
 * (rounding at each step of its algorithm; dist/comm.h). */
static ncclDataType_t reduce_type(dt_dtype t) {
  return t == DT_DTYPE_F16 ? ncclFloat16 : t == DT_DTYPE_BF16 ? ncclBfloat16 : ncclFloat32;
}

static dt_status launch(nccl_comm *nc, dt_work *w) {
  ncclRedOp_t op = w->op == DT_REDUCE_AVG ? ncclAvg : ncclSum;
  ncclDataType_t type = reduce_type(w->dtype);
  cudaStream_t s = nc->stream;
  switch (w->kind) {
    case DT_COLL_ALLREDUCE:
      NC_NCCL(ncclAllReduce(w->in_data, w->out_data, (size_t)w->count, type, op, nc->comm, s));
      return DT_OK;
    case DT_COLL_BROADCAST:
      NC_NCCL(ncclBroadcast(w->in_data, w->out_data, w->bytes, ncclUint8, w->root, nc->comm, s));
      return DT_OK;
    case DT_COLL_ALLGATHER:
      NC_NCCL(ncclAllGather(w->in_data, w->out_data, w->bytes, ncclUint8, nc->comm, s));
      return DT_OK;
    case DT_COLL_REDUCE_SCATTER:
      NC_NCCL(ncclReduceScatter(w->in_data, w->out_data, (size_t)w->count, type, op, nc->comm, s));
      return DT_OK;
    case DT_COLL_BARRIER:
      NC_NCCL(
          ncclAllReduce(nc->barrier_buf, nc->barrier_buf, 1, ncclFloat32, ncclSum, nc->comm, s));
      return DT_OK;
  }
  return DT_ERROR(DT_ERR_INTERNAL, "unknown collective kind %d", (int)w->kind);
}

static dt_status nccl_enqueue(void *impl, dt_work *w) {
  nccl_comm *nc = impl;
  if (__atomic_load_n(&nc->aborted, __ATOMIC_ACQUIRE))
    return DT_ERROR(DT_ERR_STATE, "the nccl communicator of rank %d was aborted", nc->rank);
  NC_CUDA(cudaSetDevice(nc->dev.index));
  nccl_work_events *ev = NULL;
  DT_CHECK(events_take(nc, &ev));
  w->backend_data = ev;
  if (w->ready != NULL)
    NC_CUDA(cudaStreamWaitEvent(nc->stream, (cudaEvent_t)dt_cuda_event_handle(w->ready), 0));
  NC_CUDA(cudaEventRecord(ev->start, nc->stream));
  DT_CHECK(launch(nc, w));
  NC_CUDA(cudaEventRecord(ev->end, nc->stream));
  return DT_OK;
}

static dt_status nccl_query(void *impl, dt_work *w, int *done) {
  nccl_comm *nc = impl;
  nccl_work_events *ev = w->backend_data;
  cudaError_t e = cudaEventQuery(ev->end);
  if (e == cudaErrorNotReady) {
    *done = 0;
    return DT_OK;
  }
  NC_CUDA(e);
  *done = 1;
  return DT_OK;
}

static dt_status nccl_check_async(void *impl) {
  nccl_comm *nc = impl;
  if (__atomic_load_n(&nc->aborted, __ATOMIC_ACQUIRE))
    return DT_OK;
  ncclResult_t async = ncclSuccess;
  NC_NCCL(ncclCommGetAsyncError(nc->comm, &async));
  if (async != ncclSuccess && async != ncclInProgress)
    return dt_nccl_fail(async, nc->comm, nc->rank, nc->dev.index,
                        "ncclCommGetAsyncError (asynchronous error)", __func__, __FILE__, __LINE__);
  return DT_OK;
}

static void nccl_abort_comm(void *impl) {
  nccl_comm *nc = impl;
  if (__atomic_exchange_n(&nc->aborted, 1, __ATOMIC_ACQ_REL))
    return;
  ncclCommAbort(nc->comm);
}

static void nccl_abort_job(void *impl, int code) {
  nccl_comm *nc = impl;
  if (nc->pg != NULL)
    dt_pg_abort(nc->pg, code);
  fflush(stdout);
  fflush(stderr);
  abort();
}

static dt_status nccl_wait_stream(void *impl, dt_work *w, dt_stream *s) {
  nccl_comm *nc = impl;
  nccl_work_events *ev = w->backend_data;
  cudaStream_t cs = (cudaStream_t)dt_cuda_stream_handle(s);
  /* The event is created on the current device and must be recorded on a
   * stream of the same device: the calling thread's current device may be
   * another GPU of this process. */
  NC_CUDA(cudaSetDevice(nc->dev.index));
  if (ev->waited == NULL)
    NC_CUDA(cudaEventCreate(&ev->waited));
  NC_CUDA(cudaEventRecord(ev->waited, cs)); /* where the waiting stream stands */
  NC_CUDA(cudaStreamWaitEvent(cs, ev->end, 0));
  return DT_OK;
}

static dt_status elapsed_since_epoch(nccl_comm *nc, cudaEvent_t e, double *ms) {
  float f = 0;
  NC_CUDA(cudaEventSynchronize(e));
  NC_CUDA(cudaEventElapsedTime(&f, nc->epoch, e));
  *ms = f;
  return DT_OK;
}

static dt_status nccl_device_times(void *impl, dt_work *w, double *start_ms, double *end_ms,
                                   double *waited_ms) {
  nccl_comm *nc = impl;
  nccl_work_events *ev = w->backend_data;
  double a = 0, b = 0, c = -1;
  DT_CHECK(elapsed_since_epoch(nc, ev->start, &a));
  DT_CHECK(elapsed_since_epoch(nc, ev->end, &b));
  if (ev->waited != NULL)
    DT_CHECK(elapsed_since_epoch(nc, ev->waited, &c));
  if (start_ms)
    *start_ms = a;
  if (end_ms)
    *end_ms = b;
  if (waited_ms)
    *waited_ms = c;
  return DT_OK;
}

static void clique_take_back(dt_nccl_clique *q, int rank, int broken, int aborted);

static void nccl_destroy(void *impl, int broken) {
  nccl_comm *nc = impl;
  if (nc == NULL)
    return;
  cudaSetDevice(nc->dev.index);
  if (nc->clique != NULL) {
    clique_take_back(nc->clique, nc->rank, broken, nc->aborted);
  } else if (nc->comm != NULL && !__atomic_load_n(&nc->aborted, __ATOMIC_ACQUIRE)) {
    if (broken)
      ncclCommAbort(nc->comm);
    else
      ncclCommDestroy(nc->comm);
  }
  if (!broken && nc->barrier_buf)
    cudaFree(nc->barrier_buf);
  if (nc->epoch)
    cudaEventDestroy(nc->epoch);
  if (nc->pool)
    event_pool_release(nc->pool);
  free(nc);
}

static const dt_comm_backend nccl_backend = {
    .name = "nccl",
    .host_memory = 0,
    .run = NULL,
    .abort_job = nccl_abort_job,
    .destroy = nccl_destroy,
    .check_device = nccl_check_device,
    .enqueue = nccl_enqueue,
    .query = nccl_query,
    .check_async = nccl_check_async,
    .abort_comm = nccl_abort_comm,
    .wait_stream = nccl_wait_stream,
    .device_times = nccl_device_times,
    .work_free = nccl_work_free,
};

/* Streams, the epoch event and the barrier buffer of `nc` on nc->dev. */
static dt_status device_setup(nccl_comm *nc) {
  if (nc->pool == NULL) {
    nc->pool = calloc(1, sizeof *nc->pool);
    if (nc->pool == NULL)
      return DT_ERROR(DT_ERR_OOM, "nccl: out of host memory for the event pool");
    nc->pool->refcount = 1;
    pthread_mutex_init(&nc->pool->mu, NULL);
  }
  const dt_backend_ops *ops = NULL;
  DT_CHECK(dt_backend_get(nc->dev, &ops));
  NC_CUDA(cudaSetDevice(nc->dev.index)); /* before trusting the backend's handles */
  dt_stream *s = ops->stream(nc->dev, DT_STREAM_COMM);
  if (s == NULL)
    return DT_ERROR(DT_ERR_CUDA, "cuda:%d has no communication stream (see the message above)",
                    nc->dev.index);
  nc->stream = (cudaStream_t)dt_cuda_stream_handle(s);
  NC_CUDA(cudaEventCreate(&nc->epoch));
  NC_CUDA(cudaMalloc((void **)&nc->barrier_buf, sizeof(float)));
  return DT_OK;
}

static dt_status record_epoch(nccl_comm *nc) {
  NC_CUDA(cudaEventRecord(nc->epoch, nc->stream));
  return DT_OK;
}

/* ---- over a process group ---- */

typedef struct rank_info {
  int ok;
  char bus[32];
  char host[96];
} rank_info;

typedef struct id_msg {
  int ok;
  ncclUniqueId id;
} id_msg;

static dt_status mpi_allgather_bytes(dt_pg *pg, const void *mine, void *all, int bytes) {
  dt_pg_mpi_lock(pg);
  int rc = MPI_Allgather(mine, bytes, MPI_BYTE, all, bytes, MPI_BYTE, pg->world_comm);
  dt_pg_mpi_unlock(pg);
  DT_MPI_CHECK(rc);
  return DT_OK;
}

static dt_status mpi_bcast_bytes(dt_pg *pg, void *buf, int bytes) {
  dt_pg_mpi_lock(pg);
  int rc = MPI_Bcast(buf, bytes, MPI_BYTE, 0, pg->world_comm);
  dt_pg_mpi_unlock(pg);
  DT_MPI_CHECK(rc);
  return DT_OK;
}

static dt_status mpi_all_ok(dt_pg *pg, int mine, int *all) {
  dt_pg_mpi_lock(pg);
  int rc = MPI_Allreduce(&mine, all, 1, MPI_INT, MPI_MIN, pg->world_comm);
  dt_pg_mpi_unlock(pg);
  DT_MPI_CHECK(rc);
  return DT_OK;
}

/* Every rank's GPU, gathered: fails alike on every rank when one rank has
 * no usable GPU or two ranks of a host share one. */
static dt_status check_gpus(dt_pg *pg, nccl_comm *nc, dt_status local) {
  rank_info mine;
  memset(&mine, 0, sizeof mine);
  mine.ok = local == DT_OK;
  snprintf(mine.host, sizeof mine.host, "%s", pg->host);
  if (mine.ok && cudaDeviceGetPCIBusId(mine.bus, sizeof mine.bus, nc->dev.index) != cudaSuccess)
    snprintf(mine.bus, sizeof mine.bus, "cuda:%d", nc->dev.index);
  if (!pg->uses_mpi || pg->world == 1)
    return local;
  char local_msg[1024];
  snprintf(local_msg, sizeof local_msg, "%s", local == DT_OK ? "" : dt_last_error());
  rank_info *all = calloc((size_t)pg->world, sizeof *all);
  if (all == NULL)
    return DT_ERROR(DT_ERR_OOM, "nccl setup: out of host memory");
  dt_status st = mpi_allgather_bytes(pg, &mine, all, (int)sizeof mine);
  for (int r = 0; st == DT_OK && r < pg->world; r++)
    if (!all[r].ok)
      st = local != DT_OK
               ? DT_ERROR(local, "%s", local_msg)
               : DT_ERROR(DT_ERR_NO_DEVICE, "rank %d (on %s) cannot use its GPU (see its message)",
                          r, all[r].host);
  for (int i = 0; st == DT_OK && i < pg->world; i++)
    for (int j = i + 1; st == DT_OK && j < pg->world; j++)
      if (strcmp(all[i].host, all[j].host) == 0 && strcmp(all[i].bus, all[j].bus) == 0)
        st = DT_ERROR(DT_ERR_UNSUPPORTED,
                      "ranks %d and %d share GPU %s on %s: NCCL needs a distinct GPU per rank; "
                      "start one rank per GPU (dtrain launch does), or use the host-staged mpi "
                      "backend (DT_COMM_BACKEND=mpi; auto falls back to it)",
                      i, j, all[i].bus, all[i].host);
  free(all);
  return st;
}

static dt_status init_rank(dt_pg *pg, nccl_comm *nc, double timeout_s) {
  id_msg msg;
  memset(&msg, 0, sizeof msg);
  dt_status st = DT_OK;
  if (pg->rank == 0) {
    ncclResult_t r = ncclGetUniqueId(&msg.id);
    msg.ok = r == ncclSuccess;
    if (!msg.ok)
      st = dt_nccl_fail(r, NULL, 0, nc->dev.index, "ncclGetUniqueId(&id)", __func__, __FILE__,
                        __LINE__);
  }
  if (pg->uses_mpi && pg->world > 1)
    DT_CHECK(mpi_bcast_bytes(pg, &msg, (int)sizeof msg));
  if (!msg.ok)
    return pg->rank == 0 ? st
                         : DT_ERROR(DT_ERR_NCCL,
                                    "rank 0 could not create the NCCL unique id "
                                    "(see its message)");
  /* ncclCommInitRank is collective and blocking: a rank that fails before
   * calling it would leave the others waiting in it. The ranks first agree
   * that every one selected its GPU; the call itself runs under a deadline
   * (dist/guard.h), past which this rank names it and ends the job. */
  cudaError_t se = cudaSetDevice(nc->dev.index);
  int all_ok = 1;
  if (pg->uses_mpi && pg->world > 1)
    DT_CHECK(mpi_all_ok(pg, se == cudaSuccess, &all_ok));
  NC_CUDA(se);
  if (!all_ok)
    return DT_ERROR(DT_ERR_NCCL,
                    "another rank could not select its GPU before ncclCommInitRank (see its "
                    "message)");
  dt_guard *guard = NULL;
  DT_CHECK(dt_guard_begin(pg, "ncclCommInitRank (every rank of the nccl communicator)", timeout_s,
                          &guard));
  ncclResult_t r = ncclCommInitRank(&nc->comm, pg->world, msg.id, pg->rank);
  dt_guard_end(guard);
  NC_NCCL(r);
  return DT_OK;
}

dt_status dt_comm_create_nccl(dt_pg *pg, dt_device dev, const dt_comm_config *cfg, dt_comm **out) {
  if (pg == NULL || out == NULL)
    return DT_ERROR(DT_ERR_INVALID_ARG, "creating an nccl communicator: pg or out is NULL");
  *out = NULL;
  nccl_comm *nc = calloc(1, sizeof *nc);
  if (nc == NULL)
    return DT_ERROR(DT_ERR_OOM, "creating an nccl communicator: out of host memory");
  nc->pg = pg;
  nc->rank = pg->rank;
  nc->size = pg->world;
  nc->dev = dev;
  char d[32];
  dt_status local = dev.type == DT_DEVICE_CUDA
                        ? device_setup(nc)
                        : DT_ERROR(DT_ERR_DEVICE_MISMATCH, "nccl needs a cuda device, got %s",
                                   dt_device_format(dev, d, sizeof d));
  dt_status st = check_gpus(pg, nc, local);
  if (st == DT_OK)
    st = init_rank(pg, nc, cfg ? cfg->timeout_s : DT_COMM_CONFIG_DEFAULT.timeout_s);
  /* Agree: a rank whose init failed makes every rank fail (and fall back). */
  if (pg->uses_mpi && pg->world > 1) {
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", st == DT_OK ? "" : dt_last_error());
    int all_ok = 0;
    dt_status ast = mpi_all_ok(pg, st == DT_OK, &all_ok);
    if (ast != DT_OK)
      st = ast;
    else if (st != DT_OK)
      st = DT_ERROR(st, "%s", msg);
    else if (!all_ok)
      st = DT_ERROR(DT_ERR_NCCL, "another rank failed to initialise NCCL (see its message)");
  }
  if (st == DT_OK)
    st = record_epoch(nc);
  if (st != DT_OK) {
    if (nc->comm != NULL) {
      ncclCommAbort(nc->comm); /* peers may be gone: do not wait for them */
      nc->aborted = 1;
    }
    nccl_destroy(nc, 0);
    return dt_error_wrap(st, "creating the nccl communicator of rank %d on %s", pg->rank,
                         dt_device_format(dev, d, sizeof d));
  }
  char peers[96];
  snprintf(peers, sizeof peers, pg->world == 1 ? "rank 0 only" : "ranks 0-%d", pg->world - 1);
  DT_CHECK(dt_comm_create_with_backend(&nccl_backend, nc, pg->rank, pg->world, peers, cfg, out));
  dt_comm_attach_pg(*out, pg);
  return DT_OK;
}

/* ---- a clique of one process's GPUs (data-parallel mode) ---- */

static void clique_free(dt_nccl_clique *q, int broken) {
  /* Destroying several communicators from one thread must be grouped. */
  ncclGroupStart();
  for (int i = 0; i < q->n; i++)
    if (q->comms[i] != NULL) {
      if (broken)
        ncclCommAbort(q->comms[i]);
      else
        ncclCommDestroy(q->comms[i]);
    }
  ncclGroupEnd();
  free(q->comms);
  free(q->devs);
  free(q->taken);
  free(q);
}

static void clique_take_back(dt_nccl_clique *q, int rank, int broken, int aborted) {
  if (aborted)
    q->comms[rank] = NULL; /* ncclCommAbort freed it */
  if (broken || aborted)
    __atomic_store_n(&q->broken, 1, __ATOMIC_RELEASE);
  dt_nccl_clique_release(q);
}

void dt_nccl_clique_release(dt_nccl_clique *q) {
  if (q != NULL && __atomic_sub_fetch(&q->refcount, 1, __ATOMIC_ACQ_REL) == 0)
    clique_free(q, __atomic_load_n(&q->broken, __ATOMIC_ACQUIRE));
}

dt_status dt_nccl_clique_create(const dt_device *devices, int n, dt_nccl_clique **out) {
  if (devices == NULL || out == NULL || n < 1)
    return DT_ERROR(DT_ERR_INVALID_ARG, "NCCL clique of %d GPUs: need >= 1 and an out pointer", n);
  *out = NULL;
  char d[32];
  int *list = calloc((size_t)n, sizeof *list);
  dt_nccl_clique *q = calloc(1, sizeof *q);
  if (q != NULL) {
    q->comms = calloc((size_t)n, sizeof *q->comms);
    q->devs = calloc((size_t)n, sizeof *q->devs);
    q->taken = calloc((size_t)n, 1);
  }
  dt_status st = DT_OK;
  if (list == NULL || q == NULL || !q->comms || !q->devs || !q->taken) {
    st = DT_ERROR(DT_ERR_OOM, "NCCL clique of %d GPUs: out of host memory", n);
    goto fail;
  }
  q->refcount = 1;
  q->n = n;
  for (int i = 0; i < n; i++) {
    const dt_backend_ops *ops = NULL;
    if (devices[i].type != DT_DEVICE_CUDA) {
      st = DT_ERROR(DT_ERR_DEVICE_MISMATCH, "NCCL clique: %s is not a cuda device",
                    dt_device_format(devices[i], d, sizeof d));
      goto fail;
    }
    DT_CHECK_GOTO(dt_backend_get(devices[i], &ops), st, fail);
    for (int j = 0; j < i; j++)
      if (devices[j].index == devices[i].index) {
        st = DT_ERROR(DT_ERR_INVALID_ARG,
                      "NCCL clique: %s is listed twice: NCCL needs a distinct GPU per replica",
                      dt_device_format(devices[i], d, sizeof d));
        goto fail;
      }
    q->devs[i] = devices[i];
    list[i] = devices[i].index;
  }
  {
    ncclResult_t r = ncclCommInitAll(q->comms, n, list);
    if (r != ncclSuccess) {
      st = dt_nccl_fail(r, NULL, -1, list[0], "ncclCommInitAll(comms, n, devices)", __func__,
                        __FILE__, __LINE__);
      memset(q->comms, 0, (size_t)n * sizeof *q->comms);
      goto fail;
    }
  }
  free(list);
  *out = q;
  return DT_OK;
fail:
  free(list);
  if (q != NULL)
    clique_free(q, 1);
  return dt_error_wrap(st, "creating an NCCL clique of %d GPUs", n);
}

dt_status dt_comm_create_nccl_clique(dt_nccl_clique *q, int rank, const dt_comm_config *cfg,
                                     dt_comm **out) {
  if (q == NULL || out == NULL || rank < 0 || rank >= q->n)
    return DT_ERROR(DT_ERR_INVALID_ARG, "nccl clique communicator: bad clique, rank %d or out",
                    rank);
  *out = NULL;
  if (__atomic_exchange_n(&q->taken[rank], 1, __ATOMIC_ACQ_REL))
    return DT_ERROR(DT_ERR_INVALID_ARG, "nccl clique: rank %d already has a communicator", rank);
  nccl_comm *nc = calloc(1, sizeof *nc);
  if (nc == NULL)
    return DT_ERROR(DT_ERR_OOM, "nccl clique communicator: out of host memory");
  __atomic_add_fetch(&q->refcount, 1, __ATOMIC_ACQ_REL);
  nc->clique = q;
  nc->comm = q->comms[rank];
  nc->rank = rank;
  nc->size = q->n;
  nc->dev = q->devs[rank];
  dt_status st = device_setup(nc);
  if (st == DT_OK)
    st = record_epoch(nc);
  if (st != DT_OK) {
    nccl_destroy(nc, 0);
    return dt_error_wrap(st, "nccl clique communicator %d", rank);
  }
  char peers[96];
  snprintf(peers, sizeof peers, "replicas 0-%d of this process", q->n - 1);
  return dt_comm_create_with_backend(&nccl_backend, nc, rank, q->n, peers, cfg, out);
}
