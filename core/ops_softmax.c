/* softmax / log_softmax over the last dimension, and the causal softmax of
 * attention scores. */
#include "core/ops_internal.h"

/* saved: 0 y (the output, detached); ints: 0 log, 1 cols */
static dt_status softmax_backward(dt_node *node, dt_tensor *g, dt_tensor **grad_in) {
  dt_tensor *y = node->saved[0];
  int64_t cols = node->ints[1], n = dt_tensor_numel(y);
  dt_tensor *dx = NULL;
  DT_CHECK(dt_ops_empty_like(y, dt_tensor_device(y), &dx));
  dt_status st = DT_OK;
  if (n > 0) {
    st = dt_kernel_softmax_backward(DT_TENSOR_EXEC(y), DT_F32(y), DT_F32(g), DT_F32(dx), n / cols,
                                    cols, (int)node->ints[0]);
  }
  return dt_ops_grad_result(st, dx, &grad_in[0]);
}

static dt_status softmax_op(const char *op, dt_tensor *x, int dim, int log, dt_tensor **out) {
  if (!x || !out)
    return DT_ERROR(DT_ERR_INVALID_ARG, "%s: NULL argument", op);
  DT_CHECK(dt_ops_check_inputs(op, &x, 1));
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
  dt_tensor *xc = NULL, *y = NULL;
  dt_node *node = NULL;
  dt_status st;
  DT_CHECK(dt_ops_contiguous(x, &xc));
  DT_CHECK_GOTO(dt_ops_empty_like(xc, dt_tensor_device(xc), &y), st, fail);
  int64_t cols = dt_tensor_shape(xc)[ndim - 1], n = dt_tensor_numel(xc);
  if (n > 0)
    DT_CHECK_GOTO(
        dt_kernel_softmax_forward(DT_TENSOR_EXEC(xc), DT_F32(xc), DT_F32(y), n / cols, cols, log),
        st, fail);
  DT_CHECK_GOTO(dt_ops_maybe_record(op, softmax_backward, &x, 1, y, &node), st, fail);
  if (node) {
    DT_CHECK_GOTO(dt_ops_save_output(node, 0, y), st, fail);
    node->ints[0] = log;
    node->ints[1] = cols;
  }
  st = dt_ops_take(&y, out);
fail:
  dt_tensor_release(y);
  dt_tensor_release(xc);
  return st;
}

dt_status dt_op_softmax(dt_tensor *x, int dim, dt_tensor **out) {
  return softmax_op("dt_op_softmax", x, dim, 0, out);
}

dt_status dt_op_log_softmax(dt_tensor *x, int dim, dt_tensor **out) {
  return softmax_op("dt_op_log_softmax", x, dim, 1, out);
}

/* saved: 0 y (the output, detached); ints: 0 t */
static dt_status causal_softmax_backward(dt_node *node, dt_tensor *g, dt_tensor **grad_in) {
  dt_tensor *y = node->saved[0];
  int64_t t = node->ints[0], n = dt_tensor_numel(y);
  dt_tensor *dx = NULL;
  DT_CHECK(dt_ops_empty_like(y, dt_tensor_device(y), &dx));
  dt_status st = DT_OK;
  if (n > 0)
    st = dt_kernel_causal_softmax_backward(DT_TENSOR_EXEC(y), DT_F32(y), DT_F32(g), DT_F32(dx),
                                           n / t, t);
  return dt_ops_grad_result(st, dx, &grad_in[0]);
}

dt_status dt_op_causal_softmax(dt_tensor *x, dt_tensor **out) {
  static const char *op = "dt_op_causal_softmax";
  if (!x || !out)
    return DT_ERROR(DT_ERR_INVALID_ARG, "%s: NULL argument", op);
  DT_CHECK(dt_ops_check_inputs(op, &x, 1));
  int ndim = dt_tensor_ndim(x);
  const int64_t *shape = dt_tensor_shape(x);
  if (ndim < 2 || shape[ndim - 1] != shape[ndim - 2]) {
    char b[128];
    return DT_ERROR(DT_ERR_SHAPE, "%s: input %s: expected scores (..., T, T)", op,
                    dt_shape_format(shape, ndim, b, sizeof b));
  }
  int64_t t = shape[ndim - 1], n = dt_tensor_numel(x);
  dt_tensor *xc = NULL, *y = NULL;
  dt_node *node = NULL;
  dt_status st;
  DT_CHECK(dt_ops_contiguous(x, &xc));
  DT_CHECK_GOTO(dt_ops_empty_like(xc, dt_tensor_device(xc), &y), st, fail);
  if (n > 0)
    DT_CHECK_GOTO(
        dt_kernel_causal_softmax_forward(DT_TENSOR_EXEC(xc), DT_F32(xc), DT_F32(y), n / t, t), st,
        fail);
  DT_CHECK_GOTO(dt_ops_maybe_record(op, causal_softmax_backward, &x, 1, y, &node), st, fail);
  if (node) {
    DT_CHECK_GOTO(dt_ops_save_output(node, 0, y), st, fail);
    node->ints[0] = t;
  }
  st = dt_ops_take(&y, out);
fail:
  DT_RELEASE_TENSORS(y, xc);
  return st;
}
