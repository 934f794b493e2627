/* The CUDA backend table: copies, streams and events here; memory in
 * allocator.c; kernels in blas.c, dnn.c, kernels_*.cu. Registered for
 * DT_DEVICE_CUDA by a constructor when //cuda is linked (alwayslink), without
 * touching the GPU: the probe runs on the first device_count() call, and with
 * no usable GPU the count is 0, so dt_backend_get() reports that no CUDA
 * GPU is visible and dt_cuda_probe() says why. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda/cuda.h"
#include "cuda/cuda_internal.h"

/* ---- copies ---- */

static int is_cuda(dt_device d) { return d.type == DT_DEVICE_CUDA; }

// src (bytes) on src_dev -> dst (bytes) on dst_dev; host <-> device or device <-> device
static dt_status cuda_copy(void *dst, dt_device dst_dev, const void *src, dt_device src_dev,
                           size_t bytes, dt_stream *stream) {
  if (bytes == 0 || dst == src)
    return DT_OK;
  if (!is_cuda(dst_dev) && !is_cuda(src_dev)) {
    memmove(dst, src, bytes);
    return DT_OK;
  }
  if ((dst_dev.type != DT_DEVICE_CPU && !is_cuda(dst_dev)) ||
      (src_dev.type != DT_DEVICE_CPU && !is_cuda(src_dev))) {
    char a[32], b[32];
    return DT_ERROR(DT_ERR_DEVICE_MISMATCH, "cuda copy: %s -> %s: unknown device type",
                    dt_device_format(src_dev, a, sizeof a), dt_device_format(dst_dev, b, sizeof b));
  }
  dt_device dev = is_cuda(dst_dev) ? dst_dev : src_dev;
  dt_cuda_ctx *ctx = NULL;
  if (is_cuda(src_dev) && is_cuda(dst_dev) && src_dev.index != dst_dev.index) {
    /* Across GPUs: the copy's stream waits (an event, not the host) for the
     * work queued so far on the source's compute stream, so the source's
     * pending writes land first, on the asynchronous path too, and the
     * synchronous path never blocks on another replica's stream (whose
     * later work may be an NCCL collective waiting for this thread). */
    dt_cuda_ctx *sctx = NULL;
    DT_CHECK(dt_cuda_ctx_get(src_dev, &sctx));
    DT_CHECK(dt_cuda_ctx_get(dst_dev, &ctx));
    cudaStream_t s = stream ? stream->s : dt_cuda_compute_stream(ctx);
    DT_CHECK(dt_cuda_fence_after_compute(sctx, s));
    if (stream && stream->kind == DT_STREAM_COPY && stream->device == dst_dev.index)
      DT_CHECK(dt_cuda_fence_after_compute(ctx, s));
    DT_CUDA_CHECK(cudaMemcpyPeerAsync(dst, dst_dev.index, src, src_dev.index, bytes, s));
    if (stream)
      return DT_OK;
    DT_CUDA_CHECK(cudaStreamSynchronize(s));
    DT_CHECK(dt_cuda_take_index_error(sctx));
    return dt_cuda_take_index_error(ctx);
  }
  DT_CHECK(dt_cuda_ctx_get(dev, &ctx));
  /* Synchronous copies go through the compute stream so that they are
   * ordered after the kernels that produced the data. A copy on another
   * stream is ordered by its caller (core/backend.h): the loader fences
   * only on the events that guard its destination buffers, so that its
   * uploads overlap compute. */
  cudaStream_t s = stream ? stream->s : dt_cuda_compute_stream(ctx);
  DT_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, s));
  if (stream)
    return DT_OK;
  DT_CUDA_CHECK(cudaStreamSynchronize(s));
  /* A synchronisation point: report what the index checks found. */
  return dt_cuda_take_index_error(ctx);
}

static dt_status cuda_memset_zero(dt_device dev, void *ptr, size_t bytes) {
  if (bytes == 0)
    return DT_OK;
  dt_cuda_ctx *ctx = NULL;
  DT_CHECK(dt_cuda_ctx_get(dev, &ctx));
  DT_CUDA_CHECK(cudaMemsetAsync(ptr, 0, bytes, dt_cuda_compute_stream(ctx)));
  return DT_OK;
}

/* ---- streams and events ---- */

static dt_stream *cuda_stream(dt_device dev, dt_stream_kind kind) {
  dt_cuda_ctx *ctx = NULL;
  if ((int)kind < 0 || (int)kind > 2 || dt_cuda_ctx_get(dev, &ctx) != DT_OK)
    return NULL;
  return &ctx->streams[kind];
}

void *dt_cuda_stream_handle(dt_stream *s) { return s ? (void *)s->s : NULL; }

void *dt_cuda_event_handle(dt_event *ev) { return ev ? (void *)ev->e : NULL; }

/* A host record of `size` bytes starting with a struct dt_event (an event
 * or a timing mark) holding a new CUDA event with `flags`. */
static dt_status event_new(dt_device dev, unsigned flags, size_t size, void **out) {
  *out = NULL;
  dt_cuda_ctx *ctx = NULL;
  DT_CHECK(dt_cuda_ctx_get(dev, &ctx));
  struct dt_event *ev = calloc(1, size);
  if (!ev)
    return DT_ERROR(DT_ERR_OOM, "cuda event: host malloc failed");
  ev->device = dev.index;
  cudaError_t e = cudaEventCreateWithFlags(&ev->e, flags);
  if (e != cudaSuccess) {
    free(ev);
    return dt_cuda_fail(e, "cudaEventCreateWithFlags(&ev->e, flags)", __func__, __FILE__, __LINE__);
  }
  *out = ev;
  return DT_OK;
}

static dt_status cuda_event_create(dt_device dev, dt_event **out) {
  return event_new(dev, cudaEventDisableTiming, sizeof **out, (void **)out);
}

static void cuda_event_destroy(dt_event *ev) {
  if (!ev)
    return;
  cudaEventDestroy(ev->e);
  free(ev);
}

static dt_status check_stream_event(const char *op, dt_stream *s, dt_event *ev) {
  if (!ev)
    return DT_ERROR(DT_ERR_INVALID_ARG, "%s: NULL event", op);
  if (s && s->device != ev->device)
    return DT_ERROR(DT_ERR_DEVICE_MISMATCH,
                    "%s: event of cuda:%d used with a stream of cuda:%d: record an event on "
                    "the stream's own device",
                    op, ev->device, s->device);
  return DT_OK;
}

static dt_status cuda_event_record(dt_event *ev, dt_stream *s) {
  DT_CHECK(check_stream_event("event_record", s, ev));
  dt_cuda_ctx *ctx = NULL;
  DT_CHECK(dt_cuda_ctx_get((dt_device){DT_DEVICE_CUDA, ev->device}, &ctx));
  DT_CUDA_CHECK(cudaEventRecord(ev->e, s ? s->s : dt_cuda_compute_stream(ctx)));
  return DT_OK;
}

static dt_status cuda_stream_wait_event(dt_stream *s, dt_event *ev) {
  if (!s)
    return DT_ERROR(DT_ERR_INVALID_ARG, "stream_wait_event: NULL stream");
  if (!ev)
    return DT_ERROR(DT_ERR_INVALID_ARG, "stream_wait_event: NULL event");
  /* Cross-device waits are legal in CUDA (the event may come from another GPU). */
  DT_CUDA_CHECK(cudaStreamWaitEvent(s->s, ev->e, 0));
  return DT_OK;
}

static dt_status cuda_event_synchronize(dt_event *ev) {
  if (!ev)
    return DT_ERROR(DT_ERR_INVALID_ARG, "event_synchronize: NULL event");
  DT_CUDA_CHECK(cudaEventSynchronize(ev->e));
  return DT_OK;
}

static dt_status cuda_event_query(dt_event *ev, int *done) {
  *done = 0;
  if (!ev)
    return DT_ERROR(DT_ERR_INVALID_ARG, "event_query: NULL event");
  cudaError_t e = cudaEventQuery(ev->e);
  if (e == cudaErrorNotReady)
    return DT_OK;
  DT_CUDA_CHECK(e);
  *done = 1;
  return DT_OK;
}

static dt_status cuda_stream_synchronize(dt_stream *s) {
  if (!s)
    return DT_ERROR(DT_ERR_INVALID_ARG, "stream_synchronize: NULL stream");
  DT_CUDA_CHECK(cudaStreamSynchronize(s->s));
  if (s->kind != DT_STREAM_COMPUTE)
    return DT_OK; /* the comm and copy streams' waits belong to other threads */
  dt_cuda_ctx *ctx = NULL;
  DT_CHECK(dt_cuda_ctx_get((dt_device){DT_DEVICE_CUDA, s->device}, &ctx));
  return dt_cuda_take_index_error(ctx);
}

static dt_status cuda_device_synchronize(dt_device dev) {
  dt_cuda_ctx *ctx = NULL;
  DT_CHECK(dt_cuda_ctx_get(dev, &ctx));
  DT_CUDA_CHECK(cudaDeviceSynchronize());
  return dt_cuda_take_index_error(ctx);
}

/* ---- timing marks (cuda/cuda.h) ---- */

struct dt_cuda_mark {
  struct dt_event ev; /* with timing */
};

dt_status dt_cuda_mark_create(dt_device dev, dt_cuda_mark **out) {
  return event_new(dev, cudaEventDefault, sizeof **out, (void **)out);
}

void dt_cuda_mark_destroy(dt_cuda_mark *m) {
  if (!m)
    return;
  cudaEventDestroy(m->ev.e);
  free(m);
}

dt_status dt_cuda_mark_record(dt_cuda_mark *m, dt_stream *s) {
  if (!m || !s)
    return DT_ERROR(DT_ERR_INVALID_ARG, "mark_record: NULL mark or stream");
  if (s->device != m->ev.device)
    return DT_ERROR(DT_ERR_DEVICE_MISMATCH, "mark_record: a mark of cuda:%d on a stream of cuda:%d",
                    m->ev.device, s->device);
  DT_CUDA_CHECK(cudaEventRecord(m->ev.e, s->s));
  return DT_OK;
}

dt_status dt_cuda_mark_elapsed(dt_cuda_mark *a, dt_cuda_mark *b, float *ms) {
  *ms = 0.0f;
  if (!a || !b)
    return DT_ERROR(DT_ERR_INVALID_ARG, "mark_elapsed: NULL mark");
  DT_CUDA_CHECK(cudaEventSynchronize(a->ev.e));
  DT_CUDA_CHECK(cudaEventSynchronize(b->ev.e));
  DT_CUDA_CHECK(cudaEventElapsedTime(ms, a->ev.e, b->ev.e));
  return DT_OK;
}

dt_status dt_cuda_mark_query(dt_cuda_mark *m, int *done) {
  *done = 0;
  if (!m)
    return DT_ERROR(DT_ERR_INVALID_ARG, "mark_query: NULL mark");
  return cuda_event_query(&m->ev, done);
}

/* ---- the table ---- */

static const dt_backend_ops cuda_ops = {
    .name = "cuda",
    .device_count = dt_cuda_device_count,
    .unavailable = dt_cuda_probe,
    .host_alloc = dt_cuda_pinned_alloc,
    .host_free = dt_cuda_pinned_free,
    .alloc = dt_cuda_alloc,
    .free = dt_cuda_free,
    .copy = cuda_copy,
    .memset_zero = cuda_memset_zero,
    .memory_stats = dt_cuda_memory_stats,
    .empty_cache = dt_cuda_empty_cache,
    .reset_peak_stats = dt_cuda_reset_peak_stats,
    .stream = cuda_stream,
    .event_create = cuda_event_create,
    .event_destroy = cuda_event_destroy,
    .event_record = cuda_event_record,
    .stream_wait_event = cuda_stream_wait_event,
    .event_synchronize = cuda_event_synchronize,
    .event_query = cuda_event_query,
    .stream_synchronize = cuda_stream_synchronize,
    .device_synchronize = cuda_device_synchronize,
#define DT_KERNEL(name, dtypes, check, params, args) .name = dt_cuda_##name,
#include "core/op_table.def"
};

__attribute__((constructor)) static void dt_cuda_register_backend(void) {
  dt_backend_register(DT_DEVICE_CUDA, &cuda_ops);
}
