/* CUDA backend internals shared by the files of cuda/: the per-device
 * context, the backend's stream and event objects, and the kernel entry
 * points that cuda/backend.c puts into the dt_backend_ops table (each with
 * the signature and contract of its entry in core/backend.h). Not public.
 */
#ifndef DT_CUDA_CUDA_INTERNAL_H
#define DT_CUDA_CUDA_INTERNAL_H

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <cudnn.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "core/backend.h"
#include "core/status.h"
#include "core/tensor.h"
#include "cuda/block_pool.h"
#include "cuda/cuda.h"
#include "cuda/cuda_check.h"

#ifdef __cplusplus
extern "C" {
#endif

#define DT_CUDA_MAX_DEVICES 64

struct dt_stream {
  cudaStream_t s;
  int device;
  int kind;
};

struct dt_event {
  cudaEvent_t e;
  int device;
};

/* Bytes of the per-device scratch areas (reduction partials, error flags). */
#define DT_CUDA_SCRATCH_BYTES ((size_t)64 << 10)

typedef struct dt_cuda_conv_cache dt_cuda_conv_cache; /* cuda/dnn.c */
typedef struct dt_cuda_gemm_cache dt_cuda_gemm_cache; /* cuda/blas.c */

/* Index checks without a host sync (cross-entropy targets, embedding ids,
 * cuda/kernels_index.cu). A forward kernel marks its bad rows in its stream's
 * slot; a one-thread kernel after it turns the slot's first bad row into
 * the device's index error (the first since the host last looked) and
 * resets the slot. The host reads the error at the next synchronisation
 * (dt_cuda_take_index_error) and reports it as the CPU would have. */
typedef struct dt_cuda_index_slot {
  unsigned long long bad;  /* first bad row of the launch being checked; ~0 = none */
  unsigned long long kept; /* cross-entropy: rows not ignored */
} dt_cuda_index_slot;

typedef enum dt_cuda_index_kind {
  DT_CUDA_INDEX_CROSS_ENTROPY = 1,
  DT_CUDA_INDEX_EMBEDDING = 2,
  DT_CUDA_INDEX_CLASSIFIER = 3,
} dt_cuda_index_kind;

typedef struct dt_cuda_index_error {
  int set;  /* written last (after a system fence): the fields are complete */
  int kind; /* dt_cuda_index_kind */
  long long position, value, bound, ignore_index;
} dt_cuda_index_error;

typedef struct dt_cuda_index_check {
  dt_cuda_index_slot *slots;      /* device: one per stream kind */
  int *claim;                     /* device: 0 until a failure claims `error` */
  dt_cuda_index_error *error;     /* mapped page-locked host memory */
  dt_cuda_index_error *error_dev; /* its device address */
} dt_cuda_index_check;

/* One per GPU, created on first use and kept for the process lifetime. */
typedef struct dt_cuda_ctx {
  int index;
  struct dt_stream streams[3]; /* DT_STREAM_COMPUTE, _COPY, _COMM */
  cublasHandle_t cublas;
  int cublas_tf32; /* math mode currently set on the handle */
  cudnnHandle_t cudnn;
  /* cuBLASLt (the 16-bit GEMMs) and its plans, guarded by gemm_lock */
  cublasLtHandle_t cublaslt;
  dt_cuda_gemm_cache *gemm_cache;
  pthread_mutex_t gemm_lock;
  dt_block_pool *pool;
  /* Scratch for kernels that report to the host (error flags, counts,
   * reduction partials): device and pinned host. Guarded by `scratch_lock`
   * from the launch until the host has read the result. */
  void *dev_scratch;
  void *host_scratch;
  pthread_mutex_t scratch_lock;
  dt_cuda_index_check index_check;
  dt_cuda_conv_cache *conv_cache;
  pthread_mutex_t conv_lock;
  dt_cuda_bn_counts bn_counts; /* dnn.c; updated on the training thread */
  /* Recorded on the compute stream before a copy on another stream writes
   * device memory: blocks are cached per compute stream (allocator.c), so
   * a block handed to such a copy may still be in use by queued compute
   * work; the copy stream waits for it. `fence_lock` keeps the record and
   * the wait together. */
  cudaEvent_t fence;
  pthread_mutex_t fence_lock;
  char name[256];
  size_t total_memory;
  int cc_major, cc_minor;
} dt_cuda_ctx;

/* ---- context (cuda/context.c) ---- */

/* Number of usable GPUs (0 when the probe failed). */
int dt_cuda_device_count(void);
/* The context of `dev` (created on first use) with `dev` made the calling
 * thread's current device. Fails with a clear message for a bad device. */
dt_status dt_cuda_ctx_get(dt_device dev, dt_cuda_ctx **out);
/* The compute stream of `dev` (ctx must exist). */
static inline cudaStream_t dt_cuda_compute_stream(const dt_cuda_ctx *ctx) {
  return ctx->streams[DT_STREAM_COMPUTE].s;
}
/* DT_CUDNN_BENCHMARK=1: time every cuDNN convolution algorithm once per
 * shape instead of taking the heuristics' first choice. */
int dt_cuda_cudnn_benchmark(void);
/* Makes `s` wait for the work queued so far on the compute stream of ctx
 * (no-op when `s` is that stream). */
dt_status dt_cuda_fence_after_compute(dt_cuda_ctx *ctx, cudaStream_t s);
/* After a synchronisation of ctx's device (or of one of its streams): the
 * index error a forward kernel recorded since the last call, as the CPU's
 * DT_ERR_INVALID_ARG message; DT_OK when there was none. Clears it. */
dt_status dt_cuda_take_index_error(dt_cuda_ctx *ctx);
/* 1 when no stream of `only` (NULL: of any device in use) has work queued:
 * then a call that synchronises the device (cudaFree, cudaFreeHost) cannot
 * wait on a collective in flight. */
int dt_cuda_streams_idle(const dt_cuda_ctx *only);
/* Sets the cuBLAS math mode from the global TF32 setting if it changed. */
dt_status dt_cuda_ctx_sync_math_mode(dt_cuda_ctx *ctx);

/* The context of ex->dev (made the calling thread's current device) and
 * the CUDA stream of ex->stream (NULL: the compute stream), which must be
 * a stream of that device. Every kernel starts with DT_CUDA_EXEC. */
dt_status dt_cuda_exec_begin(const dt_exec *ex, dt_cuda_ctx **ctx, cudaStream_t *stream);
#define DT_CUDA_EXEC(ex, ctx, stream) \
  dt_cuda_ctx *ctx = NULL;            \
  cudaStream_t stream = NULL;         \
  DT_CHECK(dt_cuda_exec_begin((ex), &ctx, &stream))

/* The kernels (blas.c, dnn.c, kernels_*.cu), one per DT_KERNEL of
 * core/op_table.def; arguments were checked by the dispatch. */
#define DT_KERNEL(name, dtypes, check, params, args) dt_status dt_cuda_##name DT_KPARAMS params;
#include "core/op_table.def"

/* ---- memory (cuda/allocator.c) ---- */
/* The device pool of c (its index, total_memory and streams set). */
dt_status dt_cuda_pool_create(dt_cuda_ctx *c, dt_block_pool **out);
dt_status dt_cuda_alloc(dt_device dev, size_t bytes, void **out);
void dt_cuda_free(dt_device dev, void *ptr, size_t bytes);
dt_status dt_cuda_memory_stats(dt_device dev, dt_memory_stats *out);
dt_status dt_cuda_empty_cache(dt_device dev);
dt_status dt_cuda_reset_peak_stats(dt_device dev);
/* Temporary device buffer from the context's pool, on the compute stream. */
dt_status dt_cuda_scratch_alloc(dt_cuda_ctx *ctx, size_t bytes, void **out);
void dt_cuda_scratch_free(dt_cuda_ctx *ctx, void *ptr);

/* ---- BLAS (cuda/blas.c) ---- */
/* y (m,n, dtype) = round(acc (m,n, f32) + bias (n, dtype) broadcast over
 * the rows): the bias epilogue of the 16-bit linear forward where cuBLASLt
 * has no algorithm with it (cuda/kernels_linear.cu). */
dt_status dt_cuda_add_bias_rows(cudaStream_t stream, dt_dtype dtype, const float *acc,
                                const void *bias, void *y, int64_t m, int64_t n);

/* ---- cuDNN (cuda/dnn.c) ---- */
void dt_cuda_conv_cache_destroy(dt_cuda_conv_cache *c);

/* ---- kernels beside cuDNN (cuda/kernels_norm.cu, cuda/kernels_conv.cu) ---- */
/* Per-channel fill of batch norm's eval statistics (kernels_norm.cu):
 * save_mean = rm, save_invstd = 1/sqrt(rv + eps), each (c). Used by
 * cuda/dnn.c. */
dt_status dt_cuda_bn_eval_stats(dt_cuda_ctx *ctx, const float *rm, const float *rv,
                                float *save_mean, float *save_invstd, int64_t c, float eps);

/* The bias of a 16-bit convolution (kernels_conv.cu; T = dtype, f16 or bf16): y (n, oc,
 * hw) of T += bias (oc, f32), the sum rounded once; db (oc, f32) = the sum
 * of dy (n, oc, hw) of T over n and hw (in double, a fixed order). */
dt_status dt_cuda_conv_bias_forward(cudaStream_t stream, dt_dtype dtype, const float *bias, void *y,
                                    int64_t n, int64_t oc, int64_t hw);
dt_status dt_cuda_conv_bias_backward(cudaStream_t stream, dt_dtype dtype, const void *dy, float *db,
                                     int64_t n, int64_t oc, int64_t hw);

#ifdef __cplusplus
}
#endif
#endif
