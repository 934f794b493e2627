/* The caching allocator's bookkeeping, in plain C over an injected "raw"
 * allocator, so that it is tested without a GPU (tests/cuda_allocator_test.cc
 * plugs in a fake) and used unchanged over cudaMalloc and cudaHostAlloc.
 *
 * Policy (PyTorch's CUDACachingAllocator, simplified):
 *  - requests are rounded up to `round` bytes (512);
 *  - requests up to `small_size` (1 MiB) come from the small pool, carved
 *    out of `small_segment` (2 MiB) segments; larger ones from the large
 *    pool: `large_segment` (20 MiB) segments for requests under
 *    `large_direct` (10 MiB), else the request rounded to `large_round`
 *    (2 MiB);
 *  - a free block is reused only by a request tagged with the same stream
 *    (work queued on one stream is ordered, so reuse needs no event);
 *    best fit by size;
 *  - a block larger than the request is split (small pool: when the rest is
 *    at least `round`; large pool: when it is over `small_size`); a freed
 *    block merges with free neighbours of the same segment;
 *  - when the raw allocator fails (or `limit` would be passed), whole free
 *    segments are released and the raw allocation is retried once; then the
 *    request fails with DT_ERR_OOM and a message with the numbers and advice.
 *    A raw allocator whose free would wait for the device (cudaFree) says
 *    through `releasable` when releasing is safe; while it is not, cached
 *    segments stay (and the OOM message says why).
 *
 * Thread-safe: one mutex per pool.
 */
#ifndef DT_CUDA_BLOCK_POOL_H
#define DT_CUDA_BLOCK_POOL_H

#include <stddef.h>
#include <stdint.h>

#include "core/backend.h"
#include "core/memory.h"
#include "core/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Where segments come from. `alloc` returns DT_OK, DT_ERR_OOM when the
 * memory is exhausted (the pool then frees its cache and retries), or any
 * other status for a real failure (passed through). `free` gets back exactly
 * what `alloc` returned, with its size. */
typedef struct dt_raw_allocator {
  void *ctx;
  dt_status (*alloc)(void *ctx, size_t bytes, void **out);
  void (*free)(void *ctx, void *ptr, size_t bytes);
  /* Optional: 0 when `free` must not run now (it would synchronise a
   * device that still has work queued, e.g. a collective in flight). */
  int (*releasable)(void *ctx);
} dt_raw_allocator;

typedef struct dt_block_pool_config {
  const char *what;        /* "CUDA", "pinned host": start of the OOM message */
  const char *device_name; /* "cuda:0": names the device in messages */
  const char *limit_env;   /* env var named in messages ("DT_CUDA_MEMORY_LIMIT") */
  size_t capacity;         /* device capacity for messages and stats, 0 = unknown */
  size_t limit;            /* cap on reserved bytes, 0 = none */
  size_t round;
  size_t small_size;
  size_t small_segment;
  size_t large_segment;
  size_t large_direct;
  size_t large_round;
} dt_block_pool_config;

#define DT_BLOCK_POOL_CONFIG_DEFAULT                                                      \
  {                                                                                       \
    "CUDA", "cuda:0", "DT_CUDA_MEMORY_LIMIT", 0, 0, 512, DT_MIB, 2 * DT_MIB, 20 * DT_MIB, \
        10 * DT_MIB, 2 * DT_MIB                                                           \
  }

typedef struct dt_block_pool dt_block_pool;

/* Counts for tests and diagnostics. */
typedef struct dt_block_pool_info {
  size_t segments;    /* raw allocations held */
  size_t free_blocks; /* cached blocks (both pools) */
  size_t live_blocks; /* blocks handed out */
} dt_block_pool_info;

/* Copies cfg (strings included). */
dt_status dt_block_pool_create(const dt_block_pool_config *cfg, dt_raw_allocator raw,
                               dt_block_pool **out);
/* Returns every segment to the raw allocator, live blocks included. NULL ok. */
void dt_block_pool_destroy(dt_block_pool *p);

/* A block of at least `bytes` for work on `stream` (any tag; 0 is fine). */
dt_status dt_block_pool_alloc(dt_block_pool *p, size_t bytes, uintptr_t stream, void **out);
/* Returns a block to the cache. A pointer the pool did not hand out is
 * DT_ERR_INVALID_ARG (nothing changes); NULL is a no-op. */
dt_status dt_block_pool_free(dt_block_pool *p, void *ptr);
/* Size actually reserved for a live block (the rounded size), 0 if unknown. */
size_t dt_block_pool_block_size(dt_block_pool *p, const void *ptr);

/* Releases every whole free segment to the raw allocator; 0 when its
 * `releasable` said not now (nothing released), else 1. */
int dt_block_pool_empty_cache(dt_block_pool *p);
/* allocated / reserved / peak / limit / capacity / num_allocs / num_ooms. */
void dt_block_pool_stats(dt_block_pool *p, dt_memory_stats *out);
void dt_block_pool_reset_peak(dt_block_pool *p);
void dt_block_pool_set_limit(dt_block_pool *p, size_t limit);
/* The same, and what the out-of-memory message names as the cap's source
 * (cfg.limit_env's place). */
void dt_block_pool_set_limit_from(dt_block_pool *p, size_t limit, const char *source);
void dt_block_pool_get_info(dt_block_pool *p, dt_block_pool_info *out);

#ifdef __cplusplus
}
#endif
#endif
