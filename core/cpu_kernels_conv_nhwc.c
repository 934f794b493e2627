/* Channels-last (g->nhwc) convolution and pooling on the CPU: the NCHW
 * kernels on transposed copies of the activations, each result transposed
 * back. The values are the NCHW kernels' bit for bit (a transpose moves
 * elements and rounds nothing), so this is the reference the CUDA
 * backend's channels-last path (cuDNN's NHWC convolutions) is checked
 * against. It costs two transposes a call: channels-last is a GPU layout,
 * the CPU's own kernels are NCHW (docs/decisions.md, "Channels-last"). */
#include <stdlib.h>
#include <string.h>

#include "core/cpu_internal.h"

#define TILE 32

/* Per image, the (rows, cols) matrix src into its transpose dst (cols,
 * rows), in tiles of TILE x TILE; an element is k 16-bit words (k a
 * constant at each call, so each call is specialised). */
static inline __attribute__((always_inline)) void transpose_k(const uint16_t *src, uint16_t *dst,
                                                              int64_t n, int64_t rows, int64_t cols,
                                                              const int k) {
  const int64_t row_tiles = (rows + TILE - 1) / TILE;
#pragma omp parallel for if (n * rows * cols >= DT_CPU_PAR_MIN) num_threads(dt_cpu_threads()) \
    schedule(static)
  for (int64_t t = 0; t < n * row_tiles; t++) {
    const int64_t i = t / row_tiles, r0 = (t % row_tiles) * TILE;
    const int64_t r1 = r0 + TILE < rows ? r0 + TILE : rows;
    const uint16_t *si = src + i * rows * cols * k;
    uint16_t *di = dst + i * rows * cols * k;
    for (int64_t c0 = 0; c0 < cols; c0 += TILE) {
      const int64_t c1 = c0 + TILE < cols ? c0 + TILE : cols;
      for (int64_t c = c0; c < c1; c++)
        for (int64_t r = r0; r < r1; r++)
          for (int j = 0; j < k; j++)
            di[(c * rows + r) * k + j] = si[(r * cols + c) * k + j];
    }
  }
}

static void transpose(const void *src, void *dst, int64_t n, int64_t rows, int64_t cols,
                      size_t es) {
  if (es == 2)
    transpose_k(src, dst, n, rows, cols, 1);
  else
    transpose_k(src, dst, n, rows, cols, 2);
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

/* A buffer of `elems` es-byte elements (NULL when `want` is NULL); with
 * `from`, the per-image transpose of channels-last `from` (hw, c) into
 * (c, hw). */
static dt_status scratch(const char *op, const void *want, const void *from, int64_t n, int64_t hw,
                         int64_t c, size_t es, void **out) {
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
  if (from)
    transpose(from, *out, n, hw, c, es);
  return DT_OK;
}

static void free_all(void **p, int n) {
  for (int i = 0; i < n; i++)
    free(p[i]);
}

dt_status dt_cpu_conv2d_nhwc_forward(const dt_exec *ex, const dt_conv2d_geom *g, const float *x,
                                     const float *w, const float *bias, float *y, void *workspace) {
  const nhwc_call k = call_of(ex, g);
  const size_t es = k.es;
  const int64_t hw = k.hw, ohw = k.ohw;
  void *b[2] = {NULL, NULL}; /* x, y in NCHW */
  dt_status st;
  DT_CHECK_GOTO(scratch("conv2d_forward", x, x, g->n, hw, g->c, es, &b[0]), st, done);
  DT_CHECK_GOTO(scratch("conv2d_forward", y, NULL, g->n, ohw, g->oc, es, &b[1]), st, done);
  DT_CHECK_GOTO(dt_cpu_conv2d_forward(ex, &k.c, b[0], w, bias, b[1], workspace), st, done);
  transpose(b[1], y, g->n, g->oc, ohw, es);
done:
  free_all(b, 2);
  return st;
}

dt_status dt_cpu_conv2d_nhwc_backward(const dt_exec *ex, const dt_conv2d_geom *g, const float *x,
                                      const float *w, const float *dy, float *dx, float *dw,
                                      float *db, void *workspace, int accumulate) {
  const nhwc_call k = call_of(ex, g);
  const size_t es = k.es;
  const int64_t hw = k.hw, ohw = k.ohw;
  void *b[3] = {NULL, NULL, NULL}; /* x, dy, dx in NCHW */
  dt_status st;
  /* x is read for dw only */
  DT_CHECK_GOTO(scratch("conv2d_backward", dw ? x : NULL, x, g->n, hw, g->c, es, &b[0]), st, done);
  DT_CHECK_GOTO(scratch("conv2d_backward", dy, dy, g->n, ohw, g->oc, es, &b[1]), st, done);
  DT_CHECK_GOTO(scratch("conv2d_backward", dx, NULL, g->n, hw, g->c, es, &b[2]), st, done);
  DT_CHECK_GOTO((accumulate ? dt_cpu_conv2d_backward_acc : dt_cpu_conv2d_backward)(
                    ex, &k.c, b[0], w, b[1], b[2], dw, db, workspace),
                st, done);
  if (dx)
    transpose(b[2], dx, g->n, g->c, hw, es);
done:
  free_all(b, 3);
  return st;
}

dt_status dt_cpu_pool2d_nhwc_forward(const dt_exec *ex, const dt_conv2d_geom *g, const float *x,
                                     float *y, int32_t *argmax) {
  const nhwc_call k = call_of(ex, g);
  const size_t es = k.es;
  const int64_t hw = k.hw, ohw = k.ohw;
  void *b[3] = {NULL, NULL, NULL}; /* x, y, argmax in NCHW */
  dt_status st;
  DT_CHECK_GOTO(scratch("pool2d_forward", x, x, g->n, hw, g->c, es, &b[0]), st, done);
  DT_CHECK_GOTO(scratch("pool2d_forward", y, NULL, g->n, ohw, g->c, es, &b[1]), st, done);
  DT_CHECK_GOTO(scratch("pool2d_forward", argmax, NULL, g->n, ohw, g->c, 4, &b[2]), st, done);
  if (argmax)
    DT_CHECK_GOTO(dt_cpu_max_pool2d_forward(ex, &k.c, b[0], b[1], b[2]), st, done);
  else
    DT_CHECK_GOTO(dt_cpu_avg_pool2d_forward(ex, &k.c, b[0], b[1]), st, done);
  transpose(b[1], y, g->n, g->c, ohw, es);
  if (argmax)
    transpose(b[2], argmax, g->n, g->c, ohw, 4);
done:
  free_all(b, 3);
  return st;
}

dt_status dt_cpu_pool2d_nhwc_backward(const dt_exec *ex, const dt_conv2d_geom *g, const float *dy,
                                      const int32_t *argmax, float *dx) {
  const nhwc_call k = call_of(ex, g);
  const size_t es = k.es;
  const int64_t hw = k.hw, ohw = k.ohw;
  void *b[3] = {NULL, NULL, NULL}; /* dy, argmax, dx in NCHW */
  dt_status st;
  DT_CHECK_GOTO(scratch("pool2d_backward", dy, dy, g->n, ohw, g->c, es, &b[0]), st, done);
  DT_CHECK_GOTO(scratch("pool2d_backward", argmax, argmax, g->n, ohw, g->c, 4, &b[1]), st, done);
  DT_CHECK_GOTO(scratch("pool2d_backward", dx, NULL, g->n, hw, g->c, es, &b[2]), st, done);
  if (argmax)
    DT_CHECK_GOTO(dt_cpu_max_pool2d_backward(ex, &k.c, b[0], b[1], b[2]), st, done);
  else
    DT_CHECK_GOTO(dt_cpu_avg_pool2d_backward(ex, &k.c, b[0], b[2]), st, done);
  transpose(b[2], dx, g->n, g->c, hw, es);
done:
  free_all(b, 3);
  return st;
}
