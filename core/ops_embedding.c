/* The embedding lookup. */
#include <string.h>

#include "core/ops_internal.h"

/* ---- embedding ---- */

/* saved: 0 idx (contiguous) */
typedef struct embedding_saved {
  int64_t n, v, d; /* indices, table rows, row width */
} embedding_saved;

static dt_status embedding_backward(dt_node *node, dt_tensor *gy, dt_tensor **grad_in) {
  dt_tensor *idx = node->saved[0];
  const embedding_saved *s = DT_NODE_PARAMS(node, embedding_saved);
  int64_t n = s->n, v = s->v, d = s->d;
  int64_t tshape[2] = {v, d};
  dt_device dev = dt_tensor_device(gy);
  dt_tensor *dtable = NULL;
  /* dtable (v, d) += scatter of dy (n, d): straight into the table's .grad
   * where the engine offers it (no zeroed (v, d) temporary to add in) */
  float *dest = dt_node_grad_dest(node, 0);
  if (dest == NULL)
    DT_CHECK(dt_tensor_zeros(tshape, 2, DT_DTYPE_F32, dev, &dtable));
  dt_status st = DT_OK;
  if (n * d > 0) {
    st = dt_kernel_embedding_backward(DT_TENSOR_EXEC(gy), dt_tensor_data(idx), dt_tensor_dtype(idx),
                                      DT_F32(gy), dest ? dest : DT_F32(dtable), n, v, d);
  }
  return dt_ops_grad_result(st, dtable, &grad_in[0]);
}

dt_status dt_op_embedding(dt_tensor *idx, dt_tensor *table, dt_tensor **out) {
  static const char *op = "dt_op_embedding";
  if (!out)
    return DT_ERROR(DT_ERR_INVALID_ARG, "%s: NULL argument", op);
  /* a 16-bit table: looked up in f32, an f32 result */
  DT_OPS_RUN_IN_F32(table, DT_DTYPE_F32, t32, out, dt_op_embedding(idx, t32, out));
  DT_CHECK(dt_ops_check_indexed(op, idx, "index", "indices", table));
  dt_dtype idt = dt_tensor_dtype(idx);
  int ni = dt_tensor_ndim(idx);
  char bi[128], bt[128];
  if (dt_tensor_ndim(table) != 2 || ni + 1 > DT_MAX_DIMS)
    return DT_ERROR(DT_ERR_SHAPE,
                    "%s: indices %s and table %s: expected a (V, D) table and at most %d index "
                    "dims",
                    op, dt_shape_format(dt_tensor_shape(idx), ni, bi, sizeof bi),
                    dt_shape_format(dt_tensor_shape(table), dt_tensor_ndim(table), bt, sizeof bt),
                    DT_MAX_DIMS - 1);
  int64_t v = dt_tensor_shape(table)[0], d = dt_tensor_shape(table)[1];
  int64_t n = dt_tensor_numel(idx);
  int64_t oshape[DT_MAX_DIMS];
  memcpy(oshape, dt_tensor_shape(idx), (size_t)ni * sizeof(int64_t));
  oshape[ni] = d;

  dt_device dev = dt_tensor_device(table);
  dt_tensor *ic = NULL, *tc = NULL, *y = NULL;
  dt_node *node = NULL;
  dt_status st;
  DT_CHECK_GOTO(dt_ops_contiguous(idx, &ic), st, fail);
  DT_CHECK_GOTO(dt_ops_contiguous(table, &tc), st, fail);
  DT_CHECK_GOTO(dt_tensor_empty(oshape, ni + 1, DT_DTYPE_F32, dev, &y), st, fail);
  /* idx (n), table (v, d) -> y (n, d) */
  if (n * d > 0)
    DT_CHECK_GOTO(dt_kernel_embedding_forward(DT_TENSOR_EXEC(table), dt_tensor_data(ic), idt,
                                              DT_F32(tc), DT_F32(y), n, v, d),
                  st, fail);
  DT_CHECK_GOTO(dt_ops_maybe_record(op, embedding_backward, &table, 1, y, &node), st, fail);
  dt_ops_save_for_backward(node, &ic, 1);
  DT_OPS_SAVE_PARAMS(node, embedding_saved, {n, v, d});
  st = dt_ops_take(&y, out);
fail:
  DT_RELEASE_TENSORS(y, tc, ic);
  return st;
}
