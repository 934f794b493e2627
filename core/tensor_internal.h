/* Tensor internals, for core/ and backends. Not part of the public API. */
#ifndef DT_CORE_TENSOR_INTERNAL_H
#define DT_CORE_TENSOR_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/autograd_internal.h"
#include "core/backend.h"
#include "core/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct dt_storage {
  int refcount; /* atomic */
  dt_device device;
  void *data;
  size_t bytes;
  int owns_data; /* freed through the backend when the count drops */
  /* Memory the caller provided (dt_tensor_from_cpu_memory): release(ctx)
   * when the count drops, else nothing. */
  void (*release)(void *ctx);
  void *release_ctx;
} dt_storage;

typedef struct dt_grad_hook {
  dt_hook_handle handle;
  dt_grad_ready_fn fn;
  void *user;
} dt_grad_hook;

struct dt_tensor {
  int refcount; /* atomic */
  dt_storage *storage;
  int64_t offset; /* elements */
  int ndim;
  int64_t shape[DT_MAX_DIMS];
  int64_t strides[DT_MAX_DIMS];
  dt_dtype dtype;
  int requires_grad;
  dt_tensor *grad;     /* owned reference or NULL */
  dt_node *grad_fn;    /* owned reference; NULL for leaves */
  dt_grad_hook *hooks; /* grad-ready hooks (leaves) */
  int n_hooks, cap_hooks;
  int pending_grads; /* engine scratch: edges still to contribute */
  /* A leaf standing in for a non-leaf (the input of a recomputed module,
   * core/nn_recompute.c): its gradient is summed as a non-leaf's is, never
   * added into in place by a backward (dt_node_grad_dest). */
  int sum_as_node;
  /* The rows-ready hook (leaves; dt_tensor_set_grad_rows_hook): NULL = none. */
  dt_grad_rows_ready_fn rows_fn;
  void *rows_user;
  int64_t rows_per_part;
  /* The grad-destination hook (leaves; dt_tensor_set_grad_dest_hook). */
  dt_grad_dest_fn dest_fn;
  void *dest_user;
  /* A parameter's 16-bit working copy (core/optim.h): a view of the
   * optimizer's flat 16-bit buffer, which the LOW ops use under autocast
   * instead of rounding the tensor, while *half_fresh (the optimizer's
   * flag) says it holds this tensor's values. Owned reference, or NULL. */
  dt_tensor *half_copy;
  const bool *half_fresh;
};

/* Allocates a storage of `bytes` on dev (through the backend; OOM detail
 * from the backend). */
dt_status dt_storage_alloc(dt_device dev, size_t bytes, dt_storage **out);
void dt_storage_release(dt_storage *s);

/* A new tensor handle over a storage (retained) with contiguous strides. */
dt_status dt_tensor_wrap(dt_storage *s, int64_t offset, const int64_t *shape, int ndim,
                         dt_dtype dtype, dt_tensor **out);
/* Rebinds t to a new storage/offset (same shape, contiguous); for the
 * parameter arena. */
void dt_tensor_rebind(dt_tensor *t, dt_storage *s, int64_t offset);

void dt_contiguous_strides(const int64_t *shape, int ndim, int64_t *strides);
int64_t dt_shape_numel(const int64_t *shape, int ndim);
/* "[2, 3, 4]" */
char *dt_shape_format(const int64_t *shape, int ndim, char *buf, size_t cap);

/* Common op argument checks: same device for all (non-NULL) tensors,
 * f32 dtype for all. `op` names the op in the message. */
dt_status dt_check_same_device(const char *op, dt_tensor *const *ts, int n);
dt_status dt_check_f32(const char *op, dt_tensor *const *ts, int n);

/* Backend of a tensor's device (already validated when the tensor exists). */
const dt_backend_ops *dt_tensor_backend(const dt_tensor *t);
/* The execution context for kernels over t's elements: its backend, device,
 * the device's compute stream and t's dtype. */
dt_exec dt_tensor_exec(const dt_tensor *t);
/* The same as a pointer to a temporary (valid to the end of the enclosing
 * block), for a single kernel call: dt_kernel_fill(DT_TENSOR_EXEC(t), ...). */
#define DT_TENSOR_EXEC(t) ((const dt_exec[1]){dt_tensor_exec(t)})

/* Releases each of ts[0..n) (NULLs allowed), in order. */
void dt_tensor_release_many(dt_tensor *const *ts, int n);
/* DT_RELEASE_TENSORS(a, b, c): a cleanup label's releases in one line (C only). */
#define DT_RELEASE_TENSORS(...)                             \
  dt_tensor_release_many((dt_tensor *const[]){__VA_ARGS__}, \
                         (int)(sizeof((dt_tensor *const[]){__VA_ARGS__}) / sizeof(dt_tensor *)))

/* A contiguous version of t, without recording on the tape: t itself
 * (retained) when already contiguous, else a copy. For the autograd engine
 * and ops, which record their own nodes. */
dt_status dt_tensor_contiguous_copy(dt_tensor *t, dt_tensor **out);

#ifdef __cplusplus
}
#endif
#endif
