/* Device backends: one vtable per device type.
 *
 * The CPU backend (core/cpu_backend.c) is always registered; the CUDA
 * backend (cuda/) registers itself when it is linked in and finds a GPU.
 * Everything above the kernels (ops, autograd, modules, optimizers, DDP)
 * calls through this table and never branches on the device type.
 *
 * Kernel conventions: pointers are device pointers to contiguous f32 data
 * unless the argument says otherwise; sizes are element counts; shapes are
 * given in the comment above each entry. Kernels are enqueued on the
 * device's compute stream (the CPU backend runs them synchronously).
 * A kernel returns DT_OK or a status with the message set.
 */
#ifndef DT_CORE_BACKEND_H
#define DT_CORE_BACKEND_H

#include <stddef.h>
#include <stdint.h>

#include "core/status.h"
#include "core/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct dt_stream dt_stream; /* opaque, backend-defined */
typedef struct dt_event dt_event;   /* opaque, backend-defined */

typedef enum dt_stream_kind {
  DT_STREAM_COMPUTE = 0,
  DT_STREAM_COPY = 1,
  DT_STREAM_COMM = 2,
} dt_stream_kind;

typedef enum dt_unary_op {
  DT_UNARY_RELU = 0,
  DT_UNARY_GELU, /* tanh approximation, as GPT-2 / llm.c */
  DT_UNARY_TANH,
} dt_unary_op;

typedef enum dt_binary_op {
  DT_BINARY_ADD = 0,
  DT_BINARY_SUB,
  DT_BINARY_MUL,
} dt_binary_op;

typedef struct dt_memory_stats {
  size_t allocated;      /* bytes in live tensors */
  size_t reserved;       /* bytes held from the system (>= allocated) */
  size_t peak_allocated; /* max of allocated since the last reset */
  size_t limit;          /* cap in bytes, 0 = none */
  size_t capacity;       /* device capacity in bytes, 0 = unknown */
  uint64_t num_allocs;   /* successful allocations */
  uint64_t num_ooms;     /* failed allocations */
} dt_memory_stats;

/* Arguments of a strided binary op: out = a (op) b over `shape`, with a and b
 * given by element strides (0 = broadcast); out is contiguous. */
typedef struct dt_binary_args {
  dt_binary_op op;
  int ndim;
  int64_t shape[DT_MAX_DIMS];
  int64_t a_strides[DT_MAX_DIMS];
  int64_t b_strides[DT_MAX_DIMS];
} dt_binary_args;

/* A 2-D convolution / pooling geometry (NCHW). */
typedef struct dt_conv2d_geom {
  int n, c, h, w;   /* input */
  int oc, kh, kw;   /* filters (oc unused for pooling) */
  int sh, sw;       /* stride */
  int ph, pw;       /* padding */
  int oh, ow;       /* output */
} dt_conv2d_geom;

typedef struct dt_backend_ops {
  const char *name; /* "cpu", "cuda" */

  /* ---- devices ---- */
  int (*device_count)(void);
  /* Optional: when device_count() is 0, records why (driver missing, driver
   * older than the runtime, ...) and returns the status to report. */
  dt_status (*unavailable)(void);

  /* ---- memory ---- */
  dt_status (*alloc)(dt_device dev, size_t bytes, void **out);
  void (*free)(dt_device dev, void *ptr, size_t bytes);
  /* Copy between this backend's device memory and host memory or itself.
   * `dst_dev` / `src_dev` say where each side lives (CPU = host). Async on
   * `stream` when not NULL, else synchronous. */
  dt_status (*copy)(void *dst, dt_device dst_dev, const void *src, dt_device src_dev,
                    size_t bytes, dt_stream *stream);
  dt_status (*memset_zero)(dt_device dev, void *ptr, size_t bytes);
  /* Optional (NULL: plain host memory is as good): page-locked host memory
   * from which `copy` on a stream runs asynchronously (the data loader's
   * batch buffers). */
  dt_status (*host_alloc)(size_t bytes, void **out);
  void (*host_free)(void *ptr);
  dt_status (*memory_stats)(dt_device dev, dt_memory_stats *out);
  dt_status (*empty_cache)(dt_device dev);
  dt_status (*reset_peak_stats)(dt_device dev);

  /* ---- streams and events ---- */
  dt_stream *(*stream)(dt_device dev, dt_stream_kind kind); /* owned by the backend */
  dt_status (*event_create)(dt_device dev, dt_event **out);
  void (*event_destroy)(dt_event *ev);
  dt_status (*event_record)(dt_event *ev, dt_stream *s);
  dt_status (*stream_wait_event)(dt_stream *s, dt_event *ev);
  dt_status (*event_synchronize)(dt_event *ev);
  dt_status (*stream_synchronize)(dt_stream *s);
  dt_status (*device_synchronize)(dt_device dev);

  /* ---- conversions and copies (any dtype) ---- */
  /* out (n, dst dtype) = convert(in (n, src dtype)) */
  dt_status (*cast)(dt_device dev, const void *in, dt_dtype src, void *out, dt_dtype dst,
                    int64_t n);
  /* Strided copy of `ndim`-dim `shape` from src (strides in elements) to dst
   * (strides in elements), same dtype of `elem_size` bytes. */
  dt_status (*copy_strided)(dt_device dev, void *dst, const int64_t *dst_strides,
                            const void *src, const int64_t *src_strides,
                            const int64_t *shape, int ndim, size_t elem_size);
  /* x (n) = value */
  dt_status (*fill)(dt_device dev, float *x, float value, int64_t n);

  /* ---- dense math (f32) ---- */
  /* C (m,n) = alpha * op(A) op(B) + beta * C, row-major; op(A) is (m,k),
   * A is (m,k) with leading dim lda (or (k,m) when trans_a); likewise B.
   * batch > 1: A, B, C advance by stride_a/b/c elements per batch. */
  dt_status (*gemm)(dt_device dev, int trans_a, int trans_b, int m, int n, int k, float alpha,
                    const float *a, int lda, int64_t stride_a, const float *b, int ldb,
                    int64_t stride_b, float beta, float *c, int ldc, int64_t stride_c,
                    int batch);
  /* out (shape) = a op b, see dt_binary_args */
  dt_status (*binary)(dt_device dev, const dt_binary_args *args, const float *a,
                      const float *b, float *out);
  /* y (n) = alpha * x + beta * y (axpby; beta 0 ignores y's old contents) */
  dt_status (*axpby)(dt_device dev, int64_t n, float alpha, const float *x, float beta,
                     float *y);
  /* y (n) = f(x) */
  dt_status (*unary_forward)(dt_device dev, dt_unary_op op, int64_t n, const float *x, float *y);
  /* dx (n) = dy * f'(x) (overwrites dx) */
  dt_status (*unary_backward)(dt_device dev, dt_unary_op op, int64_t n, const float *x,
                              const float *dy, float *dx);
  /* Reduce the middle axis of x (outer, r, inner) -> y (outer, inner):
   * y = scale * sum_r x. */
  dt_status (*reduce_sum)(dt_device dev, const float *x, float *y, int64_t outer, int64_t r,
                          int64_t inner, float scale);
  /* Broadcast back: x (outer, r, inner) = scale * y (outer, inner). */
  dt_status (*broadcast_axis)(dt_device dev, const float *y, float *x, int64_t outer,
                              int64_t r, int64_t inner, float scale);
  /* out = sum of squares of x (n), written to host *out (synchronises). */
  dt_status (*sum_squares)(dt_device dev, const float *x, int64_t n, double *out);

  /* ---- softmax family, over the last axis of (rows, cols) ---- */
  dt_status (*softmax_forward)(dt_device dev, const float *x, float *y, int64_t rows,
                               int64_t cols, int log);
  /* dx from y (the forward output) and dy */
  dt_status (*softmax_backward)(dt_device dev, const float *y, const float *dy, float *dx,
                                int64_t rows, int64_t cols, int log);
  /* Fused log-softmax + NLL. logits (n,c), target (n) i32 or i64
   * (`target_dtype`); writes per-row loss (n) (0 for ignored rows) and
   * logsumexp (n) for the backward; *out_count = rows not ignored (host).
   * A target outside [0,c) that is not ignore_index is DT_ERR_INVALID_ARG. */
  dt_status (*cross_entropy_forward)(dt_device dev, const float *logits, const void *target,
                                     dt_dtype target_dtype, int64_t n, int64_t c,
                                     int64_t ignore_index, float *loss_rows, float *lse,
                                     int64_t *out_count);
  /* dlogits (n,c) = scale_row * (softmax(logits) - onehot(target)), scale
   * given per sample by dloss_rows (n) (0 rows for ignored targets). */
  dt_status (*cross_entropy_backward)(dt_device dev, const float *logits, const void *target,
                                      dt_dtype target_dtype, const float *lse,
                                      const float *dloss_rows, float *dlogits, int64_t n,
                                      int64_t c, int64_t ignore_index);

  /* ---- convolution and pooling, NCHW ---- */
  /* x (n,c,h,w), w (oc,c,kh,kw), bias (oc) or NULL -> y (n,oc,oh,ow).
   * `workspace` may be used for im2col (size from conv2d_workspace). */
  size_t (*conv2d_workspace)(dt_device dev, const dt_conv2d_geom *g);
  dt_status (*conv2d_forward)(dt_device dev, const dt_conv2d_geom *g, const float *x,
                              const float *w, const float *bias, float *y, void *workspace);
  /* dx (n,c,h,w) from dy, w; dw (oc,c,kh,kw) and db (oc) from dy, x
   * (each output pointer may be NULL to skip; results overwrite). */
  dt_status (*conv2d_backward)(dt_device dev, const dt_conv2d_geom *g, const float *x,
                               const float *w, const float *dy, float *dx, float *dw,
                               float *db, void *workspace);
  /* x (n,c,h,w) -> y (n,c,oh,ow), argmax (n,c,oh,ow) i32 flat index in h*w */
  dt_status (*maxpool2d_forward)(dt_device dev, const dt_conv2d_geom *g, const float *x,
                                 float *y, int32_t *argmax);
  dt_status (*maxpool2d_backward)(dt_device dev, const dt_conv2d_geom *g, const float *dy,
                                  const int32_t *argmax, float *dx);
  /* padding counts in the divisor (count_include_pad = true, PyTorch default) */
  dt_status (*avgpool2d_forward)(dt_device dev, const dt_conv2d_geom *g, const float *x,
                                 float *y);
  dt_status (*avgpool2d_backward)(dt_device dev, const dt_conv2d_geom *g, const float *dy,
                                  float *dx);

  /* ---- normalisation ---- */
  /* x (n,c,hw). Training: batch statistics -> mean (c), invstd (c); running
   * stats updated with `momentum` (unbiased variance, as PyTorch). Eval: uses
   * running_mean/var. gamma/beta (c). */
  dt_status (*batchnorm_forward)(dt_device dev, const float *x, float *y, const float *gamma,
                                 const float *beta, float *running_mean, float *running_var,
                                 float *save_mean, float *save_invstd, int64_t n, int64_t c,
                                 int64_t hw, int training, float momentum, float eps);
  /* Training-mode backward: dx, dgamma, dbeta (all overwritten) from x, dy
   * and the saved batch statistics. Eval mode is handled by the op on top
   * (dx = dy * gamma * invstd of the running statistics). */
  dt_status (*batchnorm_backward)(dt_device dev, const float *x, const float *dy,
                                  const float *gamma, const float *save_mean,
                                  const float *save_invstd, float *dx, float *dgamma,
                                  float *dbeta, int64_t n, int64_t c, int64_t hw);
  /* x (rows, cols) normalised over cols; gamma/beta (cols); saves mean, rstd (rows) */
  dt_status (*layernorm_forward)(dt_device dev, const float *x, const float *gamma,
                                 const float *beta, float *y, float *mean, float *rstd,
                                 int64_t rows, int64_t cols, float eps);
  /* dx overwritten; dgamma, dbeta accumulated (+=) */
  dt_status (*layernorm_backward)(dt_device dev, const float *x, const float *gamma,
                                  const float *mean, const float *rstd, const float *dy,
                                  float *dx, float *dgamma, float *dbeta, int64_t rows,
                                  int64_t cols);

  /* ---- embedding ---- */
  /* idx (n) i32/i64, table (v,d) -> y (n,d). Index out of range is
   * DT_ERR_INVALID_ARG. */
  dt_status (*embedding_forward)(dt_device dev, const void *idx, dt_dtype idx_dtype,
                                 const float *table, float *y, int64_t n, int64_t v,
                                 int64_t d);
  /* dtable (v,d) += scatter of dy (n,d) */
  dt_status (*embedding_backward)(dt_device dev, const void *idx, dt_dtype idx_dtype,
                                  const float *dy, float *dtable, int64_t n, int64_t v,
                                  int64_t d);

  /* ---- dropout ---- */
  /* mask (n) u8 = keep bits from the counter-based generator (seed, offset):
   * keep element i iff dt_rng_uniform(seed, offset + i) >= p; y = x*mask/(1-p). */
  dt_status (*dropout_forward)(dt_device dev, const float *x, float *y, uint8_t *mask,
                               int64_t n, float p, uint64_t seed, uint64_t offset);
  /* dx = dy * mask / (1-p) */
  dt_status (*dropout_backward)(dt_device dev, const float *dy, const uint8_t *mask, float *dx,
                                int64_t n, float p);

  /* ---- optimizers, over flat buffers of n elements ---- */
  /* PyTorch SGD: g = grad + wd*p; buf = momentum*buf + (1-dampening)*g
   * (buf = g on the first step); g = nesterov ? g + momentum*buf : buf;
   * p -= lr * g. momentum 0 skips the buffer. */
  dt_status (*sgd_update)(dt_device dev, float *param, const float *grad, float *momentum_buf,
                          int64_t n, float lr, float momentum, float dampening,
                          float weight_decay, int nesterov, int first_step);
  /* PyTorch AdamW: p -= lr*wd*p; m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2;
   * p -= lr * (m / (1-b1^t)) / (sqrt(v / (1-b2^t)) + eps). */
  dt_status (*adamw_update)(dt_device dev, float *param, const float *grad, float *m, float *v,
                            int64_t n, float lr, float beta1, float beta2, float eps,
                            float weight_decay, int step);
} dt_backend_ops;

/* Registers (or replaces) the backend for a device type. Not thread-safe:
 * call at start-up. */
dt_status dt_backend_register(dt_device_type type, const dt_backend_ops *ops);
/* The backend for `dev`, checking that the device exists; clear error
 * (DT_ERR_NO_DEVICE / DT_ERR_UNSUPPORTED) otherwise. */
dt_status dt_backend_get(dt_device dev, const dt_backend_ops **out);
/* Number of devices of a type (0 when the backend is absent). */
int dt_device_count(dt_device_type type);

/* CPU-backend settings. Threads: default = cores available to this process
 * (sched_getaffinity), overridden by DT_NUM_THREADS or this call; at most
 * DT_CPU_MAX_THREADS (a larger n is clamped: OpenMP would fail to create
 * the threads, or crash). Callers taking a count from the user reject
 * larger values with a message. */
#define DT_CPU_MAX_THREADS 4096
void dt_cpu_set_num_threads(int n);
int dt_cpu_num_threads(void);

/* The CPU backend's table (registered automatically). */
const dt_backend_ops *dt_cpu_backend(void);

#ifdef __cplusplus
}
#endif
#endif
