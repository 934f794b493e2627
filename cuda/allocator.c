/* Device and pinned-host caching allocators: the block pool (block_pool.c)
 * over the device's stream-ordered allocator (cudaMallocFromPoolAsync /
 * cudaFreeAsync on the compute stream) or cudaMalloc, and cudaHostAlloc.
 *
 * Device blocks handed out by dt_backend_ops.alloc are tagged with the
 * compute stream: every kernel runs there, so a block freed by the host
 * while kernels that use it are still queued is only reused by later work
 * on the same stream, which runs after them. Work on the copy or comm
 * streams must be fenced with events before the memory is freed (DDP waits
 * for its buckets before the optimizer step). The other direction -- a
 * block just handed out, written on the copy stream while compute work
 * queued before its free may still use it -- is the writer's to fence (the
 * data loader does, core/data_loader.c).
 *
 * Releasing segments (dt_empty_cache, the OOM retry) never waits for the
 * device: cudaFree would synchronise it, and with a collective in flight
 * in dp mode that can deadlock (the collective waits for a peer whose
 * thread waits on the driver). The segments are freed in stream order on
 * the compute stream instead, and a new segment is fenced for the copy
 * and comm streams (they may use it before the compute stream reaches the
 * allocation). Where the device has no stream-ordered allocator (or a
 * peer GPU could not map its memory), cudaMalloc/cudaFree are used and
 * segments are released only while no stream of the device has work
 * queued. Pinned host segments (cudaFreeHost also synchronises) are
 * released only while no device has work queued.
 */
#include <stdio.h>
#include <string.h>

#include "cuda/cuda.h"
#include "cuda/cuda_internal.h"

/* ---- device memory ---- */

typedef struct raw_device {
  dt_cuda_ctx *ctx;
  cudaMemPool_t pool; /* the stream-ordered pool, when `async` */
  int async;
} raw_device;

static raw_device raw_devices[DT_CUDA_MAX_DEVICES];

static dt_status raw_device_alloc(void *ctx, size_t bytes, void **out) {
  raw_device *d = ctx;
  cudaStream_t compute = dt_cuda_compute_stream(d->ctx);
  cudaError_t e =
      d->async ? cudaMallocFromPoolAsync(out, bytes, d->pool, compute) : cudaMalloc(out, bytes);
  if (e == cudaErrorMemoryAllocation) {
    cudaGetLastError(); /* not sticky; clear it so later checks do not see it */
    return DT_ERR_OOM;
  }
  if (e != cudaSuccess)
    return dt_error_wrap(
        dt_cuda_fail(e, "cudaMalloc(FromPoolAsync)(out, bytes)", __func__, __FILE__, __LINE__),
        "allocating %zu bytes on cuda:%d", bytes, d->ctx->index);
  if (d->async) { /* the other streams use the segment only after its allocation */
    dt_status st = dt_cuda_fence_after_compute(d->ctx, d->ctx->streams[DT_STREAM_COPY].s);
    if (st == DT_OK)
      st = dt_cuda_fence_after_compute(d->ctx, d->ctx->streams[DT_STREAM_COMM].s);
    if (st != DT_OK) {
      cudaFreeAsync(*out, compute);
      *out = NULL;
      return st;
    }
  }
  return DT_OK;
}

static void raw_device_free(void *ctx, void *ptr, size_t bytes) {
  raw_device *d = ctx;
  (void)bytes;
  if (d->async) /* after the queued compute work that may use it; no host wait */
    cudaFreeAsync(ptr, dt_cuda_compute_stream(d->ctx));
  else /* only when the device is idle (raw_device_releasable): no wait either */
    cudaFree(ptr);
}

/* The cudaFree fallback: releasing is safe while no stream has work queued. */
static int raw_device_releasable(void *ctx) {
  raw_device *d = ctx;
  return dt_cuda_streams_idle(d->ctx);
}

/* The device's own stream-ordered pool, mapped for every peer GPU (dp
 * mode copies between replicas); leaves d->async 0 where that is not
 * possible. */
static dt_status stream_ordered_pool(raw_device *d, int index) {
  int supported = 0;
  if (cudaDeviceGetAttribute(&supported, cudaDevAttrMemoryPoolsSupported, index) != cudaSuccess ||
      !supported) {
    cudaGetLastError();
    return DT_OK;
  }
  int n = dt_cuda_device_count();
  for (int j = 0; j < n; j++) {
    int can = 1;
    if (j != index && (cudaDeviceCanAccessPeer(&can, j, index) != cudaSuccess || !can)) {
      cudaGetLastError();
      return DT_OK;
    }
  }
  struct cudaMemPoolProps props;
  memset(&props, 0, sizeof props);
  props.allocType = cudaMemAllocationTypePinned;
  props.location.type = cudaMemLocationTypeDevice;
  props.location.id = index;
  DT_CUDA_CHECK(cudaMemPoolCreate(&d->pool, &props));
  for (int j = 0; j < n; j++) {
    if (j == index)
      continue;
    struct cudaMemAccessDesc access;
    memset(&access, 0, sizeof access);
    access.location.type = cudaMemLocationTypeDevice;
    access.location.id = j;
    access.flags = cudaMemAccessFlagsProtReadWrite;
    DT_CUDA_CHECK(cudaMemPoolSetAccess(d->pool, &access, 1));
  }
  d->async = 1;
  return DT_OK;
}

dt_status dt_cuda_pool_create(dt_cuda_ctx *c, dt_block_pool **out) {
  char name[32];
  snprintf(name, sizeof name, "cuda:%d", c->index);
  dt_block_pool_config cfg = DT_BLOCK_POOL_CONFIG_DEFAULT;
  cfg.what = "CUDA";
  cfg.device_name = name;
  cfg.limit_env = "DT_CUDA_MEMORY_LIMIT";
  cfg.capacity = c->total_memory;
  raw_device *d = &raw_devices[c->index];
  d->ctx = c;
  DT_CHECK(stream_ordered_pool(d, c->index));
  dt_raw_allocator raw = {d, raw_device_alloc, raw_device_free,
                          d->async ? NULL : raw_device_releasable};
  return dt_block_pool_create(&cfg, raw, out);
}

int dt_cuda_stream_ordered_memory(int index) {
  return index >= 0 && index < DT_CUDA_MAX_DEVICES && raw_devices[index].async;
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
  if (!dt_block_pool_empty_cache(ctx->pool))
    return DT_OK; /* the cudaFree fallback with work queued: kept for now */
  raw_device *d = &raw_devices[dev.index];
  /* back to the system what the stream has freed by now; the rest at the
   * device's next synchronisation (release threshold 0) */
  if (d->async)
    DT_CUDA_CHECK(cudaMemPoolTrimTo(d->pool, 0));
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
    return dt_error_wrap(dt_cuda_fail(e, "cudaHostAlloc(out, bytes, cudaHostAllocPortable)",
                                      __func__, __FILE__, __LINE__),
                         "allocating %zu bytes of pinned host memory", bytes);
  return DT_OK;
}

static void raw_pinned_free(void *ctx, void *ptr, size_t bytes) {
  (void)ctx;
  (void)bytes;
  cudaFreeHost(ptr); /* synchronises: only while every device is idle (below) */
}

/* cudaFreeHost waits for the devices: release pinned segments only while
 * none of them has work queued (a collective may be in flight). */
static int raw_pinned_releasable(void *ctx) {
  (void)ctx;
  return dt_cuda_streams_idle(NULL);
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
      dt_raw_allocator raw = {NULL, raw_pinned_alloc, raw_pinned_free, raw_pinned_releasable};
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
