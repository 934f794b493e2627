/* Differentiable operations. Each returns a new tensor through `out` (the
 * caller owns one reference) and records a backward node when grad mode is
 * on and an input requires grad. Inputs must be on the same device
 * (DT_ERR_DEVICE_MISMATCH names the op and both devices); float math is f32
 * (f16/bf16 tensors must be converted first: DT_ERR_DTYPE otherwise).
 * Non-contiguous inputs are made contiguous internally.
 */
#ifndef DT_CORE_OPS_H
#define DT_CORE_OPS_H

#include <stdint.h>

#include "core/rng.h"
#include "core/status.h"
#include "core/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum dt_reduction {
  DT_REDUCTION_MEAN = 0,
  DT_REDUCTION_SUM,
  DT_REDUCTION_NONE,
} dt_reduction;

/* ---- linear algebra ---- */
/* a (..., m, k) @ b (k, n) -> (..., m, n); or batched a (B, m, k) @ b (B, k, n). */
dt_status dt_op_matmul(dt_tensor *a, dt_tensor *b, dt_tensor **out);
/* x (..., in) , weight (out, in), bias (out) or NULL -> (..., out) */
dt_status dt_op_linear(dt_tensor *x, dt_tensor *weight, dt_tensor *bias, dt_tensor **out);

/* ---- elementwise, with NumPy broadcasting ---- */
dt_status dt_op_add(dt_tensor *a, dt_tensor *b, dt_tensor **out);
dt_status dt_op_sub(dt_tensor *a, dt_tensor *b, dt_tensor **out);
dt_status dt_op_mul(dt_tensor *a, dt_tensor *b, dt_tensor **out);
dt_status dt_op_scale(dt_tensor *a, float alpha, dt_tensor **out);
dt_status dt_op_relu(dt_tensor *x, dt_tensor **out);
dt_status dt_op_gelu(dt_tensor *x, dt_tensor **out); /* tanh approximation */
dt_status dt_op_tanh(dt_tensor *x, dt_tensor **out);

/* ---- softmax and losses ---- */
/* over dimension `dim` (only the last dimension, -1, is supported) */
dt_status dt_op_softmax(dt_tensor *x, int dim, dt_tensor **out);
dt_status dt_op_log_softmax(dt_tensor *x, int dim, dt_tensor **out);
/* logits (N, C) (or (..., C), flattened), target (N) i32/i64 class ids.
 * Fused log-softmax + NLL. Mean divides by the number of non-ignored rows. */
dt_status dt_op_cross_entropy(dt_tensor *logits, dt_tensor *target, dt_reduction reduction,
                              int64_t ignore_index, dt_tensor **out);
/* mean/sum of (a - b)^2 */
dt_status dt_op_mse(dt_tensor *a, dt_tensor *b, dt_reduction reduction, dt_tensor **out);

/* ---- convolution, pooling, normalisation (NCHW) ---- */
/* x (N,C,H,W), weight (OC,C,KH,KW), bias (OC) or NULL */
dt_status dt_op_conv2d(dt_tensor *x, dt_tensor *weight, dt_tensor *bias, int stride,
                       int padding, dt_tensor **out);
dt_status dt_op_max_pool2d(dt_tensor *x, int kernel, int stride, int padding, dt_tensor **out);
dt_status dt_op_avg_pool2d(dt_tensor *x, int kernel, int stride, int padding, dt_tensor **out);
/* x (N,C,H,W) or (N,C); running_mean/var (C) updated in training mode. */
dt_status dt_op_batch_norm2d(dt_tensor *x, dt_tensor *gamma, dt_tensor *beta,
                             dt_tensor *running_mean, dt_tensor *running_var, int training,
                             float momentum, float eps, dt_tensor **out);
/* normalise over the last dimension */
dt_status dt_op_layer_norm(dt_tensor *x, dt_tensor *gamma, dt_tensor *beta, float eps,
                           dt_tensor **out);

/* ---- embedding, dropout ---- */
/* idx (...) i32/i64, table (V, D) -> (..., D) */
dt_status dt_op_embedding(dt_tensor *idx, dt_tensor *table, dt_tensor **out);
/* Training: drops with probability p using gen (advanced by numel);
 * otherwise (training 0 or p 0) returns a new reference to x. */
dt_status dt_op_dropout(dt_tensor *x, float p, int training, dt_generator *gen,
                        dt_tensor **out);

/* ---- reductions and shape ---- */
/* Over the listed dims (ndims 0 = all dims); keepdim as PyTorch. */
dt_status dt_op_sum(dt_tensor *x, const int *dims, int ndims, int keepdim, dt_tensor **out);
dt_status dt_op_mean(dt_tensor *x, const int *dims, int ndims, int keepdim, dt_tensor **out);
/* Concatenate n tensors along dim (all other dims equal). */
dt_status dt_op_concat(dt_tensor *const *xs, int n, int dim, dt_tensor **out);
/* (N, ...) -> (N, prod(...)) */
dt_status dt_op_flatten(dt_tensor *x, dt_tensor **out);

/* ---- non-differentiable helpers ---- */
/* argmax over the last dim -> i64 (..., ) */
dt_status dt_op_argmax(dt_tensor *x, dt_tensor **out);

#ifdef __cplusplus
}
#endif
#endif
