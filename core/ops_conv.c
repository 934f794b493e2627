/* Convolution and pooling, NCHW or channels-last (NHWC). */
#include <limits.h>
#include <string.h>

#include "core/ops_internal.h"

/* Geometry of a conv / pool: fills g (oc = 0 for pooling) and checks that
 * the output is non-empty and the sizes fit the kernels' int fields. */
static dt_status make_geom(const char *op, const dt_tensor *x, int nhwc, int oc, int kh, int kw,
                           int stride, int padding, dt_conv2d_geom *g) {
  char bx[128];
  const int64_t *s = dt_tensor_shape(x);
  if (dt_tensor_ndim(x) != 4)
    return DT_ERROR(DT_ERR_SHAPE, "%s: input %s is not 4-D: expected (N, %s)", op,
                    dt_shape_format(s, dt_tensor_ndim(x), bx, sizeof bx),
                    nhwc ? "H, W, C" : "C, H, W");
  if (stride < 1 || padding < 0 || kh < 1 || kw < 1)
    return DT_ERROR(DT_ERR_INVALID_ARG,
                    "%s: kernel %dx%d, stride %d, padding %d: kernel and stride must be >= 1, "
                    "padding >= 0",
                    op, kh, kw, stride, padding);
  for (int i = 0; i < 4; ++i)
    if (s[i] > INT_MAX)
      return DT_ERROR(DT_ERR_UNSUPPORTED, "%s: input %s: dims above 2^31 are not supported", op,
                      dt_shape_format(s, 4, bx, sizeof bx));
  memset(g, 0, sizeof *g);
  g->n = (int)s[0];
  g->c = (int)s[nhwc ? 3 : 1];
  g->h = (int)s[nhwc ? 1 : 2];
  g->w = (int)s[nhwc ? 2 : 3];
  g->nhwc = nhwc;
  g->oc = oc;
  g->kh = kh;
  g->kw = kw;
  g->sh = g->sw = stride;
  g->ph = g->pw = padding;
  int64_t hp = (int64_t)g->h + 2 * padding, wp = (int64_t)g->w + 2 * padding;
  if (hp < kh || wp < kw)
    return DT_ERROR(DT_ERR_SHAPE,
                    "%s: input %s with padding %d is smaller than the %dx%d kernel: use a "
                    "smaller kernel or more padding",
                    op, dt_shape_format(s, 4, bx, sizeof bx), padding, kh, kw);
  g->oh = (int)((hp - kh) / stride + 1);
  g->ow = (int)((wp - kw) / stride + 1);
  return DT_OK;
}

/* A temporary u8 buffer for the workspace of the conv kernels of `dtype`
 * (NULL when 0). */
static dt_status alloc_workspace(dt_device dev, dt_dtype dtype, const dt_conv2d_geom *g,
                                 dt_tensor **ws) {
  dt_exec ex;
  DT_CHECK(dt_exec_init(dev, dtype, &ex));
  size_t bytes = 0;
  *ws = NULL;
  DT_CHECK(dt_kernel_conv2d_workspace(&ex, g, &bytes));
  if (bytes == 0)
    return DT_OK;
  int64_t n = (int64_t)bytes;
  return dt_tensor_empty(&n, 1, DT_DTYPE_U8, dev, ws);
}

/* ---- conv2d ---- */

/* saved: 0 x, 1 weight (contiguous, of the dtype the forward computed in:
 * 16-bit under autocast). Inputs x, w[, bias]. The kernels take that
 * dtype: dx and dw come back in it (the engine widens them for f32
 * inputs), db is f32. */
typedef struct conv2d_saved {
  dt_conv2d_geom g;
} conv2d_saved;

static dt_status conv2d_backward(dt_node *node, dt_tensor *gy, dt_tensor **grad_in) {
  dt_tensor *x = node->saved[0], *w = node->saved[1];
  int has_bias = node->n_inputs == 3;
  dt_conv2d_geom g = DT_NODE_PARAMS(node, conv2d_saved)->g;
  dt_device dev = dt_tensor_device(gy);
  const dt_dtype dtype = dt_tensor_dtype(x);
  dt_tensor *dx = NULL, *dw = NULL, *db = NULL, *ws = NULL, *gc = NULL;
  dt_status st;
  DT_CHECK_GOTO(dt_ops_cast(gy, dtype, &gc), st, fail);
  if (node->needs_grad[0])
    DT_CHECK_GOTO(dt_tensor_empty(dt_tensor_shape(x), 4, dtype, dev, &dx), st, fail);
  /* dw straight into the weight's .grad where the engine offers it (f32,
   * on the CPU, whose kernel adds into it: docs/decisions.md, "Weight
   * gradients go straight into the gradient arena") */
  float *dw_dest = NULL;
  if (node->needs_grad[1] && dtype == DT_DTYPE_F32 && dev.type == DT_DEVICE_CPU)
    dw_dest = dt_node_grad_dest(node, 1);
  if (node->needs_grad[1] && !dw_dest)
    DT_CHECK_GOTO(dt_tensor_empty(dt_tensor_shape(w), 4, dtype, dev, &dw), st, fail);
  if (has_bias && node->needs_grad[2]) {
    int64_t oc = g.oc;
    DT_CHECK_GOTO(dt_tensor_empty(&oc, 1, DT_DTYPE_F32, dev, &db), st, fail);
  }
  DT_CHECK_GOTO(alloc_workspace(dev, dtype, &g, &ws), st, fail);
  DT_CHECK_GOTO((dw_dest ? dt_kernel_conv2d_backward_acc : dt_kernel_conv2d_backward)(
                    DT_TENSOR_EXEC(gc), &g, dt_tensor_data(x), dt_tensor_data(w),
                    dt_tensor_data(gc), dx ? dt_tensor_data(dx) : NULL,
                    dw_dest ? dw_dest
                    : dw    ? dt_tensor_data(dw)
                            : NULL,
                    db ? DT_F32(db) : NULL, ws ? dt_tensor_data(ws) : NULL),
                st, fail);
  st = DT_OK;
fail:
  DT_RELEASE_TENSORS(gc, ws);
  return dt_ops_grads_result(st, (dt_tensor *[]){dx, dw, db}, has_bias ? 3 : 2, grad_in);
}

/* The activations' shape (N, C, H, W), or (N, H, W, C) channels-last. */
static void activation_shape(int nhwc, int64_t n, int64_t c, int64_t h, int64_t w, int64_t *s) {
  s[0] = n;
  s[nhwc ? 3 : 1] = c;
  s[nhwc ? 1 : 2] = h;
  s[nhwc ? 2 : 3] = w;
}

static dt_status conv2d(const char *op, int nhwc, dt_tensor *x, dt_tensor *weight, dt_tensor *bias,
                        int stride, int padding, dt_tensor **out) {
  if (!x || !weight || !out)
    return DT_ERROR(DT_ERR_INVALID_ARG, "%s: NULL argument (x and weight are required)", op);
  dt_tensor *ins[3] = {x, weight, bias};
  DT_CHECK(dt_ops_check_float_inputs(op, ins, 3));
  const int64_t *sw = dt_tensor_shape(weight);
  char bx[128], bw[128], bb[128];
  if (dt_tensor_ndim(weight) != 4 || dt_tensor_ndim(x) != 4 ||
      sw[1] != dt_tensor_shape(x)[nhwc ? 3 : 1] || sw[0] > INT_MAX || sw[2] > INT_MAX ||
      sw[3] > INT_MAX)
    return DT_ERROR(DT_ERR_SHAPE,
                    "%s: input %s and weight %s do not match: expected x (N, %s) and "
                    "weight (OC, C, KH, KW)",
                    op, dt_shape_format(dt_tensor_shape(x), dt_tensor_ndim(x), bx, sizeof bx),
                    dt_shape_format(sw, dt_tensor_ndim(weight), bw, sizeof bw),
                    nhwc ? "H, W, C" : "C, H, W");
  if (bias && (dt_tensor_ndim(bias) != 1 || dt_tensor_shape(bias)[0] != sw[0]))
    return DT_ERROR(DT_ERR_SHAPE, "%s: bias %s does not match weight %s: expected bias (%lld)", op,
                    dt_shape_format(dt_tensor_shape(bias), dt_tensor_ndim(bias), bb, sizeof bb),
                    dt_shape_format(sw, 4, bw, sizeof bw), (long long)sw[0]);
  dt_conv2d_geom g;
  DT_CHECK(make_geom(op, x, nhwc, (int)sw[0], (int)sw[2], (int)sw[3], stride, padding, &g));

  dt_device dev = dt_tensor_device(x);
  dt_tensor *xc = NULL, *wc = NULL, *bc = NULL, *y = NULL, *ws = NULL;
  dt_node *node = NULL;
  dt_status st;
  int64_t oshape[4];
  activation_shape(nhwc, g.n, g.oc, g.oh, g.ow, oshape);
  /* under autocast xc, wc are 16-bit (kept for the backward) and the
   * kernels take them as they are: f32 accumulation, a 16-bit result */
  DT_CHECK_GOTO(dt_ops_autocast_input(op, x, &xc), st, fail);
  DT_CHECK_GOTO(dt_ops_autocast_input(op, weight, &wc), st, fail);
  const dt_dtype dtype = dt_tensor_dtype(xc);
  if (bias) /* f32 for every dtype */
    DT_CHECK_GOTO(dt_ops_widen(bias, &bc), st, fail);
  DT_CHECK_GOTO(dt_tensor_empty(oshape, 4, dtype, dev, &y), st, fail);
  DT_CHECK_GOTO(alloc_workspace(dev, dtype, &g, &ws), st, fail);
  /* x (n,c,h,w), w (oc,c,kh,kw), bias (oc) -> y (n,oc,oh,ow); channels-last
   * x (n,h,w,c) -> y (n,oh,ow,oc) */
  DT_CHECK_GOTO(dt_kernel_conv2d_forward(DT_TENSOR_EXEC(xc), &g, dt_tensor_data(xc),
                                         dt_tensor_data(wc), bc ? DT_F32(bc) : NULL,
                                         dt_tensor_data(y), ws ? dt_tensor_data(ws) : NULL),
                st, fail);
  DT_CHECK_GOTO(dt_ops_maybe_record(op, conv2d_backward, ins, 3, y, &node), st, fail);
  if (node) {
    dt_node_save(node, 0, xc);
    dt_node_save(node, 1, wc);
    *DT_NODE_PARAMS_INIT(node, conv2d_saved) = (conv2d_saved){g};
  }
  st = dt_ops_take(&y, out);
fail:
  DT_RELEASE_TENSORS(ws, y, bc, wc, xc);
  return st;
}

dt_status dt_op_conv2d(dt_tensor *x, dt_tensor *weight, dt_tensor *bias, int stride, int padding,
                       dt_tensor **out) {
  return conv2d("dt_op_conv2d", 0, x, weight, bias, stride, padding, out);
}

dt_status dt_op_conv2d_nhwc(dt_tensor *x, dt_tensor *weight, dt_tensor *bias, int stride,
                            int padding, dt_tensor **out) {
  return conv2d("dt_op_conv2d_nhwc", 1, x, weight, bias, stride, padding, out);
}

/* ---- pooling ---- */

/* saved: 0 argmax (i32, max pooling only) */
typedef struct pool2d_saved {
  dt_conv2d_geom g;
  bool is_max;
} pool2d_saved;

static dt_status pool_backward(dt_node *node, dt_tensor *gy, dt_tensor **grad_in) {
  const pool2d_saved *s = DT_NODE_PARAMS(node, pool2d_saved);
  dt_conv2d_geom g = s->g;
  dt_device dev = dt_tensor_device(gy);
  const dt_exec ex = dt_tensor_exec(gy);
  dt_tensor *dx = NULL;
  dt_status st;
  int64_t xshape[4];
  activation_shape(g.nhwc, g.n, g.c, g.h, g.w, xshape);
  /* dx in gy's dtype (y's, which is x's): the kernel rounds it once */
  DT_CHECK(dt_tensor_empty(xshape, 4, dt_tensor_dtype(gy), dev, &dx));
  if (dt_tensor_numel(dx) > 0) {
    if (s->is_max)
      DT_CHECK_GOTO(
          dt_kernel_max_pool2d_backward(
              &ex, &g, DT_F32(gy), (const int32_t *)dt_tensor_data(node->saved[0]), DT_F32(dx)),
          st, fail);
    else
      DT_CHECK_GOTO(dt_kernel_avg_pool2d_backward(&ex, &g, DT_F32(gy), DT_F32(dx)), st, fail);
  }
  grad_in[0] = dx;
  return DT_OK;
fail:
  dt_tensor_release(dx);
  return st;
}

static dt_status pool2d(const char *op, int is_max, int nhwc, dt_tensor *x, int kernel, int stride,
                        int padding, dt_tensor **out) {
  /* A 16-bit x goes to the kernels as it is: they pool in f32 and round y
   * (and the backward's dx) once, so no widened copy of x exists. */
  DT_CHECK(dt_ops_check_float_unary(op, x, out));
  dt_conv2d_geom g;
  DT_CHECK(make_geom(op, x, nhwc, 0, kernel, kernel, stride, padding, &g));
  if (2 * padding > kernel)
    return DT_ERROR(DT_ERR_INVALID_ARG,
                    "%s: padding %d is more than half the kernel %d: windows would lie wholly "
                    "in the padding (PyTorch rejects this too)",
                    op, padding, kernel);
  dt_device dev = dt_tensor_device(x);
  const dt_exec ex = dt_tensor_exec(x);
  dt_tensor *xc = NULL, *y = NULL, *argmax = NULL;
  dt_node *node = NULL;
  dt_status st;
  int64_t oshape[4];
  activation_shape(nhwc, g.n, g.c, g.oh, g.ow, oshape);
  DT_CHECK_GOTO(dt_ops_contiguous(x, &xc), st, fail);
  DT_CHECK_GOTO(dt_tensor_empty(oshape, 4, dt_tensor_dtype(x), dev, &y), st, fail);
  /* x (n,c,h,w) -> y (n,c,oh,ow) [, argmax (n,c,oh,ow) flat index in h*w];
   * channels-last: x (n,h,w,c) -> y and argmax (n,oh,ow,c) */
  if (is_max) {
    DT_CHECK_GOTO(dt_tensor_empty(oshape, 4, DT_DTYPE_I32, dev, &argmax), st, fail);
    if (dt_tensor_numel(y) > 0)
      DT_CHECK_GOTO(dt_kernel_max_pool2d_forward(&ex, &g, DT_F32(xc), DT_F32(y),
                                                 (int32_t *)dt_tensor_data(argmax)),
                    st, fail);
  } else if (dt_tensor_numel(y) > 0) {
    DT_CHECK_GOTO(dt_kernel_avg_pool2d_forward(&ex, &g, DT_F32(xc), DT_F32(y)), st, fail);
  }
  DT_CHECK_GOTO(dt_ops_maybe_record(op, pool_backward, &x, 1, y, &node), st, fail);
  if (node) {
    *DT_NODE_PARAMS_INIT(node, pool2d_saved) = (pool2d_saved){g, is_max};
    if (is_max)
      dt_node_save(node, 0, argmax);
  }
  st = dt_ops_take(&y, out);
fail:
  DT_RELEASE_TENSORS(argmax, y, xc);
  return st;
}

dt_status dt_op_max_pool2d(dt_tensor *x, int kernel, int stride, int padding, dt_tensor **out) {
  return pool2d("dt_op_max_pool2d", 1, 0, x, kernel, stride, padding, out);
}

dt_status dt_op_avg_pool2d(dt_tensor *x, int kernel, int stride, int padding, dt_tensor **out) {
  return pool2d("dt_op_avg_pool2d", 0, 0, x, kernel, stride, padding, out);
}

dt_status dt_op_max_pool2d_nhwc(dt_tensor *x, int kernel, int stride, int padding,
                                dt_tensor **out) {
  return pool2d("dt_op_max_pool2d_nhwc", 1, 1, x, kernel, stride, padding, out);
}

dt_status dt_op_avg_pool2d_nhwc(dt_tensor *x, int kernel, int stride, int padding,
                                dt_tensor **out) {
  return pool2d("dt_op_avg_pool2d_nhwc", 0, 1, x, kernel, stride, padding, out);
}
