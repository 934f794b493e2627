/* Tensors: dtype, device, reference-counted storage and views.
 *
 * A tensor is an opaque, reference-counted handle over a storage (a block of
 * device memory) with an element offset, a shape of at most DT_MAX_DIMS
 * dimensions and strides in elements. Functions that return a new tensor
 * through `dt_tensor **out` hand the caller one reference; release it with
 * dt_tensor_release(). Views share storage and never copy.
 */
#ifndef DT_CORE_TENSOR_H
#define DT_CORE_TENSOR_H

#include <stddef.h>
#include <stdint.h>

#include "core/device.h"
#include "core/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct dt_tensor dt_tensor;

/* ---- creation (contents uninitialised unless the name says otherwise) ---- */
dt_status dt_tensor_empty(const int64_t *shape, int ndim, dt_dtype dtype, dt_device dev,
                          dt_tensor **out);
dt_status dt_tensor_zeros(const int64_t *shape, int ndim, dt_dtype dtype, dt_device dev,
                          dt_tensor **out);
dt_status dt_tensor_full(const int64_t *shape, int ndim, float value, dt_device dev,
                         dt_tensor **out); /* f32 */
/* Copies `data` (host memory, `dtype` elements, contiguous) to a new tensor. */
dt_status dt_tensor_from_host(const void *data, const int64_t *shape, int ndim, dt_dtype dtype,
                              dt_device dev, dt_tensor **out);
/* A contiguous CPU tensor over `bytes` of memory the caller provides (a
 * mapping several processes share, say), which must hold the shape's
 * elements and be aligned to them. When the last tensor or view over it is
 * released, release(ctx) runs (NULL: nothing; the memory must then outlive
 * every tensor over it); on failure it does not, and the memory stays the
 * caller's. The CPU allocator's statistics do not count the memory. */
dt_status dt_tensor_from_cpu_memory(void *data, size_t bytes, const int64_t *shape, int ndim,
                                    dt_dtype dtype, void (*release)(void *ctx), void *ctx,
                                    dt_tensor **out);
/* Copies the tensor's elements (any layout) to host memory, contiguous.
 * `bytes` must equal numel * dtype size. Waits for pending device work. */
dt_status dt_tensor_to_host(const dt_tensor *t, void *data, size_t bytes);

/* ---- lifetime ---- */
dt_tensor *dt_tensor_retain(dt_tensor *t);
void dt_tensor_release(dt_tensor *t); /* NULL is a no-op */

/* ---- properties ---- */
int dt_tensor_ndim(const dt_tensor *t);
int64_t dt_tensor_dim(const dt_tensor *t, int i); /* negative i counts from the end */
const int64_t *dt_tensor_shape(const dt_tensor *t);
const int64_t *dt_tensor_strides(const dt_tensor *t);
int64_t dt_tensor_numel(const dt_tensor *t);
dt_dtype dt_tensor_dtype(const dt_tensor *t);
dt_device dt_tensor_device(const dt_tensor *t);
int dt_tensor_is_contiguous(const dt_tensor *t);
int dt_tensor_shares_storage(const dt_tensor *a, const dt_tensor *b);
/* Pointer to the first element (device memory for device tensors). */
void *dt_tensor_data(const dt_tensor *t);
/* Human-readable "f32[64, 1, 28, 28] cpu:0" into buf. */
char *dt_tensor_describe(const dt_tensor *t, char *buf, size_t cap);

/* ---- autograd flags (see core/autograd.h for backward) ---- */
dt_status dt_tensor_set_requires_grad(dt_tensor *t, int requires_grad); /* leaves only */
int dt_tensor_requires_grad(const dt_tensor *t);
int dt_tensor_is_leaf(const dt_tensor *t);
/* The accumulated gradient (borrowed reference) or NULL. */
dt_tensor *dt_tensor_grad(const dt_tensor *t);
/* Replaces the gradient tensor (retains `grad`; NULL clears). Shape and dtype
 * must match. Lets DDP make .grad a view into a bucket. */
dt_status dt_tensor_set_grad(dt_tensor *t, dt_tensor *grad);
/* A new handle on the same data, detached from the graph (requires_grad 0). */
dt_status dt_tensor_detach(dt_tensor *t, dt_tensor **out);

/* ---- views: share storage, no copy; differentiable ---- */
dt_status dt_tensor_reshape(dt_tensor *t, const int64_t *shape, int ndim, dt_tensor **out);
dt_status dt_tensor_permute(dt_tensor *t, const int *perm, dt_tensor **out);
dt_status dt_tensor_transpose(dt_tensor *t, int d0, int d1, dt_tensor **out);
/* Rows [start, stop) along dim 0. */
dt_status dt_tensor_slice(dt_tensor *t, int64_t start, int64_t stop, dt_tensor **out);
/* A flat view of `numel` elements at element `offset` of t's storage, given
 * shape; t must be contiguous. Not differentiable (used for arenas). */
dt_status dt_tensor_view_flat(dt_tensor *t, int64_t offset, const int64_t *shape, int ndim,
                              dt_tensor **out);

/* ---- copies ---- */
/* Contiguous copy (or a new reference to t if already contiguous). Differentiable. */
dt_status dt_tensor_contiguous(dt_tensor *t, dt_tensor **out);
/* New tensor with the same data converted to `dtype` (f32/f16/bf16/i32/i64/u8).
 * Differentiable between float dtypes. */
dt_status dt_tensor_to_dtype(dt_tensor *t, dt_dtype dtype, dt_tensor **out);
/* New tensor on `dev` (copy). Differentiable. */
dt_status dt_tensor_to_device(dt_tensor *t, dt_device dev, dt_tensor **out);
/* dst[...] = src[...]; same shape; dtype conversion and cross-device allowed.
 * Not recorded by autograd. */
dt_status dt_tensor_copy_(dt_tensor *dst, const dt_tensor *src);
dt_status dt_tensor_fill_(dt_tensor *t, float value);

/* Element (flat, row-major index) read as double; for tests and small tensors. */
dt_status dt_tensor_item(const dt_tensor *t, int64_t index, double *out);

#ifdef __cplusplus
}
#endif
#endif
