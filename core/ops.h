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
/* a (..., m, k) @ b (k, n) -> (..., m, n) (leading dims flattened into m);
 * or batched a (B..., m, k) @ b (B..., k, n) with equal batch dims. */
dt_status dt_op_matmul(dt_tensor *a, dt_tensor *b, dt_tensor **out);
/* x (..., in) , weight (out, in), bias (out) or NULL -> (..., out) */
dt_status dt_op_linear(dt_tensor *x, dt_tensor *weight, dt_tensor *bias, dt_tensor **out);

/* ---- elementwise, with NumPy broadcasting (strided inputs need no copy) ---- */
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
/* The target that cross-entropy skips by convention (PyTorch's default
 * ignore_index): padding positions, masked tokens. */
#define DT_IGNORE_INDEX (-100)

/* logits (N, C) (or (..., C), flattened), target (N) i32/i64 class ids.
 * Fused log-softmax + NLL. Mean divides by the number of non-ignored rows;
 * when every row is ignored the mean is NaN (0/0, as PyTorch) and the
 * gradient is zero; sum gives 0. NONE returns a tensor of target's shape
 * (0 for ignored rows). The result is 0-dim for MEAN and SUM. A target
 * outside [0, C) that is not ignore_index is DT_ERR_INVALID_ARG. */
dt_status dt_op_cross_entropy(dt_tensor *logits, dt_tensor *target, dt_reduction reduction,
                              int64_t ignore_index, dt_tensor **out);
/* mean/sum of (a - b)^2 (0-dim), or the elementwise (a - b)^2 for NONE;
 * a and b must have the same shape (no broadcasting). */
dt_status dt_op_mse(dt_tensor *a, dt_tensor *b, dt_reduction reduction, dt_tensor **out);

/* ---- convolution, pooling, normalisation (NCHW) ---- */
/* x (N,C,H,W), weight (OC,C,KH,KW), bias (OC) or NULL; the same stride and
 * zero padding on both axes. */
dt_status dt_op_conv2d(dt_tensor *x, dt_tensor *weight, dt_tensor *bias, int stride,
                       int padding, dt_tensor **out);
/* square windows; padding <= kernel / 2 (as PyTorch); average pooling
 * counts the padding in the divisor (count_include_pad). */
dt_status dt_op_max_pool2d(dt_tensor *x, int kernel, int stride, int padding, dt_tensor **out);
dt_status dt_op_avg_pool2d(dt_tensor *x, int kernel, int stride, int padding, dt_tensor **out);
/* x (N,C,H,W) or (N,C); running_mean/var (C) updated in place in training
 * mode (unbiased variance, as PyTorch) and used in eval mode. gamma/beta
 * NULL = affine False; running stats may be NULL in training mode only.
 * Training needs N*H*W > 1 (DT_ERR_SHAPE). */
dt_status dt_op_batch_norm2d(dt_tensor *x, dt_tensor *gamma, dt_tensor *beta,
                             dt_tensor *running_mean, dt_tensor *running_var, int training,
                             float momentum, float eps, dt_tensor **out);
/* normalise over the last dimension; gamma/beta (D) or NULL */
dt_status dt_op_layer_norm(dt_tensor *x, dt_tensor *gamma, dt_tensor *beta, float eps,
                           dt_tensor **out);

/* ---- embedding, dropout ---- */
/* idx (...) i32/i64, table (V, D) -> (..., D) */
dt_status dt_op_embedding(dt_tensor *idx, dt_tensor *table, dt_tensor **out);
/* Training: drops with probability p in [0, 1] using gen (advanced by
 * numel; the mask is element i kept iff dt_rng_uniform(seed, offset + i)
 * >= p); otherwise (training 0 or p 0) returns a new reference to x. */
dt_status dt_op_dropout(dt_tensor *x, float p, int training, dt_generator *gen,
                        dt_tensor **out);

/* ---- reductions and shape ---- */
/* Over the listed dims (negative counts from the end; ndims 0 = all dims,
 * giving a 0-dim result); keepdim as PyTorch. The mean over no elements is
 * NaN. */
dt_status dt_op_sum(dt_tensor *x, const int *dims, int ndims, int keepdim, dt_tensor **out);
dt_status dt_op_mean(dt_tensor *x, const int *dims, int ndims, int keepdim, dt_tensor **out);
/* Concatenate n tensors along dim (all other dims equal, same dtype; any
 * layout). More than 4 inputs that require grad are joined as a tree of
 * nodes (a node holds at most DT_NODE_MAX_INPUTS). */
dt_status dt_op_concat(dt_tensor *const *xs, int n, int dim, dt_tensor **out);
/* (N, ...) -> (N, prod(...)): a view of contiguous x (a copy otherwise) */
dt_status dt_op_flatten(dt_tensor *x, dt_tensor **out);

/* ---- non-differentiable helpers ---- */
/* argmax over the last dim -> i64 (..., ); the first maximum wins ties and
 * NaN counts as the maximum (as PyTorch). Computed on the host for now. */
dt_status dt_op_argmax(dt_tensor *x, dt_tensor **out);

#ifdef __cplusplus
}
#endif
#endif
