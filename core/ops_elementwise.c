/* Elementwise ops: add/sub/mul with NumPy broadcasting, scale, and the
 * unary activations relu/gelu/tanh, and SwiGLU. */
#include <string.h>

#include "core/ops_internal.h"

/* ---- broadcasting binary ops ---- */

/* out shape of broadcasting a with b (NumPy rules, aligned on the right). */
static dt_status broadcast_shape(const char *op, const dt_tensor *a, const dt_tensor *b,
                                 int64_t *shape, int *ndim) {
  int na = dt_tensor_ndim(a), nb = dt_tensor_ndim(b);
  int n = na > nb ? na : nb;
  for (int d = 0; d < n; ++d) {
    int da = d - (n - na), db = d - (n - nb);
    int64_t sa = da >= 0 ? dt_tensor_shape(a)[da] : 1;
    int64_t sb = db >= 0 ? dt_tensor_shape(b)[db] : 1;
    if (sa != sb && sa != 1 && sb != 1) {
      char bufa[128], bufb[128];
      return DT_ERROR(DT_ERR_SHAPE,
                      "%s: shapes %s and %s do not broadcast (dim %d: %lld vs %lld): sizes must "
                      "match or be 1",
                      op, dt_shape_format(dt_tensor_shape(a), na, bufa, sizeof bufa),
                      dt_shape_format(dt_tensor_shape(b), nb, bufb, sizeof bufb), d, (long long)sa,
                      (long long)sb);
    }
    shape[d] = sa == 1 ? sb : sa;
  }
  *ndim = n;
  return DT_OK;
}

/* Strides (elements) of t seen through an `ndim`-dim broadcast `shape`:
 * 0 on missing leading dims and on size-1 dims that broadcast. Uses t's
 * own strides, so non-contiguous inputs need no copy. */
static void broadcast_strides(const dt_tensor *t, const int64_t *shape, int ndim,
                              int64_t *strides) {
  int nt = dt_tensor_ndim(t);
  for (int d = 0; d < ndim; ++d) {
    int dt = d - (ndim - nt);
    if (dt < 0 || (dt_tensor_shape(t)[dt] == 1 && shape[d] != 1))
      strides[d] = 0;
    else
      strides[d] = dt_tensor_strides(t)[dt];
  }
}

/* out (shape) = a op b, a and b broadcast to shape. A 0-dim shape is run
 * as (1). */
static dt_status run_binary(dt_binary_op op, const dt_tensor *a, const dt_tensor *b,
                            const int64_t *shape, int ndim, float *out) {
  dt_binary_args args;
  memset(&args, 0, sizeof args);
  args.op = op;
  if (ndim == 0) {
    args.ndim = 1;
    args.shape[0] = 1;
  } else {
    args.ndim = ndim;
    memcpy(args.shape, shape, (size_t)ndim * sizeof(int64_t));
    broadcast_strides(a, shape, ndim, args.a_strides);
    broadcast_strides(b, shape, ndim, args.b_strides);
  }
  if (dt_shape_numel(shape, ndim) == 0)
    return DT_OK;
  return dt_kernel_binary(DT_TENSOR_EXEC(a), &args, DT_F32(a), DT_F32(b), out);
}

static int same_shape(const dt_tensor *a, const int64_t *shape, int ndim) {
  return dt_tensor_ndim(a) == ndim &&
         memcmp(dt_tensor_shape(a), shape, (size_t)ndim * sizeof(int64_t)) == 0;
}

/* Gradient of a broadcast operand: g summed to t's shape, times scale. */
static dt_status grad_to_operand(dt_tensor *g, const dt_tensor *t, float scale, dt_tensor **out) {
  if (same_shape(t, dt_tensor_shape(g), dt_tensor_ndim(g)))
    return dt_ops_scaled_copy(g, scale, out);
  return dt_ops_reduce_to_shape(g, dt_tensor_shape(t), dt_tensor_ndim(t), scale, out);
}

/* g with the broadcast output shape of the node's two inputs */
static dt_status output_grad(dt_node *node, dt_tensor *g, dt_tensor **out) {
  int64_t shape[DT_MAX_DIMS];
  int ndim = 0;
  DT_CHECK(broadcast_shape(node->name, node->inputs[0], node->inputs[1], shape, &ndim));
  return dt_ops_grad_as_shape(g, shape, ndim, out);
}

typedef struct binary_saved {
  dt_binary_op op;
} binary_saved;

static dt_status add_sub_backward(dt_node *node, dt_tensor *grad_out, dt_tensor **grad_in) {
  float sign_b = DT_NODE_PARAMS(node, binary_saved)->op == DT_BINARY_SUB ? -1.0f : 1.0f;
  dt_tensor *g = NULL;
  dt_status st;
  DT_CHECK(output_grad(node, grad_out, &g));
  if (node->needs_grad[0])
    DT_CHECK_GOTO(grad_to_operand(g, node->inputs[0], 1.0f, &grad_in[0]), st, done);
  if (node->needs_grad[1])
    DT_CHECK_GOTO(grad_to_operand(g, node->inputs[1], sign_b, &grad_in[1]), st, done);
  st = DT_OK;
done:
  dt_tensor_release(g);
  return st;
}

/* d(a*b)/da = g * b (broadcast), summed to a's shape; likewise for b. */
static dt_status mul_grad_for(dt_tensor *g, const dt_tensor *self, const dt_tensor *other,
                              dt_tensor **out) {
  int ndim = dt_tensor_ndim(g);
  const int64_t *shape = dt_tensor_shape(g);
  dt_tensor *prod = NULL;
  DT_CHECK(dt_tensor_empty(shape, ndim, DT_DTYPE_F32, dt_tensor_device(g), &prod));
  dt_status st = run_binary(DT_BINARY_MUL, g, other, shape, ndim, DT_F32(prod));
  if (st == DT_OK && same_shape(self, shape, ndim)) {
    *out = prod;
    return DT_OK;
  }
  if (st == DT_OK)
    st = dt_ops_reduce_to_shape(prod, dt_tensor_shape(self), dt_tensor_ndim(self), 1.0f, out);
  dt_tensor_release(prod);
  return st;
}

static dt_status mul_backward(dt_node *node, dt_tensor *grad_out, dt_tensor **grad_in) {
  dt_tensor *a = node->inputs[0], *b = node->inputs[1];
  dt_tensor *g = NULL;
  dt_status st;
  DT_CHECK(output_grad(node, grad_out, &g));
  if (node->needs_grad[0])
    DT_CHECK_GOTO(mul_grad_for(g, a, b, &grad_in[0]), st, done);
  if (node->needs_grad[1])
    DT_CHECK_GOTO(mul_grad_for(g, b, a, &grad_in[1]), st, done);
  st = DT_OK;
done:
  dt_tensor_release(g);
  return st;
}

static dt_status binary_op(const char *name, dt_binary_op op, dt_tensor *a, dt_tensor *b,
                           dt_tensor **out) {
  dt_tensor *ins[2] = {a, b};
  if (!a || !b || !out)
    return DT_ERROR(DT_ERR_INVALID_ARG, "%s: NULL argument", name);
  DT_CHECK(dt_ops_check_float_inputs(name, ins, 2));
  /* 16-bit inputs: computed in f32, the result 16-bit when both are
   * (PyTorch's type promotion: 16-bit with f32 gives f32) */
  dt_dtype res = dt_tensor_dtype(a) == dt_tensor_dtype(b) ? dt_tensor_dtype(a) : DT_DTYPE_F32;
  DT_OPS_RUN_IN_F32_2(a, b, res, a32, b32, out, binary_op(name, op, a32, b32, out));
  DT_CHECK(dt_ops_check_inputs(name, ins, 2));
  int64_t shape[DT_MAX_DIMS];
  int ndim = 0;
  DT_CHECK(broadcast_shape(name, a, b, shape, &ndim));
  dt_tensor *y = NULL;
  DT_CHECK(dt_tensor_empty(shape, ndim, DT_DTYPE_F32, dt_tensor_device(a), &y));
  dt_status st = run_binary(op, a, b, shape, ndim, DT_F32(y));
  dt_node *node = NULL;
  if (st == DT_OK)
    st = dt_ops_maybe_record(name, op == DT_BINARY_MUL ? mul_backward : add_sub_backward, ins, 2, y,
                             &node);
  if (st != DT_OK) {
    dt_tensor_release(y);
    return st;
  }
  DT_OPS_SAVE_PARAMS(node, binary_saved, {op});
  *out = y;
  return DT_OK;
}

dt_status dt_op_add(dt_tensor *a, dt_tensor *b, dt_tensor **out) {
  return binary_op("dt_op_add", DT_BINARY_ADD, a, b, out);
}

dt_status dt_op_sub(dt_tensor *a, dt_tensor *b, dt_tensor **out) {
  return binary_op("dt_op_sub", DT_BINARY_SUB, a, b, out);
}

dt_status dt_op_mul(dt_tensor *a, dt_tensor *b, dt_tensor **out) {
  return binary_op("dt_op_mul", DT_BINARY_MUL, a, b, out);
}

/* ---- scale ---- */

typedef struct scale_saved {
  float alpha;
} scale_saved;

static dt_status scale_backward(dt_node *node, dt_tensor *g, dt_tensor **grad_in) {
  return dt_ops_scaled_copy(g, DT_NODE_PARAMS(node, scale_saved)->alpha, &grad_in[0]);
}

dt_status dt_op_scale(dt_tensor *a, float alpha, dt_tensor **out) {
  if (!a || !out)
    return DT_ERROR(DT_ERR_INVALID_ARG, "dt_op_scale: NULL argument");
  DT_CHECK(dt_ops_check_float_inputs("dt_op_scale", &a, 1)); /* y in a's dtype */
  dt_tensor *x = NULL, *y = NULL;
  dt_node *node = NULL;
  DT_CHECK(dt_ops_contiguous(a, &x));
  dt_status st = dt_ops_scaled_copy(x, alpha, &y);
  dt_tensor_release(x); /* read by the copy only: the backward needs just alpha */
  DT_CHECK(st);
  DT_CHECK_GOTO(dt_ops_maybe_record("dt_op_scale", scale_backward, &a, 1, y, &node), st, fail);
  DT_OPS_SAVE_PARAMS(node, scale_saved, {alpha});
  return dt_ops_take(&y, out);
fail:
  dt_tensor_release(y);
  return st;
}

/* ---- unary activations ---- */

/* saved[0] = x (contiguous); f'(x) is computed from the input */
typedef struct unary_saved {
  dt_unary_op op;
} unary_saved;

static dt_status unary_backward(dt_node *node, dt_tensor *g, dt_tensor **grad_in) {
  dt_tensor *x = node->saved[0];
  dt_tensor *dx = NULL; /* x's dtype, which g has too (16-bit: f32 math in the kernel) */
  DT_CHECK(dt_tensor_empty(dt_tensor_shape(x), dt_tensor_ndim(x), dt_tensor_dtype(x),
                           dt_tensor_device(x), &dx));
  int64_t n = dt_tensor_numel(x);
  dt_status st = DT_OK;
  if (n > 0) {
    st = dt_kernel_unary_backward(DT_TENSOR_EXEC(x), DT_NODE_PARAMS(node, unary_saved)->op, n,
                                  DT_F32(x), DT_F32(g), DT_F32(dx));
  }
  return dt_ops_grad_result(st, dx, &grad_in[0]);
}

static dt_status unary_op(const char *name, dt_unary_op op, dt_tensor *a, dt_tensor **out) {
  if (!a || !out)
    return DT_ERROR(DT_ERR_INVALID_ARG, "%s: NULL argument", name);
  DT_CHECK(dt_ops_check_float_inputs(name, &a, 1));
  dt_tensor *x = NULL, *y = NULL;
  dt_node *node = NULL;
  dt_status st;
  DT_CHECK(dt_ops_contiguous(a, &x));
  /* y in x's dtype: a 16-bit activation stays 16-bit (f32 math) */
  DT_CHECK_GOTO(dt_tensor_empty(dt_tensor_shape(x), dt_tensor_ndim(x), dt_tensor_dtype(x),
                                dt_tensor_device(x), &y),
                st, fail);
  int64_t n = dt_tensor_numel(x);
  if (n > 0)
    DT_CHECK_GOTO(dt_kernel_unary_forward(DT_TENSOR_EXEC(x), op, n, DT_F32(x), DT_F32(y)), st,
                  fail);
  DT_CHECK_GOTO(dt_ops_maybe_record(name, unary_backward, &a, 1, y, &node), st, fail);
  dt_ops_save_for_backward(node, &x, 1);
  DT_OPS_SAVE_PARAMS(node, unary_saved, {op});
  st = dt_ops_take(&y, out);
fail:
  dt_tensor_release(y);
  dt_tensor_release(x);
  return st;
}

dt_status dt_op_relu(dt_tensor *x, dt_tensor **out) {
  return unary_op("dt_op_relu", DT_UNARY_RELU, x, out);
}

dt_status dt_op_gelu(dt_tensor *x, dt_tensor **out) {
  return unary_op("dt_op_gelu", DT_UNARY_GELU, x, out);
}

dt_status dt_op_tanh(dt_tensor *x, dt_tensor **out) {
  return unary_op("dt_op_tanh", DT_UNARY_TANH, x, out);
}

/* ---- SwiGLU ---- */

/* saved[0] = x (contiguous, (rows, 2f)) */
static dt_status swiglu_backward(dt_node *node, dt_tensor *g, dt_tensor **grad_in) {
  dt_tensor *x = node->saved[0];
  dt_tensor *dx = NULL; /* x's dtype, which g has too (16-bit: f32 math in the kernel) */
  DT_CHECK(dt_tensor_empty(dt_tensor_shape(x), dt_tensor_ndim(x), dt_tensor_dtype(x),
                           dt_tensor_device(x), &dx));
  const int64_t f = dt_tensor_dim(x, -1) / 2, rows = dt_tensor_numel(g) / (f > 0 ? f : 1);
  dt_status st = DT_OK;
  if (rows * f > 0)
    st = dt_kernel_swiglu_backward(DT_TENSOR_EXEC(x), DT_F32(x), DT_F32(g), DT_F32(dx), rows, f);
  return dt_ops_grad_result(st, dx, &grad_in[0]);
}

dt_status dt_op_swiglu(dt_tensor *a, dt_tensor **out) {
  static const char *op = "dt_op_swiglu";
  DT_CHECK(dt_ops_check_float_unary(op, a, out));
  const int nd = dt_tensor_ndim(a);
  char buf[128];
  if (nd < 1 || dt_tensor_shape(a)[nd - 1] % 2 != 0)
    return DT_ERROR(DT_ERR_SHAPE,
                    "%s: x %s: expected (..., 2F) with the gate and up projections side by side "
                    "on the last axis (an even width)",
                    op, dt_shape_format(dt_tensor_shape(a), nd, buf, sizeof buf));
  int64_t shape[DT_MAX_DIMS];
  memcpy(shape, dt_tensor_shape(a), (size_t)nd * sizeof(int64_t));
  const int64_t f = shape[nd - 1] / 2, rows = dt_shape_numel(shape, nd - 1);
  shape[nd - 1] = f;
  dt_tensor *x = NULL, *y = NULL;
  dt_node *node = NULL;
  dt_status st;
  DT_CHECK(dt_ops_contiguous(a, &x));
  /* y in x's dtype: a 16-bit activation stays 16-bit (f32 math) */
  DT_CHECK_GOTO(dt_tensor_empty(shape, nd, dt_tensor_dtype(x), dt_tensor_device(x), &y), st, fail);
  if (rows * f > 0)
    DT_CHECK_GOTO(dt_kernel_swiglu_forward(DT_TENSOR_EXEC(x), DT_F32(x), DT_F32(y), rows, f), st,
                  fail);
  DT_CHECK_GOTO(dt_ops_maybe_record(op, swiglu_backward, &a, 1, y, &node), st, fail);
  dt_ops_save_for_backward(node, &x, 1);
  st = dt_ops_take(&y, out);
fail:
  DT_RELEASE_TENSORS(y, x);
  return st;
}
