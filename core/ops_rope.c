/* Rotary position embedding: dt_op_rope (its convention, Hugging Face's
 * rotate_half, is documented at its entry in core/op_table.def). */
#include <math.h>

#include "core/ops_internal.h"

/* The rotation is linear in x: the backward turns the gradient by the
 * opposite angles with the same kernel and keeps no tensor. */
typedef struct rope_saved {
  int64_t n, t, c, hd, n_rot;
  float theta;
} rope_saved;

static dt_status rope_backward(dt_node *node, dt_tensor *g, dt_tensor **grad_in) {
  const rope_saved *s = DT_NODE_PARAMS(node, rope_saved);
  dt_tensor *dx = NULL; /* the output's dtype, which is x's (16-bit: f32 math in the kernel) */
  DT_CHECK(dt_tensor_empty(dt_tensor_shape(g), dt_tensor_ndim(g), dt_tensor_dtype(g),
                           dt_tensor_device(g), &dx));
  dt_status st = DT_OK;
  if (s->n * s->t * s->c > 0)
    st = dt_kernel_rope(DT_TENSOR_EXEC(g), DT_F32(g), DT_F32(dx), s->n, s->t, s->c, s->hd, s->n_rot,
                        s->theta, true);
  return dt_ops_grad_result(st, dx, &grad_in[0]);
}

dt_status dt_op_rope(dt_tensor *a, int head_dim, int n_rot, float theta, dt_tensor **out) {
  static const char *op = "dt_op_rope";
  DT_CHECK(dt_ops_check_float_unary(op, a, out));
  if (!(theta > 0.0f) || isinf(theta))
    return DT_ERROR(DT_ERR_INVALID_ARG, "%s: theta %g: the base must be a positive finite number",
                    op, (double)theta);
  const int nd = dt_tensor_ndim(a);
  const int64_t *shape = dt_tensor_shape(a);
  char buf[128];
  if (nd < 2)
    return DT_ERROR(DT_ERR_SHAPE,
                    "%s: x %s: expected (..., T, C), the positions of each sequence on dim -2", op,
                    dt_shape_format(shape, nd, buf, sizeof buf));
  const int64_t c = shape[nd - 1], t = shape[nd - 2], n = dt_shape_numel(shape, nd - 2);
  if (head_dim < 2 || head_dim % 2 != 0 || c % head_dim != 0)
    return DT_ERROR(DT_ERR_INVALID_ARG,
                    "%s: head_dim %d for x %s: it must be even (pairs (i, i + head_dim/2) turn "
                    "together) and divide the last dimension into heads",
                    op, head_dim, dt_shape_format(shape, nd, buf, sizeof buf));
  if (n_rot < 0 || n_rot > c / head_dim)
    return DT_ERROR(DT_ERR_INVALID_ARG, "%s: n_rot %d: x %s has %lld heads of %d columns", op,
                    n_rot, dt_shape_format(shape, nd, buf, sizeof buf), (long long)(c / head_dim),
                    head_dim);
  dt_tensor *x = NULL, *y = NULL;
  dt_node *node = NULL;
  dt_status st;
  DT_CHECK(dt_ops_contiguous(a, &x));
  /* y in x's dtype: a 16-bit activation stays 16-bit (f32 math) */
  DT_CHECK_GOTO(dt_tensor_empty(shape, nd, dt_tensor_dtype(x), dt_tensor_device(x), &y), st, fail);
  if (n * t * c > 0)
    DT_CHECK_GOTO(dt_kernel_rope(DT_TENSOR_EXEC(x), DT_F32(x), DT_F32(y), n, t, c, head_dim, n_rot,
                                 theta, false),
                  st, fail);
  DT_CHECK_GOTO(dt_ops_maybe_record(op, rope_backward, &a, 1, y, &node), st, fail);
  DT_OPS_SAVE_PARAMS(node, rope_saved, {n, t, c, head_dim, n_rot, theta});
  st = dt_ops_take(&y, out);
fail:
  DT_RELEASE_TENSORS(y, x);
  return st;
}
