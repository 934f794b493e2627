/* The local communicator backend: participants are threads of one process.
 *
 * Each collective: every participant posts its buffers in its slot, a
 * barrier, each participant works on its own 1/N slice of the data across
 * all buffers (reading every participant's slice, writing the result to
 * every participant), a second barrier so that nobody returns (and reuses
 * its buffer) while another still reads it. A sum is taken in rank order,
 * so all participants get bitwise identical results. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "dist/comm_internal.h"

typedef struct local_slot {
  dt_coll_kind kind;
  dt_dtype dtype;
  dt_reduce_op op;
  int64_t count;
  size_t elem;
  int root;
  uint64_t seq;
  void *in, *out;
} local_slot;

struct dt_local_group {
  int refcount; /* atomic */
  int size;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int arrived;
  unsigned long generation;
  int broken;
  char broken_why[256];
  int *joined;
  local_slot *slots;
  const void **parts; /* size x size: each participant's list of the buffers it reduces */
};

typedef struct local_comm {
  dt_local_group *g;
  int rank;
} local_comm;

dt_status dt_local_group_create(int size, dt_local_group **out) {
  if (out == NULL || size < 1)
    return DT_ERROR(DT_ERR_INVALID_ARG, "creating a local group of %d participants: need >= 1",
                    size);
  dt_local_group *g = calloc(1, sizeof *g);
  if (g != NULL) {
    g->joined = calloc((size_t)size, sizeof *g->joined);
    g->slots = calloc((size_t)size, sizeof *g->slots);
    g->parts = calloc((size_t)size * (size_t)size, sizeof *g->parts);
  }
  if (g == NULL || g->joined == NULL || g->slots == NULL || g->parts == NULL) {
    if (g) {
      free(g->joined);
      free(g->slots);
      free(g->parts);
    }
    free(g);
    return DT_ERROR(DT_ERR_OOM, "creating a local group of %d: out of host memory", size);
  }
  g->refcount = 1;
  g->size = size;
  pthread_mutex_init(&g->mu, NULL);
  pthread_condattr_t attr;
  pthread_condattr_init(&attr);
  pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
  pthread_cond_init(&g->cv, &attr);
  pthread_condattr_destroy(&attr);
  *out = g;
  return DT_OK;
}

void dt_local_group_release(dt_local_group *g) {
  if (g == NULL || __atomic_sub_fetch(&g->refcount, 1, __ATOMIC_ACQ_REL) != 0)
    return;
  pthread_mutex_destroy(&g->mu);
  pthread_cond_destroy(&g->cv);
  free(g->joined);
  free(g->slots);
  free(g->parts);
  free(g);
}

/* Waits until every participant arrives. DT_ERR_TIMEOUT past the deadline
 * (the group becomes broken so that the others stop waiting too);
 * DT_ERR_STATE when another participant broke the group. */
static dt_status group_barrier(dt_local_group *g, int rank, uint64_t seq, double deadline) {
  pthread_mutex_lock(&g->mu);
  if (g->broken) {
    pthread_mutex_unlock(&g->mu);
    return DT_ERROR(DT_ERR_STATE, "local group broken: %s", g->broken_why);
  }
  unsigned long gen = g->generation;
  if (++g->arrived == g->size) {
    g->arrived = 0;
    g->generation++;
    pthread_cond_broadcast(&g->cv);
    pthread_mutex_unlock(&g->mu);
    return DT_OK;
  }
  struct timespec until;
  until.tv_sec = (time_t)deadline;
  until.tv_nsec = (long)((deadline - (double)until.tv_sec) * 1e9);
  if (until.tv_nsec >= 1000000000L) { /* rounding: EINVAL would spin forever */
    until.tv_sec++;
    until.tv_nsec -= 1000000000L;
  }
  while (gen == g->generation && !g->broken) {
    if (pthread_cond_timedwait(&g->cv, &g->mu, &until) == ETIMEDOUT && gen == g->generation &&
        !g->broken) {
      g->broken = 1;
      snprintf(g->broken_why, sizeof g->broken_why,
               "participant %d timed out in collective #%llu waiting for the others", rank,
               (unsigned long long)seq);
      pthread_cond_broadcast(&g->cv);
      pthread_mutex_unlock(&g->mu);
      return DT_ERR_TIMEOUT;
    }
  }
  int ok = gen != g->generation;
  pthread_mutex_unlock(&g->mu);
  if (!ok)
    return DT_ERROR(DT_ERR_STATE, "local group broken: %s", g->broken_why);
  return DT_OK;
}

static dt_status check_slots(const dt_local_group *g) {
  const local_slot *a = &g->slots[0];
  for (int k = 1; k < g->size; k++) {
    const local_slot *b = &g->slots[k];
    if (a->kind != b->kind || a->count != b->count || a->elem != b->elem || a->root != b->root ||
        a->op != b->op || a->dtype != b->dtype)
      return DT_ERROR(DT_ERR_DIST_MISMATCH,
                      "local participants disagree on a collective: participant 0 submitted "
                      "#%llu %s of %lld %s elements (root %d), participant %d #%llu %s "
                      "of %lld %s elements (root %d): every participant must submit the "
                      "same collectives in the same order",
                      (unsigned long long)a->seq, dt_coll_kind_name(a->kind), (long long)a->count,
                      dt_dtype_name(a->dtype), a->root, k, (unsigned long long)b->seq,
                      dt_coll_kind_name(b->kind), (long long)b->count, dt_dtype_name(b->dtype),
                      b->root);
  }
  return DT_OK;
}

/* Element `i` of a buffer of `elem`-byte elements. */
static void *at(void *base, int64_t i, size_t elem) { return (char *)base + (size_t)i * elem; }

/* Participant `rank`'s share of the reduction: elements [lo, hi) of each
 * participant's `src` summed in rank order (in f32, one rounding to the
 * data's type: comm_reduce.c) into each participant's dst. */
static void reduce_slice(const dt_local_group *g, int64_t lo, int64_t hi, int64_t src_off,
                         int to_all, int rank) {
  int n = g->size;
  const local_slot *me = &g->slots[rank];
  int avg = me->op == DT_REDUCE_AVG;
  float acc[DT_COMM_REDUCE_CHUNK];
  uint16_t rounded[DT_COMM_REDUCE_CHUNK]; /* the result in the 16-bit type */
  const void **parts = g->parts + (size_t)rank * (size_t)n;
  for (int64_t c0 = lo; c0 < hi; c0 += DT_COMM_REDUCE_CHUNK) {
    int64_t len = hi - c0 < DT_COMM_REDUCE_CHUNK ? hi - c0 : DT_COMM_REDUCE_CHUNK;
    size_t bytes = (size_t)len * me->elem;
    for (int k = 0; k < n; k++)
      parts[k] = at(g->slots[k].in, src_off + c0, me->elem);
    dt_comm_sum_f32(parts, n, me->dtype, len, avg, acc);
    const void *result = acc;
    if (me->dtype != DT_DTYPE_F32) {
      dt_comm_from_f32(acc, me->dtype, rounded, len);
      result = rounded;
    }
    if (to_all) {
      for (int k = 0; k < n; k++)
        memcpy(at(g->slots[k].out, c0, me->elem), result, bytes);
    } else {
      memcpy(at(me->out, c0 - lo, me->elem), result, bytes);
    }
  }
}

static void do_collective(const dt_local_group *g, int rank) {
  const local_slot *me = &g->slots[rank];
  int n = g->size;
  switch (me->kind) {
    case DT_COLL_ALLREDUCE: {
      int64_t lo = me->count * rank / n, hi = me->count * (rank + 1) / n;
      reduce_slice(g, lo, hi, 0, 1, rank);
      break;
    }
    case DT_COLL_REDUCE_SCATTER:
      reduce_slice(g, 0, me->count, (int64_t)rank * me->count, 0, rank);
      break;
    case DT_COLL_BROADCAST:
      if (rank != me->root && me->count > 0)
        memcpy(me->out, g->slots[me->root].in, (size_t)me->count * me->elem);
      break;
    case DT_COLL_ALLGATHER: {
      size_t bytes = (size_t)me->count * me->elem;
      for (int k = 0; k < n; k++) {
        char *dst = (char *)me->out + (size_t)k * bytes;
        if (dst != g->slots[k].in || k != rank)
          memmove(dst, g->slots[k].in, bytes);
      }
      break;
    }
    case DT_COLL_BARRIER: break;
  }
}

static dt_status local_run(void *impl, dt_work *w, double deadline) {
  local_comm *lc = impl;
  dt_local_group *g = lc->g;
  local_slot *me = &g->slots[lc->rank];
  *me = (local_slot){w->kind, w->dtype, w->op,      w->count,   w->elem,
                     w->root, w->seq,   w->in_data, w->out_data};
  DT_CHECK(group_barrier(g, lc->rank, w->seq, deadline));
  dt_status mismatch = check_slots(g);
  if (mismatch == DT_OK)
    do_collective(g, lc->rank);
  dt_status st = group_barrier(g, lc->rank, w->seq, deadline);
  if (st != DT_OK)
    w->leaked = 1; /* peers past the first barrier may still use our buffers */
  if (mismatch != DT_OK)
    return DT_ERR_DIST_MISMATCH; /* message already set by check_slots */
  return st;
}

static void local_abort_job(void *impl, int code) {
  (void)impl;
  (void)code;
  fflush(stdout);
  fflush(stderr);
  abort();
}

static void local_destroy(void *impl, int broken) {
  (void)broken;
  local_comm *lc = impl;
  if (lc == NULL)
    return;
  pthread_mutex_lock(&lc->g->mu);
  lc->g->joined[lc->rank] = 0;
  pthread_mutex_unlock(&lc->g->mu);
  dt_local_group_release(lc->g);
  free(lc);
}

static const dt_comm_backend local_backend = {
    .name = "local",
    .host_memory = 1,
    .run = local_run,
    .abort_job = local_abort_job,
    .destroy = local_destroy,
};

dt_status dt_comm_create_local(dt_local_group *g, int rank, const dt_comm_config *cfg,
                               dt_comm **out) {
  if (g == NULL || out == NULL)
    return DT_ERROR(DT_ERR_INVALID_ARG, "creating a local communicator: group or out is NULL");
  *out = NULL;
  if (rank < 0 || rank >= g->size)
    return DT_ERROR(DT_ERR_INVALID_ARG,
                    "creating a local communicator: rank %d is outside the group of %d", rank,
                    g->size);
  pthread_mutex_lock(&g->mu);
  int taken = g->joined[rank];
  g->joined[rank] = 1;
  pthread_mutex_unlock(&g->mu);
  if (taken)
    return DT_ERROR(DT_ERR_INVALID_ARG,
                    "creating a local communicator: rank %d of the group already has one", rank);
  local_comm *lc = calloc(1, sizeof *lc);
  if (lc == NULL) {
    pthread_mutex_lock(&g->mu);
    g->joined[rank] = 0;
    pthread_mutex_unlock(&g->mu);
    return DT_ERROR(DT_ERR_OOM, "creating a local communicator: out of host memory");
  }
  __atomic_add_fetch(&g->refcount, 1, __ATOMIC_ACQ_REL);
  lc->g = g;
  lc->rank = rank;
  char peers[96];
  snprintf(peers, sizeof peers, "local participants 0-%d", g->size - 1);
  return dt_comm_create_with_backend(&local_backend, lc, rank, g->size, peers, cfg, out);
}
