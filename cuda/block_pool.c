/* Caching block pool: see block_pool.h for the policy. Plain C, no CUDA.
 *
 * Free blocks live in one array per pool sorted by (stream, size, address),
 * so best fit is a binary search; live blocks are found by address in an
 * open-addressing hash table. Blocks of one segment are linked by address
 * (prev/next) for splitting and merging. */
#include "cuda/block_pool.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/memory.h"

typedef struct block {
  uintptr_t ptr;
  size_t size;
  uintptr_t stream;
  int large;                 /* pool index: 0 small, 1 large */
  int allocated;             /* handed out */
  struct block *prev, *next; /* address neighbours in the same segment */
} block;

typedef struct block_set {
  block **items;
  size_t n, cap;
} block_set;

struct dt_block_pool {
  dt_block_pool_config cfg;
  char what[32], device_name[32], limit_env[48];
  dt_raw_allocator raw;
  pthread_mutex_t lock;
  block_set free_sets[2];
  block **live; /* hash table of live blocks by address; NULL = empty slot */
  size_t live_cap, live_n;
  size_t segments;
  size_t allocated, reserved, peak;
  uint64_t num_allocs, num_ooms;
};

/* ---- sorted free sets ---- */

static int block_less(const block *a, uintptr_t stream, size_t size, uintptr_t ptr) {
  if (a->stream != stream)
    return a->stream < stream;
  if (a->size != size)
    return a->size < size;
  return a->ptr < ptr;
}

/* First index whose block is not less than (stream, size, ptr). */
static size_t set_lower_bound(const block_set *s, uintptr_t stream, size_t size, uintptr_t ptr) {
  size_t lo = 0, hi = s->n;
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    if (block_less(s->items[mid], stream, size, ptr))
      lo = mid + 1;
    else
      hi = mid;
  }
  return lo;
}

static int set_insert(block_set *s, block *b) {
  if (s->n == s->cap) {
    size_t cap = s->cap ? s->cap * 2 : 64;
    block **items = realloc(s->items, cap * sizeof *items);
    if (!items)
      return 0;
    s->items = items;
    s->cap = cap;
  }
  size_t i = set_lower_bound(s, b->stream, b->size, b->ptr);
  memmove(s->items + i + 1, s->items + i, (s->n - i) * sizeof *s->items);
  s->items[i] = b;
  s->n++;
  return 1;
}

static void set_remove(block_set *s, block *b) {
  size_t i = set_lower_bound(s, b->stream, b->size, b->ptr);
  DT_ASSERT(i < s->n && s->items[i] == b);
  memmove(s->items + i, s->items + i + 1, (s->n - i - 1) * sizeof *s->items);
  s->n--;
}

/* ---- live table (linear probing, backward-shift deletion) ---- */

static size_t hash_ptr(uintptr_t p, size_t cap) {
  uint64_t h = (uint64_t)p * 0x9E3779B97F4A7C15ull;
  return (size_t)(h >> 17) & (cap - 1);
}

static int live_grow(dt_block_pool *p) {
  size_t cap = p->live_cap ? p->live_cap * 2 : 256;
  block **t = calloc(cap, sizeof *t);
  if (!t)
    return 0;
  for (size_t i = 0; i < p->live_cap; i++) {
    block *b = p->live[i];
    if (!b)
      continue;
    size_t j = hash_ptr(b->ptr, cap);
    while (t[j])
      j = (j + 1) & (cap - 1);
    t[j] = b;
  }
  free(p->live);
  p->live = t;
  p->live_cap = cap;
  return 1;
}

static int live_insert(dt_block_pool *p, block *b) {
  if ((p->live_n + 1) * 2 > p->live_cap && !live_grow(p))
    return 0;
  size_t j = hash_ptr(b->ptr, p->live_cap);
  while (p->live[j])
    j = (j + 1) & (p->live_cap - 1);
  p->live[j] = b;
  p->live_n++;
  return 1;
}

static size_t live_find(const dt_block_pool *p, uintptr_t ptr) {
  if (!p->live_cap)
    return SIZE_MAX;
  size_t j = hash_ptr(ptr, p->live_cap);
  while (p->live[j]) {
    if (p->live[j]->ptr == ptr)
      return j;
    j = (j + 1) & (p->live_cap - 1);
  }
  return SIZE_MAX;
}

static void live_erase(dt_block_pool *p, size_t j) {
  size_t mask = p->live_cap - 1;
  p->live[j] = NULL;
  p->live_n--;
  for (size_t k = (j + 1) & mask; p->live[k]; k = (k + 1) & mask) {
    size_t home = hash_ptr(p->live[k]->ptr, p->live_cap);
    /* Move k back into the hole when its home is not in (j, k]. */
    int between = j < k ? (home > j && home <= k) : (home > j || home <= k);
    if (!between) {
      p->live[j] = p->live[k];
      p->live[k] = NULL;
      j = k;
    }
  }
}

/* ---- create / destroy ---- */

static void copy_name(char *dst, size_t cap, const char *src, const char *fallback) {
  snprintf(dst, cap, "%s", src ? src : fallback);
}

dt_status dt_block_pool_create(const dt_block_pool_config *cfg, dt_raw_allocator raw,
                               dt_block_pool **out) {
  *out = NULL;
  if (!raw.alloc || !raw.free)
    return DT_ERROR(DT_ERR_INVALID_ARG, "block pool: raw allocator without alloc/free");
  if (cfg->round == 0 || (cfg->round & (cfg->round - 1)) || cfg->small_segment < cfg->small_size ||
      cfg->large_round == 0)
    return DT_ERROR(DT_ERR_INVALID_ARG,
                    "block pool: bad config: round %zu (power of two), small_size %zu <= "
                    "small_segment %zu, large_round %zu > 0",
                    cfg->round, cfg->small_size, cfg->small_segment, cfg->large_round);
  dt_block_pool *p = calloc(1, sizeof *p);
  if (!p)
    return DT_ERROR(DT_ERR_OOM, "block pool: malloc of %zu bytes failed", sizeof *p);
  p->cfg = *cfg;
  copy_name(p->what, sizeof p->what, cfg->what, "device");
  copy_name(p->device_name, sizeof p->device_name, cfg->device_name, "device");
  copy_name(p->limit_env, sizeof p->limit_env, cfg->limit_env, "the memory limit");
  p->cfg.what = p->what;
  p->cfg.device_name = p->device_name;
  p->cfg.limit_env = p->limit_env;
  p->raw = raw;
  pthread_mutex_init(&p->lock, NULL);
  *out = p;
  return DT_OK;
}

/* Frees the segment starting at `head` (all its blocks). */
static void release_segment(dt_block_pool *p, block *head) {
  size_t size = 0;
  for (block *b = head; b;) {
    block *next = b->next;
    size += b->size;
    if (b != head)
      free(b);
    b = next;
  }
  p->raw.free(p->raw.ctx, (void *)head->ptr, size);
  p->reserved -= size;
  p->segments--;
  free(head);
}

void dt_block_pool_destroy(dt_block_pool *p) {
  if (!p)
    return;
  /* Every block is either cached or live: collect the segment heads. */
  block **heads = NULL;
  size_t nh = 0, ch = 0;
  for (int k = 0; k < 3; k++) {
    size_t n = k < 2 ? p->free_sets[k].n : p->live_cap;
    for (size_t i = 0; i < n; i++) {
      block *b = k < 2 ? p->free_sets[k].items[i] : p->live[i];
      if (!b || b->prev)
        continue;
      if (nh == ch) {
        ch = ch ? ch * 2 : 64;
        block **h = realloc(heads, ch * sizeof *h);
        if (!h)
          break; /* leak rather than crash at teardown */
        heads = h;
      }
      heads[nh++] = b;
    }
  }
  for (size_t i = 0; i < nh; i++)
    release_segment(p, heads[i]);
  free(heads);
  free(p->free_sets[0].items);
  free(p->free_sets[1].items);
  free(p->live);
  pthread_mutex_destroy(&p->lock);
  free(p);
}

/* ---- allocation ---- */

static size_t round_up(size_t x, size_t m) { return (x + m - 1) / m * m; }

static size_t segment_size(const dt_block_pool *p, size_t size) {
  if (size <= p->cfg.small_size)
    return p->cfg.small_segment;
  if (size < p->cfg.large_direct)
    return p->cfg.large_segment > size ? p->cfg.large_segment : round_up(size, p->cfg.large_round);
  return round_up(size, p->cfg.large_round);
}

/* Releases every whole free segment; caller holds the lock. Returns 0
 * when the raw allocator said releasing is not safe now (nothing freed). */
static int empty_cache_locked(dt_block_pool *p) {
  if (p->raw.releasable && !p->raw.releasable(p->raw.ctx))
    return 0;
  for (int k = 0; k < 2; k++) {
    block_set *s = &p->free_sets[k];
    size_t w = 0;
    for (size_t i = 0; i < s->n; i++) {
      block *b = s->items[i];
      if (!b->prev && !b->next)
        release_segment(p, b);
      else
        s->items[w++] = b;
    }
    s->n = w;
  }
  return 1;
}

static dt_status oom_error(dt_block_pool *p, size_t bytes, size_t seg, const char *why) {
  char req[32], cap[32], al[32], unused[32], lim[128], segs[32];
  p->num_ooms++;
  dt_format_bytes(bytes, req, sizeof req);
  dt_format_bytes(seg, segs, sizeof segs);
  if (p->cfg.capacity)
    dt_format_bytes(p->cfg.capacity, cap, sizeof cap);
  else
    snprintf(cap, sizeof cap, "unknown");
  dt_format_bytes(p->allocated, al, sizeof al);
  dt_format_bytes(p->reserved - p->allocated, unused, sizeof unused);
  if (p->cfg.limit) {
    char l[32];
    dt_format_bytes(p->cfg.limit, l, sizeof l);
    snprintf(lim, sizeof lim, "; cap %s from %s", l, p->limit_env);
  } else {
    lim[0] = '\0';
  }
  return DT_ERROR(DT_ERR_OOM,
                  "%s out of memory: tried to allocate %s (%zu bytes; a %s segment) on %s (%s): "
                  "%s total capacity %s; %s allocated by dtrain; %s reserved by dtrain but "
                  "unused%s. Reduce the micro-batch size, or keep the global batch with "
                  "gradient accumulation (--accum N); mixed precision (f16/bf16) also halves "
                  "activations%s",
                  p->what, req, bytes, segs, p->device_name, why, p->device_name, cap, al, unused,
                  lim, p->cfg.limit ? "; or raise the cap" : "");
}

/* Gets a new segment of `seg` bytes (or at least `size` when the cap leaves
 * room for that only), releasing the cache and retrying once. */
static dt_status new_segment(dt_block_pool *p, size_t size, size_t seg, block **out) {
  const char *why = "the device is full";
  int kept = 0;
  for (int attempt = 0; attempt < 2; attempt++) {
    if (attempt == 1)
      kept = !empty_cache_locked(p);
    size_t want = seg;
    if (p->cfg.limit && p->reserved + want > p->cfg.limit) {
      if (p->reserved + size > p->cfg.limit || size > p->cfg.limit) {
        why = "over the cap";
        continue;
      }
      want = size; /* fits under the cap as an exact segment */
    }
    void *ptr = NULL;
    dt_status st = p->raw.alloc(p->raw.ctx, want, &ptr);
    if (st == DT_ERR_OOM) {
      why = "the raw allocator is out of memory";
      continue;
    }
    if (st != DT_OK)
      return st;
    block *b = calloc(1, sizeof *b);
    if (!b) {
      p->raw.free(p->raw.ctx, ptr, want);
      return DT_ERROR(DT_ERR_OOM, "block pool: malloc of a block record failed");
    }
    b->ptr = (uintptr_t)ptr;
    b->size = want;
    p->reserved += want;
    p->segments++;
    *out = b;
    return DT_OK;
  }
  if (kept)
    why =
        "its cached segments were kept: releasing them would have synchronised the device "
        "while it still had queued work, possibly a collective in flight";
  return oom_error(p, size, seg, why);
}

/* b absorbs the block after it (adjacent in its segment): b's size grows by
 * it and it is freed. Returns b. */
static block *join_next(block *b) {
  block *next = b->next;
  b->size += next->size;
  b->next = next->next;
  if (next->next)
    next->next->prev = b;
  free(next);
  return b;
}

dt_status dt_block_pool_alloc(dt_block_pool *p, size_t bytes, uintptr_t stream, void **out) {
  *out = NULL;
  if (bytes > SIZE_MAX / 2)
    return DT_ERROR(DT_ERR_OOM,
                    "%s allocation of %zu bytes on %s is impossibly large: check "
                    "the shape that produced it",
                    p->what, bytes, p->device_name);
  size_t size = round_up(bytes ? bytes : 1, p->cfg.round);
  int large = size > p->cfg.small_size;
  dt_status st = DT_OK;
  pthread_mutex_lock(&p->lock);
  block_set *set = &p->free_sets[large];
  block *b = NULL;
  size_t i = set_lower_bound(set, stream, size, 0);
  if (i < set->n && set->items[i]->stream == stream) {
    b = set->items[i];
    memmove(set->items + i, set->items + i + 1, (set->n - i - 1) * sizeof *set->items);
    set->n--;
  } else {
    st = new_segment(p, size, segment_size(p, size), &b);
    if (st != DT_OK)
      goto unlock;
    b->stream = stream;
    b->large = large;
  }
  size_t rest = b->size - size;
  if (large ? rest > p->cfg.small_size : rest >= p->cfg.round) {
    block *r = calloc(1, sizeof *r);
    if (r) { /* without a record the block is just used whole */
      r->ptr = b->ptr + size;
      r->size = rest;
      r->stream = stream;
      r->large = large;
      r->prev = b;
      r->next = b->next;
      if (b->next)
        b->next->prev = r;
      b->next = r;
      b->size = size;
      if (!set_insert(set, r))
        join_next(b); /* undo */
    }
  }
  if (!live_insert(p, b)) {
    b->allocated = 0;
    if (!set_insert(set, b))
      DT_ASSERT(!"block pool: cannot re-cache a block");
    st = DT_ERROR(DT_ERR_OOM, "block pool: growing the live-block table failed (host malloc)");
    goto unlock;
  }
  b->allocated = 1;
  p->allocated += b->size;
  if (p->allocated > p->peak)
    p->peak = p->allocated;
  p->num_allocs++;
  *out = (void *)b->ptr;
unlock:
  pthread_mutex_unlock(&p->lock);
  return st;
}

dt_status dt_block_pool_free(dt_block_pool *p, void *ptr) {
  if (!ptr)
    return DT_OK;
  pthread_mutex_lock(&p->lock);
  size_t j = live_find(p, (uintptr_t)ptr);
  if (j == SIZE_MAX) {
    pthread_mutex_unlock(&p->lock);
    return DT_ERROR(DT_ERR_INVALID_ARG,
                    "%s free of %p on %s: not a live block of this allocator (double free, or "
                    "memory from another device/allocator)",
                    p->what, ptr, p->device_name);
  }
  block *b = p->live[j];
  live_erase(p, j);
  b->allocated = 0;
  p->allocated -= b->size;
  block_set *set = &p->free_sets[b->large];
  if (b->prev && !b->prev->allocated) {
    set_remove(set, b->prev);
    b = join_next(b->prev);
  }
  if (b->next && !b->next->allocated) {
    set_remove(set, b->next);
    join_next(b);
  }
  if (!set_insert(set, b)) {
    /* Keep the block out of the cache rather than lose track of it: mark it
     * live again (it leaks until destroy). */
    b->allocated = 1;
    p->allocated += b->size;
    live_insert(p, b);
  }
  pthread_mutex_unlock(&p->lock);
  return DT_OK;
}

size_t dt_block_pool_block_size(dt_block_pool *p, const void *ptr) {
  pthread_mutex_lock(&p->lock);
  size_t j = live_find(p, (uintptr_t)ptr);
  size_t s = j == SIZE_MAX ? 0 : p->live[j]->size;
  pthread_mutex_unlock(&p->lock);
  return s;
}

/* ---- cache control and statistics ---- */

int dt_block_pool_empty_cache(dt_block_pool *p) {
  pthread_mutex_lock(&p->lock);
  int done = empty_cache_locked(p);
  pthread_mutex_unlock(&p->lock);
  return done;
}

void dt_block_pool_stats(dt_block_pool *p, dt_memory_stats *out) {
  memset(out, 0, sizeof *out);
  pthread_mutex_lock(&p->lock);
  out->allocated = p->allocated;
  out->reserved = p->reserved;
  out->peak_allocated = p->peak;
  out->limit = p->cfg.limit;
  out->capacity = p->cfg.capacity;
  out->num_allocs = p->num_allocs;
  out->num_ooms = p->num_ooms;
  pthread_mutex_unlock(&p->lock);
}

void dt_block_pool_reset_peak(dt_block_pool *p) {
  pthread_mutex_lock(&p->lock);
  p->peak = p->allocated;
  pthread_mutex_unlock(&p->lock);
}

void dt_block_pool_set_limit(dt_block_pool *p, size_t limit) {
  pthread_mutex_lock(&p->lock);
  p->cfg.limit = limit;
  pthread_mutex_unlock(&p->lock);
}

void dt_block_pool_set_limit_from(dt_block_pool *p, size_t limit, const char *source) {
  pthread_mutex_lock(&p->lock);
  p->cfg.limit = limit;
  copy_name(p->limit_env, sizeof p->limit_env, source, "the memory limit");
  pthread_mutex_unlock(&p->lock);
}

void dt_block_pool_get_info(dt_block_pool *p, dt_block_pool_info *out) {
  pthread_mutex_lock(&p->lock);
  out->segments = p->segments;
  out->free_blocks = p->free_sets[0].n + p->free_sets[1].n;
  out->live_blocks = p->live_n;
  pthread_mutex_unlock(&p->lock);
}
