/* Fused causal multi-head self-attention (flash-attention style). */
#include "core/ops_internal.h"

/* saved: 0 qkv (contiguous), 1 out (detached), both 16-bit under autocast,
 * 2 lse (b, h, t) f32;
 * ints: 0 b, 1 t, 2 heads, 3 hd */
static dt_status causal_attention_backward(dt_node *node, dt_tensor *g, dt_tensor **grad_in) {
  dt_tensor *qkv = node->saved[0], *y = node->saved[1], *lse = node->saved[2];
  int64_t b = node->ints[0], t = node->ints[1], h = node->ints[2], hd = node->ints[3];
  dt_tensor *dqkv = NULL, *q32 = NULL, *g32 = NULL, *y32 = NULL;
  /* 16-bit qkv under autocast: the kernels compute in f32 */
  dt_status st = dt_ops_widen(qkv, &q32);
  if (st == DT_OK)
    st = dt_ops_widen(y, &y32);
  if (st == DT_OK)
    st = dt_ops_round_to(g, dt_tensor_dtype(qkv), &g32);
  if (st == DT_OK)
    st = dt_ops_empty_like(qkv, dt_tensor_device(qkv), &dqkv);
  if (st == DT_OK && b * t > 0)
    st = dt_kernel_attention_backward(DT_TENSOR_EXEC(q32), DT_F32(q32), DT_F32(y32), DT_F32(lse),
                                      DT_F32(g32), DT_F32(dqkv), b, t, h, hd);
  DT_RELEASE_TENSORS(y32, g32, q32);
  return dt_ops_grad_result(st, dqkv, &grad_in[0]);
}

dt_status dt_op_causal_attention(dt_tensor *qkv, int n_head, dt_tensor **out) {
  static const char *op = "dt_op_causal_attention";
  if (!qkv || !out)
    return DT_ERROR(DT_ERR_INVALID_ARG, "%s: NULL argument", op);
  DT_CHECK(dt_ops_check_float_inputs(op, &qkv, 1));
  const int nd = dt_tensor_ndim(qkv);
  const int64_t *s = dt_tensor_shape(qkv);
  char buf[128];
  if (nd != 3 || s[2] % 3 != 0 || s[2] == 0)
    return DT_ERROR(DT_ERR_SHAPE,
                    "%s: qkv %s: expected (B, T, 3C) with q, k and v side by side on the last "
                    "axis",
                    op, dt_shape_format(s, nd, buf, sizeof buf));
  const int64_t b = s[0], t = s[1], c = s[2] / 3;
  if (n_head < 1 || c % n_head != 0)
    return DT_ERROR(DT_ERR_INVALID_ARG,
                    "%s: n_head %d does not divide the embedding width C = %lld of qkv %s: "
                    "each head takes C / n_head columns",
                    op, n_head, (long long)c, dt_shape_format(s, nd, buf, sizeof buf));
  const int64_t hd = c / n_head;
  const int64_t oshape[3] = {b, t, c}, lshape[3] = {b, n_head, t};
  dt_device dev = dt_tensor_device(qkv);
  dt_tensor *qc = NULL, *q32 = NULL, *y = NULL, *lse = NULL;
  dt_node *node = NULL;
  dt_status st;
  /* under autocast qc is 16-bit (kept for the backward), widened for the
   * f32 kernels */
  DT_CHECK(dt_ops_autocast_input(op, qkv, &qc));
  DT_CHECK_GOTO(dt_ops_widen(qc, &q32), st, fail);
  DT_CHECK_GOTO(dt_tensor_empty(oshape, 3, DT_DTYPE_F32, dev, &y), st, fail);
  const int record = dt_autograd_should_record(&qkv, 1);
  if (record)
    DT_CHECK_GOTO(dt_tensor_empty(lshape, 3, DT_DTYPE_F32, dev, &lse), st, fail);
  /* qkv (b, t, 3c) -> y (b, t, c), lse (b, h, t) */
  if (b * t > 0)
    DT_CHECK_GOTO(dt_kernel_attention_forward(DT_TENSOR_EXEC(q32), DT_F32(q32), DT_F32(y),
                                              lse ? DT_F32(lse) : NULL, b, t, n_head, hd),
                  st, fail);
  /* the result in qc's dtype: 16-bit under autocast */
  DT_CHECK_GOTO(dt_ops_narrow_result(dt_tensor_dtype(qc), &y), st, fail);
  DT_CHECK_GOTO(dt_ops_maybe_record(op, causal_attention_backward, &qkv, 1, y, &node), st, fail);
  if (node) {
    DT_CHECK_GOTO(dt_ops_save_output(node, 1, y), st, fail);
    dt_tensor *saved[1] = {qc};
    const int64_t ints[4] = {b, t, n_head, hd};
    dt_ops_save_for_backward(node, saved, 1, ints, 4);
    dt_node_save(node, 2, lse);
  }
  st = dt_ops_take(&y, out);
fail:
  DT_RELEASE_TENSORS(y, lse, q32, qc);
  return st;
}
