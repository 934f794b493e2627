/* The flat parameter arena: every parameter's data in one buffer and every
 * gradient in another, in registration order, with the module's tensors as
 * views (llm.c's malloc_and_point_parameters). Offsets are dense, without
 * padding, so that a DDP bucket is one contiguous slice of the gradients;
 * ZeRO adds a zeroed tail after the last parameter (dt_param_arena_pad). */
#include <stdlib.h>
#include <string.h>

#include "core/module.h"
#include "core/tensor_internal.h"

struct dt_param_arena {
  int n;
  dt_tensor **params; /* retained */
  char **names;       /* owned copies of the dotted names */
  int64_t *offsets;   /* elements */
  int64_t numel;
  int64_t tail; /* zeroed elements after the last parameter (dt_param_arena_pad) */
  dt_device device;
  dt_tensor *data_padded;  /* flat f32 (numel + tail): the storage */
  dt_tensor *data;         /* its first numel elements */
  dt_tensor *grads_padded; /* the same for the gradients; NULL after dt_param_arena_drop_grads */
  dt_tensor *grads;
};

/* *padded (n + tail elements, tail zeroed) and *head, a view of its first n. */
static dt_status alloc_flat(dt_device dev, int64_t n, int64_t tail, int zero, dt_tensor **padded,
                            dt_tensor **head) {
  int64_t shape[1] = {n + tail};
  *padded = *head = NULL;
  DT_CHECK(zero ? dt_tensor_zeros(shape, 1, DT_DTYPE_F32, dev, padded)
                : dt_tensor_empty(shape, 1, DT_DTYPE_F32, dev, padded));
  dt_status st = DT_OK;
  if (!zero && tail > 0) {
    const dt_backend_ops *be = dt_tensor_backend(*padded);
    st = be->memset_zero(dev, (float *)dt_tensor_data(*padded) + n, (size_t)tail * sizeof(float));
  }
  if (st == DT_OK)
    st = dt_tensor_view_flat(*padded, 0, &n, 1, head);
  if (st != DT_OK) {
    dt_tensor_release(*padded);
    *padded = NULL;
  }
  return st;
}

/* Points parameter i's data at the flat data buffer and its gradient at a
 * view of the flat gradient buffer (when there is one). */
static dt_status point_param(dt_param_arena *a, int i) {
  dt_tensor *p = a->params[i];
  dt_tensor_rebind(p, a->data->storage, a->data->offset + a->offsets[i]);
  if (a->grads == NULL)
    return dt_tensor_set_grad(p, NULL);
  dt_tensor *grad_view = NULL;
  DT_CHECK(dt_tensor_view_flat(a->grads, a->offsets[i], dt_tensor_shape(p), dt_tensor_ndim(p),
                               &grad_view));
  dt_status st = dt_tensor_set_grad(p, grad_view);
  dt_tensor_release(grad_view);
  return st;
}

static dt_status check_params(const dt_module *m, int n, dt_device *dev, int64_t *numel) {
  char want[32], got[32];
  *numel = 0;
  for (int i = 0; i < n; i++) {
    const char *name = NULL;
    dt_tensor *p = dt_module_parameter_at(m, i, &name);
    if (dt_tensor_dtype(p) != DT_DTYPE_F32)
      return DT_ERROR(DT_ERR_DTYPE,
                      "parameter \"%s\" is %s: the arena holds f32 parameters only (keep f32 "
                      "master weights; autocast converts per op)",
                      name, dt_dtype_name(dt_tensor_dtype(p)));
    if (i == 0)
      *dev = dt_tensor_device(p);
    if (!dt_device_equal(dt_tensor_device(p), *dev))
      return DT_ERROR(DT_ERR_DEVICE_MISMATCH,
                      "parameter \"%s\" is on %s but the first parameter is on %s: move the "
                      "module with dt_module_to() before creating the arena",
                      name, dt_device_format(dt_tensor_device(p), got, sizeof got),
                      dt_device_format(*dev, want, sizeof want));
    if (!dt_tensor_is_leaf(p))
      return DT_ERROR(DT_ERR_INVALID_ARG, "parameter \"%s\" is not a leaf tensor", name);
    *numel += dt_tensor_numel(p);
  }
  return DT_OK;
}

dt_status dt_param_arena_create(dt_module *m, dt_param_arena **out) {
  dt_status st = DT_OK;
  if (m == NULL || out == NULL)
    return DT_ERROR(DT_ERR_INVALID_ARG, "creating a parameter arena: module or out is NULL");
  *out = NULL;
  int n = dt_module_num_parameters(m);
  if (n == 0)
    return DT_ERROR(DT_ERR_INVALID_ARG,
                    "creating a parameter arena for a %s module: it has no parameters",
                    dt_module_type_name(m));
  dt_device dev = DT_CPU;
  int64_t numel = 0;
  DT_CHECK(check_params(m, n, &dev, &numel));

  dt_param_arena *a = calloc(1, sizeof *a);
  if (a == NULL)
    return DT_ERROR(DT_ERR_OOM, "allocating the parameter arena: out of host memory");
  a->params = calloc((size_t)n, sizeof *a->params);
  a->names = calloc((size_t)n, sizeof *a->names);
  a->offsets = calloc((size_t)n, sizeof *a->offsets);
  if (a->params == NULL || a->names == NULL || a->offsets == NULL) {
    st = DT_ERROR(DT_ERR_OOM,
                  "allocating the arena's table of %d parameters: out of host "
                  "memory",
                  n);
    goto destroy_arena;
  }
  a->numel = numel;
  a->device = dev;
  DT_CHECK_GOTO(alloc_flat(dev, numel, 0, 0, &a->data_padded, &a->data), st, destroy_arena);
  DT_CHECK_GOTO(alloc_flat(dev, numel, 0, 1, &a->grads_padded, &a->grads), st, destroy_arena);

  int64_t off = 0;
  for (int i = 0; i < n; i++) {
    const char *name = NULL;
    dt_tensor *p = dt_module_parameter_at(m, i, &name);
    size_t len = strlen(name) + 1;
    a->names[i] = malloc(len);
    if (a->names[i] == NULL) {
      st = DT_ERROR(DT_ERR_OOM, "copying parameter name \"%s\": out of host memory", name);
      goto destroy_arena;
    }
    memcpy(a->names[i], name, len);
    a->params[i] = dt_tensor_retain(p);
    a->offsets[i] = off;
    a->n = i + 1;

    dt_tensor *data_view = NULL, *grad_view = NULL;
    DT_CHECK_GOTO(
        dt_tensor_view_flat(a->data, off, dt_tensor_shape(p), dt_tensor_ndim(p), &data_view), st,
        destroy_arena);
    st = dt_tensor_copy_(data_view, p);
    dt_tensor_release(data_view);
    if (st != DT_OK)
      goto destroy_arena;
    DT_CHECK_GOTO(
        dt_tensor_view_flat(a->grads, off, dt_tensor_shape(p), dt_tensor_ndim(p), &grad_view), st,
        destroy_arena);
    /* A gradient accumulated before the arena existed is kept. */
    dt_tensor *old_grad = dt_tensor_grad(p);
    if (old_grad != NULL)
      st = dt_tensor_copy_(grad_view, old_grad);
    if (st == DT_OK)
      st = dt_tensor_set_grad(p, grad_view);
    dt_tensor_release(grad_view);
    if (st != DT_OK)
      goto destroy_arena;
    dt_tensor_rebind(p, a->data->storage, a->data->offset + off);
    off += dt_tensor_numel(p);
  }
  *out = a;
  return DT_OK;

destroy_arena:
  /* Parameters already rebound keep the arena's storage alive through their
   * own references, so releasing the arena's handles is safe. */
  st = dt_error_wrap(st, "creating the parameter arena of a %s module", dt_module_type_name(m));
  dt_param_arena_destroy(a);
  return st;
}

void dt_param_arena_destroy(dt_param_arena *a) {
  if (a == NULL)
    return;
  for (int i = a->n - 1; i >= 0; i--) {
    dt_tensor_release(a->params[i]);
    free(a->names[i]);
  }
  DT_RELEASE_TENSORS(a->grads, a->grads_padded, a->data, a->data_padded);
  free(a->offsets);
  free(a->names);
  free(a->params);
  free(a);
}

int dt_param_arena_count(const dt_param_arena *a) { return a->n; }

dt_tensor *dt_param_arena_param(const dt_param_arena *a, int i, const char **name) {
  if (i < 0 || i >= a->n) {
    if (name != NULL)
      *name = NULL;
    return NULL;
  }
  if (name != NULL)
    *name = a->names[i];
  return a->params[i];
}

int64_t dt_param_arena_offset(const dt_param_arena *a, int i) {
  return (i >= 0 && i < a->n) ? a->offsets[i] : -1;
}

dt_tensor *dt_param_arena_data(const dt_param_arena *a) { return a->data; }

dt_tensor *dt_param_arena_grads(const dt_param_arena *a) { return a->grads; }

int64_t dt_param_arena_numel(const dt_param_arena *a) { return a->numel; }

dt_device dt_param_arena_device(const dt_param_arena *a) { return a->device; }

int64_t dt_param_arena_tail(const dt_param_arena *a) { return a->tail; }
dt_tensor *dt_param_arena_padded_data(const dt_param_arena *a) { return a->data_padded; }
dt_tensor *dt_param_arena_padded_grads(const dt_param_arena *a) { return a->grads_padded; }

dt_status dt_param_arena_zero_grad(dt_param_arena *a) {
  if (a == NULL)
    return DT_ERROR(DT_ERR_INVALID_ARG, "zeroing arena gradients: arena is NULL");
  if (a->grads == NULL) {
    for (int i = 0; i < a->n; i++)
      DT_CHECK(dt_tensor_set_grad(a->params[i], NULL));
    return DT_OK;
  }
  const dt_backend_ops *be = dt_tensor_backend(a->grads);
  return be->memset_zero(a->device, dt_tensor_data(a->grads),
                         (size_t)(a->numel + a->tail) * sizeof(float));
}

dt_status dt_param_arena_pad(dt_param_arena *a, int64_t tail) {
  if (a == NULL || tail < 0)
    return DT_ERROR(DT_ERR_INVALID_ARG, "padding a parameter arena: arena NULL or tail %lld < 0",
                    (long long)tail);
  if (tail <= a->tail)
    return DT_OK;
  dt_tensor *data_padded = NULL, *data = NULL, *grads_padded = NULL, *grads = NULL;
  dt_status st = alloc_flat(a->device, a->numel, tail, 0, &data_padded, &data);
  if (st == DT_OK)
    st = dt_tensor_copy_(data, a->data);
  if (st == DT_OK && a->grads != NULL)
    st = alloc_flat(a->device, a->numel, tail, 1, &grads_padded, &grads);
  if (st == DT_OK && a->grads != NULL)
    st = dt_tensor_copy_(grads, a->grads); /* gradients accumulated so far are kept */
  if (st != DT_OK) {
    dt_tensor_release(grads);
    dt_tensor_release(grads_padded);
    dt_tensor_release(data);
    dt_tensor_release(data_padded);
    return dt_error_wrap(st, "padding the parameter arena with %lld elements", (long long)tail);
  }
  dt_tensor *old[4] = {a->data, a->data_padded, a->grads, a->grads_padded};
  a->data = data;
  a->data_padded = data_padded;
  a->grads = grads;
  a->grads_padded = grads_padded;
  a->tail = tail;
  for (int i = 0; i < a->n && st == DT_OK; i++)
    st = point_param(a, i); /* cannot fail: same shapes, fresh contiguous buffers */
  for (int i = 0; i < 4; i++)
    dt_tensor_release(old[i]);
  return st;
}

dt_status dt_param_arena_move_grads(dt_param_arena *a, dt_tensor *flat) {
  if (a == NULL || flat == NULL)
    return DT_ERROR(DT_ERR_INVALID_ARG, "moving the arena's gradients: arena or buffer is NULL");
  if (a->grads == NULL)
    return DT_ERROR(DT_ERR_STATE, "moving the arena's gradients: they were dropped (ZeRO stage 2)");
  char want[32], got[32];
  int64_t n = a->numel + a->tail;
  if (dt_tensor_dtype(flat) != DT_DTYPE_F32 || dt_tensor_ndim(flat) != 1 ||
      dt_tensor_numel(flat) != n || !dt_tensor_is_contiguous(flat) ||
      !dt_device_equal(dt_tensor_device(flat), a->device))
    return DT_ERROR(DT_ERR_INVALID_ARG,
                    "moving the arena's gradients into a %s tensor of %lld elements on %s: "
                    "expected a contiguous flat f32 tensor of %lld elements on %s",
                    dt_dtype_name(dt_tensor_dtype(flat)), (long long)dt_tensor_numel(flat),
                    dt_device_format(dt_tensor_device(flat), got, sizeof got), (long long)n,
                    dt_device_format(a->device, want, sizeof want));
  dt_tensor *grads = NULL;
  int64_t numel = a->numel;
  dt_status st = dt_tensor_view_flat(flat, 0, &numel, 1, &grads);
  if (st == DT_OK)
    st = dt_tensor_copy_(flat, a->grads_padded); /* the tail too: zero, or what was written */
  if (st != DT_OK) {
    dt_tensor_release(grads);
    return dt_error_wrap(st, "moving the arena's gradients");
  }
  dt_tensor *old[2] = {a->grads, a->grads_padded};
  a->grads = grads;
  a->grads_padded = dt_tensor_retain(flat);
  for (int i = 0; i < a->n && st == DT_OK; i++)
    st = point_param(a, i); /* cannot fail: same shapes, a contiguous buffer */
  for (int i = 0; i < 2; i++)
    dt_tensor_release(old[i]);
  return st;
}

dt_status dt_param_arena_drop_grads(dt_param_arena *a) {
  if (a == NULL)
    return DT_ERROR(DT_ERR_INVALID_ARG, "dropping arena gradients: arena is NULL");
  for (int i = 0; i < a->n; i++)
    DT_CHECK(dt_tensor_set_grad(a->params[i], NULL));
  dt_tensor_release(a->grads);
  dt_tensor_release(a->grads_padded);
  a->grads = a->grads_padded = NULL;
  return DT_OK;
}
