/* Views (reshape, permute, transpose, slice) and the differentiable copies
 * (contiguous, to_dtype, to_device). */
#include <stdlib.h>
#include <string.h>

#include "core/tensor_internal.h"

/* A view handle sharing t's storage, with the given geometry. */
static dt_status make_view(dt_tensor *t, int64_t offset, const int64_t *shape,
                           const int64_t *strides, int ndim, dt_tensor **out) {
  dt_tensor *v;
  DT_CHECK(dt_tensor_wrap(t->storage, offset, shape, ndim, t->dtype, &v));
  memcpy(v->strides, strides, sizeof(int64_t) * (size_t)ndim);
  *out = v;
  return DT_OK;
}

/* ---- reshape ---- */

/* The end of a tensor-to-tensor function y = f(x) given the status so far:
 * when `record` and grad mode want it, puts `name` on the tape (the node
 * through *node when node is not NULL, else NULL); hands y to *out on
 * success, releases it on failure. */
static dt_status finish_unary(dt_status st, bool record, const char *name, dt_backward_fn bw,
                              dt_tensor *x, dt_tensor *y, dt_node **node, dt_tensor **out) {
  dt_node *n = NULL;
  if (st == DT_OK && record && dt_autograd_should_record(&x, 1))
    st = dt_autograd_record(name, bw, &x, 1, y, &n);
  if (node)
    *node = n;
  if (st != DT_OK) {
    dt_tensor_release(y);
    return st;
  }
  *out = y;
  return DT_OK;
}

static dt_status reshape_backward(dt_node *node, dt_tensor *g, dt_tensor **gin) {
  dt_tensor *in = node->inputs[0];
  return dt_tensor_reshape(g, in->shape, in->ndim, &gin[0]);
}

dt_status dt_tensor_reshape(dt_tensor *t, const int64_t *shape, int ndim, dt_tensor **out) {
  int64_t sh[DT_MAX_DIMS];
  int infer = -1;
  int64_t known = 1;
  char a[160], b[160];
  if (ndim < 0 || ndim > DT_MAX_DIMS)
    return DT_ERROR(DT_ERR_SHAPE, "reshape: rank %d out of range", ndim);
  for (int i = 0; i < ndim; i++) {
    sh[i] = shape[i];
    if (shape[i] == -1) {
      if (infer >= 0)
        return DT_ERROR(DT_ERR_SHAPE, "reshape: more than one -1 in %s",
                        dt_shape_format(shape, ndim, a, sizeof a));
      infer = i;
    } else if (shape[i] < 0) {
      return DT_ERROR(DT_ERR_SHAPE, "reshape: negative dimension in %s",
                      dt_shape_format(shape, ndim, a, sizeof a));
    } else {
      known *= shape[i];
    }
  }
  int64_t n = dt_tensor_numel(t);
  if (infer >= 0) {
    if (known == 0 || n % known != 0)
      return DT_ERROR(DT_ERR_SHAPE, "reshape: cannot infer -1 in %s from %lld elements",
                      dt_shape_format(shape, ndim, a, sizeof a), (long long)n);
    sh[infer] = n / known;
    known *= sh[infer];
  }
  if (known != n)
    return DT_ERROR(DT_ERR_SHAPE, "reshape: shape %s has %lld elements, tensor %s has %lld",
                    dt_shape_format(sh, ndim, a, sizeof a), (long long)known,
                    dt_shape_format(t->shape, t->ndim, b, sizeof b), (long long)n);
  dt_tensor *src;
  /* A non-contiguous tensor is copied first, like torch.reshape. */
  DT_CHECK(dt_tensor_contiguous(t, &src));
  int64_t strides[DT_MAX_DIMS];
  dt_contiguous_strides(sh, ndim, strides);
  dt_tensor *v = NULL;
  dt_status st = make_view(src, src->offset, sh, strides, ndim, &v);
  st = finish_unary(st, true, "reshape", reshape_backward, src, v, NULL, out);
  dt_tensor_release(src);
  return st;
}

/* ---- permute / transpose ---- */

typedef struct permute_saved {
  int perm[DT_MAX_DIMS];
} permute_saved;

static dt_status permute_backward(dt_node *node, dt_tensor *g, dt_tensor **gin) {
  const permute_saved *s = DT_NODE_PARAMS(node, permute_saved);
  int inv[DT_MAX_DIMS];
  int nd = node->inputs[0]->ndim;
  for (int i = 0; i < nd; i++)
    inv[s->perm[i]] = i;
  dt_tensor *p;
  DT_CHECK(dt_tensor_permute(g, inv, &p));
  dt_status st = dt_tensor_contiguous(p, &gin[0]);
  dt_tensor_release(p);
  return st;
}

dt_status dt_tensor_permute(dt_tensor *t, const int *perm, dt_tensor **out) {
  int seen[DT_MAX_DIMS] = {0};
  int64_t sh[DT_MAX_DIMS], st_[DT_MAX_DIMS];
  for (int i = 0; i < t->ndim; i++) {
    int p = perm[i];
    if (p < 0 || p >= t->ndim || seen[p])
      return DT_ERROR(DT_ERR_INVALID_ARG, "permute: not a permutation of %d dims (entry %d = %d)",
                      t->ndim, i, p);
    seen[p] = 1;
    sh[i] = t->shape[p];
    st_[i] = t->strides[p];
  }
  dt_tensor *v;
  dt_node *node;
  DT_CHECK(make_view(t, t->offset, sh, st_, t->ndim, &v));
  DT_CHECK(finish_unary(DT_OK, true, "permute", permute_backward, t, v, &node, out));
  if (node)
    memcpy(DT_NODE_PARAMS_INIT(node, permute_saved)->perm, perm, (size_t)t->ndim * sizeof(int));
  return DT_OK;
}

dt_status dt_tensor_transpose(dt_tensor *t, int d0, int d1, dt_tensor **out) {
  int perm[DT_MAX_DIMS];
  if (d0 < 0)
    d0 += t->ndim;
  if (d1 < 0)
    d1 += t->ndim;
  if (d0 < 0 || d0 >= t->ndim || d1 < 0 || d1 >= t->ndim)
    return DT_ERROR(DT_ERR_INVALID_ARG, "transpose: dims out of range for a %d-dim tensor",
                    t->ndim);
  for (int i = 0; i < t->ndim; i++)
    perm[i] = i;
  perm[d0] = d1;
  perm[d1] = d0;
  return dt_tensor_permute(t, perm, out);
}

/* ---- slice along dim 0 ---- */

typedef struct slice_saved {
  int64_t start, stop; /* rows [start, stop) of dim 0 */
} slice_saved;

static dt_status slice_backward(dt_node *node, dt_tensor *g, dt_tensor **gin) {
  const slice_saved *s = DT_NODE_PARAMS(node, slice_saved);
  dt_tensor *in = node->inputs[0];
  dt_tensor *z, *part;
  DT_CHECK(dt_tensor_zeros(in->shape, in->ndim, DT_DTYPE_F32, in->storage->device, &z));
  dt_status st = dt_tensor_slice(z, s->start, s->stop, &part);
  if (st == DT_OK) {
    st = dt_tensor_copy_(part, g);
    dt_tensor_release(part);
  }
  if (st != DT_OK) {
    dt_tensor_release(z);
    return st;
  }
  gin[0] = z;
  return DT_OK;
}

dt_status dt_tensor_slice(dt_tensor *t, int64_t start, int64_t stop, dt_tensor **out) {
  if (t->ndim < 1)
    return DT_ERROR(DT_ERR_SHAPE, "slice: needs at least one dimension");
  if (start < 0 || stop < start || stop > t->shape[0])
    return DT_ERROR(DT_ERR_INVALID_ARG, "slice: rows [%lld, %lld) out of range [0, %lld]",
                    (long long)start, (long long)stop, (long long)t->shape[0]);
  int64_t sh[DT_MAX_DIMS];
  memcpy(sh, t->shape, sizeof sh);
  sh[0] = stop - start;
  dt_tensor *v;
  dt_node *node;
  DT_CHECK(make_view(t, t->offset + start * t->strides[0], sh, t->strides, t->ndim, &v));
  DT_CHECK(finish_unary(DT_OK, true, "slice", slice_backward, t, v, &node, out));
  if (node)
    *DT_NODE_PARAMS_INIT(node, slice_saved) = (slice_saved){start, stop};
  return DT_OK;
}

dt_status dt_tensor_view_flat(dt_tensor *t, int64_t offset, const int64_t *shape, int ndim,
                              dt_tensor **out) {
  char a[160];
  if (!dt_tensor_is_contiguous(t))
    return DT_ERROR(DT_ERR_INVALID_ARG, "view_flat: source must be contiguous");
  int64_t n = dt_shape_numel(shape, ndim);
  if (offset < 0 || offset + n > dt_tensor_numel(t))
    return DT_ERROR(DT_ERR_SHAPE, "view_flat: %s at offset %lld exceeds %lld elements",
                    dt_shape_format(shape, ndim, a, sizeof a), (long long)offset,
                    (long long)dt_tensor_numel(t));
  return dt_tensor_wrap(t->storage, t->offset + offset, shape, ndim, t->dtype, out);
}

/* ---- contiguous ---- */

static dt_status identity_backward(dt_node *node, dt_tensor *g, dt_tensor **gin) {
  (void)node;
  gin[0] = dt_tensor_retain(g);
  return DT_OK;
}

dt_status dt_tensor_contiguous(dt_tensor *t, dt_tensor **out) {
  dt_tensor *c;
  DT_CHECK(dt_tensor_contiguous_copy(t, &c));
  return finish_unary(DT_OK, c != t, "contiguous", identity_backward, t, c, NULL, out);
}

/* ---- dtype and device conversion ---- */

static dt_status to_dtype_backward(dt_node *node, dt_tensor *g, dt_tensor **gin) {
  /* A gradient has its tensor's dtype (a 16-bit activation gets a 16-bit
   * gradient, an f32 master weight an f32 one). */
  dt_tensor *in = node->inputs[0];
  if (in->dtype == g->dtype) {
    gin[0] = dt_tensor_retain(g);
    return DT_OK;
  }
  dt_no_grad_begin();
  dt_status st = dt_tensor_to_dtype(g, in->dtype, &gin[0]);
  dt_no_grad_end();
  return st;
}

dt_status dt_tensor_to_dtype(dt_tensor *t, dt_dtype dtype, dt_tensor **out) {
  if ((int)dtype < 0 || dtype >= DT_DTYPE_COUNT)
    return DT_ERROR(DT_ERR_DTYPE, "to_dtype: unknown dtype %d", (int)dtype);
  dt_tensor *c, *r = NULL;
  DT_CHECK(dt_tensor_contiguous(t, &c));
  dt_status st = dt_tensor_empty(c->shape, c->ndim, dtype, c->storage->device, &r);
  if (st == DT_OK)
    st = dt_kernel_cast(DT_TENSOR_EXEC(c), dt_tensor_data(c), c->dtype, dt_tensor_data(r), dtype,
                        dt_tensor_numel(c));
  bool floats = dt_dtype_is_float(dtype) && dt_dtype_is_float(c->dtype);
  st = finish_unary(st, floats, "to_dtype", to_dtype_backward, c, r, NULL, out);
  dt_tensor_release(c);
  return st;
}

static dt_status to_device_backward(dt_node *node, dt_tensor *g, dt_tensor **gin) {
  return dt_tensor_to_device(g, node->inputs[0]->storage->device, &gin[0]);
}

dt_status dt_tensor_to_device(dt_tensor *t, dt_device dev, dt_tensor **out) {
  const dt_backend_ops *be;
  DT_CHECK(dt_backend_get(dev, &be));
  dt_tensor *r;
  DT_CHECK(dt_tensor_empty(t->shape, t->ndim, t->dtype, dev, &r));
  return finish_unary(dt_tensor_copy_(r, t), true, "to_device", to_device_backward, t, r, NULL,
                      out);
}
