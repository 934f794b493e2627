/* CPU convolution on 16-bit storage (ex->dtype f16/bf16): the f32 kernels
 * of cpu_kernels_conv.c on widened copies, each 16-bit result rounded
 * once; bias and db stay f32. */
#include <stdlib.h>

#include "core/cpu_conv_table.h"
#include "core/cpu_internal.h"
#include "core/half.h"

/* ---- 16-bit storage (ex->dtype f16/bf16): the f32 kernels on widened
 * copies, each 16-bit result rounded once; bias and db stay f32 ---- */

static int64_t conv_numel_x(const dt_conv2d_geom *g) { return (int64_t)g->n * g->c * g->h * g->w; }
static int64_t conv_numel_w(const dt_conv2d_geom *g) {
  return (int64_t)g->oc * g->c * g->kh * g->kw;
}
static int64_t conv_numel_y(const dt_conv2d_geom *g) {
  return (int64_t)g->n * g->oc * g->oh * g->ow;
}

/* *out = a new f32 buffer of n elements (NULL when `want` is NULL), the
 * widened 16-bit `src` when src is not NULL. */
static dt_status half_f32_buffer(dt_dtype dtype, const void *want, const void *src, int64_t n,
                                 float **out) {
  *out = NULL;
  if (!want)
    return DT_OK;
  *out = malloc((size_t)(n > 0 ? n : 1) * sizeof(float));
  if (!*out)
    return DT_ERROR(DT_ERR_OOM, "conv2d: an f32 copy of %lld %s elements: malloc failed",
                    (long long)n, dt_dtype_name(dtype));
  return src ? dt_half_to_f32(dtype, (const uint16_t *)src, *out, n) : DT_OK;
}

dt_status dt_cpu_conv2d_half_forward(const dt_exec *ex, const dt_conv2d_geom *g, const void *x,
                                     const void *w, const float *bias, void *y, void *workspace) {
  dt_exec ex32 = *ex;
  ex32.dtype = DT_DTYPE_F32;
  float *x32 = NULL, *w32 = NULL, *y32 = NULL;
  dt_status st;
  DT_CHECK_GOTO(half_f32_buffer(ex->dtype, x, x, conv_numel_x(g), &x32), st, done);
  DT_CHECK_GOTO(half_f32_buffer(ex->dtype, w, w, conv_numel_w(g), &w32), st, done);
  DT_CHECK_GOTO(half_f32_buffer(ex->dtype, y, NULL, conv_numel_y(g), &y32), st, done);
  DT_CHECK_GOTO(dt_cpu_conv2d_forward(&ex32, g, x32, w32, bias, y32, workspace), st, done);
  st = dt_half_from_f32(ex->dtype, y32, (uint16_t *)y, conv_numel_y(g));
done:
  free(y32);
  free(w32);
  free(x32);
  return st;
}

dt_status dt_cpu_conv2d_half_backward(const dt_exec *ex, const dt_conv2d_geom *g, const void *x,
                                      const void *w, const void *dy, void *dx, void *dw, float *db,
                                      void *workspace) {
  dt_exec ex32 = *ex;
  ex32.dtype = DT_DTYPE_F32;
  float *x32 = NULL, *w32 = NULL, *dy32 = NULL, *dx32 = NULL, *dw32 = NULL;
  dt_status st;
  DT_CHECK_GOTO(half_f32_buffer(ex->dtype, x, x, conv_numel_x(g), &x32), st, done);
  DT_CHECK_GOTO(half_f32_buffer(ex->dtype, w, w, conv_numel_w(g), &w32), st, done);
  DT_CHECK_GOTO(half_f32_buffer(ex->dtype, dy, dy, conv_numel_y(g), &dy32), st, done);
  DT_CHECK_GOTO(half_f32_buffer(ex->dtype, dx, NULL, conv_numel_x(g), &dx32), st, done);
  DT_CHECK_GOTO(half_f32_buffer(ex->dtype, dw, NULL, conv_numel_w(g), &dw32), st, done);
  DT_CHECK_GOTO(dt_cpu_conv2d_backward(&ex32, g, x32, w32, dy32, dx32, dw32, db, workspace), st,
                done);
  if (dx)
    DT_CHECK_GOTO(dt_half_from_f32(ex->dtype, dx32, (uint16_t *)dx, conv_numel_x(g)), st, done);
  if (dw)
    DT_CHECK_GOTO(dt_half_from_f32(ex->dtype, dw32, (uint16_t *)dw, conv_numel_w(g)), st, done);
  st = DT_OK;
done:
  free(dw32);
  free(dx32);
  free(dy32);
  free(w32);
  free(x32);
  return st;
}
