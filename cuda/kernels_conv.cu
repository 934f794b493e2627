/* CUDA kernels of the conv family (core/ops_conv.c) beside cuDNN's
 * convolution (cuda/dnn.c): max and average pooling, and the bias of a
 * 16-bit convolution. Pooling backward gathers in the CPU's summation order
 * (core/cpu_kernels_conv_pool.c), so it matches bit for bit. */
#include <math.h>

#include "cuda/kernels_common.cuh"

/* ---- pooling ---- */

/* Output rows oy whose window [oy*s - p, oy*s - p + k) contains input iy. */
static __device__ __forceinline__ void covering(int iy, int s, int p, int k, int on, int *lo,
                                                int *hi) {
  int a = iy + p - k + 1; /* oy*s >= a */
  int l = a <= 0 ? 0 : (a + s - 1) / s;
  int h = (iy + p) / s; /* oy*s <= iy + p */
  *lo = l;
  *hi = h < on - 1 ? h : on - 1;
}

/* Input element t of a backward gather (in x's memory order): its position
 * in its (h, w) plane, the outputs [oy0, oy1] x [ox0, ox1] whose windows
 * contain it, and where its plane's outputs lie: dy (and argmax) of output
 * position o at gbase + o * gstep (NCHW: a plane of its own, step 1;
 * channels-last: the channel's column, step c). */
struct pool_gather {
  int64_t gbase, gstep;
  int pos, oy0, oy1, ox0, ox1;
};

static __device__ __forceinline__ pool_gather pool_gather_of(const dt_conv2d_geom &g, int64_t t) {
  pool_gather p;
  const int64_t hw = (int64_t)g.h * g.w, ohw = (int64_t)g.oh * g.ow;
  if (g.nhwc) {
    const int64_t r = t / g.c, c = t - r * g.c, n = r / hw;
    p.pos = (int)(r - n * hw);
    p.gbase = n * ohw * g.c + c;
    p.gstep = g.c;
  } else {
    const int64_t plane = t / hw;
    p.pos = (int)(t - plane * hw);
    p.gbase = plane * ohw;
    p.gstep = 1;
  }
  const int iy = p.pos / g.w, ix = p.pos - iy * g.w;
  covering(iy, g.sh, g.ph, g.kh, g.oh, &p.oy0, &p.oy1);
  covering(ix, g.sw, g.pw, g.kw, g.ow, &p.ox0, &p.ox1);
  return p;
}

/* Output t of a forward (in y's memory order): its position in the (oh,
 * ow) plane, and its input plane: x of input position i at *xbase + i *
 * *xstep. */
static __device__ __forceinline__ int pool_output_of(const dt_conv2d_geom &g, int64_t t,
                                                     int64_t *xbase, int64_t *xstep) {
  const int64_t hw = (int64_t)g.h * g.w, ohw = (int64_t)g.oh * g.ow;
  if (g.nhwc) {
    const int64_t r = t / g.c, c = t - r * g.c, n = r / ohw;
    *xbase = n * hw * g.c + c;
    *xstep = g.c;
    return (int)(r - n * ohw);
  }
  const int64_t plane = t / ohw;
  *xbase = plane * hw;
  *xstep = 1;
  return (int)(t - plane * ohw);
}

// x (n,c,h,w) -> y (n,c,oh,ow) of T, argmax (n,c,oh,ow) flat index into h*w or NULL;
// channels-last: x (n,h,w,c) -> y, argmax (n,oh,ow,c)
template <typename T>
static __global__ void max_pool_forward_kernel(dt_conv2d_geom g, const T *x, T *y, int32_t *argmax,
                                               int64_t total) {
  DT_GRID_STRIDE(t, total) {
    int64_t xbase, xs;
    const int rem = pool_output_of(g, t, &xbase, &xs), oy = rem / g.ow, ox = rem - oy * g.ow;
    int y0 = oy * g.sh - g.ph, y1 = min(y0 + g.kh, g.h);
    int x0 = ox * g.sw - g.pw, x1 = min(x0 + g.kw, g.w);
    y0 = max(y0, 0);
    x0 = max(x0, 0);
    float best = -INFINITY;
    int32_t at = y0 * g.w + x0;
    bool nan = false;
    for (int iy = y0; iy < y1 && !nan; iy++)
      for (int ix = x0; ix < x1; ix++) {
        float v = dt_load_f32(x, xbase + (iy * g.w + ix) * xs);
        if (v > best || v != v) { /* NaN wins, as PyTorch */
          best = v;
          at = iy * g.w + ix;
          if (v != v) {
            nan = true;
            break;
          }
        }
      }
    dt_store_f32(y, t, best); /* exact: best is one of the inputs */
    if (argmax)
      argmax[t] = at;
  }
}

// dy (n,c,oh,ow), argmax -> dx (n,c,h,w) of T: gathers in output order, as the CPU
// scatter, in f32, rounded once
template <typename T>
static __global__ void max_pool_backward_kernel(dt_conv2d_geom g, const T *dy,
                                                const int32_t *argmax, T *dx, int64_t total) {
  DT_GRID_STRIDE(t, total) {
    const pool_gather p = pool_gather_of(g, t);
    float s = 0.0f;
    for (int oy = p.oy0; oy <= p.oy1; oy++)
      for (int ox = p.ox0; ox <= p.ox1; ox++) {
        const int64_t o = p.gbase + (oy * g.ow + ox) * p.gstep;
        if (argmax[o] == p.pos)
          s += dt_load_f32(dy, o);
      }
    dt_store_f32(dx, t, s);
  }
}

/* Divisor of output (oy, ox): the window clipped to the padded input. */
static __device__ __forceinline__ float avg_divisor(const dt_conv2d_geom &g, int oy, int ox) {
  int y0 = oy * g.sh - g.ph, x0 = ox * g.sw - g.pw;
  int y1 = min(y0 + g.kh, g.h + g.ph), x1 = min(x0 + g.kw, g.w + g.pw);
  return (float)((y1 - y0) * (x1 - x0));
}

// x (n,c,h,w) -> y (n,c,oh,ow) of T, padding counted in the divisor; sums in f32
template <typename T>
static __global__ void avg_pool_forward_kernel(dt_conv2d_geom g, const T *x, T *y, int64_t total) {
  DT_GRID_STRIDE(t, total) {
    int64_t xbase, xs;
    const int rem = pool_output_of(g, t, &xbase, &xs), oy = rem / g.ow, ox = rem - oy * g.ow;
    int y0 = max(oy * g.sh - g.ph, 0), y1 = min(oy * g.sh - g.ph + g.kh, g.h);
    int x0 = max(ox * g.sw - g.pw, 0), x1 = min(ox * g.sw - g.pw + g.kw, g.w);
    float s = 0.0f;
    for (int iy = y0; iy < y1; iy++)
      for (int ix = x0; ix < x1; ix++)
        s += dt_load_f32(x, xbase + (iy * g.w + ix) * xs);
    dt_store_f32(y, t, s / avg_divisor(g, oy, ox));
  }
}

// dy (n,c,oh,ow) -> dx (n,c,h,w) of T: gathers in output order, as the CPU scatter
template <typename T>
static __global__ void avg_pool_backward_kernel(dt_conv2d_geom g, const T *dy, T *dx,
                                                int64_t total) {
  DT_GRID_STRIDE(t, total) {
    const pool_gather p = pool_gather_of(g, t);
    float s = 0.0f;
    for (int oy = p.oy0; oy <= p.oy1; oy++)
      for (int ox = p.ox0; ox <= p.ox1; ox++)
        s += dt_load_f32(dy, p.gbase + (oy * g.ow + ox) * p.gstep) / avg_divisor(g, oy, ox);
    dt_store_f32(dx, t, s);
  }
}

/* The host side of a pooling kernel: kernel<T> (T: ex->dtype's storage
 * type) over `total` elements, launched with (*g, args..., total), where
 * args may name T; nothing to do when total is 0. */
#define POOL_LAUNCH(ex, g, total, kernel, ...)                                                  \
  do {                                                                                          \
    const int64_t total_ = (total);                                                             \
    if (total_ == 0)                                                                            \
      return DT_OK;                                                                             \
    DT_CUDA_STORAGE_DISPATCH((ex)->dtype, T,                                                    \
                             dt_launch_flat(ex, total_, kernel<T>, *(g), __VA_ARGS__, total_)); \
  } while (0)

static int64_t pool_inputs(const dt_conv2d_geom *g) { return (int64_t)g->n * g->c * g->h * g->w; }
static int64_t pool_outputs(const dt_conv2d_geom *g) {
  return (int64_t)g->n * g->c * g->oh * g->ow;
}

extern "C" dt_status dt_cuda_max_pool2d_forward(const dt_exec *ex, const dt_conv2d_geom *g,
                                                const float *x, float *y, int32_t *argmax) {
  POOL_LAUNCH(ex, g, pool_outputs(g), max_pool_forward_kernel, (const T *)x, (T *)y, argmax);
}

extern "C" dt_status dt_cuda_max_pool2d_backward(const dt_exec *ex, const dt_conv2d_geom *g,
                                                 const float *dy, const int32_t *argmax,
                                                 float *dx) {
  POOL_LAUNCH(ex, g, pool_inputs(g), max_pool_backward_kernel, (const T *)dy, argmax, (T *)dx);
}

extern "C" dt_status dt_cuda_avg_pool2d_forward(const dt_exec *ex, const dt_conv2d_geom *g,
                                                const float *x, float *y) {
  POOL_LAUNCH(ex, g, pool_outputs(g), avg_pool_forward_kernel, (const T *)x, (T *)y);
}

extern "C" dt_status dt_cuda_avg_pool2d_backward(const dt_exec *ex, const dt_conv2d_geom *g,
                                                 const float *dy, float *dx) {
  POOL_LAUNCH(ex, g, pool_inputs(g), avg_pool_backward_kernel, (const T *)dy, (T *)dx);
}

/* ---- the bias of a 16-bit convolution (cuda/dnn.c) ---- */

// y (n, oc, hw) of T += bias (oc) f32: the sum in f32, rounded once
template <typename T>
static __global__ void conv_bias_forward_kernel(const float *bias, T *y, int64_t oc, int64_t hw,
                                                int64_t total) {
  DT_GRID_STRIDE(i, total) { dt_store_f32(y, i, dt_load_f32(y, i) + bias[(i / hw) % oc]); }
}

// dy (n, oc, hw) of T -> db (oc) f32 = the sum over n and hw, in double; a block per channel
template <typename T>
static __global__ void conv_bias_backward_kernel(const T *dy, float *db, int64_t n, int64_t oc,
                                                 int64_t hw) {
  __shared__ double sh[32];
  for (int64_t o = blockIdx.x; o < oc; o += gridDim.x) {
    double s = 0.0;
    for (int64_t k = threadIdx.x; k < n * hw; k += blockDim.x) {
      int64_t i = k / hw, j = k - i * hw;
      s += (double)dt_load_f32(dy, (i * oc + o) * hw + j);
    }
    s = dt_block_sum(s, sh);
    if (threadIdx.x == 0)
      db[o] = (float)s;
  }
}

extern "C" dt_status dt_cuda_conv_bias_forward(cudaStream_t stream, dt_dtype dtype,
                                               const float *bias, void *y, int64_t n, int64_t oc,
                                               int64_t hw) {
  const int64_t total = n * oc * hw;
  if (total == 0)
    return DT_OK;
  if (dtype == DT_DTYPE_F16)
    conv_bias_forward_kernel<<<dt_grid_for(total), DT_THREADS, 0, stream>>>(bias, (__half *)y, oc,
                                                                            hw, total);
  else
    conv_bias_forward_kernel<<<dt_grid_for(total), DT_THREADS, 0, stream>>>(
        bias, (__nv_bfloat16 *)y, oc, hw, total);
  DT_CUDA_CHECK_LAUNCH();
  return DT_OK;
}

extern "C" dt_status dt_cuda_conv_bias_backward(cudaStream_t stream, dt_dtype dtype, const void *dy,
                                                float *db, int64_t n, int64_t oc, int64_t hw) {
  if (oc == 0)
    return DT_OK;
  unsigned blocks = (unsigned)(oc < 65535 ? oc : 65535);
  if (dtype == DT_DTYPE_F16)
    conv_bias_backward_kernel<<<blocks, DT_THREADS, 0, stream>>>((const __half *)dy, db, n, oc, hw);
  else
    conv_bias_backward_kernel<<<blocks, DT_THREADS, 0, stream>>>((const __nv_bfloat16 *)dy, db, n,
                                                                 oc, hw);
  DT_CUDA_CHECK_LAUNCH();
  return DT_OK;
}
