/* CUDA backend internals shared by the files of cuda/: the per-device
 * context, the backend's stream and event objects, and the kernel entry
 * points that cuda/backend.c puts into the dt_backend_ops table (each with
 * the signature and contract of its entry in core/backend.h). Not public.
 */
#ifndef DT_CUDA_CUDA_INTERNAL_H
#define DT_CUDA_CUDA_INTERNAL_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <cudnn.h>

#include "core/backend.h"
#include "core/status.h"
#include "core/tensor.h"
#include "cuda/block_pool.h"
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

/* One per GPU, created on first use and kept for the process lifetime. */
typedef struct dt_cuda_ctx {
  int index;
  struct dt_stream streams[3]; /* DT_STREAM_COMPUTE, _COPY, _COMM */
  cublasHandle_t cublas;
  int cublas_tf32; /* math mode currently set on the handle */
  cudnnHandle_t cudnn;
  dt_block_pool *pool;
  /* Scratch for kernels that report to the host (error flags, counts,
   * reduction partials): device and pinned host. Guarded by `scratch_lock`
   * from the launch until the host has read the result. */
  void *dev_scratch;
  void *host_scratch;
  pthread_mutex_t scratch_lock;
  dt_cuda_conv_cache *conv_cache;
  pthread_mutex_t conv_lock;
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
/* Sets the cuBLAS math mode from the global TF32 setting if it changed. */
dt_status dt_cuda_ctx_sync_math_mode(dt_cuda_ctx *ctx);

/* ---- memory (cuda/allocator.c) ---- */
dt_status dt_cuda_pool_create(int index, size_t capacity, dt_block_pool **out);
dt_status dt_cuda_alloc(dt_device dev, size_t bytes, void **out);
void dt_cuda_free(dt_device dev, void *ptr, size_t bytes);
dt_status dt_cuda_memory_stats(dt_device dev, dt_memory_stats *out);
dt_status dt_cuda_empty_cache(dt_device dev);
dt_status dt_cuda_reset_peak_stats(dt_device dev);
/* Temporary device buffer from the context's pool, on the compute stream. */
dt_status dt_cuda_scratch_alloc(dt_cuda_ctx *ctx, size_t bytes, void **out);
void dt_cuda_scratch_free(dt_cuda_ctx *ctx, void *ptr);

/* ---- BLAS (cuda/blas.c) ---- */
dt_status dt_cuda_gemm(dt_device dev, int trans_a, int trans_b, int m, int n, int k, float alpha,
                       const float *a, int lda, int64_t stride_a, const float *b, int ldb,
                       int64_t stride_b, float beta, float *c, int ldc, int64_t stride_c,
                       int batch);

/* ---- cuDNN (cuda/dnn.c) ---- */
void dt_cuda_conv_cache_destroy(dt_cuda_conv_cache *c);
size_t dt_cuda_conv2d_workspace(dt_device dev, const dt_conv2d_geom *g);
dt_status dt_cuda_conv2d_forward(dt_device dev, const dt_conv2d_geom *g, const float *x,
                                 const float *w, const float *bias, float *y, void *workspace);
dt_status dt_cuda_conv2d_backward(dt_device dev, const dt_conv2d_geom *g, const float *x,
                                  const float *w, const float *dy, float *dx, float *dw,
                                  float *db, void *workspace);
dt_status dt_cuda_batchnorm_forward(dt_device dev, const float *x, float *y, const float *gamma,
                                    const float *beta, float *running_mean, float *running_var,
                                    float *save_mean, float *save_invstd, int64_t n, int64_t c,
                                    int64_t hw, int training, float momentum, float eps);
dt_status dt_cuda_batchnorm_backward(dt_device dev, const float *x, const float *dy,
                                     const float *gamma, const float *save_mean,
                                     const float *save_invstd, float *dx, float *dgamma,
                                     float *dbeta, int64_t n, int64_t c, int64_t hw);

/* ---- dense kernels (cuda/kernels_dense.cu) ---- */
dt_status dt_cuda_cast(dt_device dev, const void *in, dt_dtype src, void *out, dt_dtype dst,
                       int64_t n);
dt_status dt_cuda_copy_strided(dt_device dev, void *dst, const int64_t *dst_strides,
                               const void *src, const int64_t *src_strides,
                               const int64_t *shape, int ndim, size_t elem_size);
dt_status dt_cuda_fill(dt_device dev, float *x, float value, int64_t n);
dt_status dt_cuda_binary(dt_device dev, const dt_binary_args *args, const float *a,
                         const float *b, float *out);
dt_status dt_cuda_axpby(dt_device dev, int64_t n, float alpha, const float *x, float beta,
                        float *y);
dt_status dt_cuda_unary_forward(dt_device dev, dt_unary_op op, int64_t n, const float *x,
                                float *y);
dt_status dt_cuda_unary_backward(dt_device dev, dt_unary_op op, int64_t n, const float *x,
                                 const float *dy, float *dx);
dt_status dt_cuda_reduce_sum(dt_device dev, const float *x, float *y, int64_t outer, int64_t r,
                             int64_t inner, float scale);
dt_status dt_cuda_broadcast_axis(dt_device dev, const float *y, float *x, int64_t outer,
                                 int64_t r, int64_t inner, float scale);
dt_status dt_cuda_sum_squares(dt_device dev, const float *x, int64_t n, double *out);
dt_status dt_cuda_sgd_update(dt_device dev, float *param, const float *grad,
                             float *momentum_buf, int64_t n, float lr, float momentum,
                             float dampening, float weight_decay, int nesterov, int first_step);
dt_status dt_cuda_adamw_update(dt_device dev, float *param, const float *grad, float *m,
                               float *v, int64_t n, float lr, float beta1, float beta2,
                               float eps, float weight_decay, int step);
/* Per-channel fill of batchnorm eval statistics: save_mean = rm,
 * save_invstd = 1/sqrt(rv + eps), each (c). Used by cuda/dnn.c. */
dt_status dt_cuda_bn_eval_stats(dt_cuda_ctx *ctx, const float *rm, const float *rv,
                                float *save_mean, float *save_invstd, int64_t c, float eps);

/* ---- nn kernels (cuda/kernels_nn.cu) ---- */
dt_status dt_cuda_softmax_forward(dt_device dev, const float *x, float *y, int64_t rows,
                                  int64_t cols, int log);
dt_status dt_cuda_softmax_backward(dt_device dev, const float *y, const float *dy, float *dx,
                                   int64_t rows, int64_t cols, int log);
dt_status dt_cuda_cross_entropy_forward(dt_device dev, const float *logits, const void *target,
                                        dt_dtype target_dtype, int64_t n, int64_t c,
                                        int64_t ignore_index, float *loss_rows, float *lse,
                                        int64_t *out_count);
dt_status dt_cuda_cross_entropy_backward(dt_device dev, const float *logits, const void *target,
                                         dt_dtype target_dtype, const float *lse,
                                         const float *dloss_rows, float *dlogits, int64_t n,
                                         int64_t c, int64_t ignore_index);
dt_status dt_cuda_layernorm_forward(dt_device dev, const float *x, const float *gamma,
                                    const float *beta, float *y, float *mean, float *rstd,
                                    int64_t rows, int64_t cols, float eps);
dt_status dt_cuda_layernorm_backward(dt_device dev, const float *x, const float *gamma,
                                     const float *mean, const float *rstd, const float *dy,
                                     float *dx, float *dgamma, float *dbeta, int64_t rows,
                                     int64_t cols);
dt_status dt_cuda_embedding_forward(dt_device dev, const void *idx, dt_dtype idx_dtype,
                                    const float *table, float *y, int64_t n, int64_t v,
                                    int64_t d);
dt_status dt_cuda_embedding_backward(dt_device dev, const void *idx, dt_dtype idx_dtype,
                                     const float *dy, float *dtable, int64_t n, int64_t v,
                                     int64_t d);
dt_status dt_cuda_dropout_forward(dt_device dev, const float *x, float *y, uint8_t *mask,
                                  int64_t n, float p, uint64_t seed, uint64_t offset);
dt_status dt_cuda_dropout_backward(dt_device dev, const float *dy, const uint8_t *mask,
                                   float *dx, int64_t n, float p);
dt_status dt_cuda_maxpool2d_forward(dt_device dev, const dt_conv2d_geom *g, const float *x,
                                    float *y, int32_t *argmax);
dt_status dt_cuda_maxpool2d_backward(dt_device dev, const dt_conv2d_geom *g, const float *dy,
                                     const int32_t *argmax, float *dx);
dt_status dt_cuda_avgpool2d_forward(dt_device dev, const dt_conv2d_geom *g, const float *x,
                                    float *y);
dt_status dt_cuda_avgpool2d_backward(dt_device dev, const dt_conv2d_geom *g, const float *dy,
                                     float *dx);

/* Shared geometry check for pooling and convolution (cuda/dnn.c). */
dt_status dt_cuda_check_geom(const char *op, const dt_conv2d_geom *g, int conv);

#ifdef __cplusplus
}
#endif
#endif
