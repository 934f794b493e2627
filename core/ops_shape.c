/* Reductions (sum, mean over dims), concat, flatten and argmax. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/ops_internal.h"

/* ---- sum / mean ---- */

typedef struct reduce_saved {
  int ndim;              /* x's */
  int mask[DT_MAX_DIMS]; /* 1: dim reduced */
  float scale;           /* 1 (sum), 1 / count (mean) */
} reduce_saved;

static dt_status reduce_backward(dt_node *node, dt_tensor *g, dt_tensor **grad_in) {
  dt_tensor *x = node->inputs[0];
  const reduce_saved *s = DT_NODE_PARAMS(node, reduce_saved);
  int ndim = s->ndim;
  dt_tensor *dx = NULL;
  DT_CHECK(dt_ops_empty_like(x, dt_tensor_device(g), &dx));
  /* dx (x's shape) = scale * g broadcast over the reduced dims */
  dt_status st = dt_ops_broadcast_dims(dt_tensor_device(g), DT_F32(g), dt_tensor_shape(x), ndim,
                                       s->mask, s->scale, DT_F32(dx));
  return dt_ops_grad_result(st, dx, &grad_in[0]);
}

static dt_status reduce_op(const char *op, bool is_mean, dt_tensor *x, const int *dims, int ndims,
                           bool keepdim, dt_tensor **out) {
  if (!x || !out || (ndims > 0 && !dims) || ndims < 0)
    return DT_ERROR(DT_ERR_INVALID_ARG, "%s: NULL argument or negative ndims", op);
  /* 16-bit x: summed in f32, an f32 result (autocast's fp32 ops) */
  DT_OPS_RUN_IN_F32(x, DT_DTYPE_F32, x32, out,
                    reduce_op(op, is_mean, x32, dims, ndims, keepdim, out));
  DT_CHECK(dt_ops_check_inputs(op, &x, 1));
  int nd = dt_tensor_ndim(x);
  const int64_t *s = dt_tensor_shape(x);
  int mask[DT_MAX_DIMS] = {0};
  for (int i = 0; i < ndims; ++i) {
    int d = 0;
    DT_CHECK(dt_ops_normalize_dim(op, dims[i], nd, &d));
    if (mask[d])
      return DT_ERROR(DT_ERR_INVALID_ARG, "%s: dim %d is listed twice", op, dims[i]);
    mask[d] = 1;
  }
  if (ndims == 0)
    for (int d = 0; d < nd; ++d)
      mask[d] = 1;
  int64_t count = 1, oshape[DT_MAX_DIMS], kshape[DT_MAX_DIMS];
  int ond = 0;
  for (int d = 0; d < nd; ++d) {
    kshape[d] = mask[d] ? 1 : s[d];
    if (mask[d])
      count *= s[d];
    if (!mask[d] || keepdim)
      oshape[ond++] = kshape[d];
  }
  float scale = is_mean ? (count > 0 ? 1.0f / (float)count : NAN) : 1.0f;

  dt_device dev = dt_tensor_device(x);
  dt_tensor *xc = NULL, *y = NULL;
  dt_node *node = NULL;
  dt_status st;
  DT_CHECK_GOTO(dt_ops_contiguous(x, &xc), st, fail);
  DT_CHECK_GOTO(dt_tensor_empty(ond ? oshape : kshape, ond, DT_DTYPE_F32, dev, &y), st, fail);
  if (is_mean && count == 0) /* PyTorch: the mean of no elements is NaN */
    DT_CHECK_GOTO(dt_kernel_fill(DT_TENSOR_EXEC(x), DT_F32(y), NAN, dt_tensor_numel(y)), st, fail);
  else
    DT_CHECK_GOTO(dt_ops_reduce_dims(dev, DT_F32(xc), s, nd, mask, scale, DT_F32(y)), st, fail);
  DT_CHECK_GOTO(dt_ops_maybe_record(op, reduce_backward, &x, 1, y, &node), st, fail);
  if (node) {
    reduce_saved *saved = DT_NODE_PARAMS_INIT(node, reduce_saved);
    saved->ndim = nd;
    memcpy(saved->mask, mask, (size_t)nd * sizeof(int));
    saved->scale = count > 0 ? scale : 0.0f;
  }
  st = dt_ops_take(&y, out);
fail:
  dt_tensor_release(y);
  dt_tensor_release(xc);
  return st;
}

dt_status dt_op_sum(dt_tensor *x, const int *dims, int ndims, bool keepdim, dt_tensor **out) {
  return reduce_op("dt_op_sum", 0, x, dims, ndims, keepdim, out);
}

dt_status dt_op_mean(dt_tensor *x, const int *dims, int ndims, bool keepdim, dt_tensor **out) {
  return reduce_op("dt_op_mean", 1, x, dims, ndims, keepdim, out);
}

/* ---- concat ---- */

typedef struct concat_saved {
  int dim;
  int64_t sizes[DT_NODE_MAX_INPUTS]; /* of each input along dim */
} concat_saved;

static dt_status concat_backward(dt_node *node, dt_tensor *grad_out, dt_tensor **grad_in) {
  const concat_saved *s = DT_NODE_PARAMS(node, concat_saved);
  int dim = s->dim;
  int nd = dt_tensor_ndim(node->inputs[0]);
  int64_t oshape[DT_MAX_DIMS];
  memcpy(oshape, dt_tensor_shape(node->inputs[0]), (size_t)nd * sizeof(int64_t));
  oshape[dim] = 0;
  for (int i = 0; i < node->n_inputs; ++i)
    oshape[dim] += s->sizes[i];
  dt_tensor *g = NULL;
  DT_CHECK(dt_ops_grad_as_shape(grad_out, oshape, nd, &g));
  const int64_t *gstrides = dt_tensor_strides(g);
  const dt_exec ex = dt_tensor_exec(g);
  dt_status st = DT_OK;
  int64_t start = 0;
  for (int i = 0; st == DT_OK && i < node->n_inputs; ++i) {
    dt_tensor *x = node->inputs[i];
    int64_t len = s->sizes[i];
    if (node->needs_grad[i]) {
      dt_tensor *dx = NULL;
      st = dt_ops_empty_like(x, dt_tensor_device(g), &dx);
      /* dx = g[..., start:start+len, ...] along dim */
      if (st == DT_OK && dt_tensor_numel(dx) > 0)
        st = dt_kernel_copy_strided(&ex, DT_F32(dx), dt_tensor_strides(dx),
                                    DT_F32(g) + start * gstrides[dim], gstrides, dt_tensor_shape(x),
                                    nd, sizeof(float));
      if (st == DT_OK)
        grad_in[i] = dx;
      else
        dt_tensor_release(dx);
    }
    start += len;
  }
  dt_tensor_release(g);
  return st;
}

/* Concatenates n (<= DT_NODE_MAX_INPUTS when recording) checked tensors. */
static dt_status concat_direct(const char *op, dt_tensor *const *xs, int n, int dim,
                               dt_tensor **out) {
  int nd = dt_tensor_ndim(xs[0]);
  int64_t oshape[DT_MAX_DIMS];
  memcpy(oshape, dt_tensor_shape(xs[0]), (size_t)nd * sizeof(int64_t));
  oshape[dim] = 0;
  for (int i = 0; i < n; ++i)
    oshape[dim] += dt_tensor_shape(xs[i])[dim];
  dt_device dev = dt_tensor_device(xs[0]);
  dt_dtype dtype = dt_tensor_dtype(xs[0]);
  size_t es = dt_dtype_size(dtype);
  const dt_exec ex = dt_tensor_exec(xs[0]);
  dt_tensor *y = NULL;
  dt_node *node = NULL;
  dt_status st;
  DT_CHECK(dt_tensor_empty(oshape, nd, dtype, dev, &y));
  const int64_t *ostrides = dt_tensor_strides(y);
  int64_t start = 0;
  for (int i = 0; i < n; ++i) {
    /* y[..., start:start+len, ...] = xs[i] (any layout) */
    if (dt_tensor_numel(xs[i]) > 0)
      DT_CHECK_GOTO(
          dt_kernel_copy_strided(
              &ex, (char *)dt_tensor_data(y) + (size_t)(start * ostrides[dim]) * es, ostrides,
              dt_tensor_data(xs[i]), dt_tensor_strides(xs[i]), dt_tensor_shape(xs[i]), nd, es),
          st, fail);
    start += dt_tensor_shape(xs[i])[dim];
  }
  if (n <= DT_NODE_MAX_INPUTS)
    DT_CHECK_GOTO(dt_ops_maybe_record(op, concat_backward, xs, n, y, &node), st, fail);
  if (node) {
    concat_saved *saved = DT_NODE_PARAMS_INIT(node, concat_saved);
    saved->dim = dim;
    for (int i = 0; i < n; ++i)
      saved->sizes[i] = dt_tensor_shape(xs[i])[dim];
  }
  *out = y;
  return DT_OK;
fail:
  dt_tensor_release(y);
  return st;
}

/* When recording more inputs than a node holds: concat groups of
 * DT_NODE_MAX_INPUTS, then concat the groups (a tree; each level copies
 * the data once). */
static dt_status concat_tree(const char *op, dt_tensor *const *xs, int n, int dim,
                             dt_tensor **out) {
  if (n <= DT_NODE_MAX_INPUTS)
    return concat_direct(op, xs, n, dim, out);
  int groups = (n + DT_NODE_MAX_INPUTS - 1) / DT_NODE_MAX_INPUTS;
  dt_tensor **parts = calloc((size_t)groups, sizeof *parts);
  if (!parts)
    return DT_ERROR(DT_ERR_OOM, "%s: out of host memory for %d partial results", op, groups);
  dt_status st = DT_OK;
  for (int gi = 0; st == DT_OK && gi < groups; ++gi) {
    int first = gi * DT_NODE_MAX_INPUTS;
    int len = n - first < DT_NODE_MAX_INPUTS ? n - first : DT_NODE_MAX_INPUTS;
    st = concat_direct(op, xs + first, len, dim, &parts[gi]);
  }
  if (st == DT_OK)
    st = concat_tree(op, parts, groups, dim, out);
  for (int gi = 0; gi < groups; ++gi)
    dt_tensor_release(parts[gi]);
  free(parts);
  return st;
}

/* 16-bit inputs of mixed dtypes or requiring grad: concatenated in f32
 * (recorded casts), the result in their dtype when all share one, else f32
 * (PyTorch's promotion). Leaves *out NULL when this does not apply (one
 * dtype, no gradient: the copy kernel moves 16-bit elements as they are). */
static dt_status concat_half(const char *op, dt_tensor *const *xs, int n, int dim,
                             dt_tensor **out) {
  int half = 0, same = 1;
  *out = NULL;
  for (int i = 0; i < n; ++i) {
    half |= dt_ops_is_half(xs[i]);
    same &= dt_tensor_dtype(xs[i]) == dt_tensor_dtype(xs[0]);
  }
  if (!half || (same && !dt_autograd_should_record(xs, n)))
    return DT_OK;
  for (int i = 0; i < n; ++i)
    DT_CHECK(dt_ops_check_float_inputs(op, &xs[i], 1));
  dt_tensor **w = calloc((size_t)n, sizeof *w);
  if (!w)
    return DT_ERROR(DT_ERR_OOM, "%s: no host memory for %d tensors", op, n);
  dt_status st = DT_OK;
  for (int i = 0; st == DT_OK && i < n; ++i)
    st = dt_ops_f32_input(xs[i], &w[i]);
  if (st == DT_OK)
    st = dt_op_concat(w, n, dim, out);
  st = dt_ops_f32_done(st, w, n, same ? dt_tensor_dtype(xs[0]) : DT_DTYPE_F32, out);
  free(w);
  if (st != DT_OK)
    *out = NULL;
  return st;
}

dt_status dt_op_concat(dt_tensor *const *xs, int n, int dim, dt_tensor **out) {
  static const char *op = "dt_op_concat";
  if (!xs || n < 1 || !out)
    return DT_ERROR(DT_ERR_INVALID_ARG, "%s: needs at least one tensor", op);
  for (int i = 0; i < n; ++i)
    if (!xs[i])
      return DT_ERROR(DT_ERR_INVALID_ARG, "%s: tensor %d is NULL", op, i);
  DT_CHECK(dt_check_same_device(op, xs, n));
  DT_CHECK(concat_half(op, xs, n, dim, out));
  if (*out)
    return DT_OK;
  int nd = dt_tensor_ndim(xs[0]);
  int d = 0;
  if (nd < 1)
    return DT_ERROR(DT_ERR_SHAPE, "%s: cannot concatenate 0-dim tensors: reshape them to (1)", op);
  DT_CHECK(dt_ops_normalize_dim(op, dim, nd, &d));
  char b0[128], bi[128];
  for (int i = 1; i < n; ++i) {
    if (dt_tensor_dtype(xs[i]) != dt_tensor_dtype(xs[0]))
      return DT_ERROR(DT_ERR_DTYPE, "%s: tensor %d is %s, tensor 0 is %s: convert them first", op,
                      i, dt_dtype_name(dt_tensor_dtype(xs[i])),
                      dt_dtype_name(dt_tensor_dtype(xs[0])));
    int ok = dt_tensor_ndim(xs[i]) == nd;
    for (int k = 0; ok && k < nd; ++k)
      ok = k == d || dt_tensor_shape(xs[i])[k] == dt_tensor_shape(xs[0])[k];
    if (!ok)
      return DT_ERROR(DT_ERR_SHAPE,
                      "%s: tensor %d %s does not match tensor 0 %s: all dims but %d must be "
                      "equal",
                      op, i,
                      dt_shape_format(dt_tensor_shape(xs[i]), dt_tensor_ndim(xs[i]), bi, sizeof bi),
                      dt_shape_format(dt_tensor_shape(xs[0]), nd, b0, sizeof b0), d);
  }
  if (dt_autograd_should_record(xs, n) && dt_tensor_dtype(xs[0]) != DT_DTYPE_F32)
    return DT_ERROR(DT_ERR_DTYPE, "%s: inputs requiring grad must be f32 (got %s)", op,
                    dt_dtype_name(dt_tensor_dtype(xs[0])));
  if (n > DT_NODE_MAX_INPUTS && dt_autograd_should_record(xs, n))
    return concat_tree(op, xs, n, d, out);
  return concat_direct(op, xs, n, d, out);
}

/* ---- flatten ---- */

dt_status dt_op_flatten(dt_tensor *x, dt_tensor **out) {
  if (!x || !out)
    return DT_ERROR(DT_ERR_INVALID_ARG, "dt_op_flatten: NULL argument");
  int nd = dt_tensor_ndim(x);
  if (nd < 1)
    return DT_ERROR(DT_ERR_SHAPE, "dt_op_flatten: input is 0-dim: expected (N, ...)");
  /* (N, ...) -> (N, prod(...)): a view (reshape copies non-contiguous input) */
  int64_t shape[2] = {dt_tensor_shape(x)[0], dt_shape_numel(dt_tensor_shape(x) + 1, nd - 1)};
  return dt_tensor_reshape(x, shape, 2, out);
}

/* ---- argmax ---- */

dt_status dt_op_argmax(dt_tensor *x, dt_tensor **out) {
  static const char *op = "dt_op_argmax";
  if (dt_ops_is_half(x) && out) { /* the 16-bit logits of a training step's metric */
    dt_tensor *x32 = NULL;
    DT_CHECK(dt_ops_widen(x, &x32));
    dt_status st = dt_op_argmax(x32, out);
    dt_tensor_release(x32);
    return st;
  }
  DT_CHECK(dt_ops_check_unary(op, x, out));
  int nd = dt_tensor_ndim(x);
  char b[128];
  if (nd < 1 || dt_tensor_shape(x)[nd - 1] < 1)
    return DT_ERROR(DT_ERR_SHAPE, "%s: input %s: needs a non-empty last dimension", op,
                    dt_shape_format(dt_tensor_shape(x), nd, b, sizeof b));
  int64_t cols = dt_tensor_shape(x)[nd - 1], n = dt_tensor_numel(x), rows = n / cols;
  /* On the host until a backend kernel exists: argmax is for metrics, not
   * the training step. */
  float *host = malloc(sizeof(float) * (size_t)(n > 0 ? n : 1));
  int64_t *idx = malloc(sizeof(int64_t) * (size_t)(rows > 0 ? rows : 1));
  dt_status st = DT_OK;
  if (!host || !idx) {
    st = DT_ERROR(DT_ERR_OOM, "%s: out of host memory for %lld elements", op, (long long)n);
    goto done;
  }
  DT_CHECK_GOTO(dt_tensor_to_host(x, host, sizeof(float) * (size_t)n), st, done);
  for (int64_t r = 0; r < rows; ++r) {
    const float *v = host + r * cols;
    int64_t best = 0;
    for (int64_t j = 0; j < cols; ++j) {
      if (isnan(v[j])) { /* NaN wins, as in PyTorch */
        best = j;
        break;
      }
      if (v[j] > v[best])
        best = j;
    }
    idx[r] = best;
  }
  DT_CHECK_GOTO(
      dt_tensor_from_host(idx, dt_tensor_shape(x), nd - 1, DT_DTYPE_I64, dt_tensor_device(x), out),
      st, done);
done:
  free(idx);
  free(host);
  return st;
}
