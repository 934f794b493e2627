/* CPU max and average pooling, NCHW, parallel over (image, channel) planes.
 * x, y, dy and dx hold ex->dtype (f32, f16 or bf16); argmax is i32. One f32
 * body per kernel works on one plane: a 16-bit plane is widened into the
 * thread's slice of a pooled scratch buffer and its result rounded once,
 * so the results are bit for bit the f32 kernel's on a widened copy. */
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <string.h>

#include "core/cpu_conv_direct.h"
#include "core/cpu_internal.h"
#include "core/half.h"

#define MIN(a, b) ((a) < (b) ? (a) : (b))
#define MAX(a, b) ((a) > (b) ? (a) : (b))

/* Whether v replaces the running maximum: larger, or the first NaN (NaN
 * wins and sticks, as PyTorch). Ties keep the earlier index. */
static inline int max_takes(float v, float best) {
  return (v > best) | ((v != v) & (best == best));
}

static inline uint32_t bits_of(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  return u;
}

static inline float float_of(uint32_t u) {
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

/* best, at = v, v_at if v takes; selected through bit masks because GCC
 * turns float ?: into branches, which mispredict on random data and keep
 * the 2x2 loop from vectorizing. */
static inline void max_update(float v, int32_t v_at, float *best, int32_t *at) {
  uint32_t m = -(uint32_t)max_takes(v, *best);
  *best = float_of((bits_of(*best) & ~m) | (bits_of(v) & m));
  *at = (int32_t)(((uint32_t)*at & ~m) | ((uint32_t)v_at & m));
}

/* Max of a 2x2 window a b / c d in scan order, with the flat index of the
 * winner (`at` is the index of a, `w` the row length). */
static inline float max_2x2(float a, float b, float c, float d, int32_t at, int32_t w,
                            int32_t *at_out) {
  float best = a;
  int32_t i = at;
  max_update(b, at + 1, &best, &i);
  max_update(c, at + w, &best, &i);
  max_update(d, at + w + 1, &best, &i);
  *at_out = i;
  return best;
}

/* The common 2x2, stride 2, unpadded window: one plane x (h,w) -> y (oh,ow),
 * argmax (oh,ow) or NULL. Same scan order as the general loop, so the
 * results are identical. */
static void max_pool_2x2_plane(const dt_conv2d_geom *g, const float *x, float *y, int32_t *argmax) {
  int32_t w = g->w;
  for (int oy = 0; oy < g->oh; oy++) {
    const float *r0 = x + (int64_t)(2 * oy) * w, *r1 = r0 + w;
    float *yr = y + (int64_t)oy * g->ow;
    int32_t base = 2 * oy * w;
    if (argmax) {
      int32_t *ar = argmax + (int64_t)oy * g->ow;
#pragma omp simd
      for (int ox = 0; ox < g->ow; ox++)
        yr[ox] = max_2x2(r0[2 * ox], r0[2 * ox + 1], r1[2 * ox], r1[2 * ox + 1], base + 2 * ox, w,
                         &ar[ox]);
    } else {
#pragma omp simd
      for (int ox = 0; ox < g->ow; ox++) {
        int32_t at;
        yr[ox] =
            max_2x2(r0[2 * ox], r0[2 * ox + 1], r1[2 * ox], r1[2 * ox + 1], base + 2 * ox, w, &at);
      }
    }
  }
}

static int is_2x2_stride2(const dt_conv2d_geom *g) {
  return g->kh == 2 && g->kw == 2 && g->sh == 2 && g->sw == 2 && g->ph == 0 && g->pw == 0;
}

/* The f32 body of a pooling kernel: plane p's input `in` (f32) -> its
 * output `out` (f32, every element written); nonzero when the plane's
 * inputs are invalid (an argmax out of range). */
typedef int (*pool_plane_fn)(const dt_conv2d_geom *g, const void *ctx, int64_t p, const float *in,
                             float *out);

/* Runs fn over the n*c planes: `in` holds planes of in_len elements, `out`
 * planes of out_len, both of ex->dtype. f32 planes are passed in place; a
 * 16-bit plane is widened into scratch, fn writes an f32 plane beside it,
 * rounded once into `out`. Planes are independent, so the results do not
 * depend on the thread count. *bad is nonzero when fn reported a bad plane
 * (the caller words the error); DT_ERR_OOM when the scratch cannot be had. */
static dt_status pool_planes(const char *op, const dt_exec *ex, const dt_conv2d_geom *g,
                             const void *in, int64_t in_len, void *out, int64_t out_len,
                             pool_plane_fn fn, const void *ctx, int *bad) {
  const int64_t planes = (int64_t)g->n * g->c;
  const int par = planes * (in_len > out_len ? in_len : out_len) >= DT_CPU_PAR_MIN;
  const int nt = par ? dt_cpu_threads() : 1;
  const dt_dtype dtype = ex->dtype;
  int any_bad = 0;
  if (!dt_dtype_is_half(dtype)) {
#pragma omp parallel for if (par) num_threads(nt) schedule(static) reduction(| : any_bad)
    for (int64_t p = 0; p < planes; p++)
      any_bad |= fn(g, ctx, p, (const float *)in + p * in_len, (float *)out + p * out_len);
    *bad = any_bad;
    return DT_OK;
  }
  /* one pooled buffer per call, an input and an output plane per thread */
  dt_cpu_scratch *scratch = NULL;
  float *wide = NULL;
  size_t bytes = (size_t)nt * (size_t)(in_len + out_len) * sizeof(float);
  if (dt_cpu_scratch_acquire(bytes, &scratch, (void **)&wide) != DT_OK)
    return DT_ERROR(DT_ERR_OOM, "%s: %zu bytes to widen 16-bit planes: malloc failed", op, bytes);
#pragma omp parallel for if (par) num_threads(nt) schedule(static) reduction(| : any_bad)
  for (int64_t p = 0; p < planes; p++) {
    float *win = wide + (int64_t)omp_get_thread_num() * (in_len + out_len), *wout = win + in_len;
    (void)dt_half_to_f32(dtype, (const uint16_t *)in + p * in_len, win, in_len);
    any_bad |= fn(g, ctx, p, win, wout);
    (void)dt_half_from_f32(dtype, wout, (uint16_t *)out + p * out_len, out_len);
  }
  dt_cpu_scratch_release(scratch);
  *bad = any_bad;
  return DT_OK;
}

/* pool_planes from the input planes to the output planes, x (n,c,h,w) ->
 * y (n,c,oh,ow): the forward kernels; fn reports no bad planes. */
static dt_status pool_forward_planes(const char *op, const dt_exec *ex, const dt_conv2d_geom *g,
                                     const float *x, float *y, pool_plane_fn fn, const void *ctx) {
  int bad;
  return pool_planes(op, ex, g, x, (int64_t)g->h * g->w, y, (int64_t)g->oh * g->ow, fn, ctx, &bad);
}

/* pool_planes from the output planes back, dy (n,c,oh,ow) -> dx (n,c,h,w):
 * the backward kernels. */
static dt_status pool_backward_planes(const char *op, const dt_exec *ex, const dt_conv2d_geom *g,
                                      const float *dy, float *dx, pool_plane_fn fn, const void *ctx,
                                      int *bad) {
  return pool_planes(op, ex, g, dy, (int64_t)g->oh * g->ow, dx, (int64_t)g->h * g->w, fn, ctx, bad);
}

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>

/* The general window on AVX-512: 16 outputs of a row at a time, each
 * window row's maximum from one masked gather per column, then the rows'
 * (the same updates as max_update, lane by lane, so the same winner). */
__attribute__((target("avx512f"))) static void max_pool_plane_avx512(const dt_conv2d_geom *g,
                                                                     const float *x, float *y,
                                                                     int32_t *argmax) {
  const __m512i lane = _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
  const __m512 ninf = _mm512_set1_ps(-INFINITY);
  const __m512i zero = _mm512_setzero_si512(), w = _mm512_set1_epi32(g->w);
  for (int oy = 0; oy < g->oh; oy++) {
    int y0 = oy * g->sh - g->ph, y1 = MIN(y0 + g->kh, g->h);
    y0 = MAX(y0, 0);
    for (int c0 = 0; c0 < g->ow; c0 += 16) {
      __mmask16 in = g->ow - c0 >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (g->ow - c0)) - 1);
      /* ix0: each lane's first window column, unclipped */
      __m512i ix0 =
          _mm512_sub_epi32(_mm512_mullo_epi32(_mm512_add_epi32(_mm512_set1_epi32(c0), lane),
                                              _mm512_set1_epi32(g->sw)),
                           _mm512_set1_epi32(g->pw));
      __m512i first = _mm512_max_epi32(ix0, zero);
      __m512 best = ninf;
      __m512i at = _mm512_add_epi32(_mm512_set1_epi32(y0 * g->w), first);
      for (int iy = y0; iy < y1; iy++) {
        const float *row = x + (int64_t)iy * g->w;
        __m512i base = _mm512_set1_epi32(iy * g->w);
        __m512 hb = ninf;
        __m512i ha = _mm512_add_epi32(base, first);
        for (int kx = 0; kx < g->kw; kx++) {
          __m512i ix = _mm512_add_epi32(ix0, _mm512_set1_epi32(kx));
          __mmask16 ok =
              _mm512_mask_cmpge_epi32_mask(in, ix, zero) & _mm512_cmplt_epi32_mask(ix, w);
          __m512 v = _mm512_mask_i32gather_ps(ninf, ok, ix, row, 4);
          __mmask16 take =
              ok &
              (_mm512_cmp_ps_mask(v, hb, _CMP_GT_OQ) |
               (_mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q) & _mm512_cmp_ps_mask(hb, hb, _CMP_ORD_Q)));
          hb = _mm512_mask_blend_ps(take, hb, v);
          ha = _mm512_mask_blend_epi32(take, ha, _mm512_add_epi32(base, ix));
        }
        __mmask16 take = in & (_mm512_cmp_ps_mask(hb, best, _CMP_GT_OQ) |
                               (_mm512_cmp_ps_mask(hb, hb, _CMP_UNORD_Q) &
                                _mm512_cmp_ps_mask(best, best, _CMP_ORD_Q)));
        best = _mm512_mask_blend_ps(take, best, hb);
        at = _mm512_mask_blend_epi32(take, at, ha);
      }
      _mm512_mask_storeu_ps(y + (int64_t)oy * g->ow + c0, in, best);
      if (argmax)
        _mm512_mask_storeu_epi32(argmax + (int64_t)oy * g->ow + c0, in, at);
    }
  }
}

static int pool_avx512(void) {
  __builtin_cpu_init();
  return dt_cpu_conv_simd_enabled() && __builtin_cpu_supports("avx512f");
}
#else
static void max_pool_plane_avx512(const dt_conv2d_geom *g, const float *x, float *y,
                                  int32_t *argmax) {
  (void)g, (void)x, (void)y, (void)argmax;
}
static int pool_avx512(void) { return 0; }
#endif

// one plane: x (h,w) -> y (oh,ow); ctx: argmax (n,c,oh,ow) or NULL
static int max_pool_forward_plane(const dt_conv2d_geom *g, const void *ctx, int64_t p,
                                  const float *xp, float *yp) {
  int32_t *argmax = (int32_t *)ctx;
  int32_t *ap = argmax ? argmax + p * g->oh * g->ow : NULL;
  if (is_2x2_stride2(g)) {
    max_pool_2x2_plane(g, xp, yp, ap);
    return 0;
  }
  if (pool_avx512()) {
    max_pool_plane_avx512(g, xp, yp, ap);
    return 0;
  }
  /* Row by row: each window row's maximum (the first NaN, else the first
   * largest), then the rows' in order. That is the first NaN, else the
   * first largest, in the window's scan order, without a branch on the
   * data (the branchy scan took 3 % of a ResNet-18 step). */
  enum { CHUNK = 128 };
  float best[CHUNK];
  int32_t at[CHUNK];
  const int32_t w = g->w;
  for (int oy = 0; oy < g->oh; oy++) {
    int y0 = oy * g->sh - g->ph, y1 = MIN(y0 + g->kh, g->h);
    y0 = MAX(y0, 0);
    for (int c0 = 0; c0 < g->ow; c0 += CHUNK) {
      int c1 = MIN(c0 + CHUNK, g->ow);
      for (int ox = c0; ox < c1; ox++) {
        best[ox - c0] = -INFINITY;
        at[ox - c0] = y0 * w + MAX(ox * g->sw - g->pw, 0);
      }
      for (int iy = y0; iy < y1; iy++) {
        const float *row = xp + (int64_t)iy * w;
        for (int ox = c0; ox < c1; ox++) {
          int x0 = ox * g->sw - g->pw, x1 = MIN(x0 + g->kw, w);
          x0 = MAX(x0, 0);
          float hb = -INFINITY;
          int32_t ha = iy * w + x0;
          for (int ix = x0; ix < x1; ix++)
            max_update(row[ix], iy * w + ix, &hb, &ha);
          max_update(hb, ha, &best[ox - c0], &at[ox - c0]);
        }
      }
      memcpy(yp + (int64_t)oy * g->ow + c0, best, (size_t)(c1 - c0) * sizeof(float));
      if (ap)
        memcpy(ap + (int64_t)oy * g->ow + c0, at, (size_t)(c1 - c0) * sizeof(int32_t));
    }
  }
  return 0;
}

// x (n,c,h,w) -> y (n,c,oh,ow), argmax (n,c,oh,ow) flat index into h*w or NULL
dt_status dt_cpu_max_pool2d_forward(const dt_exec *ex, const dt_conv2d_geom *g, const float *x,
                                    float *y, int32_t *argmax) {
  if (g->nhwc)
    return dt_cpu_pool2d_nhwc_forward(ex, g, x, y, argmax);
  return pool_forward_planes("max_pool2d_forward", ex, g, x, y, max_pool_forward_plane, argmax);
}

// one plane: dy (oh,ow) -> dx (h,w) through the argmax (ctx) of plane p
static int max_pool_backward_plane(const dt_conv2d_geom *g, const void *ctx, int64_t p,
                                   const float *gp, float *dp) {
  const int64_t hw = (int64_t)g->h * g->w, ohw = (int64_t)g->oh * g->ow;
  const int32_t *ap = (const int32_t *)ctx + p * ohw;
  int bad = 0;
  memset(dp, 0, (size_t)hw * sizeof(float));
  for (int64_t o = 0; o < ohw; o++) {
    if (ap[o] < 0 || ap[o] >= hw) {
      bad = 1;
      continue;
    }
    dp[ap[o]] += gp[o];
  }
  return bad;
}

// dy (n,c,oh,ow), argmax -> dx (n,c,h,w) overwritten
dt_status dt_cpu_max_pool2d_backward(const dt_exec *ex, const dt_conv2d_geom *g, const float *dy,
                                     const int32_t *argmax, float *dx) {
  if (g->nhwc)
    return dt_cpu_pool2d_nhwc_backward(ex, g, dy, argmax, dx);
  const int64_t hw = (int64_t)g->h * g->w;
  int bad;
  DT_CHECK(pool_backward_planes("max_pool2d_backward", ex, g, dy, dx, max_pool_backward_plane,
                                argmax, &bad));
  if (bad)
    return DT_ERROR(DT_ERR_INVALID_ARG,
                    "max_pool2d_backward: argmax outside [0, %lld): pass the indices from "
                    "max_pool2d_forward with the same geometry",
                    (long long)hw);
  return DT_OK;
}

/* Divisor of output (oy, ox): the window clipped to the padded input, so
 * padding counts (count_include_pad = true). */
static float avg_divisor(const dt_conv2d_geom *g, int oy, int ox) {
  int y0 = oy * g->sh - g->ph, x0 = ox * g->sw - g->pw;
  int y1 = MIN(y0 + g->kh, g->h + g->ph), x1 = MIN(x0 + g->kw, g->w + g->pw);
  return (float)((y1 - y0) * (x1 - x0));
}

// one plane: x (h,w) -> y (oh,ow)
static int avg_pool_forward_plane(const dt_conv2d_geom *g, const void *ctx, int64_t p,
                                  const float *xp, float *yp) {
  (void)ctx, (void)p;
  for (int oy = 0; oy < g->oh; oy++) {
    int y0 = MAX(oy * g->sh - g->ph, 0), y1 = MIN(oy * g->sh - g->ph + g->kh, g->h);
    for (int ox = 0; ox < g->ow; ox++) {
      int x0 = MAX(ox * g->sw - g->pw, 0), x1 = MIN(ox * g->sw - g->pw + g->kw, g->w);
      float s = 0.0f;
      for (int iy = y0; iy < y1; iy++)
        for (int ix = x0; ix < x1; ix++)
          s += xp[iy * g->w + ix];
      yp[oy * g->ow + ox] = s / avg_divisor(g, oy, ox);
    }
  }
  return 0;
}

// x (n,c,h,w) -> y (n,c,oh,ow)
dt_status dt_cpu_avg_pool2d_forward(const dt_exec *ex, const dt_conv2d_geom *g, const float *x,
                                    float *y) {
  if (g->nhwc)
    return dt_cpu_pool2d_nhwc_forward(ex, g, x, y, NULL);
  return pool_forward_planes("avg_pool2d_forward", ex, g, x, y, avg_pool_forward_plane, NULL);
}

// one plane: dy (oh,ow) -> dx (h,w)
static int avg_pool_backward_plane(const dt_conv2d_geom *g, const void *ctx, int64_t p,
                                   const float *gp, float *dp) {
  (void)ctx, (void)p;
  memset(dp, 0, (size_t)g->h * g->w * sizeof(float));
  for (int oy = 0; oy < g->oh; oy++) {
    int y0 = MAX(oy * g->sh - g->ph, 0), y1 = MIN(oy * g->sh - g->ph + g->kh, g->h);
    for (int ox = 0; ox < g->ow; ox++) {
      int x0 = MAX(ox * g->sw - g->pw, 0), x1 = MIN(ox * g->sw - g->pw + g->kw, g->w);
      float v = gp[oy * g->ow + ox] / avg_divisor(g, oy, ox);
      for (int iy = y0; iy < y1; iy++)
        for (int ix = x0; ix < x1; ix++)
          dp[iy * g->w + ix] += v;
    }
  }
  return 0;
}

// dy (n,c,oh,ow) -> dx (n,c,h,w) overwritten
dt_status dt_cpu_avg_pool2d_backward(const dt_exec *ex, const dt_conv2d_geom *g, const float *dy,
                                     float *dx) {
  if (g->nhwc)
    return dt_cpu_pool2d_nhwc_backward(ex, g, dy, NULL, dx);
  int bad; /* the average has no bad planes */
  return pool_backward_planes("avg_pool2d_backward", ex, g, dy, dx, avg_pool_backward_plane, NULL,
                              &bad);
}
