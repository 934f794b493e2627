/* Dropout (inverted: the kept elements scaled by 1 / (1 - p)). */
#include "core/ops_internal.h"

/* saved: 0 mask (u8) */
typedef struct dropout_saved {
  float p;
} dropout_saved;

static dt_status dropout_backward(dt_node *node, dt_tensor *gy, dt_tensor **grad_in) {
  dt_tensor *mask = node->saved[0];
  int64_t n = dt_tensor_numel(mask);
  dt_tensor *dx = NULL, *gyc = NULL;
  /* dx in gy's dtype (x's: 16-bit stays 16-bit) */
  DT_CHECK(dt_ops_contiguous(gy, &gyc));
  dt_status st = dt_tensor_empty(dt_tensor_shape(gyc), dt_tensor_ndim(gyc), dt_tensor_dtype(gyc),
                                 dt_tensor_device(gyc), &dx);
  if (st == DT_OK && n > 0) {
    /* dx = dy * mask / (1 - p) */
    st = dt_kernel_dropout_backward(DT_TENSOR_EXEC(gyc), DT_F32(gyc),
                                    (const uint8_t *)dt_tensor_data(mask), DT_F32(dx), n,
                                    DT_NODE_PARAMS(node, dropout_saved)->p);
  }
  dt_tensor_release(gyc);
  return dt_ops_grad_result(st, dx, &grad_in[0]);
}

dt_status dt_op_dropout(dt_tensor *x, float p, bool training, dt_generator *gen, dt_tensor **out) {
  static const char *op = "dt_op_dropout";
  if (!x || !out)
    return DT_ERROR(DT_ERR_INVALID_ARG, "%s: NULL argument", op);
  DT_CHECK(dt_ops_check_float_inputs(op, &x, 1));
  if (!(p >= 0.0f && p <= 1.0f))
    return DT_ERROR(DT_ERR_INVALID_ARG, "%s: probability p=%g is outside [0, 1]", op, (double)p);
  if (!training || p == 0.0f) {
    *out = dt_tensor_retain(x);
    return DT_OK;
  }
  /* 16-bit x: the kernels read and write its dtype (f32 math, one rounding) */
  if (!gen)
    return DT_ERROR(DT_ERR_INVALID_ARG,
                    "%s: training mode needs a dt_generator (seeded with dt_generator_init)", op);
  dt_device dev = dt_tensor_device(x);
  int64_t n = dt_tensor_numel(x);
  dt_tensor *xc = NULL, *y = NULL, *mask = NULL;
  dt_node *node = NULL;
  dt_status st;
  DT_CHECK_GOTO(dt_ops_contiguous(x, &xc), st, fail);
  DT_CHECK_GOTO(dt_tensor_empty(dt_tensor_shape(x), dt_tensor_ndim(x), dt_tensor_dtype(x), dev, &y),
                st, fail);
  DT_CHECK_GOTO(dt_tensor_empty(dt_tensor_shape(x), dt_tensor_ndim(x), DT_DTYPE_U8, dev, &mask), st,
                fail);
  /* keep element i iff uniform(seed, offset + i) >= p; y = x * mask / (1 - p) */
  uint64_t offset = dt_generator_advance(gen, (uint64_t)n);
  if (n > 0)
    DT_CHECK_GOTO(
        dt_kernel_dropout_forward(DT_TENSOR_EXEC(xc), DT_F32(xc), DT_F32(y),
                                  (uint8_t *)dt_tensor_data(mask), n, p, gen->seed, offset),
        st, fail);
  DT_CHECK_GOTO(dt_ops_maybe_record(op, dropout_backward, &x, 1, y, &node), st, fail);
  if (node) {
    dt_node_save(node, 0, mask);
    *DT_NODE_PARAMS_INIT(node, dropout_saved) = (dropout_saved){p};
  }
  st = dt_ops_take(&y, out);
fail:
  DT_RELEASE_TENSORS(y, mask, xc);
  return st;
}
