/* Device and pinned-host caching allocators: the block pool (block_pool.c)
 * over cudaMalloc / cudaHostAlloc.
 *
 * Device blocks handed out by dt_backend_ops.alloc are tagged with the
 * compute stream: every kernel runs there, so a block freed by the host
 * while kernels that use it are still queued is only reused by later work
 * on the same stream, which runs after them. Work on the copy or comm
 * streams must be fenced with events before the memory is freed (DDP waits
 * for its buckets before the optimizer step). The other direction -- a
 * block just handed out, written on the copy stream while compute work
 * queued before its free may still use it -- is fenced by the copy itself
 * (cuda_copy in backend.c waits for the compute stream).
 */
#include <stdio.h>
#include <string.h>

#include "cuda/cuda.h"
#include "cuda/cuda_internal.h"

/* ---- device memory ---- */

typedef struct raw_device {
  int index;
} raw_device;

static raw_device raw_devices[DT_CUDA_MAX_DEVICES];

static dt_status raw_device_alloc(void *ctx, size_t bytes, void **out) {
  raw_device *d = ctx;
  cudaError_t e = cudaMalloc(out, bytes);
  if (e == cudaErrorMemoryAllocation) {
    cudaGetLastError(); /* not sticky; clear it so later checks do not see it */
    return DT_ERR_OOM;
  }
  if (e != cudaSuccess)
    return dt_error_wrap(dt_cuda_fail(e, "cudaMalloc(out, bytes)", __func__, __FILE__, __LINE__),
                         "allocating %zu bytes on cuda:%d", bytes, d->index);
  return DT_OK;
}

static void raw_device_free(void *ctx, void *ptr, size_t bytes) {
  (void)ctx;
  (void)bytes;
  /* cudaFree synchronises the device, so no queued kernel still uses ptr. */
  cudaFree(ptr);
}

dt_status dt_cuda_pool_create(int index, size_t capacity, dt_block_pool **out) {
  char name[32];
  snprintf(name, sizeof name, "cuda:%d", index);
  dt_block_pool_config cfg = DT_BLOCK_POOL_CONFIG_DEFAULT;
  cfg.what = "CUDA";
  cfg.device_name = name;
  cfg.limit_env = "DT_CUDA_MEMORY_LIMIT";
  cfg.capacity = capacity;
  raw_devices[index].index = index;
  dt_raw_allocator raw = {&raw_devices[index], raw_device_alloc, raw_device_free};
  return dt_block_pool_create(&cfg, raw, out);
}

dt_status dt_cuda_alloc(dt_device dev, size_t bytes, void **out) {
  *out = NULL;
  dt_cuda_ctx *ctx = NULL;
  DT_CHECK(dt_cuda_ctx_get(dev, &ctx));
  return dt_block_pool_alloc(ctx->pool, bytes, (uintptr_t)dt_cuda_compute_stream(ctx), out);
}

void dt_cuda_free(dt_device dev, void *ptr, size_t bytes) {
  (void)bytes;
  if (!ptr)
    return;
  dt_cuda_ctx *ctx = NULL;
  if (dt_cuda_ctx_get(dev, &ctx) != DT_OK) {
    fprintf(stderr, "dtrain: cuda free of %p on cuda:%d: %s\n", ptr, dev.index, dt_last_error());
    return;
  }
  if (dt_block_pool_free(ctx->pool, ptr) != DT_OK)
    fprintf(stderr, "dtrain: %s\n", dt_last_error()); /* a broken invariant upstream */
}

dt_status dt_cuda_memory_stats(dt_device dev, dt_memory_stats *out) {
  dt_cuda_ctx *ctx = NULL;
  DT_CHECK(dt_cuda_ctx_get(dev, &ctx));
  dt_block_pool_stats(ctx->pool, out);
  return DT_OK;
}

dt_status dt_cuda_empty_cache(dt_device dev) {
  dt_cuda_ctx *ctx = NULL;
  DT_CHECK(dt_cuda_ctx_get(dev, &ctx));
  dt_block_pool_empty_cache(ctx->pool);
  return DT_OK;
}

dt_status dt_cuda_reset_peak_stats(dt_device dev) {
  dt_cuda_ctx *ctx = NULL;
  DT_CHECK(dt_cuda_ctx_get(dev, &ctx));
  dt_block_pool_reset_peak(ctx->pool);
  return DT_OK;
}

dt_status dt_cuda_scratch_alloc(dt_cuda_ctx *ctx, size_t bytes, void **out) {
  return dt_block_pool_alloc(ctx->pool, bytes, (uintptr_t)dt_cuda_compute_stream(ctx), out);
}

void dt_cuda_scratch_free(dt_cuda_ctx *ctx, void *ptr) { dt_block_pool_free(ctx->pool, ptr); }

/* ---- pinned host memory ---- */

static pthread_mutex_t pinned_lock = PTHREAD_MUTEX_INITIALIZER;
static dt_block_pool *pinned_pool;

static dt_status raw_pinned_alloc(void *ctx, size_t bytes, void **out) {
  (void)ctx;
  cudaError_t e = cudaHostAlloc(out, bytes, cudaHostAllocPortable);
  if (e == cudaErrorMemoryAllocation) {
    cudaGetLastError();
    return DT_ERR_OOM;
  }
  if (e != cudaSuccess)
    return dt_error_wrap(
        dt_cuda_fail(e, "cudaHostAlloc(out, bytes, cudaHostAllocPortable)", __func__, __FILE__,
                     __LINE__),
        "allocating %zu bytes of pinned host memory", bytes);
  return DT_OK;
}

static void raw_pinned_free(void *ctx, void *ptr, size_t bytes) {
  (void)ctx;
  (void)bytes;
  cudaFreeHost(ptr);
}

static dt_status pinned_get(dt_block_pool **out) {
  pthread_mutex_lock(&pinned_lock);
  dt_status st = DT_OK;
  if (!pinned_pool) {
    st = dt_cuda_probe();
    if (st == DT_OK) {
      dt_block_pool_config cfg = DT_BLOCK_POOL_CONFIG_DEFAULT;
      cfg.what = "pinned host";
      cfg.device_name = "the host (page-locked)";
      cfg.limit_env = "dt_block_pool_set_limit";
      dt_raw_allocator raw = {NULL, raw_pinned_alloc, raw_pinned_free};
      st = dt_block_pool_create(&cfg, raw, &pinned_pool);
    } else {
      st = dt_error_wrap(st, "pinned host memory needs a usable GPU");
    }
  }
  *out = pinned_pool;
  pthread_mutex_unlock(&pinned_lock);
  return st;
}

dt_status dt_cuda_pinned_alloc(size_t bytes, void **out) {
  *out = NULL;
  dt_block_pool *p = NULL;
  DT_CHECK(pinned_get(&p));
  return dt_block_pool_alloc(p, bytes, 0, out);
}

void dt_cuda_pinned_free(void *ptr) {
  if (!ptr)
    return;
  dt_block_pool *p = NULL;
  if (pinned_get(&p) != DT_OK || dt_block_pool_free(p, ptr) != DT_OK)
    fprintf(stderr, "dtrain: dt_cuda_pinned_free(%p): %s\n", ptr, dt_last_error());
}

dt_status dt_cuda_pinned_stats(dt_memory_stats *out) {
  dt_block_pool *p = NULL;
  DT_CHECK(pinned_get(&p));
  dt_block_pool_stats(p, out);
  return DT_OK;
}

dt_status dt_cuda_pinned_empty_cache(void) {
  dt_block_pool *p = NULL;
  DT_CHECK(pinned_get(&p));
  dt_block_pool_empty_cache(p);
  return DT_OK;
}
