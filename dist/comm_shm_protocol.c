/* The shared-memory transport's collectives over its mapped segment (see
 * comm_shm.h; the layout is in comm_shm_internal.h).
 *
 * A collective is cut into chunks; chunk g (counted over the
 * communicator's life) uses slot g % SHM_SLOTS of every rank. Per chunk a
 * rank passes three phases and counts each in its control block:
 *   in    its contributions copied into its slot (the slices the others
 *         reduce; allgather/broadcast: its data);
 *   red   its own slice reduced from every rank's slot (reading its own
 *         slice in place) and the result written to its buffer and slot;
 *   out   the others' results (or data) copied out of their slots.
 * A phase waits for the phase before it on every rank; a slot is refilled
 * only after every rank has passed `out` of the chunk that used it before.
 * The phases of consecutive chunks are pipelined (chunk i's copy-in, chunk
 * i-1's reduction, chunk i-2's copy-out), so one rank's reduction overlaps
 * the others' copies. Every collective has at least one chunk; its first
 * copy-in also publishes the collective's signature, checked against every
 * rank's before anything is read from the others (the agreement, costing
 * no extra round trip).
 *
 * Waiting (wait_peer): a short spin, short sleeps, then FUTEX_WAIT on the
 * peer's counter (a shared, not private, futex: the word lives in the
 * shared mapping), woken by the peer's FUTEX_WAKE once the count it waits
 * for is reached; every SHM_LIVE_CHECK_S it checks that the peer lives.
 * Liveness: each rank's communication thread holds a robust process-shared
 * mutex in its control block from its first collective on; when that
 * thread or its process ends (SIGKILL included) the kernel marks the mutex
 * owner-dead, which a peer's trylock sees. */
#include <errno.h>
#include <limits.h>
#include <linux/futex.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "dist/comm_shm_internal.h"

#define SHM_SLOTS 4              /* > 2: the pipeline keeps three chunks in flight */
#define SHM_SPIN_S 2e-6          /* spin before sleeping while the rank computes */
#define SHM_SPIN_WAITING_S 50e-6 /* ... and while a thread of the rank waits for the result */
#define SHM_POLL_S 2e-3          /* poll this long before sleeping on a futex */
#define SHM_LIVE_CHECK_S 0.05    /* how often a wait checks that the peer lives */

/* Each control block on its own cache lines. */
#define SHM_CTL_STRIDE (((sizeof(shm_ctl) + 127) / 128) * 128)

/* ---- segment layout ---- */

char *dt_shm_region_part(const shm_region *r, int k) {
  return r->base + SHM_REGION_HEADER + (size_t)k * r->part_bytes;
}

static size_t ctl_offset(void) { return 256; }

static size_t data_offset(int world) {
  size_t end = ctl_offset() + (size_t)world * SHM_CTL_STRIDE;
  return (end + SHM_ALIGN - 1) / SHM_ALIGN * SHM_ALIGN;
}

size_t dt_shm_segment_bytes(int world, size_t slot_bytes) {
  return data_offset(world) + (size_t)world * SHM_SLOTS * slot_bytes;
}

static shm_ctl *ctl_at(char *base, int k) {
  return (shm_ctl *)(base + ctl_offset() + (size_t)k * SHM_CTL_STRIDE);
}

static shm_ctl *ctl_of(const dt_shm_transport *t, int k) { return ctl_at(t->base, k); }

/* Slot of rank k that global chunk g uses. */
static char *slot_of(const dt_shm_transport *t, int k, uint64_t g) {
  size_t index = (size_t)k * SHM_SLOTS + (size_t)(g % SHM_SLOTS);
  return t->base + data_offset(t->world) + index * t->slot_bytes;
}

/* ---- counters and waits ---- */

static long futex(uint32_t *word, int op, uint32_t val, const struct timespec *timeout) {
  return syscall(SYS_futex, word, op, val, timeout, NULL, 0);
}

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  __asm__ __volatile__("yield");
#endif
}

/* `count` (mod 2^32) has reached `target`. */
static int reached(uint32_t count, uint64_t target) {
  return (int32_t)(count - (uint32_t)target) >= 0;
}

/* "Asleep until rank k's counter p reaches target": never 0. */
static uint64_t sleep_word(int k, int p, uint32_t target) {
  return ((uint64_t)target << 32) | ((uint64_t)(uint32_t)k << 4) | (uint64_t)(p + 1);
}

/* This rank passed phase p of one more chunk; wakes the peers asleep on
 * that counter whose target it meets (and only those: a sleeper woken
 * early would cost two context switches for nothing). The counter update
 * and the sleepers' load are sequentially consistent, as are a sleeper's
 * store of what it waits for and its load of the counter: one side always
 * sees the other. */
static void post(dt_shm_transport *t, int p) {
  shm_ctl *me = ctl_of(t, t->rank);
  uint32_t now = __atomic_add_fetch(&me->done[p], 1, __ATOMIC_SEQ_CST);
  for (int k = 0; k < t->world; k++) {
    if (k == t->rank)
      continue;
    uint64_t s = __atomic_load_n(&ctl_of(t, k)->sleeping_on, __ATOMIC_SEQ_CST);
    if (s != 0 && s == sleep_word(t->rank, p, (uint32_t)(s >> 32)) && reached(now, s >> 32)) {
      futex(&me->done[p], FUTEX_WAKE, INT_MAX, NULL);
      return; /* wakes every sleeper on the word */
    }
  }
}

/* Takes this rank's liveness mutex on the communication thread. */
static dt_status arm(dt_shm_transport *t) {
  shm_ctl *me = ctl_of(t, t->rank);
  int rc = pthread_mutex_lock(&me->alive);
  if (rc == EOWNERDEAD) /* a previous communication thread of ours ended */
    rc = pthread_mutex_consistent(&me->alive);
  if (rc != 0)
    return DT_ERROR(DT_ERR_INTERNAL, "shared-memory transport: locking the liveness mutex: %s",
                    strerror(rc));
  __atomic_store_n(&me->armed, 1, __ATOMIC_RELEASE);
  t->armed = 1;
  return DT_OK;
}

dt_status dt_shm_init_alive(char *base, int k) {
  shm_ctl *c = ctl_at(base, k);
  pthread_mutexattr_t a;
  pthread_mutexattr_init(&a);
  pthread_mutexattr_setpshared(&a, PTHREAD_PROCESS_SHARED);
  pthread_mutexattr_setrobust(&a, PTHREAD_MUTEX_ROBUST);
  int rc = pthread_mutex_init(&c->alive, &a);
  pthread_mutexattr_destroy(&a);
  if (rc != 0)
    return DT_ERROR(DT_ERR_INTERNAL, "a robust process-shared mutex: %s", strerror(rc));
  return DT_OK;
}

/* DT_OK while peer k's communication thread lives (or has not started). */
static dt_status check_alive(dt_shm_transport *t, int k, dt_work *w) {
  shm_ctl *peer = ctl_of(t, k);
  if (!__atomic_load_n(&peer->armed, __ATOMIC_ACQUIRE))
    return DT_OK;
  int rc = pthread_mutex_trylock(&peer->alive);
  if (rc == EBUSY)
    return DT_OK;
  if (rc == 0 || rc == EOWNERDEAD)
    pthread_mutex_unlock(&peer->alive); /* not consistent: later checks see ENOTRECOVERABLE */
  w->peer_lost = 1;
  return DT_ERROR(DT_ERR_STATE,
                  "rank %d's process died (or its communicator was destroyed) while rank %d "
                  "waited for it in collective #%llu (%s, %zu bytes) on the shared-memory "
                  "transport: see that rank's output for why it ended",
                  k, t->rank, (unsigned long long)w->seq, dt_coll_kind_name(w->kind), w->bytes);
}

/* Waits until rank k has passed phase p of global chunk g (its counter
 * reaches g + 1), in three stages:
 *   spin   briefly while this rank computes (the core is the
 *          computation's), longer while a thread of this rank waits for the
 *          collective (the core is idle);
 *   poll   sleeps growing from 10 us by half each time, up to 50 us while a
 *          thread waits for the result and 250 us while the rank computes,
 *          for SHM_POLL_S: the exchange's hand-offs are this short, and a
 *          wake-up by the peer would preempt whatever runs on the core it
 *          lands on (measured on 2 busy cores: futex hand-offs at every
 *          phase lost a third of the throughput to context switches);
 *   sleep  then FUTEX_WAIT until the peer's FUTEX_WAKE (it wakes only
 *          sleepers whose count it reached), waking every
 *          SHM_LIVE_CHECK_S: a peer that is far behind (still computing,
 *          loading data) costs no wake-ups.
 * Throughout, past `deadline`: DT_ERR_TIMEOUT; a dead peer: DT_ERR_STATE. */
static dt_status wait_peer(dt_shm_transport *t, int k, int p, uint64_t g, dt_work *w,
                           double deadline) {
  uint32_t *word = &ctl_of(t, k)->done[p];
  if (reached(__atomic_load_n(word, __ATOMIC_ACQUIRE), g + 1))
    return DT_OK;
  int waiting = dt_comm_host_waiting(w->comm);
  double start = dt_comm_now();
  double spin_until = start + (waiting ? SHM_SPIN_WAITING_S : SHM_SPIN_S);
  do {
    for (int i = 0; i < 64; i++) {
      if (reached(__atomic_load_n(word, __ATOMIC_ACQUIRE), g + 1))
        return DT_OK;
      cpu_relax();
    }
  } while (dt_comm_now() < spin_until);
  uint64_t *sleeping = &ctl_of(t, t->rank)->sleeping_on;
  dt_status st = DT_OK;
  double pause_s = 10e-6, next_check = start; /* a first check once the spin is over */
  for (;;) {
    uint32_t v = __atomic_load_n(word, __ATOMIC_SEQ_CST);
    if (reached(v, g + 1))
      break;
    double now = dt_comm_now();
    if (now > deadline) {
      st = DT_ERR_TIMEOUT;
      break;
    }
    if (now > next_check) {
      st = check_alive(t, k, w);
      if (st != DT_OK)
        break;
      next_check = now + SHM_LIVE_CHECK_S;
    }
    double left = (deadline < next_check ? deadline : next_check) - now;
    if (now - start < SHM_POLL_S) {
      double cap = dt_comm_host_waiting(w->comm) ? 50e-6 : 250e-6;
      double nap = pause_s < cap ? pause_s : cap;
      struct timespec ts = {0, (long)((nap < left ? nap : left) * 1e9) + 1};
      nanosleep(&ts, NULL);
      pause_s *= 1.5;
      continue;
    }
    __atomic_store_n(sleeping, sleep_word(k, p, (uint32_t)(g + 1)), __ATOMIC_SEQ_CST);
    if (!reached(__atomic_load_n(word, __ATOMIC_SEQ_CST), g + 1)) {
      struct timespec ts = {0, (long)(left * 1e9) + 1};
      futex(word, FUTEX_WAIT, v, &ts); /* EAGAIN: it moved on; ETIMEDOUT: look again */
    }
  }
  __atomic_store_n(sleeping, 0, __ATOMIC_RELEASE);
  return st;
}

static dt_status wait_all(dt_shm_transport *t, int p, uint64_t g, dt_work *w, double deadline) {
  for (int i = 1; i < t->world; i++)
    DT_CHECK(wait_peer(t, (t->rank + i) % t->world, p, g, w, deadline));
  return DT_OK;
}

/* ---- the collectives' chunks ---- */

/* What one collective moves, in the units of its chunks. Reductions
 * (allreduce, reduce_scatter) split the data into `world` segments and
 * chunk each into pieces of `q` elements (a slot holds one piece of every
 * segment); the others move bytes, `q` of them (a whole slot) per chunk. */
typedef struct plan {
  dt_work *w;
  int reduction;
  int64_t q;       /* elements (reductions) or bytes per chunk */
  uint64_t chunks; /* >= 1 */
  uint64_t g0;     /* global index of chunk 0 */
} plan;

/* Segment k of a reduction: its first element and length. */
static char *seg_data(const plan *pl, int k, int64_t *len) {
  dt_work *w = pl->w;
  int world = dt_comm_size(w->comm);
  if (w->kind == DT_COLL_REDUCE_SCATTER) {
    *len = w->count;
    return (char *)w->in_data + (size_t)k * (size_t)w->count * w->elem;
  }
  int64_t lo = w->count * k / world, hi = w->count * (k + 1) / world;
  *len = hi - lo;
  return (char *)w->out_data + (size_t)lo * w->elem;
}

/* Piece c of a range `len` long, `q` per piece: its offset and length. */
static int64_t piece(int64_t len, int64_t q, uint64_t c, int64_t *off) {
  *off = (int64_t)c * q;
  int64_t n = len - *off;
  return n <= 0 ? 0 : n < q ? n : q;
}

static void plan_init(plan *pl, dt_shm_transport *t, dt_work *w) {
  pl->w = w;
  pl->reduction = w->kind == DT_COLL_ALLREDUCE || w->kind == DT_COLL_REDUCE_SCATTER;
  int64_t longest = 0;
  if (pl->reduction) {
    pl->q = (int64_t)(t->slot_bytes / (size_t)t->world / w->elem) / 64 * 64;
    for (int k = 0; k < t->world; k++) {
      int64_t len = 0;
      seg_data(pl, k, &len);
      longest = len > longest ? len : longest;
    }
  } else {
    pl->q = (int64_t)t->slot_bytes;
    longest = w->kind == DT_COLL_BARRIER ? 0 : (int64_t)w->bytes;
  }
  pl->chunks = longest == 0 ? 1 : (uint64_t)((longest + pl->q - 1) / pl->q);
  pl->g0 = t->chunks;
}

static void copy_in(dt_shm_transport *t, const plan *pl, uint64_t c) {
  dt_work *w = pl->w;
  char *slot = slot_of(t, t->rank, pl->g0 + c);
  int64_t off, n;
  if (pl->reduction) {
    for (int k = 0; k < t->world; k++) {
      int64_t len;
      char *seg = seg_data(pl, k, &len);
      if (k != t->rank && (n = piece(len, pl->q, c, &off)) > 0)
        memcpy(slot + (size_t)k * (size_t)pl->q * w->elem, seg + (size_t)off * w->elem,
               (size_t)n * w->elem);
    }
  } else if (w->kind == DT_COLL_ALLGATHER) {
    if ((n = piece((int64_t)w->bytes, pl->q, c, &off)) > 0) {
      const char *src = (const char *)w->in_data + off;
      memcpy(slot, src, (size_t)n);
      char *mine = (char *)w->out_data + (size_t)t->rank * w->bytes + off;
      if (mine != src) /* ZeRO gathers in place */
        memcpy(mine, src, (size_t)n);
    }
  } else if (w->kind == DT_COLL_BROADCAST && t->rank == w->root) {
    if ((n = piece((int64_t)w->bytes, pl->q, c, &off)) > 0)
      memcpy(slot, (const char *)w->in_data + off, (size_t)n);
  }
}

/* This rank's piece c of its segment: the sum over the ranks in rank order
 * (comm_reduce.c: f32 sums, one rounding), into the buffer and the slot. */
static void reduce(dt_shm_transport *t, const plan *pl, uint64_t c) {
  dt_work *w = pl->w;
  int64_t len, off;
  char *seg = seg_data(pl, t->rank, &len);
  int64_t n = piece(len, pl->q, c, &off);
  if (n == 0)
    return;
  size_t in_slot = (size_t)t->rank * (size_t)pl->q * w->elem;
  for (int k = 0; k < t->world; k++)
    t->parts[k] = k == t->rank ? seg + (size_t)off * w->elem : slot_of(t, k, pl->g0 + c) + in_slot;
  int reduce_scatter = w->kind == DT_COLL_REDUCE_SCATTER;
  char *dst =
      reduce_scatter ? (char *)w->out_data + (size_t)off * w->elem : seg + (size_t)off * w->elem;
  char *published = reduce_scatter ? NULL : slot_of(t, t->rank, pl->g0 + c) + in_slot;
  if (w->dtype == DT_DTYPE_F32) { /* one pass: read the parts, write both copies */
    dt_comm_sum_f32_into((const float *const *)t->parts, t->world, n, w->op == DT_REDUCE_AVG,
                         (float *)dst, (float *)published);
    return;
  }
  float acc[DT_COMM_REDUCE_CHUNK];
  for (int64_t s = 0; s < n; s += DT_COMM_REDUCE_CHUNK) {
    int64_t m = n - s < DT_COMM_REDUCE_CHUNK ? n - s : DT_COMM_REDUCE_CHUNK;
    size_t at = (size_t)s * w->elem;
    for (int k = 0; k < t->world; k++)
      t->sub[k] = (const char *)t->parts[k] + at;
    dt_comm_sum_f32(t->sub, t->world, w->dtype, m, w->op == DT_REDUCE_AVG, acc);
    dt_comm_from_f32(acc, w->dtype, dst + at, m);
    if (published != NULL)
      memcpy(published + at, dst + at, (size_t)m * w->elem);
  }
}

static void copy_out(dt_shm_transport *t, const plan *pl, uint64_t c) {
  dt_work *w = pl->w;
  int64_t off, n;
  if (w->kind == DT_COLL_ALLREDUCE) {
    for (int k = 0; k < t->world; k++) {
      int64_t len;
      char *seg = seg_data(pl, k, &len);
      if (k != t->rank && (n = piece(len, pl->q, c, &off)) > 0)
        memcpy(seg + (size_t)off * w->elem,
               slot_of(t, k, pl->g0 + c) + (size_t)k * (size_t)pl->q * w->elem,
               (size_t)n * w->elem);
    }
  } else if (w->kind == DT_COLL_ALLGATHER) {
    if ((n = piece((int64_t)w->bytes, pl->q, c, &off)) > 0)
      for (int k = 0; k < t->world; k++)
        if (k != t->rank)
          memcpy((char *)w->out_data + (size_t)k * w->bytes + off, slot_of(t, k, pl->g0 + c),
                 (size_t)n);
  } else if (w->kind == DT_COLL_BROADCAST && t->rank != w->root) {
    if ((n = piece((int64_t)w->bytes, pl->q, c, &off)) > 0)
      memcpy((char *)w->out_data + off, slot_of(t, w->root, pl->g0 + c), (size_t)n);
  }
}

/* Publishes this rank's signature and place of collective w. */
static void publish(dt_shm_transport *t, const dt_work *w, const int64_t place[2]) {
  shm_ctl *me = ctl_of(t, t->rank);
  dt_comm_signature(w, me->sig[w->seq & 1]);
  me->place[w->seq & 1][0] = place[0];
  me->place[w->seq & 1][1] = place[1];
}

/* Every rank's signature of this collective against ours, then the places
 * of its buffers: in the staging slots on every rank, or at the same place
 * of the same shared buffer on every rank (one rank's in-place exchange
 * against another's staged one would pair different counts). */
static dt_status agree(dt_shm_transport *t, const dt_work *w) {
  int64_t lo[DT_SIG_N], hi[DT_SIG_N];
  const int64_t *mine = ctl_of(t, t->rank)->sig[w->seq & 1];
  memcpy(lo, mine, sizeof lo);
  memcpy(hi, mine, sizeof hi);
  for (int k = 0; k < t->world; k++) {
    const int64_t *s = ctl_of(t, k)->sig[w->seq & 1];
    for (int i = 0; i < DT_SIG_N; i++) {
      lo[i] = s[i] < lo[i] ? s[i] : lo[i];
      hi[i] = s[i] > hi[i] ? s[i] : hi[i];
    }
  }
  DT_CHECK(dt_comm_signatures_agree(lo, hi));
  const int64_t *place = ctl_of(t, t->rank)->place[w->seq & 1];
  for (int k = 0; k < t->world; k++) {
    const int64_t *p = ctl_of(t, k)->place[w->seq & 1];
    if (p[0] != place[0] || p[1] != place[1])
      return DT_ERROR(DT_ERR_DIST_MISMATCH,
                      "collective #%llu (%s, %zu bytes): rank %d's buffer is %s (shared buffer "
                      "%lld, byte %lld) but rank %d's is %s (shared buffer %lld, byte %lld): an "
                      "all-reduce of a shared buffer (dt_comm_shared_buffer) must use the same "
                      "slice of it on every rank",
                      (unsigned long long)w->seq, dt_coll_kind_name(w->kind), w->bytes, t->rank,
                      place[0] < 0 ? "private" : "shared", (long long)place[0], (long long)place[1],
                      k, p[0] < 0 ? "private" : "shared", (long long)p[0], (long long)p[1]);
  }
  return DT_OK;
}

/* The pipeline: iteration i copies chunk i in, reduces chunk i-1 and
 * copies chunk i-2 out. */
static dt_status run_plan(dt_shm_transport *t, plan *pl, double deadline) {
  dt_work *w = pl->w;
  /* allgather and broadcast read the others' slots once their copy-in is
   * done; reductions once their reductions are. */
  int out_after = pl->reduction ? PH_RED : PH_IN;
  for (uint64_t i = 0; i < pl->chunks + 2; i++) {
    if (i < pl->chunks) {
      uint64_t g = pl->g0 + i;
      if (g >= SHM_SLOTS)
        DT_CHECK(wait_all(t, PH_OUT, g - SHM_SLOTS, w, deadline));
      if (i == 0)
        publish(t, w, (const int64_t[2]){-1, -1});
      copy_in(t, pl, i);
      post(t, PH_IN);
      t->chunks++;
      if (i == 0) {
        DT_CHECK(wait_all(t, PH_IN, pl->g0, w, deadline));
        DT_CHECK(agree(t, w));
      }
    }
    if (i >= 1 && i <= pl->chunks) {
      uint64_t c = i - 1;
      if (c > 0)
        DT_CHECK(wait_all(t, PH_IN, pl->g0 + c, w, deadline));
      if (pl->reduction)
        reduce(t, pl, c);
      post(t, PH_RED);
    }
    if (i >= 2) {
      uint64_t c = i - 2;
      if (w->kind != DT_COLL_REDUCE_SCATTER && w->kind != DT_COLL_BARRIER)
        DT_CHECK(wait_all(t, out_after, pl->g0 + c, w, deadline));
      copy_out(t, pl, c);
      post(t, PH_OUT);
    }
  }
  return DT_OK;
}

/* ---- all-reduce in place over a shared buffer ----
 * Every rank's data lies in its part of one shared buffer, at the same
 * offset: rank r reduces its segment reading every rank's data where it
 * lies (its own in place), then copies each other segment's result from
 * its owner's buffer. No staging copies, no publishing copy. Per chunk the
 * counters mean: in, this rank's data is final (all chunks at once, once
 * the collective's signature is agreed); red, its segment's chunk reduced
 * (the others may copy it out, and it has finished reading their inputs of
 * that chunk, so they may overwrite them); out, it has copied that chunk of
 * every other segment. The collective ends once every rank is past out of
 * its last chunk: nobody reads this rank's buffer any more, and its caller
 * may change it. Chunks of SHM_INPLACE_ELEMS elements let a rank's
 * reduction of chunk c overlap the others' copies of chunk c - 1. */
#define SHM_INPLACE_ELEMS 32768

/* The shared buffer w's data lies in, with place = its id and the byte
 * offset in this rank's part; NULL and -1, -1 when it is not all in one
 * (or w is not an in-place all-reduce). The work holds the buffer's
 * tensor, so the buffer stays in the table while w runs. */
static shm_region *find_place(dt_shm_transport *t, const dt_work *w, int64_t place[2]) {
  place[0] = place[1] = -1;
  if (w->kind != DT_COLL_ALLREDUCE || w->in_data != w->out_data || w->bytes == 0)
    return NULL;
  uintptr_t p = (uintptr_t)w->out_data;
  shm_region *found = NULL;
  pthread_mutex_lock(&t->regions_mu);
  for (int i = 0; i < SHM_MAX_REGIONS && found == NULL; i++) {
    shm_region *r = t->regions[i];
    uintptr_t mine = r != NULL ? (uintptr_t)dt_shm_region_part(r, t->rank) : 0;
    if (r != NULL && p >= mine && p - mine <= r->part_bytes &&
        w->bytes <= r->part_bytes - (p - mine)) {
      found = r;
      place[0] = (int64_t)r->id;
      place[1] = (int64_t)(p - mine);
    }
  }
  pthread_mutex_unlock(&t->regions_mu);
  return found;
}

/* Segment k of an in-place all-reduce of `count` elements: [lo, lo + len). */
static int64_t inplace_seg(int64_t count, int world, int k, int64_t *len) {
  int64_t lo = count * k / world;
  *len = count * (k + 1) / world - lo;
  return lo;
}

/* This rank's chunk c: the sum in rank order of every rank's elements,
 * written over its own. */
static void inplace_reduce(dt_shm_transport *t, dt_work *w, char *const *data, uint64_t c) {
  int64_t len, off;
  int64_t lo = inplace_seg(w->count, t->world, t->rank, &len);
  int64_t n = piece(len, SHM_INPLACE_ELEMS, c, &off);
  if (n == 0)
    return;
  size_t at = (size_t)(lo + off) * w->elem;
  for (int k = 0; k < t->world; k++)
    t->parts[k] = data[k] + at;
  char *dst = data[t->rank] + at;
  int avg = w->op == DT_REDUCE_AVG;
  if (w->dtype == DT_DTYPE_F32) {
    dt_comm_sum_f32_into((const float *const *)t->parts, t->world, n, avg, (float *)dst, NULL);
    return;
  }
  float acc[DT_COMM_REDUCE_CHUNK];
  for (int64_t s = 0; s < n; s += DT_COMM_REDUCE_CHUNK) {
    int64_t m = n - s < DT_COMM_REDUCE_CHUNK ? n - s : DT_COMM_REDUCE_CHUNK;
    for (int k = 0; k < t->world; k++)
      t->sub[k] = (const char *)t->parts[k] + (size_t)s * w->elem;
    dt_comm_sum_f32(t->sub, t->world, w->dtype, m, avg, acc);
    dt_comm_from_f32(acc, w->dtype, dst + (size_t)s * w->elem, m);
  }
}

/* Chunk c of every other rank's segment, once that rank has reduced it. */
static dt_status inplace_copy_out(dt_shm_transport *t, dt_work *w, char *const *data, uint64_t g0,
                                  uint64_t c, double deadline) {
  for (int i = 1; i < t->world; i++) {
    int k = (t->rank + i) % t->world;
    int64_t len, off;
    int64_t lo = inplace_seg(w->count, t->world, k, &len);
    int64_t n = piece(len, SHM_INPLACE_ELEMS, c, &off);
    DT_CHECK(wait_peer(t, k, PH_RED, g0 + c, w, deadline));
    if (n > 0) {
      size_t at = (size_t)(lo + off) * w->elem;
      memcpy(data[t->rank] + at, data[k] + at, (size_t)n * w->elem);
    }
  }
  post(t, PH_OUT);
  return DT_OK;
}

static dt_status run_inplace(dt_shm_transport *t, dt_work *w, const shm_region *r,
                             const int64_t place[2], double deadline) {
  char **data = t->bufs;
  for (int k = 0; k < t->world; k++)
    data[k] = dt_shm_region_part(r, k) + place[1];
  int64_t longest = (w->count + t->world - 1) / t->world;
  uint64_t chunks =
      longest == 0 ? 1 : (uint64_t)((longest + SHM_INPLACE_ELEMS - 1) / SHM_INPLACE_ELEMS);
  uint64_t g0 = t->chunks;
  t->chunks += chunks;
  /* The agreement: as the staged path's first chunk, then the rest. */
  publish(t, w, place);
  post(t, PH_IN);
  DT_CHECK(wait_all(t, PH_IN, g0, w, deadline));
  DT_CHECK(agree(t, w));
  for (uint64_t c = 1; c < chunks; c++)
    post(t, PH_IN); /* the data was final from the start: the counts stay in chunks */
  for (uint64_t c = 0; c <= chunks; c++) {
    if (c < chunks) {
      inplace_reduce(t, w, data, c);
      post(t, PH_RED);
    }
    if (c >= 1)
      DT_CHECK(inplace_copy_out(t, w, data, g0, c - 1, deadline));
  }
  return wait_all(t, PH_OUT, g0 + chunks - 1, w, deadline);
}

dt_status dt_shm_transport_run(dt_shm_transport *t, dt_work *w, double deadline) {
  if (!t->armed)
    DT_CHECK(arm(t));
  int64_t place[2];
  const shm_region *r = find_place(t, w, place);
  if (r != NULL)
    return run_inplace(t, w, r, place, deadline);
  plan pl;
  plan_init(&pl, t, w);
  return run_plan(t, &pl, deadline);
}
