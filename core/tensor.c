/* Tensors: storage, creation, lifetime, properties, copies. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/half.h"
#include "core/memory.h"
#include "core/tensor_internal.h"

/* ---- storage ---- */

/* A header with one reference, no data yet. */
static dt_status storage_header(dt_device dev, size_t bytes, dt_storage **out) {
  dt_storage *s = calloc(1, sizeof *s);
  if (s == NULL)
    return DT_ERROR(DT_ERR_OOM, "out of host memory for a storage header");
  s->refcount = 1;
  s->device = dev;
  s->bytes = bytes;
  *out = s;
  return DT_OK;
}

dt_status dt_storage_alloc(dt_device dev, size_t bytes, dt_storage **out) {
  const dt_backend_ops *be;
  DT_CHECK(dt_backend_get(dev, &be));
  dt_storage *s = NULL;
  DT_CHECK(storage_header(dev, bytes, &s));
  s->owns_data = 1;
  if (bytes > 0) {
    dt_status st = be->alloc(dev, bytes, &s->data);
    if (st != DT_OK) {
      free(s);
      return st;
    }
  }
  *out = s;
  return DT_OK;
}

void dt_storage_release(dt_storage *s) {
  if (s == NULL)
    return;
  if (__atomic_sub_fetch(&s->refcount, 1, __ATOMIC_ACQ_REL) != 0)
    return;
  if (s->owns_data && s->data != NULL) {
    const dt_backend_ops *be;
    if (dt_backend_get(s->device, &be) == DT_OK)
      be->free(s->device, s->data, s->bytes);
  } else if (s->release != NULL) {
    s->release(s->release_ctx);
  }
  free(s);
}

/* ---- shapes ---- */

void dt_contiguous_strides(const int64_t *shape, int ndim, int64_t *strides) {
  int64_t st = 1;
  for (int i = ndim - 1; i >= 0; i--) {
    strides[i] = st;
    st *= shape[i];
  }
}

int64_t dt_shape_numel(const int64_t *shape, int ndim) {
  int64_t n = 1;
  for (int i = 0; i < ndim; i++)
    n *= shape[i];
  return n;
}

char *dt_shape_format(const int64_t *shape, int ndim, char *buf, size_t cap) {
  size_t used = 0;
  used += (size_t)snprintf(buf, cap, "[");
  for (int i = 0; i < ndim && used < cap; i++)
    used += (size_t)snprintf(buf + used, cap - used, i ? ", %lld" : "%lld", (long long)shape[i]);
  if (used < cap)
    snprintf(buf + used, cap - used, "]");
  return buf;
}

static dt_status check_shape(const int64_t *shape, int ndim) {
  char buf[128];
  if (ndim < 0 || ndim > DT_MAX_DIMS)
    return DT_ERROR(DT_ERR_SHAPE, "tensor rank %d out of range [0, %d]", ndim, DT_MAX_DIMS);
  for (int i = 0; i < ndim; i++)
    if (shape[i] < 0)
      return DT_ERROR(DT_ERR_SHAPE, "negative dimension in shape %s",
                      dt_shape_format(shape, ndim, buf, sizeof buf));
  return DT_OK;
}

/* ---- creation ---- */

dt_status dt_tensor_wrap(dt_storage *s, int64_t offset, const int64_t *shape, int ndim,
                         dt_dtype dtype, dt_tensor **out) {
  DT_CHECK(check_shape(shape, ndim));
  dt_tensor *t = calloc(1, sizeof *t);
  if (t == NULL)
    return DT_ERROR(DT_ERR_OOM, "out of host memory for a tensor header");
  t->refcount = 1;
  __atomic_add_fetch(&s->refcount, 1, __ATOMIC_RELAXED);
  t->storage = s;
  t->offset = offset;
  t->ndim = ndim;
  if (ndim > 0)
    memcpy(t->shape, shape, sizeof(int64_t) * (size_t)ndim);
  dt_contiguous_strides(t->shape, ndim, t->strides);
  t->dtype = dtype;
  *out = t;
  return DT_OK;
}

dt_status dt_tensor_empty(const int64_t *shape, int ndim, dt_dtype dtype, dt_device dev,
                          dt_tensor **out) {
  DT_CHECK(check_shape(shape, ndim));
  if ((int)dtype < 0 || dtype >= DT_DTYPE_COUNT)
    return DT_ERROR(DT_ERR_DTYPE, "unknown dtype %d", (int)dtype);
  /* The byte count must not wrap: (2^32, 2^32) f32 would otherwise
   * "allocate" 0 bytes for 2^64 elements. */
  int64_t n = 1;
  size_t bytes = 0;
  for (int i = 0; i < ndim; i++)
    if (__builtin_mul_overflow(n, shape[i], &n))
      n = -1;
  if (n < 0 || __builtin_mul_overflow((size_t)n, dt_dtype_size(dtype), &bytes) ||
      bytes > (size_t)INT64_MAX) {
    char buf[128];
    return DT_ERROR(DT_ERR_SHAPE, "tensor shape %s of %s is too large: its size overflows 64 bits",
                    dt_shape_format(shape, ndim, buf, sizeof buf), dt_dtype_name(dtype));
  }
  dt_storage *s;
  DT_CHECK(dt_storage_alloc(dev, bytes, &s));
  dt_status st = dt_tensor_wrap(s, 0, shape, ndim, dtype, out);
  dt_storage_release(s);
  return st;
}

dt_status dt_tensor_from_cpu_memory(void *data, size_t bytes, const int64_t *shape, int ndim,
                                    dt_dtype dtype, void (*release)(void *ctx), void *ctx,
                                    dt_tensor **out) {
  if (out == NULL)
    return DT_ERROR(DT_ERR_INVALID_ARG, "a tensor over caller memory: out is NULL");
  *out = NULL;
  DT_CHECK(check_shape(shape, ndim));
  if ((int)dtype < 0 || dtype >= DT_DTYPE_COUNT)
    return DT_ERROR(DT_ERR_DTYPE, "unknown dtype %d", (int)dtype);
  int64_t n = dt_shape_numel(shape, ndim);
  size_t need = 0;
  if (__builtin_mul_overflow((size_t)n, dt_dtype_size(dtype), &need) || need > bytes ||
      (data == NULL && need > 0)) {
    char buf[128];
    return DT_ERROR(DT_ERR_INVALID_ARG,
                    "a tensor of shape %s of %s over %zu bytes of caller memory at %p: it needs "
                    "%zu bytes",
                    dt_shape_format(shape, ndim, buf, sizeof buf), dt_dtype_name(dtype), bytes,
                    data, need);
  }
  if ((uintptr_t)data % dt_dtype_size(dtype) != 0)
    return DT_ERROR(DT_ERR_INVALID_ARG, "caller memory at %p is not aligned to its %s elements",
                    data, dt_dtype_name(dtype));
  dt_storage *s = NULL;
  DT_CHECK(storage_header(DT_CPU, bytes, &s));
  s->data = data;
  s->release = release;
  s->release_ctx = ctx;
  dt_status st = dt_tensor_wrap(s, 0, shape, ndim, dtype, out);
  if (st != DT_OK) /* the caller keeps the memory: no release on failure */
    s->release = NULL;
  dt_storage_release(s);
  return st;
}

dt_status dt_tensor_zeros(const int64_t *shape, int ndim, dt_dtype dtype, dt_device dev,
                          dt_tensor **out) {
  dt_tensor *t;
  DT_CHECK(dt_tensor_empty(shape, ndim, dtype, dev, &t));
  if (t->storage->bytes > 0) {
    dt_status st = dt_tensor_backend(t)->memset_zero(dev, t->storage->data, t->storage->bytes);
    if (st != DT_OK) {
      dt_tensor_release(t);
      return st;
    }
  }
  *out = t;
  return DT_OK;
}

dt_status dt_tensor_full(const int64_t *shape, int ndim, float value, dt_device dev,
                         dt_tensor **out) {
  dt_tensor *t;
  DT_CHECK(dt_tensor_empty(shape, ndim, DT_DTYPE_F32, dev, &t));
  dt_status st = dt_tensor_fill_(t, value);
  if (st != DT_OK) {
    dt_tensor_release(t);
    return st;
  }
  *out = t;
  return DT_OK;
}

dt_status dt_tensor_from_host(const void *data, const int64_t *shape, int ndim, dt_dtype dtype,
                              dt_device dev, dt_tensor **out) {
  dt_tensor *t;
  DT_CHECK(dt_tensor_empty(shape, ndim, dtype, dev, &t));
  size_t bytes = t->storage->bytes;
  if (bytes > 0) {
    dt_status st = dt_tensor_backend(t)->copy(t->storage->data, dev, data, DT_CPU, bytes, NULL);
    if (st != DT_OK) {
      dt_tensor_release(t);
      return st;
    }
  }
  *out = t;
  return DT_OK;
}

dt_status dt_tensor_to_host(const dt_tensor *t, void *data, size_t bytes) {
  size_t need = (size_t)dt_tensor_numel(t) * dt_dtype_size(t->dtype);
  if (bytes != need)
    return DT_ERROR(DT_ERR_INVALID_ARG, "host buffer holds %zu bytes, tensor needs %zu", bytes,
                    need);
  if (need == 0)
    return DT_OK;
  dt_tensor *c;
  DT_CHECK(dt_tensor_contiguous_copy((dt_tensor *)t, &c));
  const dt_backend_ops *be = dt_tensor_backend(c);
  dt_status st = be->copy(data, DT_CPU, dt_tensor_data(c), c->storage->device, need, NULL);
  dt_tensor_release(c);
  return st;
}

/* ---- lifetime ---- */

dt_tensor *dt_tensor_retain(dt_tensor *t) {
  if (t != NULL)
    __atomic_add_fetch(&t->refcount, 1, __ATOMIC_RELAXED);
  return t;
}

void dt_node_release(dt_node *n) {
  if (n != NULL && __atomic_sub_fetch(&n->refcount, 1, __ATOMIC_ACQ_REL) == 0)
    n->destroy(n);
}

void dt_tensor_release(dt_tensor *t) {
  if (t == NULL)
    return;
  if (__atomic_sub_fetch(&t->refcount, 1, __ATOMIC_ACQ_REL) != 0)
    return;
  dt_tensor_release(t->grad);
  dt_node_release(t->grad_fn);
  dt_tensor_release(t->half_copy);
  free(t->hooks);
  dt_storage_release(t->storage);
  free(t);
}

void dt_tensor_release_many(dt_tensor *const *ts, int n) {
  for (int i = 0; i < n; i++)
    dt_tensor_release(ts[i]);
}

/* ---- properties ---- */

int dt_tensor_ndim(const dt_tensor *t) { return t->ndim; }

int64_t dt_tensor_dim(const dt_tensor *t, int i) {
  if (i < 0)
    i += t->ndim;
  if (i < 0 || i >= t->ndim)
    return 0;
  return t->shape[i];
}

const int64_t *dt_tensor_shape(const dt_tensor *t) { return t->shape; }
const int64_t *dt_tensor_strides(const dt_tensor *t) { return t->strides; }
int64_t dt_tensor_numel(const dt_tensor *t) { return dt_shape_numel(t->shape, t->ndim); }
dt_dtype dt_tensor_dtype(const dt_tensor *t) { return t->dtype; }
dt_device dt_tensor_device(const dt_tensor *t) { return t->storage->device; }

int dt_tensor_is_contiguous(const dt_tensor *t) {
  int64_t st = 1;
  for (int i = t->ndim - 1; i >= 0; i--) {
    if (t->shape[i] != 1 && t->strides[i] != st)
      return 0;
    st *= t->shape[i];
  }
  return 1;
}

int dt_tensor_shares_storage(const dt_tensor *a, const dt_tensor *b) {
  return a->storage == b->storage;
}

void *dt_tensor_data(const dt_tensor *t) {
  if (t->storage->data == NULL)
    return NULL;
  return (char *)t->storage->data + (size_t)t->offset * dt_dtype_size(t->dtype);
}

char *dt_tensor_describe(const dt_tensor *t, char *buf, size_t cap) {
  char shape[160], dev[32];
  snprintf(buf, cap, "%s%s %s", dt_dtype_name(t->dtype),
           dt_shape_format(t->shape, t->ndim, shape, sizeof shape),
           dt_device_format(t->storage->device, dev, sizeof dev));
  return buf;
}

const dt_backend_ops *dt_tensor_backend(const dt_tensor *t) {
  const dt_backend_ops *be = NULL;
  dt_status st = dt_backend_get(t->storage->device, &be);
  DT_ASSERT(st == DT_OK); /* a tensor only exists on a device that exists */
  return be;
}

dt_exec dt_tensor_exec(const dt_tensor *t) {
  dt_exec ex;
  ex.be = dt_tensor_backend(t);
  ex.dev = t->storage->device;
  ex.dtype = t->dtype;
  ex.stream = ex.be->stream ? ex.be->stream(ex.dev, DT_STREAM_COMPUTE) : NULL;
  return ex;
}

dt_status dt_tensor_contiguous_copy(dt_tensor *t, dt_tensor **out) {
  if (dt_tensor_is_contiguous(t)) {
    *out = dt_tensor_retain(t);
    return DT_OK;
  }
  dt_tensor *c;
  DT_CHECK(dt_tensor_empty(t->shape, t->ndim, t->dtype, t->storage->device, &c));
  dt_status st =
      dt_kernel_copy_strided(DT_TENSOR_EXEC(t), dt_tensor_data(c), c->strides, dt_tensor_data(t),
                             t->strides, t->shape, t->ndim, dt_dtype_size(t->dtype));
  if (st != DT_OK) {
    dt_tensor_release(c);
    return st;
  }
  *out = c;
  return DT_OK;
}

/* ---- autograd flags ---- */

dt_status dt_tensor_set_requires_grad(dt_tensor *t, int requires_grad) {
  if (t->grad_fn != NULL)
    return DT_ERROR(DT_ERR_INVALID_ARG,
                    "requires_grad can only be set on leaf tensors (this one is the output "
                    "of %s); detach it first",
                    t->grad_fn->name);
  if (requires_grad && !dt_dtype_is_float(t->dtype))
    return DT_ERROR(DT_ERR_DTYPE, "only floating-point tensors can require grad (got %s)",
                    dt_dtype_name(t->dtype));
  t->requires_grad = requires_grad ? 1 : 0;
  return DT_OK;
}

int dt_tensor_requires_grad(const dt_tensor *t) { return t->requires_grad; }
int dt_tensor_is_leaf(const dt_tensor *t) { return t->grad_fn == NULL; }
dt_tensor *dt_tensor_grad(const dt_tensor *t) { return t->grad; }

dt_status dt_tensor_set_grad(dt_tensor *t, dt_tensor *grad) {
  if (grad != NULL) {
    char a[200], b[200];
    if (grad->ndim != t->ndim || memcmp(grad->shape, t->shape, sizeof(int64_t) * (size_t)t->ndim) ||
        grad->dtype != DT_DTYPE_F32 ||
        !dt_device_equal(grad->storage->device, t->storage->device) ||
        !dt_tensor_is_contiguous(grad))
      return DT_ERROR(DT_ERR_SHAPE,
                      "gradient %s does not fit tensor %s (needs the same shape and device, "
                      "f32, contiguous)",
                      dt_tensor_describe(grad, a, sizeof a), dt_tensor_describe(t, b, sizeof b));
    dt_tensor_retain(grad);
  }
  dt_tensor_release(t->grad);
  t->grad = grad;
  return DT_OK;
}

dt_status dt_tensor_detach(dt_tensor *t, dt_tensor **out) {
  dt_tensor *d = calloc(1, sizeof *d);
  if (d == NULL)
    return DT_ERROR(DT_ERR_OOM, "out of host memory for a tensor header");
  d->refcount = 1;
  d->storage = t->storage;
  __atomic_add_fetch(&t->storage->refcount, 1, __ATOMIC_RELAXED);
  d->offset = t->offset;
  d->ndim = t->ndim;
  memcpy(d->shape, t->shape, sizeof d->shape);
  memcpy(d->strides, t->strides, sizeof d->strides);
  d->dtype = t->dtype;
  *out = d;
  return DT_OK;
}

void dt_tensor_rebind(dt_tensor *t, dt_storage *s, int64_t offset) {
  __atomic_add_fetch(&s->refcount, 1, __ATOMIC_RELAXED);
  dt_storage_release(t->storage);
  t->storage = s;
  t->offset = offset;
  dt_contiguous_strides(t->shape, t->ndim, t->strides);
}

/* ---- checks shared by ops ---- */

dt_status dt_check_same_device(const char *op, dt_tensor *const *ts, int n) {
  const dt_tensor *first = NULL;
  for (int i = 0; i < n; i++) {
    if (ts[i] == NULL)
      continue;
    if (first == NULL) {
      first = ts[i];
    } else if (!dt_device_equal(first->storage->device, ts[i]->storage->device)) {
      char a[32], b[32];
      return DT_ERROR(DT_ERR_DEVICE_MISMATCH,
                      "%s: expected all tensors on the same device, found %s and %s: move them "
                      "with dt_tensor_to_device / dt_module_to first",
                      op, dt_device_format(first->storage->device, a, sizeof a),
                      dt_device_format(ts[i]->storage->device, b, sizeof b));
    }
  }
  return DT_OK;
}

dt_status dt_check_f32(const char *op, dt_tensor *const *ts, int n) {
  for (int i = 0; i < n; i++) {
    if (ts[i] != NULL && ts[i]->dtype != DT_DTYPE_F32)
      return DT_ERROR(DT_ERR_DTYPE,
                      "%s: input %d is %s but this op computes in f32: convert it with "
                      "dt_tensor_to_dtype first",
                      op, i, dt_dtype_name(ts[i]->dtype));
  }
  return DT_OK;
}

/* ---- copies ---- */

/* Picks the backend that can move bytes between a and b (the non-CPU one). */
static dt_status copy_backend(dt_device a, dt_device b, const dt_backend_ops **out) {
  if (a.type != DT_DEVICE_CPU)
    return dt_backend_get(a, out);
  return dt_backend_get(b, out);
}

dt_status dt_tensor_copy_(dt_tensor *dst, const dt_tensor *src) {
  char a[200], b[200];
  if (dst->ndim != src->ndim ||
      memcmp(dst->shape, src->shape, sizeof(int64_t) * (size_t)dst->ndim) != 0)
    return DT_ERROR(DT_ERR_SHAPE, "copy: shapes differ: destination %s, source %s",
                    dt_tensor_describe(dst, a, sizeof a), dt_tensor_describe(src, b, sizeof b));
  int64_t n = dt_tensor_numel(dst);
  if (n == 0)
    return DT_OK;
  dt_device dd = dst->storage->device, sd = src->storage->device;
  dt_status st = DT_OK;
  if (dt_device_equal(dd, sd) && dst->dtype == src->dtype) {
    const dt_exec ex = dt_tensor_exec(dst);
    return dt_kernel_copy_strided(&ex, dt_tensor_data(dst), dst->strides, dt_tensor_data(src),
                                  src->strides, dst->shape, dst->ndim, dt_dtype_size(dst->dtype));
  }
  /* General path: contiguous source, convert on the source device, move,
   * then scatter into dst's layout. */
  dt_tensor *c = NULL, *conv = NULL, *moved = NULL;
  DT_CHECK(dt_tensor_contiguous_copy((dt_tensor *)src, &c));
  if (c->dtype != dst->dtype) {
    DT_CHECK_GOTO(dt_tensor_empty(c->shape, c->ndim, dst->dtype, sd, &conv), st, done);
    DT_CHECK_GOTO(dt_kernel_cast(DT_TENSOR_EXEC(c), dt_tensor_data(c), c->dtype,
                                 dt_tensor_data(conv), dst->dtype, n),
                  st, done);
  } else {
    conv = dt_tensor_retain(c);
  }
  if (!dt_device_equal(dd, sd)) {
    const dt_backend_ops *be;
    DT_CHECK_GOTO(copy_backend(dd, sd, &be), st, done);
    DT_CHECK_GOTO(dt_tensor_empty(c->shape, c->ndim, dst->dtype, dd, &moved), st, done);
    DT_CHECK_GOTO(be->copy(dt_tensor_data(moved), dd, dt_tensor_data(conv), sd,
                           (size_t)n * dt_dtype_size(dst->dtype), NULL),
                  st, done);
  } else {
    moved = dt_tensor_retain(conv);
  }
  st = dt_kernel_copy_strided(DT_TENSOR_EXEC(dst), dt_tensor_data(dst), dst->strides,
                              dt_tensor_data(moved), moved->strides, dst->shape, dst->ndim,
                              dt_dtype_size(dst->dtype));
done:
  DT_RELEASE_TENSORS(moved, conv, c);
  return st;
}

dt_status dt_tensor_fill_(dt_tensor *t, float value) {
  if (t->dtype != DT_DTYPE_F32 || !dt_tensor_is_contiguous(t))
    return DT_ERROR(DT_ERR_DTYPE, "fill: needs a contiguous f32 tensor (got %s)",
                    dt_dtype_name(t->dtype));
  return dt_kernel_fill(DT_TENSOR_EXEC(t), dt_tensor_data(t), value, dt_tensor_numel(t));
}

dt_status dt_tensor_item(const dt_tensor *t, int64_t index, double *out) {
  int64_t n = dt_tensor_numel(t);
  if (index < 0 || index >= n)
    return DT_ERROR(DT_ERR_INVALID_ARG, "item: index %lld out of range [0, %lld)", (long long)index,
                    (long long)n);
  /* Walk the strides to the element, then read it to the host. */
  int64_t off = 0, rem = index;
  for (int i = t->ndim - 1; i >= 0; i--) {
    off += (rem % t->shape[i]) * t->strides[i];
    rem /= t->shape[i];
  }
  size_t es = dt_dtype_size(t->dtype);
  unsigned char buf[8];
  const dt_backend_ops *be = dt_tensor_backend(t);
  DT_CHECK(be->copy(buf, DT_CPU, (const char *)dt_tensor_data(t) + off * (int64_t)es,
                    t->storage->device, es, NULL));
  union {
    float f;
    uint16_t h;
    int32_t i;
    int64_t l;
    uint8_t u;
  } v;
  memcpy(&v, buf, es);
  switch (t->dtype) {
    case DT_DTYPE_F32: *out = v.f; break;
    case DT_DTYPE_F16: *out = dt_f16_to_f32(v.h); break;
    case DT_DTYPE_BF16: *out = dt_bf16_to_f32(v.h); break;
    case DT_DTYPE_I32: *out = v.i; break;
    case DT_DTYPE_I64: *out = (double)v.l; break;
    case DT_DTYPE_U8: *out = v.u; break;
    default: return DT_ERROR(DT_ERR_DTYPE, "item: unknown dtype");
  }
  return DT_OK;
}
