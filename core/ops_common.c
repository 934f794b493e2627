/* Shared helpers of the differentiable ops: argument checks, recording,
 * reductions over dims and their broadcast inverse. */
#include <string.h>

#include "core/ops_internal.h"

int dt_ops_compact(dt_tensor *const *ts, int n, dt_tensor **dst) {
  int k = 0;
  for (int i = 0; i < n; ++i)
    if (ts[i])
      dst[k++] = ts[i];
  return k;
}

/* Same device and f32 (half_ok: or f16/bf16) for the non-NULL tensors of ts. */
static dt_status check_inputs(const char *op, dt_tensor *const *ts, int n, int half_ok) {
  dt_tensor *live[16];
  DT_ASSERT(n <= 16);
  int k = dt_ops_compact(ts, n, live);
  if (k == 0)
    return DT_OK;
  DT_CHECK(dt_check_same_device(op, live, k));
  if (!half_ok)
    return dt_check_f32(op, live, k);
  for (int i = 0; i < k; i++) {
    dt_dtype d = dt_tensor_dtype(live[i]);
    if (d != DT_DTYPE_F32 && !dt_dtype_is_half(d))
      return DT_ERROR(DT_ERR_DTYPE,
                      "%s: input %d is %s: this op takes floats (f32, f16 or bf16): convert it "
                      "with dt_tensor_to_dtype first",
                      op, i, dt_dtype_name(d));
  }
  return DT_OK;
}

dt_status dt_ops_check_inputs(const char *op, dt_tensor *const *ts, int n) {
  return check_inputs(op, ts, n, 0);
}

dt_status dt_ops_check_float_inputs(const char *op, dt_tensor *const *ts, int n) {
  return check_inputs(op, ts, n, 1);
}

dt_status dt_ops_check_unary(const char *op, dt_tensor *x, dt_tensor **out) {
  if (!x || !out)
    return DT_ERROR(DT_ERR_INVALID_ARG, "%s: NULL argument", op);
  return dt_ops_check_inputs(op, &x, 1);
}

dt_status dt_ops_check_float_unary(const char *op, dt_tensor *x, dt_tensor **out) {
  if (!x || !out)
    return DT_ERROR(DT_ERR_INVALID_ARG, "%s: NULL argument", op);
  return dt_ops_check_float_inputs(op, &x, 1);
}

dt_status dt_ops_check_indexed(const char *op, dt_tensor *index, const char *index_name,
                               const char *ids_name, dt_tensor *values) {
  if (!index || !values)
    return DT_ERROR(DT_ERR_INVALID_ARG, "%s: NULL argument", op);
  dt_tensor *both[2] = {index, values};
  DT_CHECK(dt_check_same_device(op, both, 2));
  DT_CHECK(dt_ops_check_float_inputs(op, &values, 1));
  dt_dtype t = dt_tensor_dtype(index);
  if (t != DT_DTYPE_I32 && t != DT_DTYPE_I64)
    return DT_ERROR(DT_ERR_DTYPE, "%s: %s dtype %s: %s must be i32 or i64", op, index_name,
                    dt_dtype_name(t), ids_name);
  return DT_OK;
}

dt_status dt_ops_maybe_record(const char *name, dt_backward_fn backward, dt_tensor *const *inputs,
                              int n, dt_tensor *out, dt_node **node) {
  dt_tensor *live[DT_NODE_MAX_INPUTS];
  DT_ASSERT(n <= DT_NODE_MAX_INPUTS);
  *node = NULL;
  int k = dt_ops_compact(inputs, n, live);
  if (k == 0 || !dt_autograd_should_record(live, k))
    return DT_OK;
  return dt_autograd_record(name, backward, live, k, out, node);
}

dt_status dt_ops_take(dt_tensor **y, dt_tensor **out) {
  *out = *y;
  *y = NULL;
  return DT_OK;
}

dt_status dt_ops_grad_result(dt_status st, dt_tensor *g, dt_tensor **grad_in) {
  if (st == DT_OK)
    *grad_in = g;
  else
    dt_tensor_release(g);
  return st;
}

dt_status dt_ops_grads_result(dt_status st, dt_tensor *const *g, int n, dt_tensor **grad_in) {
  for (int i = 0; i < n; i++) {
    if (st == DT_OK)
      grad_in[i] = g[i];
    else
      dt_tensor_release(g[i]);
  }
  return st;
}

dt_status dt_ops_contiguous(dt_tensor *t, dt_tensor **out) {
  return dt_tensor_contiguous_copy(t, out);
}

void dt_ops_save_for_backward(dt_node *node, dt_tensor *const *saved, int n_saved) {
  if (!node)
    return;
  for (int i = 0; i < n_saved; ++i)
    dt_node_save(node, i, saved[i]);
}

dt_status dt_ops_empty_like(const dt_tensor *t, dt_device dev, dt_tensor **out) {
  return dt_tensor_empty(dt_tensor_shape(t), dt_tensor_ndim(t), DT_DTYPE_F32, dev, out);
}

dt_status dt_ops_cast(dt_tensor *t, dt_dtype dtype, dt_tensor **out) {
  dt_tensor *c = NULL, *y = NULL;
  *out = NULL;
  DT_CHECK(dt_tensor_contiguous_copy(t, &c));
  if (dt_tensor_dtype(c) == dtype) {
    *out = c;
    return DT_OK;
  }
  dt_status st =
      dt_tensor_empty(dt_tensor_shape(c), dt_tensor_ndim(c), dtype, dt_tensor_device(c), &y);
  if (st == DT_OK && dt_tensor_numel(c) > 0)
    st = dt_kernel_cast(DT_TENSOR_EXEC(c), dt_tensor_data(c), dt_tensor_dtype(c), dt_tensor_data(y),
                        dtype, dt_tensor_numel(c));
  dt_tensor_release(c);
  if (st != DT_OK) {
    dt_tensor_release(y);
    return st;
  }
  *out = y;
  return DT_OK;
}

dt_status dt_ops_autocast_input(const char *op, dt_tensor *t, dt_tensor **out) {
  dt_dtype want = t ? dt_autocast_dtype_for(op) : DT_DTYPE_F32;
  if (t && want != DT_DTYPE_F32 && t->half_copy && *t->half_fresh &&
      dt_tensor_dtype(t->half_copy) == want) { /* the optimizer's working copy of a parameter */
    *out = dt_tensor_retain(t->half_copy);
    return DT_OK;
  }
  *out = NULL;
  return t ? dt_ops_cast(t, want, out) : DT_OK;
}

dt_status dt_ops_widen(dt_tensor *t, dt_tensor **out) { return dt_ops_cast(t, DT_DTYPE_F32, out); }

int dt_ops_is_half(const dt_tensor *t) { return t != NULL && dt_dtype_is_half(dt_tensor_dtype(t)); }

dt_status dt_ops_f32_input(dt_tensor *x, dt_tensor **w) {
  *w = NULL;
  if (!dt_ops_is_half(x)) {
    *w = x ? dt_tensor_retain(x) : NULL;
    return DT_OK;
  }
  return dt_tensor_to_dtype(x, DT_DTYPE_F32, w);
}

dt_status dt_ops_f32_done(dt_status st, dt_tensor *const *w, int n, dt_dtype dtype,
                          dt_tensor **out) {
  for (int i = 0; i < n; i++)
    dt_tensor_release(w[i]);
  if (st != DT_OK || !dt_dtype_is_half(dtype))
    return st;
  dt_tensor *y32 = *out;
  *out = NULL;
  st = dt_tensor_to_dtype(y32, dtype, out);
  dt_tensor_release(y32);
  return st;
}

dt_status dt_ops_narrow_result(dt_dtype dtype, dt_tensor **y) {
  if (!dt_dtype_is_half(dtype) || dt_tensor_dtype(*y) == dtype)
    return DT_OK;
  dt_tensor *r = NULL;
  DT_CHECK(dt_ops_cast(*y, dtype, &r));
  dt_tensor_release(*y);
  *y = r;
  return DT_OK;
}

dt_status dt_ops_save_output(dt_node *node, int slot, dt_tensor *out) {
  dt_tensor *alias = NULL;
  DT_CHECK(dt_tensor_detach(out, &alias));
  dt_node_save(node, slot, alias);
  dt_tensor_release(alias);
  return DT_OK;
}

dt_status dt_ops_scaled_copy(dt_tensor *x, float alpha, dt_tensor **out) {
  dt_tensor *y = NULL;
  DT_CHECK(dt_tensor_empty(dt_tensor_shape(x), dt_tensor_ndim(x), dt_tensor_dtype(x),
                           dt_tensor_device(x), &y));
  int64_t n = dt_tensor_numel(x);
  if (n > 0) {
    dt_status st = dt_kernel_axpby(DT_TENSOR_EXEC(x), n, alpha, DT_F32(x), 0.0f, DT_F32(y));
    if (st != DT_OK) {
      dt_tensor_release(y);
      return st;
    }
  }
  *out = y;
  return DT_OK;
}

/* Merged view of a shape: runs of adjacent dims with the same "reduced"
 * flag collapse into one dim; size-1 dims are dropped (reducing them is a
 * no-op). */
typedef struct merged_dims {
  dt_exec ex; /* f32 execution on the device */
  int n;
  int64_t size[DT_MAX_DIMS];
  int reduced[DT_MAX_DIMS];
  int groups; /* reduced runs */
  int last;   /* the last reduced run, -1 when none */
} merged_dims;

static void merge_dims(const int64_t *shape, int ndim, const int *mask, merged_dims *m) {
  m->n = 0;
  for (int d = 0; d < ndim; ++d) {
    if (shape[d] == 1)
      continue;
    int red = mask[d] != 0;
    if (m->n > 0 && m->reduced[m->n - 1] == red) {
      m->size[m->n - 1] *= shape[d];
    } else {
      m->size[m->n] = shape[d];
      m->reduced[m->n] = red;
      m->n++;
    }
  }
  m->groups = 0;
  m->last = -1;
  for (int i = 0; i < m->n; ++i)
    if (m->reduced[i]) {
      m->groups++;
      m->last = i;
    }
}

/* Where the reduce and broadcast helpers start: f32 execution on dev and
 * the merged runs of shape. */
static dt_status merged_on(dt_device dev, const int64_t *shape, int ndim, const int *mask,
                           merged_dims *m) {
  DT_CHECK(dt_exec_init(dev, DT_DTYPE_F32, &m->ex));
  merge_dims(shape, ndim, mask, m);
  return DT_OK;
}

static int64_t product(const int64_t *v, int from, int to) {
  int64_t p = 1;
  for (int i = from; i < to; ++i)
    p *= v[i];
  return p;
}

dt_status dt_ops_reduce_dims(dt_device dev, const float *x, const int64_t *shape, int ndim,
                             const int *mask, float scale, float *out) {
  merged_dims m;
  DT_CHECK(merged_on(dev, shape, ndim, mask, &m));
  const int groups = m.groups;
  int64_t out_numel = 1;
  int empty_reduction = 0;
  for (int i = 0; i < m.n; ++i) {
    if (!m.reduced[i])
      out_numel *= m.size[i];
    else if (m.size[i] == 0)
      empty_reduction = 1;
  }
  if (out_numel == 0)
    return DT_OK;
  if (empty_reduction)
    return dt_kernel_fill(&m.ex, out, 0.0f, out_numel);
  if (groups == 0)
    return dt_kernel_axpby(&m.ex, out_numel, scale, x, 0.0f, out);

  /* One reduce_sum per reduced run, innermost first; the scale is applied
   * by the first, the last writes into `out`. */
  dt_status st = DT_OK;
  dt_tensor *bufs[2] = {NULL, NULL};
  const float *src = x;
  int done = 0;
  for (int i = m.n - 1; i >= 0; --i) {
    if (!m.reduced[i])
      continue;
    int64_t outer = product(m.size, 0, i), r = m.size[i], inner = product(m.size, i + 1, m.n);
    float *dst;
    if (++done == groups) {
      dst = out;
    } else {
      int64_t n = outer * inner;
      dt_tensor *buf = NULL;
      DT_CHECK_GOTO(dt_tensor_empty(&n, 1, DT_DTYPE_F32, dev, &buf), st, release_bufs);
      dt_tensor_release(bufs[done & 1]);
      bufs[done & 1] = buf;
      dst = DT_F32(buf);
    }
    DT_CHECK_GOTO(dt_kernel_reduce_sum(&m.ex, src, dst, outer, r, inner, done == 1 ? scale : 1.0f),
                  st, release_bufs);
    m.size[i] = 1;
    src = dst;
  }
release_bufs:
  dt_tensor_release(bufs[0]);
  dt_tensor_release(bufs[1]);
  return st;
}

dt_status dt_ops_broadcast_dims(dt_device dev, const float *y, const int64_t *shape, int ndim,
                                const int *mask, float scale, float *x) {
  merged_dims m;
  DT_CHECK(merged_on(dev, shape, ndim, mask, &m));
  int64_t numel = product(m.size, 0, m.n);
  if (numel == 0)
    return DT_OK;
  const int groups = m.groups, last = m.last;
  if (groups == 0)
    return dt_kernel_axpby(&m.ex, numel, scale, y, 0.0f, x);
  if (groups == 1)
    return dt_kernel_broadcast_axis(&m.ex, y, x, product(m.size, 0, last), m.size[last],
                                    product(m.size, last + 1, m.n), scale);

  /* Several runs: a strided copy with 0 strides on the broadcast dims. */
  int64_t src_strides[DT_MAX_DIMS], dst_strides[DT_MAX_DIMS];
  int64_t s = 1;
  for (int i = m.n - 1; i >= 0; --i) {
    dst_strides[i] = product(m.size, i + 1, m.n);
    src_strides[i] = m.reduced[i] ? 0 : s;
    if (!m.reduced[i])
      s *= m.size[i];
  }
  DT_CHECK(
      dt_kernel_copy_strided(&m.ex, x, dst_strides, y, src_strides, m.size, m.n, sizeof(float)));
  if (scale != 1.0f)
    DT_CHECK(dt_kernel_axpby(&m.ex, numel, scale, x, 0.0f, x));
  return DT_OK;
}

dt_status dt_ops_reduce_to_shape(dt_tensor *g, const int64_t *tshape, int tndim, float scale,
                                 dt_tensor **out) {
  int gndim = dt_tensor_ndim(g);
  const int64_t *gshape = dt_tensor_shape(g);
  DT_ASSERT(gndim >= tndim);
  int mask[DT_MAX_DIMS];
  int lead = gndim - tndim;
  for (int d = 0; d < gndim; ++d)
    mask[d] = d < lead || (tshape[d - lead] == 1 && gshape[d] != 1);
  dt_tensor *r = NULL;
  DT_CHECK(dt_tensor_empty(tshape, tndim, DT_DTYPE_F32, dt_tensor_device(g), &r));
  dt_status st =
      dt_ops_reduce_dims(dt_tensor_device(g), DT_F32(g), gshape, gndim, mask, scale, DT_F32(r));
  if (st != DT_OK) {
    dt_tensor_release(r);
    return st;
  }
  *out = r;
  return DT_OK;
}

dt_status dt_ops_grad_as_shape(dt_tensor *g, const int64_t *shape, int ndim, dt_tensor **out) {
  if (dt_tensor_ndim(g) == ndim &&
      memcmp(dt_tensor_shape(g), shape, (size_t)ndim * sizeof(int64_t)) == 0) {
    *out = dt_tensor_retain(g);
    return DT_OK;
  }
  return dt_tensor_view_flat(g, 0, shape, ndim, out);
}

dt_status dt_ops_normalize_dim(const char *op, int dim, int ndim, int *out) {
  int d = dim < 0 ? dim + ndim : dim;
  if (d < 0 || d >= ndim)
    return DT_ERROR(DT_ERR_INVALID_ARG, "%s: dim %d out of range for a %d-dim tensor: use -%d..%d",
                    op, dim, ndim, ndim, ndim - 1);
  *out = d;
  return DT_OK;
}
