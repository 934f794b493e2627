/* Channels-last (g->nhwc) convolution and pooling on the CPU: the NCHW
 * kernels on transposed copies of the activations, each result transposed
 * back. The values are the NCHW kernels' bit for bit (a transpose moves
 * elements and rounds nothing), so this is the reference the CUDA
 * backend's channels-last path (cuDNN's NHWC convolutions) is checked
 * against. It costs two transposes a call: channels-last is a GPU layout,
 * the CPU's own kernels are NCHW (docs/decisions.md, "Channels-last"). */
#include <stdlib.h>

#include "core/cpu_internal.h"

/* Per image, the (rows, cols) matrix src into its transpose dst (cols,
 * rows), es-byte elements: the strided copy's kernel. */
static dt_status transpose(const dt_exec *ex, const void *src, void *dst, int64_t n, int64_t rows,
                           int64_t cols, size_t es) {
  const int64_t shape[3] = {n, cols, rows};
  const int64_t dst_strides[3] = {rows * cols, rows, 1}, src_strides[3] = {rows * cols, 1, cols};
  return dt_cpu_copy_strided(ex, dst, dst_strides, src, src_strides, shape, 3, es);
}

/* A channels-last call: the NCHW twin of its geometry, the element size,
 * the input and output plane sizes. */
typedef struct nhwc_call {
  dt_conv2d_geom c;
  size_t es;
  int64_t hw, ohw;
} nhwc_call;

static nhwc_call call_of(const dt_exec *ex, const dt_conv2d_geom *g) {
  nhwc_call k = {*g, dt_dtype_size(ex->dtype), (int64_t)g->h * g->w, (int64_t)g->oh * g->ow};
  k.c.nhwc = 0;
  return k;
}

/* A buffer of n * hw * c es-byte elements (NULL when `want` is NULL);
 * with `from`, the per-image transpose of channels-last `from` (hw, c)
 * into (c, hw). */
static dt_status scratch(const dt_exec *ex, const char *op, const void *want, const void *from,
                         int64_t n, int64_t hw, int64_t c, size_t es, void **out) {
  *out = NULL;
  if (!want)
    return DT_OK;
  size_t bytes = (size_t)(n * hw * c) * es;
  *out = malloc(bytes ? bytes : 1);
  if (!*out)
    return DT_ERROR(DT_ERR_OOM,
                    "%s (channels-last): a %zu-byte NCHW copy: malloc failed: reduce the batch "
                    "or image size",
                    op, bytes);
  return from ? transpose(ex, from, *out, n, hw, c, es) : DT_OK;
}

static void free_all(void **p, int n) {
  for (int i = 0; i < n; i++)
    free(p[i]);
}

dt_status dt_cpu_conv2d_nhwc_forward(const dt_exec *ex, const dt_conv2d_geom *g, const float *x,
                                     const float *w, const float *bias, float *y, void *workspace) {
  const nhwc_call k = call_of(ex, g);
  void *b[2] = {NULL, NULL}; /* x, y in NCHW */
  dt_status st;
  DT_CHECK_GOTO(scratch(ex, "conv2d_forward", x, x, g->n, k.hw, g->c, k.es, &b[0]), st, done);
  DT_CHECK_GOTO(scratch(ex, "conv2d_forward", y, NULL, g->n, k.ohw, g->oc, k.es, &b[1]), st, done);
  DT_CHECK_GOTO(dt_cpu_conv2d_forward(ex, &k.c, b[0], w, bias, b[1], workspace), st, done);
  st = transpose(ex, b[1], y, g->n, g->oc, k.ohw, k.es);
done:
  free_all(b, 2);
  return st;
}

dt_status dt_cpu_conv2d_nhwc_backward(const dt_exec *ex, const dt_conv2d_geom *g, const float *x,
                                      const float *w, const float *dy, float *dx, float *dw,
                                      float *db, void *workspace, int accumulate) {
  const nhwc_call k = call_of(ex, g);
  void *b[3] = {NULL, NULL, NULL}; /* x, dy, dx in NCHW */
  dt_status st;
  /* x is read for dw only */
  DT_CHECK_GOTO(scratch(ex, "conv2d_backward", dw ? x : NULL, x, g->n, k.hw, g->c, k.es, &b[0]), st,
                done);
  DT_CHECK_GOTO(scratch(ex, "conv2d_backward", dy, dy, g->n, k.ohw, g->oc, k.es, &b[1]), st, done);
  DT_CHECK_GOTO(scratch(ex, "conv2d_backward", dx, NULL, g->n, k.hw, g->c, k.es, &b[2]), st, done);
  DT_CHECK_GOTO((accumulate ? dt_cpu_conv2d_backward_acc : dt_cpu_conv2d_backward)(
                    ex, &k.c, b[0], w, b[1], b[2], dw, db, workspace),
                st, done);
  if (dx)
    st = transpose(ex, b[2], dx, g->n, g->c, k.hw, k.es);
done:
  free_all(b, 3);
  return st;
}

dt_status dt_cpu_pool2d_nhwc_forward(const dt_exec *ex, const dt_conv2d_geom *g, const float *x,
                                     float *y, int32_t *argmax) {
  const nhwc_call k = call_of(ex, g);
  void *b[3] = {NULL, NULL, NULL}; /* x, y, argmax in NCHW */
  dt_status st;
  DT_CHECK_GOTO(scratch(ex, "pool2d_forward", x, x, g->n, k.hw, g->c, k.es, &b[0]), st, done);
  DT_CHECK_GOTO(scratch(ex, "pool2d_forward", y, NULL, g->n, k.ohw, g->c, k.es, &b[1]), st, done);
  DT_CHECK_GOTO(scratch(ex, "pool2d_forward", argmax, NULL, g->n, k.ohw, g->c, 4, &b[2]), st, done);
  if (argmax)
    DT_CHECK_GOTO(dt_cpu_max_pool2d_forward(ex, &k.c, b[0], b[1], b[2]), st, done);
  else
    DT_CHECK_GOTO(dt_cpu_avg_pool2d_forward(ex, &k.c, b[0], b[1]), st, done);
  DT_CHECK_GOTO(transpose(ex, b[1], y, g->n, g->c, k.ohw, k.es), st, done);
  if (argmax)
    st = transpose(ex, b[2], argmax, g->n, g->c, k.ohw, 4);
done:
  free_all(b, 3);
  return st;
}

dt_status dt_cpu_pool2d_nhwc_backward(const dt_exec *ex, const dt_conv2d_geom *g, const float *dy,
                                      const int32_t *argmax, float *dx) {
  const nhwc_call k = call_of(ex, g);
  void *b[3] = {NULL, NULL, NULL}; /* dy, argmax, dx in NCHW */
  dt_status st;
  DT_CHECK_GOTO(scratch(ex, "pool2d_backward", dy, dy, g->n, k.ohw, g->c, k.es, &b[0]), st, done);
  DT_CHECK_GOTO(scratch(ex, "pool2d_backward", argmax, argmax, g->n, k.ohw, g->c, 4, &b[1]), st,
                done);
  DT_CHECK_GOTO(scratch(ex, "pool2d_backward", dx, NULL, g->n, k.hw, g->c, k.es, &b[2]), st, done);
  if (argmax)
    DT_CHECK_GOTO(dt_cpu_max_pool2d_backward(ex, &k.c, b[0], b[1], b[2]), st, done);
  else
    DT_CHECK_GOTO(dt_cpu_avg_pool2d_backward(ex, &k.c, b[0], b[2]), st, done);
  st = transpose(ex, b[2], dx, g->n, g->c, k.hw, k.es);
done:
  free_all(b, 3);
  return st;
}
