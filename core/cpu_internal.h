/* CPU reference backend internals: the kernels that core/cpu_backend.c puts
 * into the dt_backend_ops table, and the helpers they share. Not public API.
 *
 * Every kernel has the signature of its vtable entry (see core/backend.h for
 * the shapes and the contract of each).
 */
#ifndef DT_CORE_CPU_INTERNAL_H
#define DT_CORE_CPU_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "core/backend.h"
#include "core/status.h"
#include "core/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Below this many elements a kernel runs on the calling thread only: an
 * OpenMP fork/join costs more than the work. */
#define DT_CPU_PAR_MIN 32768

/* Logical CPU devices (cpu:0 .. cpu:DT_CPU_MAX_DEVICES-1). */
#define DT_CPU_MAX_DEVICES 64

/* Threads the kernels use (>= 1). Reads DT_NUM_THREADS on first use. */
int dt_cpu_threads(void);
/* Cap for CPU allocations, per device (0 = none); memory.c's
 * dt_cpu_set_memory_limit lands here. */
void dt_cpu_alloc_set_limit(size_t bytes);

/* ---- dense (cpu_kernels_dense.c) ---- */
dt_status dt_cpu_cast(dt_device dev, const void *in, dt_dtype src, void *out, dt_dtype dst,
                      int64_t n);
dt_status dt_cpu_copy_strided(dt_device dev, void *dst, const int64_t *dst_strides,
                              const void *src, const int64_t *src_strides, const int64_t *shape,
                              int ndim, size_t elem_size);
dt_status dt_cpu_fill(dt_device dev, float *x, float value, int64_t n);
dt_status dt_cpu_gemm(dt_device dev, int trans_a, int trans_b, int m, int n, int k, float alpha,
                      const float *a, int lda, int64_t stride_a, const float *b, int ldb,
                      int64_t stride_b, float beta, float *c, int ldc, int64_t stride_c,
                      int batch);
dt_status dt_cpu_binary(dt_device dev, const dt_binary_args *args, const float *a,
                        const float *b, float *out);
dt_status dt_cpu_axpby(dt_device dev, int64_t n, float alpha, const float *x, float beta,
                       float *y);
dt_status dt_cpu_unary_forward(dt_device dev, dt_unary_op op, int64_t n, const float *x,
                               float *y);
dt_status dt_cpu_unary_backward(dt_device dev, dt_unary_op op, int64_t n, const float *x,
                                const float *dy, float *dx);
dt_status dt_cpu_reduce_sum(dt_device dev, const float *x, float *y, int64_t outer, int64_t r,
                            int64_t inner, float scale);
dt_status dt_cpu_broadcast_axis(dt_device dev, const float *y, float *x, int64_t outer,
                                int64_t r, int64_t inner, float scale);
dt_status dt_cpu_sum_squares(dt_device dev, const float *x, int64_t n, double *out);
/* Sum of x (n) in double with four interleaved accumulators (the order
 * every CPU reduction uses). */
double dt_cpu_sum_contiguous(const float *x, int64_t n);

/* ---- softmax, losses, normalisation, embedding, dropout (cpu_kernels_nn.c) ---- */
dt_status dt_cpu_softmax_forward(dt_device dev, const float *x, float *y, int64_t rows,
                                 int64_t cols, int log);
dt_status dt_cpu_softmax_backward(dt_device dev, const float *y, const float *dy, float *dx,
                                  int64_t rows, int64_t cols, int log);
dt_status dt_cpu_cross_entropy_forward(dt_device dev, const float *logits, const void *target,
                                       dt_dtype target_dtype, int64_t n, int64_t c,
                                       int64_t ignore_index, float *loss_rows, float *lse,
                                       int64_t *out_count);
dt_status dt_cpu_cross_entropy_backward(dt_device dev, const float *logits, const void *target,
                                        dt_dtype target_dtype, const float *lse,
                                        const float *dloss_rows, float *dlogits, int64_t n,
                                        int64_t c, int64_t ignore_index);
dt_status dt_cpu_embedding_forward(dt_device dev, const void *idx, dt_dtype idx_dtype,
                                   const float *table, float *y, int64_t n, int64_t v,
                                   int64_t d);
dt_status dt_cpu_embedding_backward(dt_device dev, const void *idx, dt_dtype idx_dtype,
                                    const float *dy, float *dtable, int64_t n, int64_t v,
                                    int64_t d);
dt_status dt_cpu_dropout_forward(dt_device dev, const float *x, float *y, uint8_t *mask,
                                 int64_t n, float p, uint64_t seed, uint64_t offset);
dt_status dt_cpu_dropout_backward(dt_device dev, const float *dy, const uint8_t *mask,
                                  float *dx, int64_t n, float p);

/* ---- normalisation (cpu_kernels_norm.c) ---- */
dt_status dt_cpu_batchnorm_forward(dt_device dev, const float *x, float *y, const float *gamma,
                                   const float *beta, float *running_mean, float *running_var,
                                   float *save_mean, float *save_invstd, int64_t n, int64_t c,
                                   int64_t hw, int training, float momentum, float eps);
dt_status dt_cpu_batchnorm_backward(dt_device dev, const float *x, const float *dy,
                                    const float *gamma, const float *save_mean,
                                    const float *save_invstd, float *dx, float *dgamma,
                                    float *dbeta, int64_t n, int64_t c, int64_t hw);
dt_status dt_cpu_layernorm_forward(dt_device dev, const float *x, const float *gamma,
                                   const float *beta, float *y, float *mean, float *rstd,
                                   int64_t rows, int64_t cols, float eps);
dt_status dt_cpu_layernorm_backward(dt_device dev, const float *x, const float *gamma,
                                    const float *mean, const float *rstd, const float *dy,
                                    float *dx, float *dgamma, float *dbeta, int64_t rows,
                                    int64_t cols);

/* ---- convolution and pooling (cpu_kernels_conv.c) ---- */
size_t dt_cpu_conv2d_workspace(dt_device dev, const dt_conv2d_geom *g);
dt_status dt_cpu_conv2d_forward(dt_device dev, const dt_conv2d_geom *g, const float *x,
                                const float *w, const float *bias, float *y, void *workspace);
dt_status dt_cpu_conv2d_backward(dt_device dev, const dt_conv2d_geom *g, const float *x,
                                 const float *w, const float *dy, float *dx, float *dw,
                                 float *db, void *workspace);
dt_status dt_cpu_maxpool2d_forward(dt_device dev, const dt_conv2d_geom *g, const float *x,
                                   float *y, int32_t *argmax);
dt_status dt_cpu_maxpool2d_backward(dt_device dev, const dt_conv2d_geom *g, const float *dy,
                                    const int32_t *argmax, float *dx);
dt_status dt_cpu_avgpool2d_forward(dt_device dev, const dt_conv2d_geom *g, const float *x,
                                   float *y);
dt_status dt_cpu_avgpool2d_backward(dt_device dev, const dt_conv2d_geom *g, const float *dy,
                                    float *dx);

/* ---- optimizers (cpu_kernels_optim.c) ---- */
dt_status dt_cpu_sgd_update(dt_device dev, float *param, const float *grad,
                            float *momentum_buf, int64_t n, float lr, float momentum,
                            float dampening, float weight_decay, int nesterov, int first_step);
dt_status dt_cpu_adamw_update(dt_device dev, float *param, const float *grad, float *m,
                              float *v, int64_t n, float lr, float beta1, float beta2, float eps,
                              float weight_decay, int step);

#ifdef __cplusplus
}
#endif
#endif
