/* The mpi communicator backend: host buffers, nonblocking MPI collectives
 * polled on the communication thread so that the thread can enforce the
 * watchdog deadline without a second MPI caller. */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "dist/comm_internal.h"
#include "dist/comm_shm.h"
#include "dist/guard.h"
#include "dist/mpi_util.h"
#include "dist/process_group_internal.h"

typedef struct mpi_comm {
  dt_pg *pg;
  MPI_Comm comm; /* private dup: our collectives never mix with anyone else's */
  /* 16-bit reductions (communication thread only): every rank's part of
   * this rank's slice, and the counts and displacements of the exchange. */
  void *parts;
  size_t parts_cap;
  int *counts, *displs, *recv_counts, *recv_displs;
  const void **part_ptrs;
  /* The f32 ring all-reduce (communication thread only): the segment
   * received from the left neighbour, and the requests of its chunks. */
  float *ring_tmp;
  size_t ring_tmp_cap; /* elements */
  MPI_Request *ring_reqs;
  size_t ring_reqs_cap;
  /* All ranks on one node: every collective runs through shared memory
   * (comm_shm*.c) instead of the MPI paths below. */
  dt_shm_transport *shm;
} mpi_comm;

static dt_status start_collective(mpi_comm *m, dt_work *w, MPI_Request *req) {
  if (w->count > INT_MAX || w->bytes > INT_MAX)
    return DT_ERROR(DT_ERR_UNSUPPORTED,
                    "%s of %lld elements (%zu bytes): above the 2^31-1 count MPI takes in one "
                    "call; use smaller DDP buckets",
                    dt_coll_kind_name(w->kind), (long long)w->count, w->bytes);
  int n = (int)w->count, nb = (int)w->bytes;
  switch (w->kind) {
    case DT_COLL_ALLREDUCE: break; /* ring_allreduce_f32 */
    case DT_COLL_BROADCAST:
      DT_MPI_CHECK(MPI_Ibcast(w->out_data, nb, MPI_BYTE, w->root, m->comm, req));
      return DT_OK;
    case DT_COLL_ALLGATHER: {
      /* In place (ZeRO: the input is this rank's part of the output): MPI
       * forbids aliased buffers and takes MPI_IN_PLACE instead. */
      int in_place = w->in_data == (char *)w->out_data + (size_t)dt_comm_rank(w->comm) * w->bytes;
      DT_MPI_CHECK(MPI_Iallgather(in_place ? MPI_IN_PLACE : w->in_data, nb, MPI_BYTE, w->out_data,
                                  nb, MPI_BYTE, m->comm, req));
      return DT_OK;
    }
    case DT_COLL_REDUCE_SCATTER:
      DT_MPI_CHECK(
          MPI_Ireduce_scatter_block(w->in_data, w->out_data, n, MPI_FLOAT, MPI_SUM, m->comm, req));
      return DT_OK;
    case DT_COLL_BARRIER: DT_MPI_CHECK(MPI_Ibarrier(m->comm, req)); return DT_OK;
  }
  return DT_ERROR(DT_ERR_INTERNAL, "unknown collective kind %d", (int)w->kind);
}

static dt_status test_request(mpi_comm *m, MPI_Request *req, int *done) {
  dt_pg_mpi_lock(m->pg);
  int rc = MPI_Test(req, done, MPI_STATUS_IGNORE);
  dt_pg_mpi_unlock(m->pg);
  DT_MPI_CHECK(rc);
  return DT_OK;
}

/* Waits for `req`, polling: Open MPI progresses nonblocking collectives
 * only inside MPI calls, and blocking in MPI would spin a core. The thread
 * tests a few times back to back, then sleeps between tests, the pause
 * growing by half each time while nothing completes: up to 50 us while a
 * thread waits for the result on the host (the step's end: latency
 * matters), up to 250 us while the caller computes (the backward pass that
 * the all-reduce overlaps), since each wake-up is two context switches
 * taken from the computation on a machine whose cores all compute. Past the
 * deadline the request (and the work's buffers) is left to MPI:
 * DT_ERR_TIMEOUT. */
static dt_status wait_request(mpi_comm *m, MPI_Request *req, dt_work *w, double deadline) {
  int done = 0;
  long pause_ns = 10000L;
  for (long polls = 0; !done; polls++) {
    DT_CHECK(test_request(m, req, &done));
    if (done)
      break;
    if (polls >= 16) {
      long cap = dt_comm_host_waiting(w->comm) ? 50000L : 250000L;
      struct timespec pause = {0, pause_ns < cap ? pause_ns : cap};
      nanosleep(&pause, NULL);
      pause_ns = pause_ns * 3 / 2 < 250000L ? pause_ns * 3 / 2 : 250000L;
    }
    if ((polls & 15) == 0 && dt_comm_now() > deadline) {
      w->leaked = 1; /* the request still owns the buffers */
      return DT_ERR_TIMEOUT;
    }
  }
  return DT_OK;
}

/* Before the data moves, the ranks agree that they are at the same
 * collective: sequence number, kind, root and size. Collectives that pair
 * up wrongly (ranks that ran different numbers of steps, or with other
 * batch sizes or models) would otherwise exchange buffers of different
 * sizes, which corrupts memory. One small all-reduce (max of each value and
 * of its negation gives the range over the ranks; on 2 ranks a swap of the
 * values); a disagreement fails the collective on every rank with the
 * ranges. */
#define DT_AGREE_TAG 0x4147 /* "AG": the point-to-point signatures of 2 ranks */

static dt_status agree(mpi_comm *m, dt_work *w, double deadline) {
  int64_t sig[2 * DT_SIG_N];
  dt_comm_signature(w, sig);
  for (int i = 0; i < DT_SIG_N; i++)
    sig[DT_SIG_N + i] = -sig[i];
  if (dt_comm_size(w->comm) == 2) {
    /* Two ranks: swap the signatures (one message each way at once, where
     * the all-reduce takes two one after the other) and take the ranges. */
    int64_t peer[DT_SIG_N];
    MPI_Request reqs[2] = {MPI_REQUEST_NULL, MPI_REQUEST_NULL};
    int other = 1 - dt_comm_rank(w->comm);
    dt_pg_mpi_lock(m->pg);
    int rc = MPI_Irecv(peer, DT_SIG_N, MPI_INT64_T, other, DT_AGREE_TAG, m->comm, &reqs[0]);
    if (rc == MPI_SUCCESS)
      rc = MPI_Isend(sig, DT_SIG_N, MPI_INT64_T, other, DT_AGREE_TAG, m->comm, &reqs[1]);
    dt_pg_mpi_unlock(m->pg);
    DT_MPI_CHECK(rc);
    DT_CHECK(wait_request(m, &reqs[1], w, deadline));
    DT_CHECK(wait_request(m, &reqs[0], w, deadline));
    for (int i = 0; i < DT_SIG_N; i++) {
      sig[DT_SIG_N + i] = -sig[i] > -peer[i] ? -sig[i] : -peer[i];
      sig[i] = sig[i] > peer[i] ? sig[i] : peer[i];
    }
  } else {
    MPI_Request req = MPI_REQUEST_NULL;
    dt_pg_mpi_lock(m->pg);
    int rc = MPI_Iallreduce(MPI_IN_PLACE, sig, 2 * DT_SIG_N, MPI_INT64_T, MPI_MAX, m->comm, &req);
    dt_pg_mpi_unlock(m->pg);
    DT_MPI_CHECK(rc);
    DT_CHECK(wait_request(m, &req, w, deadline));
  }
  int64_t lo[DT_SIG_N];
  for (int i = 0; i < DT_SIG_N; i++)
    lo[i] = -sig[DT_SIG_N + i];
  return dt_comm_signatures_agree(lo, sig);
}

/* ---- 16-bit reductions: a reduce-scatter of our own, then all-gather ---- */

/* Room for `bytes` of parts and the per-rank tables. */
static dt_status reserve_parts(mpi_comm *m, int world, size_t bytes) {
  if (m->counts == NULL) {
    m->counts = calloc((size_t)world * 4, sizeof *m->counts);
    m->part_ptrs = calloc((size_t)world, sizeof *m->part_ptrs);
    if (m->counts == NULL || m->part_ptrs == NULL)
      return DT_ERROR(DT_ERR_OOM, "16-bit reduction over %d ranks: out of host memory", world);
    m->displs = m->counts + world;
    m->recv_counts = m->displs + world;
    m->recv_displs = m->recv_counts + world;
  }
  if (bytes <= m->parts_cap)
    return DT_OK;
  void *p = realloc(m->parts, bytes);
  if (p == NULL)
    return DT_ERROR(DT_ERR_OOM, "16-bit reduction: out of host memory for %zu bytes", bytes);
  m->parts = p;
  m->parts_cap = bytes;
  return DT_OK;
}

/* Starts a nonblocking MPI call under the MPI lock and waits for it. */
#define RUN_MPI(m, w, deadline, call)                    \
  do {                                                   \
    MPI_Request req_ = MPI_REQUEST_NULL;                 \
    dt_pg_mpi_lock((m)->pg);                             \
    int rc_ = (call);                                    \
    dt_pg_mpi_unlock((m)->pg);                           \
    DT_MPI_CHECK(rc_);                                   \
    DT_CHECK(wait_request((m), &req_, (w), (deadline))); \
  } while (0)

/* This rank's slice `len` elements long of the world's parts (in rank
 * order, `len` apart in m->parts) reduced into `out`. */
static void reduce_parts(mpi_comm *m, dt_work *w, int world, int64_t len, void *out) {
  float acc[DT_COMM_REDUCE_CHUNK];
  for (int64_t c0 = 0; c0 < len; c0 += DT_COMM_REDUCE_CHUNK) {
    int64_t n = len - c0 < DT_COMM_REDUCE_CHUNK ? len - c0 : DT_COMM_REDUCE_CHUNK;
    for (int k = 0; k < world; k++)
      m->part_ptrs[k] = (const char *)m->parts + ((size_t)k * (size_t)len + (size_t)c0) * w->elem;
    dt_comm_sum_f32(m->part_ptrs, world, w->dtype, n, w->op == DT_REDUCE_AVG, acc);
    dt_comm_from_f32(acc, w->dtype, (char *)out + (size_t)c0 * w->elem, n);
  }
}

/* reduce_scatter of 16-bit data: every rank sends rank k its k-th slice
 * (MPI_Ialltoall of 2-byte elements) and reduces what it received. */
static dt_status reduce_scatter_16(mpi_comm *m, dt_work *w, double deadline) {
  int world = dt_comm_size(w->comm), n = (int)w->count;
  DT_CHECK(reserve_parts(m, world, (size_t)world * (size_t)n * w->elem));
  RUN_MPI(m, w, deadline,
          MPI_Ialltoall(w->in_data, n, MPI_UINT16_T, m->parts, n, MPI_UINT16_T, m->comm, &req_));
  reduce_parts(m, w, world, n, w->out_data);
  return DT_OK;
}

/* allreduce of 16-bit data: rank k reduces slice k of every rank's data
 * (MPI_Ialltoallv), then the reduced slices are gathered in place. */
static dt_status allreduce_16(mpi_comm *m, dt_work *w, double deadline) {
  int world = dt_comm_size(w->comm), rank = dt_comm_rank(w->comm);
  int64_t n = w->count;
  DT_CHECK(reserve_parts(m, world, 0));
  for (int k = 0; k < world; k++) {
    m->displs[k] = (int)(n * k / world);
    m->counts[k] = (int)(n * (k + 1) / world) - m->displs[k];
  }
  int mine = m->counts[rank];
  for (int k = 0; k < world; k++) {
    m->recv_counts[k] = mine;
    m->recv_displs[k] = k * mine;
  }
  DT_CHECK(reserve_parts(m, world, (size_t)world * (size_t)mine * w->elem));
  RUN_MPI(m, w, deadline,
          MPI_Ialltoallv(w->out_data, m->counts, m->displs, MPI_UINT16_T, m->parts, m->recv_counts,
                         m->recv_displs, MPI_UINT16_T, m->comm, &req_));
  reduce_parts(m, w, world, mine, (char *)w->out_data + (size_t)m->displs[rank] * w->elem);
  RUN_MPI(m, w, deadline,
          MPI_Iallgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, w->out_data, m->counts, m->displs,
                          MPI_UINT16_T, m->comm, &req_));
  return DT_OK;
}

/* ---- f32 all-reduce: a pipelined ring of our own ----
 *
 * Open MPI's nonblocking all-reduce (libnbc) reduces in place with a binomial
 * tree: on 2 ranks rank 1 sends everything to rank 0, which reduces it all
 * and sends it all back, one step after the other. The ring instead splits
 * the buffer into `world` segments: world-1 reduce-scatter steps (send a
 * segment to the right, receive the next from the left and add it in), then
 * world-1 all-gather steps (pass the reduced segments on), each rank sending
 * and reducing 1/world of the data per step. Every segment goes in chunks
 * of DT_RING_CHUNK elements and each chunk is passed on (as the next step's
 * send) as soon as it is reduced, so that the reduction of one chunk overlaps
 * the transfer of the next and the all-gather of a segment starts with its
 * first reduced chunk. The average divides in the last reduce-scatter step
 * (fused with the add). On 2 ranks the result has the bits of the plain sum
 * (x0 + x1) / 2; with more ranks each segment's sum runs in ring order,
 * the same on every rank (every rank receives the reducer's values). */
#define DT_RING_CHUNK ((int64_t)32768) /* elements: 128 KiB of f32 */
#define DT_RING_TAG 0x5249             /* "RI" */

static int64_t seg_lo(int64_t n, int world, int k) { return n * k / world; }

static int64_t num_chunks(int64_t len) { return (len + DT_RING_CHUNK - 1) / DT_RING_CHUNK; }

static dt_status isend_chunk(mpi_comm *m, const float *p, int64_t len, int peer, MPI_Request *r) {
  dt_pg_mpi_lock(m->pg);
  int rc = MPI_Isend(p, (int)len, MPI_FLOAT, peer, DT_RING_TAG, m->comm, r);
  dt_pg_mpi_unlock(m->pg);
  DT_MPI_CHECK(rc);
  return DT_OK;
}

static dt_status irecv_chunk(mpi_comm *m, float *p, int64_t len, int peer, MPI_Request *r) {
  dt_pg_mpi_lock(m->pg);
  int rc = MPI_Irecv(p, (int)len, MPI_FLOAT, peer, DT_RING_TAG, m->comm, r);
  dt_pg_mpi_unlock(m->pg);
  DT_MPI_CHECK(rc);
  return DT_OK;
}

/* Room for the ring's receive segment and 3 * chunks requests. */
static dt_status reserve_ring(mpi_comm *m, int64_t seg_max) {
  size_t reqs = 3 * (size_t)num_chunks(seg_max);
  if ((size_t)seg_max > m->ring_tmp_cap) {
    float *p = realloc(m->ring_tmp, (size_t)seg_max * sizeof(float));
    if (p == NULL)
      return DT_ERROR(DT_ERR_OOM, "ring all-reduce: out of host memory for %lld elements",
                      (long long)seg_max);
    m->ring_tmp = p;
    m->ring_tmp_cap = (size_t)seg_max;
  }
  if (reqs > m->ring_reqs_cap) {
    MPI_Request *r = realloc(m->ring_reqs, reqs * sizeof *r);
    if (r == NULL)
      return DT_ERROR(DT_ERR_OOM, "ring all-reduce: out of host memory for %zu requests", reqs);
    m->ring_reqs = r;
    m->ring_reqs_cap = reqs;
  }
  for (size_t i = 0; i < reqs; i++)
    m->ring_reqs[i] = MPI_REQUEST_NULL;
  return DT_OK;
}

/* Waits for every request of `reqs[0..n)` (null ones are done). */
static dt_status wait_all(mpi_comm *m, MPI_Request *reqs, int64_t n, dt_work *w, double deadline) {
  for (int64_t i = 0; i < n; i++)
    if (reqs[i] != MPI_REQUEST_NULL)
      DT_CHECK(wait_request(m, &reqs[i], w, deadline));
  return DT_OK;
}

/* Chunk c of a segment `len` long: its offset and length. */
static int64_t chunk_len(int64_t len, int64_t c) {
  int64_t off = c * DT_RING_CHUNK;
  return len - off < DT_RING_CHUNK ? len - off : DT_RING_CHUNK;
}

static dt_status ring_allreduce_f32(mpi_comm *m, dt_work *w, double deadline) {
  int world = dt_comm_size(w->comm), rank = dt_comm_rank(w->comm);
  float *x = w->out_data;
  int64_t n = w->count;
  int avg = w->op == DT_REDUCE_AVG;
  if (world == 1) {
    if (avg)
      dt_comm_scale_avg_f32(x, n, world);
    return DT_OK;
  }
  int right = (rank + 1) % world, left = (rank + world - 1) % world;
  int64_t seg_max = 0;
  for (int k = 0; k < world; k++)
    if (seg_lo(n, world, k + 1) - seg_lo(n, world, k) > seg_max)
      seg_max = seg_lo(n, world, k + 1) - seg_lo(n, world, k);
  DT_CHECK(reserve_ring(m, seg_max));
  int64_t cmax = num_chunks(seg_max);
  /* The sends of a step are posted during the step before (as its chunks
   * are reduced), alternating between two request arrays; the receives of
   * a step are posted when it begins. */
  MPI_Request *sends[2] = {m->ring_reqs, m->ring_reqs + cmax}, *recvs = m->ring_reqs + 2 * cmax;
  int steps = 2 * (world - 1);
  int64_t lo = seg_lo(n, world, rank), len = seg_lo(n, world, rank + 1) - lo;
  for (int64_t c = 0; c < num_chunks(len); c++) /* step 0 sends this rank's segment */
    DT_CHECK(isend_chunk(m, x + lo + c * DT_RING_CHUNK, chunk_len(len, c), right, &sends[0][c]));
  for (int s = 0; s < steps; s++) {
    int reduce = s < world - 1; /* reduce-scatter, then all-gather */
    /* Step s receives segment rank-s-1 (mod world): the one step s+1
     * sends on. */
    int seg = ((rank - s - 1) % world + world) % world;
    lo = seg_lo(n, world, seg);
    len = seg_lo(n, world, seg + 1) - lo;
    MPI_Request *next = sends[(s + 1) & 1];
    /* The sends before step s are done before its receives land: an
     * all-gather step writes the segment an early step sent from. */
    DT_CHECK(wait_all(m, next, cmax, w, deadline));
    int64_t chunks = num_chunks(len);
    for (int64_t c = 0; c < chunks; c++) {
      float *dst = (reduce ? m->ring_tmp : x + lo) + c * DT_RING_CHUNK;
      DT_CHECK(irecv_chunk(m, dst, chunk_len(len, c), left, &recvs[c]));
    }
    for (int64_t c = 0; c < chunks; c++) {
      int64_t off = c * DT_RING_CHUNK, cl = chunk_len(len, c);
      DT_CHECK(wait_request(m, &recvs[c], w, deadline));
      if (reduce)
        dt_comm_add_f32(x + lo + off, m->ring_tmp + off, cl, avg && s == world - 2, world);
      if (s + 1 < steps)
        DT_CHECK(isend_chunk(m, x + lo + off, cl, right, &next[c]));
    }
  }
  DT_CHECK(wait_all(m, sends[0], cmax, w, deadline));
  return wait_all(m, sends[1], cmax, w, deadline);
}

static dt_status mpi_run(void *impl, dt_work *w, double deadline) {
  mpi_comm *m = impl;
  if (m->shm != NULL)
    return dt_shm_transport_run(m->shm, w, deadline);
  DT_CHECK(agree(m, w, deadline));
  int reduction = w->kind == DT_COLL_ALLREDUCE || w->kind == DT_COLL_REDUCE_SCATTER;
  if (reduction && w->dtype != DT_DTYPE_F32) {
    if (w->count > INT_MAX / dt_comm_size(w->comm))
      return DT_ERROR(DT_ERR_UNSUPPORTED,
                      "16-bit %s of %lld elements over %d ranks: above the 2^31-1 count MPI "
                      "takes in one call; use smaller DDP buckets",
                      dt_coll_kind_name(w->kind), (long long)w->count, dt_comm_size(w->comm));
    return w->kind == DT_COLL_ALLREDUCE ? allreduce_16(m, w, deadline)
                                        : reduce_scatter_16(m, w, deadline);
  }
  if (w->kind == DT_COLL_ALLREDUCE) /* chunks of at most DT_RING_CHUNK: any count */
    return ring_allreduce_f32(m, w, deadline);
  MPI_Request req = MPI_REQUEST_NULL;
  dt_pg_mpi_lock(m->pg);
  dt_status st = start_collective(m, w, &req);
  dt_pg_mpi_unlock(m->pg);
  if (st != DT_OK)
    return st;
  DT_CHECK(wait_request(m, &req, w, deadline));
  if (w->op == DT_REDUCE_AVG && reduction)
    dt_comm_scale_avg_f32(w->out_data, w->count, dt_comm_size(w->comm));
  return DT_OK;
}

static void mpi_abort_job(void *impl, int code) {
  mpi_comm *m = impl;
  dt_pg_abort(m->pg, code);
}

static void mpi_destroy(void *impl, int broken) {
  mpi_comm *m = impl;
  if (m == NULL)
    return;
  /* A stuck request still refers to the communicator: freeing it would be
   * erroneous, and the job is ending anyway. */
  if (!broken && m->comm != MPI_COMM_NULL) {
    dt_pg_mpi_lock(m->pg);
    MPI_Comm_free(&m->comm);
    dt_pg_mpi_unlock(m->pg);
  }
  if (!broken) { /* a stuck exchange may still use the parts, counts and requests */
    free(m->parts);
    free(m->counts);
    free(m->ring_tmp);
    free(m->ring_reqs);
  }
  free(m->part_ptrs);
  dt_shm_transport_destroy(m->shm);
  free(m);
}

static const char *mpi_transport(void *impl) {
  return ((mpi_comm *)impl)->shm != NULL ? "shm" : "mpi";
}

static dt_status mpi_shared_buffer(void *impl, size_t bytes, void **data,
                                   void (**release)(void *ctx), void **ctx) {
  mpi_comm *m = impl;
  *data = NULL;
  if (m->shm == NULL)
    return DT_OK;
  return dt_shm_transport_share(m->shm, bytes, data, release, ctx);
}

static const dt_comm_backend mpi_backend = {
    .name = "mpi",
    .host_memory = 1,
    .run = mpi_run,
    .shared_buffer = mpi_shared_buffer,
    .transport = mpi_transport,
    .abort_job = mpi_abort_job,
    .destroy = mpi_destroy,
};

static dt_status dup_comm(dt_pg *pg, MPI_Comm *out) {
  DT_MPI_CHECK(MPI_Comm_dup(pg->world_comm, out));
  DT_MPI_CHECK(MPI_Comm_set_errhandler(*out, MPI_ERRORS_RETURN));
  return DT_OK;
}

dt_status dt_comm_create_mpi(dt_pg *pg, const dt_comm_config *cfg, dt_comm **out) {
  if (pg == NULL || out == NULL)
    return DT_ERROR(DT_ERR_INVALID_ARG, "creating an mpi communicator: pg or out is NULL");
  *out = NULL;
  if (!pg->uses_mpi)
    return DT_ERROR(DT_ERR_INVALID_ARG,
                    "creating an mpi communicator: the process group is a single process "
                    "without MPI (launch with mpirun / srun --mpi=pmix, or use "
                    "dt_comm_create_for_pg)");
  mpi_comm *m = calloc(1, sizeof *m);
  if (m == NULL)
    return DT_ERROR(DT_ERR_OOM, "creating an mpi communicator: out of host memory");
  m->pg = pg;
  m->comm = MPI_COMM_NULL;
  /* MPI_Comm_dup is collective: a peer that stopped (loading data, say)
   * would block this rank in it for ever; the collective deadline bounds it. */
  dt_guard *guard = NULL;
  dt_status st = dt_guard_begin(pg, "creating the mpi communicator (MPI_Comm_dup, every rank)",
                                cfg ? cfg->timeout_s : DT_COMM_CONFIG_DEFAULT.timeout_s, &guard);
  if (st != DT_OK) {
    mpi_destroy(m, 0);
    return st;
  }
  dt_pg_mpi_lock(pg);
  st = dup_comm(pg, &m->comm);
  dt_pg_mpi_unlock(pg);
  dt_guard_end(guard);
  if (st != DT_OK) {
    mpi_destroy(m, 0);
    return dt_error_wrap(st, "creating an mpi communicator on rank %d", pg->rank);
  }
  dt_comm_config cc = cfg ? *cfg : DT_COMM_CONFIG_DEFAULT;
  st = dt_shm_transport_create(pg, m->comm, cc.shm, cc.timeout_s, &m->shm);
  if (st != DT_OK) {
    mpi_destroy(m, 0);
    return st;
  }
  char peers[96];
  if (pg->world == 1)
    snprintf(peers, sizeof peers, "rank 0 only");
  else
    snprintf(peers, sizeof peers, "ranks 0-%d", pg->world - 1);
  DT_CHECK(dt_comm_create_with_backend(&mpi_backend, m, pg->rank, pg->world, peers, cfg, out));
  dt_comm_attach_pg(*out, pg);
  return DT_OK;
}

dt_status dt_comm_create_for_pg(dt_pg *pg, const dt_comm_config *cfg, dt_comm **out) {
  if (pg == NULL || out == NULL)
    return DT_ERROR(DT_ERR_INVALID_ARG, "creating a communicator: pg or out is NULL");
  if (pg->uses_mpi)
    return dt_comm_create_mpi(pg, cfg, out);
  dt_local_group *g = NULL;
  DT_CHECK(dt_local_group_create(1, &g));
  dt_status st = dt_comm_create_local(g, 0, cfg, out);
  dt_local_group_release(g);
  return st;
}
