/* Helpers shared by the differentiable ops (core/ops_*.c). Not public API. */
#ifndef DT_CORE_OPS_INTERNAL_H
#define DT_CORE_OPS_INTERNAL_H

#include <stdint.h>

#include "core/amp.h"
#include "core/autograd_internal.h"
#include "core/backend.h"
#include "core/half.h"
#include "core/ops.h"
#include "core/tensor_internal.h"

#ifdef __cplusplus
extern "C" {
#endif

/* f32 data pointer of a tensor (device memory for device tensors). */
#define DT_F32(t) ((float *)dt_tensor_data(t))

/* Validates the inputs of a float op: every non-NULL tensor on the same
 * device and f32. `ts` may contain NULLs (optional bias etc.). */
dt_status dt_ops_check_inputs(const char *op, dt_tensor *const *ts, int n);

/* The same for an op that takes 16-bit floats too (the low-precision ops,
 * whose inputs autocast converts): f32, f16 or bf16. */
dt_status dt_ops_check_float_inputs(const char *op, dt_tensor *const *ts, int n);

/* Validates the arguments of an op of one f32 tensor: x and out non-NULL,
 * x f32. */
dt_status dt_ops_check_unary(const char *op, dt_tensor *x, dt_tensor **out);

/* The same for an op whose kernels read 16-bit x as it is: x f32, f16 or
 * bf16. */
dt_status dt_ops_check_float_unary(const char *op, dt_tensor *x, dt_tensor **out);

/* Validates the inputs of an op indexing a float tensor: `index` and
 * `values` non-NULL and on one device, `values` f32, f16 or bf16 (an op
 * whose kernels are f32 widens 16-bit values first), `index` i32 or i64.
 * The dtype error names the index tensor as "<index_name> dtype" and its
 * entries as `ids_name` ("index", "indices"). */
dt_status dt_ops_check_indexed(const char *op, dt_tensor *index, const char *index_name,
                               const char *ids_name, dt_tensor *values);

/* Copies the non-NULL tensors of ts into dst; returns how many. */
int dt_ops_compact(dt_tensor *const *ts, int n, dt_tensor **dst);

/* Records a node for `out` if any (non-NULL) input requires grad and grad
 * mode is on; *node is NULL otherwise. NULL inputs are skipped, so the
 * node's input i is the i-th non-NULL entry of `inputs`. */
dt_status dt_ops_maybe_record(const char *name, dt_backward_fn backward, dt_tensor *const *inputs,
                              int n, dt_tensor *out, dt_node **node);

/* A contiguous version of t (a new reference; t itself when already
 * contiguous) made without recording: the op records its own node on the
 * original input, so a "contiguous" node would only hold memory. */
dt_status dt_ops_contiguous(dt_tensor *t, dt_tensor **out);

/* Keeps the tensors an op's backward reads on its node: saved[i]
 * (retained) in slot i. Does nothing when node is NULL (no node was
 * recorded), so it can follow dt_ops_maybe_record directly. */
void dt_ops_save_for_backward(dt_node *node, dt_tensor *const *saved, int n_saved);

/* Keeps the op's saved struct on its node, when a node was recorded:
 *   DT_OPS_SAVE_PARAMS(node, linear_saved, {rows, in, out, bias != NULL});
 * the backward reads it with DT_NODE_PARAMS(node, linear_saved). */
#define DT_OPS_SAVE_PARAMS(node, type, ...)                 \
  do {                                                      \
    if (node)                                               \
      *DT_NODE_PARAMS_INIT(node, type) = (type)__VA_ARGS__; \
  } while (0)

/* Hands the op's result to the caller: *out = *y, *y = NULL (so the
 * cleanup label's release of y does nothing); returns DT_OK. */
dt_status dt_ops_take(dt_tensor **y, dt_tensor **out);

/* The end of a backward function with one gradient: on success stores g in
 * *grad_in (the engine takes the reference), else releases g; returns st. */
dt_status dt_ops_grad_result(dt_status st, dt_tensor *g, dt_tensor **grad_in);
/* The same for the first n inputs' gradients g[0..n) (NULLs allowed): all
 * handed over on success, all released on failure. */
dt_status dt_ops_grads_result(dt_status st, dt_tensor *const *g, int n, dt_tensor **grad_in);

/* A new contiguous f32 tensor with t's shape on dev, uninitialised. */
dt_status dt_ops_empty_like(const dt_tensor *t, dt_device dev, dt_tensor **out);

/* A contiguous copy of t converted to `dtype` (f32/f16/bf16), made without
 * recording; a new reference to the contiguous t when it has that dtype. */
dt_status dt_ops_cast(dt_tensor *t, dt_dtype dtype, dt_tensor **out);

/* Mixed precision (core/amp.h): t as the op computes with it, contiguous,
 * in dt_autocast_dtype_for(op) (16-bit for a low-precision op under
 * autocast, else f32); not recorded (the op's own node routes the gradient
 * to t in f32). t NULL gives NULL. */
dt_status dt_ops_autocast_input(const char *op, dt_tensor *t, dt_tensor **out);

/* The f32 values of t (a contiguous f32 copy of a 16-bit t, a new
 * reference to contiguous f32): low-precision ops whose kernels compute in
 * f32 widen their 16-bit inputs with it. */
dt_status dt_ops_widen(dt_tensor *t, dt_tensor **out);

/* Mixed precision: ops of 16-bit inputs whose kernels compute in f32
 * (core/autocast_policy.def). 1 when t is f16 or bf16 (0 for NULL). */
int dt_ops_is_half(const dt_tensor *t);
/* *w = x widened to f32 through a recorded cast (dt_tensor_to_dtype) when
 * x is 16-bit, so the gradient flows back to x in x's dtype (PyTorch
 * autocast's cast at the entry of an fp32 op); a new reference to x
 * otherwise (NULL stays NULL). */
dt_status dt_ops_f32_input(dt_tensor *x, dt_tensor **w);
/* The end of an op run on the f32 inputs w[0..n) of dt_ops_f32_input:
 * releases them and, when st is DT_OK and `dtype` is 16-bit, replaces *out
 * by its rounding to `dtype` (recorded: a 16-bit result of 16-bit inputs,
 * as PyTorch's elementwise ops give). Returns st or the cast's status.
 *   if (dt_ops_is_half(x)) {
 *     dt_tensor *w = NULL;
 *     dt_status st = dt_ops_f32_input(x, &w);
 *     if (st == DT_OK) st = dt_op_batch_norm2d(w, ..., out);
 *     return dt_ops_f32_done(st, &w, 1, dt_tensor_dtype(x), out);
 *   } */
dt_status dt_ops_f32_done(dt_status st, dt_tensor *const *w, int n, dt_dtype dtype,
                          dt_tensor **out);

/* The entry of an op that computes in f32, for 16-bit inputs: when x (a
 * and/or b) is 16-bit, returns the op called again (CALL) on the input
 * widened by dt_ops_f32_input (named X32: A32, B32), its result *out
 * rounded to `res` when that is 16-bit (dt_ops_f32_done). `out` is the
 * op's result pointer. */
#define DT_OPS_RUN_IN_F32(x, res, X32, out, CALL)         \
  do {                                                    \
    if (dt_ops_is_half(x)) {                              \
      dt_tensor *X32 = NULL;                              \
      dt_status st_ = dt_ops_f32_input((x), &X32);        \
      if (st_ == DT_OK)                                   \
        st_ = (CALL);                                     \
      return dt_ops_f32_done(st_, &X32, 1, (res), (out)); \
    }                                                     \
  } while (0)
#define DT_OPS_RUN_IN_F32_2(a, b, res, A32, B32, out, CALL) \
  do {                                                      \
    if (dt_ops_is_half(a) || dt_ops_is_half(b)) {           \
      dt_tensor *w_[2] = {NULL, NULL};                      \
      dt_status st_ = dt_ops_f32_input((a), &w_[0]);        \
      if (st_ == DT_OK)                                     \
        st_ = dt_ops_f32_input((b), &w_[1]);                \
      dt_tensor *A32 = w_[0], *B32 = w_[1];                 \
      if (st_ == DT_OK)                                     \
        st_ = (CALL);                                       \
      return dt_ops_f32_done(st_, w_, 2, (res), (out));     \
    }                                                       \
  } while (0)

/* *y (an op's f32 result, not yet recorded) replaced by its rounding to
 * `dtype` when that is 16-bit: a low-precision op's result under autocast
 * (f32 accumulation, one rounding at the end). */
dt_status dt_ops_narrow_result(dt_dtype dtype, dt_tensor **y);

/* The causal attention's GEMM path (core/ops_attention.c) works on groups
 * of heads whose scores (f32) and probabilities fit `bytes` (256 MiB; 0
 * restores that); returns the previous budget. For tests, which set it
 * small to run several groups; not thread-safe. */
int64_t dt_ops_attention_gemm_scratch(int64_t bytes);

/* Saves a detached alias of an op's own output (no reference cycle
 * output -> node -> output). */
dt_status dt_ops_save_output(dt_node *node, int slot, dt_tensor *out);

/* out (new, contiguous, same shape and dtype) = alpha * x; x must be
 * contiguous f32 or 16-bit. */
dt_status dt_ops_scaled_copy(dt_tensor *x, float alpha, dt_tensor **out);

/* Sum of x (contiguous, `shape`) over the dims with mask[d] != 0, times
 * `scale`, written to `out` (contiguous, `shape` with those dims = 1). */
dt_status dt_ops_reduce_dims(dt_device dev, const float *x, const int64_t *shape, int ndim,
                             const int *mask, float scale, float *out);

/* Broadcasts y (contiguous, `shape` with the masked dims = 1) back to x
 * (contiguous, `shape`): x = scale * y. */
dt_status dt_ops_broadcast_dims(dt_device dev, const float *y, const int64_t *shape, int ndim,
                                const int *mask, float scale, float *x);

/* Gradient of a broadcast: g (contiguous, gshape) summed down to a new
 * tensor of tshape (NumPy broadcasting of tshape to gshape), times scale. */
dt_status dt_ops_reduce_to_shape(dt_tensor *g, const int64_t *tshape, int tndim, float scale,
                                 dt_tensor **out);

/* grad_out seen with the op output's shape: a new reference to g when the
 * shapes agree, else a view (dt_backward accepts a seed gradient with the
 * loss's numel but any shape). g is contiguous. */
dt_status dt_ops_grad_as_shape(dt_tensor *g, const int64_t *shape, int ndim, dt_tensor **out);

/* Normalises a possibly negative dim for an ndim-dim tensor; error names op. */
dt_status dt_ops_normalize_dim(const char *op, int dim, int ndim, int *out);

#ifdef __cplusplus
}
#endif
#endif
