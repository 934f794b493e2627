/* softmax / log_softmax over the last dimension, and the causal softmax of
 * attention scores: row-wise softmaxes, each differentiated from its
 * output. */
#include "core/ops_internal.h"

enum softmax_kind { SOFTMAX = 0, LOG_SOFTMAX = 1, CAUSAL_SOFTMAX = 2 };

/* saved: 0 y (the output, detached) */
typedef struct softmax_saved {
  enum softmax_kind kind;
  int64_t cols;
} softmax_saved;

static dt_status softmax_backward(dt_node *node, dt_tensor *g, dt_tensor **grad_in) {
  dt_tensor *y = node->saved[0];
  const softmax_saved *s = DT_NODE_PARAMS(node, softmax_saved);
  int kind = s->kind;
  int64_t cols = s->cols, n = dt_tensor_numel(y);
  dt_tensor *dx = NULL;
  DT_CHECK(dt_ops_empty_like(y, dt_tensor_device(y), &dx));
  dt_status st = DT_OK;
  if (n > 0 && kind == CAUSAL_SOFTMAX)
    st = dt_kernel_causal_softmax_backward(DT_TENSOR_EXEC(y), DT_F32(y), DT_F32(g), DT_F32(dx),
                                           n / cols, cols);
  else if (n > 0)
    st = dt_kernel_softmax_backward(DT_TENSOR_EXEC(y), DT_F32(y), DT_F32(g), DT_F32(dx), n / cols,
                                    cols, kind == LOG_SOFTMAX);
  return dt_ops_grad_result(st, dx, &grad_in[0]);
}

/* x (..., cols), validated by the caller -> the softmax `kind` of each row.
 * A 16-bit x (autocast's f32 ops) goes to the kernel as it is: it reads it
 * into f32, the result is f32, and the backward's f32 gradient is rounded
 * to x's dtype by the autograd engine. */
static dt_status softmax_rows(const char *op, dt_tensor *x, enum softmax_kind kind,
                              dt_tensor **out) {
  int64_t cols = dt_tensor_shape(x)[dt_tensor_ndim(x) - 1], n = dt_tensor_numel(x);
  dt_tensor *xc = NULL, *y = NULL;
  dt_node *node = NULL;
  dt_status st;
  DT_CHECK(dt_ops_contiguous(x, &xc));
  DT_CHECK_GOTO(dt_ops_empty_like(xc, dt_tensor_device(xc), &y), st, fail);
  if (n > 0 && kind == CAUSAL_SOFTMAX)
    DT_CHECK_GOTO(
        dt_kernel_causal_softmax_forward(DT_TENSOR_EXEC(xc), DT_F32(xc), DT_F32(y), n / cols, cols),
        st, fail);
  else if (n > 0)
    DT_CHECK_GOTO(dt_kernel_softmax_forward(DT_TENSOR_EXEC(xc), DT_F32(xc), DT_F32(y), n / cols,
                                            cols, kind == LOG_SOFTMAX),
                  st, fail);
  DT_CHECK_GOTO(dt_ops_maybe_record(op, softmax_backward, &x, 1, y, &node), st, fail);
  if (node) {
    DT_CHECK_GOTO(dt_ops_save_output(node, 0, y), st, fail);
    *DT_NODE_PARAMS_INIT(node, softmax_saved) = (softmax_saved){kind, cols};
  }
  st = dt_ops_take(&y, out);
fail:
  DT_RELEASE_TENSORS(y, xc);
  return st;
}

static dt_status softmax_op(const char *op, dt_tensor *x, int dim, int log, dt_tensor **out) {
  DT_CHECK(dt_ops_check_float_unary(op, x, out));
  int ndim = dt_tensor_ndim(x);
  if (ndim == 0)
    return DT_ERROR(DT_ERR_SHAPE, "%s: input is 0-dim: softmax needs at least one dimension", op);
  int d = 0;
  DT_CHECK(dt_ops_normalize_dim(op, dim, ndim, &d));
  if (d != ndim - 1)
    return DT_ERROR(DT_ERR_UNSUPPORTED,
                    "%s: dim %d of a %d-dim tensor: only the last dimension (-1) is supported: "
                    "permute the dimension to the end first",
                    op, dim, ndim);
  return softmax_rows(op, x, log ? LOG_SOFTMAX : SOFTMAX, out);
}

dt_status dt_op_softmax(dt_tensor *x, int dim, dt_tensor **out) {
  return softmax_op("dt_op_softmax", x, dim, 0, out);
}

dt_status dt_op_log_softmax(dt_tensor *x, int dim, dt_tensor **out) {
  return softmax_op("dt_op_log_softmax", x, dim, 1, out);
}

dt_status dt_op_causal_softmax(dt_tensor *x, dt_tensor **out) {
  static const char *op = "dt_op_causal_softmax";
  DT_CHECK(dt_ops_check_float_unary(op, x, out));
  int ndim = dt_tensor_ndim(x);
  const int64_t *shape = dt_tensor_shape(x);
  if (ndim < 2 || shape[ndim - 1] != shape[ndim - 2]) {
    char b[128];
    return DT_ERROR(DT_ERR_SHAPE, "%s: input %s: expected scores (..., T, T)", op,
                    dt_shape_format(shape, ndim, b, sizeof b));
  }
  return softmax_rows(op, x, CAUSAL_SOFTMAX, out);
}
