/* Direct stride-1 convolution kernels on AVX-512 (core/cpu_conv_direct.h).
 *
 * Every function that touches a 512-bit register carries the target
 * attribute, so the build needs no -m flag; dt_cpu_conv_direct_usable keeps
 * them off CPUs without AVX-512F. */
#include <stdatomic.h>
#include <stdint.h>
#include <string.h>

#include "core/cpu.h"
#include "core/cpu_conv_direct.h"

#define MIN(a, b) ((a) < (b) ? (a) : (b))
#define MAX(a, b) ((a) > (b) ? (a) : (b))

static atomic_int direct_enabled = 1;

int dt_cpu_set_conv_direct(int enabled) { return atomic_exchange(&direct_enabled, enabled != 0); }

int dt_cpu_conv_simd_enabled(void) {
  return atomic_load_explicit(&direct_enabled, memory_order_relaxed);
}

/* ---- geometry ---- */

typedef struct direct_geom {
  int hp, wp, L, ckk, taps;
  int plane;
  int shift;   /* S: the largest tap offset ki*wp + kj, dwide's left zero run in dx */
  int gstride; /* floats per output channel of the padded gradient: S + plane, rounded */
  int padded;
} direct_geom;

static size_t round16(size_t floats) { return (floats + 15) / 16 * 16; }

static void direct_geom_of(const dt_conv2d_geom *g, direct_geom *d) {
  d->hp = g->h + 2 * g->ph;
  d->wp = g->w + 2 * g->pw;
  d->plane = d->hp * d->wp;
  d->L = (g->oh - 1) * d->wp + g->ow;
  d->taps = g->kh * g->kw;
  d->ckk = g->c * d->taps;
  d->shift = (g->kh - 1) * d->wp + (g->kw - 1);
  d->gstride = (int)round16((size_t)d->shift + (size_t)d->plane);
  d->padded = g->ph > 0 || g->pw > 0;
}

/* Limits that keep one image's operands in the core's L2 and every offset
 * in an int32: beyond them sgemm's cache blocking wins. */
#define DIRECT_MAX_FLOATS (1 << 16) /* an input, output or gradient plane set */
#define DIRECT_MAX_K 4096           /* ckk and oc*taps: the products' depth */

int dt_cpu_conv_direct_usable(const dt_conv2d_geom *g) {
#if defined(__x86_64__) && defined(__GNUC__)
  if (!atomic_load_explicit(&direct_enabled, memory_order_relaxed))
    return 0;
  if (g->sh != 1 || g->sw != 1 || (g->kh == 1 && g->kw == 1))
    return 0;
  if (g->n < 1 || g->c < 1 || g->oc < 1 || g->oh < 1 || g->ow < 1)
    return 0;
  direct_geom d;
  direct_geom_of(g, &d);
  if ((int64_t)g->c * d.plane > DIRECT_MAX_FLOATS || (int64_t)g->oc * d.gstride > DIRECT_MAX_FLOATS)
    return 0;
  if (d.ckk > DIRECT_MAX_K || (int64_t)g->oc * d.taps > DIRECT_MAX_K)
    return 0;
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512f");
#else
  (void)g;
  return 0;
#endif
}

int dt_cpu_conv_direct_eligible(const dt_conv2d_geom *g) { return dt_cpu_conv_direct_usable(g); }

/* Scratch: [padded input (c, plane) | forward: wide output (oc, L);
 * backward: padded gradient (oc, gstride) + padded input gradient (c,
 * plane)] then the int32 offsets. */
static size_t xp_floats(const dt_conv2d_geom *g, const direct_geom *d) {
  return d->padded ? round16((size_t)g->c * d->plane) : 0;
}
static size_t work_floats(const dt_conv2d_geom *g, const direct_geom *d) {
  size_t fwd = round16((size_t)g->oc * d->L);
  size_t bwd = (size_t)g->oc * d->gstride + xp_floats(g, d);
  return MAX(fwd, bwd);
}
static size_t offsets_count(const dt_conv2d_geom *g, const direct_geom *d) {
  return round16((size_t)MAX(d->ckk, g->oc * d->taps));
}

size_t dt_cpu_conv_direct_scratch_floats(const dt_conv2d_geom *g) {
  direct_geom d;
  direct_geom_of(g, &d);
  return xp_floats(g, &d) + work_floats(g, &d) + offsets_count(g, &d);
}

// x (c,h,w) -> xp (c,hp,wp) with zero borders
static void pad_image(const dt_conv2d_geom *g, const direct_geom *d, const float *x, float *xp) {
  memset(xp, 0, (size_t)g->c * d->plane * sizeof(float));
  for (int ci = 0; ci < g->c; ci++)
    for (int iy = 0; iy < g->h; iy++)
      memcpy(xp + (int64_t)ci * d->plane + (int64_t)(iy + g->ph) * d->wp + g->pw,
             x + ((int64_t)ci * g->h + iy) * g->w, (size_t)g->w * sizeof(float));
}

/* off[r] for tap r = (ci, ki, kj): where im2col row r starts in xp */
static void input_offsets(const dt_conv2d_geom *g, const direct_geom *d, int32_t *off) {
  for (int r = 0; r < d->ckk; r++) {
    int ci = r / d->taps, t = r % d->taps;
    off[r] = ci * d->plane + (t / g->kw) * d->wp + t % g->kw;
  }
}

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>

#define TARGET_AVX512 __attribute__((target("avx512f")))
#define TILE_INLINE static inline __attribute__((always_inline)) TARGET_AVX512

/* ---- C (M, N) = init + A (M, K) . B[off[k] + n]: forward and dx ----
 *
 * A tile of MR <= 6 rows by NV <= 4 vectors of 16 columns: 24
 * accumulators, the NV loads of B's row k and one broadcast of A per row
 * in registers. Columns past N are masked off, in loads and stores. */

#define OG_MR 6
#define OG_NV 4

TILE_INLINE void offset_gemm_tile(const int MR, const int NV, const float *A, int lda, int K,
                                  const float *B, const int32_t *off, const __mmask16 *mask,
                                  const float *init, float *C, int ldc) {
  __m512 acc[OG_MR][OG_NV];
#pragma GCC unroll 6
  for (int m = 0; m < MR; m++) {
    __m512 v0 = init ? _mm512_set1_ps(init[m]) : _mm512_setzero_ps();
#pragma GCC unroll 4
    for (int v = 0; v < NV; v++)
      acc[m][v] = v0;
  }
  for (int k = 0; k < K; k++) {
    const float *b = B + off[k];
    __m512 bv[OG_NV];
#pragma GCC unroll 4
    for (int v = 0; v < NV; v++)
      bv[v] = _mm512_maskz_loadu_ps(mask[v], b + 16 * v);
#pragma GCC unroll 6
    for (int m = 0; m < MR; m++) {
      __m512 a = _mm512_set1_ps(A[(int64_t)m * lda + k]);
#pragma GCC unroll 4
      for (int v = 0; v < NV; v++)
        acc[m][v] = _mm512_fmadd_ps(a, bv[v], acc[m][v]);
    }
  }
#pragma GCC unroll 6
  for (int m = 0; m < MR; m++)
#pragma GCC unroll 4
    for (int v = 0; v < NV; v++)
      _mm512_mask_storeu_ps(C + (int64_t)m * ldc + 16 * v, mask[v], acc[m][v]);
}

#define OG_CASE(MR, NV)                                                         \
  case (MR)*8 + (NV):                                                           \
    offset_gemm_tile(MR, NV, A + (int64_t)m0 * lda, lda, K, B + n0, off, mask,  \
                     init ? init + m0 : NULL, C + (int64_t)m0 * ldc + n0, ldc); \
    break;
#define OG_CASES_NV(MR) OG_CASE(MR, 1) OG_CASE(MR, 2) OG_CASE(MR, 3) OG_CASE(MR, 4)
/* the tile of mr rows by nv vectors, one unrolled body per shape */
#define OG_TILE(mr, nv)                                                                           \
  do {                                                                                            \
    switch ((mr)*8 + (nv)) {                                                                      \
      default:                                                                                    \
        break; /* no such tile */                                                                 \
        OG_CASES_NV(1) OG_CASES_NV(2) OG_CASES_NV(3) OG_CASES_NV(4) OG_CASES_NV(5) OG_CASES_NV(6) \
    }                                                                                             \
  } while (0)

TARGET_AVX512 static void offset_gemm(int M, int N, int K, const float *A, int lda, const float *B,
                                      const int32_t *off, const float *init, float *C, int ldc) {
  for (int n0 = 0; n0 < N; n0 += 16 * OG_NV) {
    int nv = MIN(OG_NV, (N - n0 + 15) / 16);
    __mmask16 mask[OG_NV] = {0, 0, 0, 0};
    for (int v = 0; v < nv; v++) {
      int rem = N - n0 - 16 * v;
      mask[v] = rem >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << rem) - 1);
    }
    for (int m0 = 0; m0 < M; m0 += OG_MR)
      OG_TILE(MIN(OG_MR, M - m0), nv);
  }
}

/* ---- C (M, J) (+)= D (M, N) . B[off[j] + n]^T: the weight gradient ----
 *
 * Dot products of length N, 16 lanes at a time: a tile of MR <= 4 rows
 * of D by NJ <= 6 offsets, 24 accumulators summed across their lanes at
 * the end. */

#define IP_MR 4
#define IP_NJ 6

TILE_INLINE void offset_dots_tile(const int MR, const int NJ, const float *D, int ldd, int N,
                                  const float *B, const int32_t *off, float *C, int ldc,
                                  int accumulate) {
  __m512 acc[IP_MR][IP_NJ];
#pragma GCC unroll 4
  for (int m = 0; m < MR; m++)
#pragma GCC unroll 6
    for (int j = 0; j < NJ; j++)
      acc[m][j] = _mm512_setzero_ps();
  for (int n = 0; n < N; n += 16) {
    __mmask16 mask = N - n >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (N - n)) - 1);
    __m512 dv[IP_MR];
#pragma GCC unroll 4
    for (int m = 0; m < MR; m++)
      dv[m] = _mm512_maskz_loadu_ps(mask, D + (int64_t)m * ldd + n);
#pragma GCC unroll 6
    for (int j = 0; j < NJ; j++) {
      __m512 b = _mm512_maskz_loadu_ps(mask, B + off[j] + n);
#pragma GCC unroll 4
      for (int m = 0; m < MR; m++)
        acc[m][j] = _mm512_fmadd_ps(dv[m], b, acc[m][j]);
    }
  }
#pragma GCC unroll 4
  for (int m = 0; m < MR; m++)
#pragma GCC unroll 6
    for (int j = 0; j < NJ; j++) {
      float s = _mm512_reduce_add_ps(acc[m][j]);
      float *c = C + (int64_t)m * ldc + j;
      *c = accumulate ? *c + s : s;
    }
}

#define IP_CASE(MR, NJ)                                                  \
  case (MR)*8 + (NJ):                                                    \
    offset_dots_tile(MR, NJ, D + (int64_t)m0 * ldd, ldd, N, B, off + j0, \
                     C + (int64_t)m0 * ldc + j0, ldc, accumulate);       \
    break;
#define IP_CASES_NJ(MR) \
  IP_CASE(MR, 1) IP_CASE(MR, 2) IP_CASE(MR, 3) IP_CASE(MR, 4) IP_CASE(MR, 5) IP_CASE(MR, 6)
/* the tile of mr rows of D by nj offsets, one unrolled body per shape */
#define IP_TILE(mr, nj)                                             \
  do {                                                              \
    switch ((mr)*8 + (nj)) {                                        \
      default:                                                      \
        break; /* no such tile */                                   \
        IP_CASES_NJ(1) IP_CASES_NJ(2) IP_CASES_NJ(3) IP_CASES_NJ(4) \
    }                                                               \
  } while (0)

TARGET_AVX512 static void offset_dots(int M, int J, int N, const float *D, int ldd, const float *B,
                                      const int32_t *off, float *C, int ldc, int accumulate) {
  for (int m0 = 0; m0 < M; m0 += IP_MR) {
    int mr = MIN(IP_MR, M - m0);
    for (int j0 = 0; j0 < J; j0 += IP_NJ)
      IP_TILE(mr, MIN(IP_NJ, J - j0));
  }
}

#else /* not x86-64 GCC: never called (dt_cpu_conv_direct_usable is 0) */
static void offset_gemm(int M, int N, int K, const float *A, int lda, const float *B,
                        const int32_t *off, const float *init, float *C, int ldc) {
  (void)M, (void)N, (void)K, (void)A, (void)lda, (void)B, (void)off, (void)init, (void)C, (void)ldc;
}
static void offset_dots(int M, int J, int N, const float *D, int ldd, const float *B,
                        const int32_t *off, float *C, int ldc, int accumulate) {
  (void)M, (void)J, (void)N, (void)D, (void)ldd, (void)B, (void)off, (void)C, (void)ldc,
      (void)accumulate;
}
#endif

/* ---- the convolution's products ---- */

void dt_cpu_conv_direct_forward_image(const dt_conv2d_geom *g, const float *x, const float *w,
                                      const float *bias, float *y, float *scratch) {
  direct_geom d;
  direct_geom_of(g, &d);
  float *xp_buf = scratch, *wide = scratch + xp_floats(g, &d);
  int32_t *off = (int32_t *)(wide + work_floats(g, &d));
  const float *xp = x;
  if (d.padded) {
    pad_image(g, &d, x, xp_buf);
    xp = xp_buf;
  }
  input_offsets(g, &d, off);
  /* wide (oc, L) = bias + w (oc, ckk) . X */
  offset_gemm(g->oc, d.L, d.ckk, w, d.ckk, xp, off, bias, wide, d.L);
  for (int o = 0; o < g->oc; o++)
    for (int oy = 0; oy < g->oh; oy++)
      memcpy(y + ((int64_t)o * g->oh + oy) * g->ow, wide + (int64_t)o * d.L + (int64_t)oy * d.wp,
             (size_t)g->ow * sizeof(float));
}

void dt_cpu_conv_direct_pack_wt(const dt_conv2d_geom *g, const float *w, float *wt) {
  int taps = g->kh * g->kw, ckk = g->c * taps, k = g->oc * taps;
  for (int o = 0; o < g->oc; o++)
    for (int ci = 0; ci < g->c; ci++)
      memcpy(wt + (int64_t)ci * k + (int64_t)o * taps, w + (int64_t)o * ckk + (int64_t)ci * taps,
             (size_t)taps * sizeof(float));
}

void dt_cpu_conv_direct_backward_image(const dt_conv2d_geom *g, const float *x, const float *wt,
                                       const float *dy, float *dx, float *dw_acc, int accumulate,
                                       float *scratch) {
  direct_geom d;
  direct_geom_of(g, &d);
  float *xp_buf = scratch, *gpad = scratch + xp_floats(g, &d);
  float *dxp = gpad + (size_t)g->oc * d.gstride;
  int32_t *off = (int32_t *)(gpad + work_floats(g, &d));
  /* gpad (oc, gstride): per channel S zeros, then dy on wide rows (zeros
   * between the rows), then zeros; dwide[o] starts at gpad + o*gstride + S */
  memset(gpad, 0, (size_t)g->oc * d.gstride * sizeof(float));
  for (int o = 0; o < g->oc; o++)
    for (int oy = 0; oy < g->oh; oy++)
      memcpy(gpad + (int64_t)o * d.gstride + d.shift + (int64_t)oy * d.wp,
             dy + ((int64_t)o * g->oh + oy) * g->ow, (size_t)g->ow * sizeof(float));
  if (dw_acc) {
    const float *xp = x;
    if (d.padded) {
      pad_image(g, &d, x, xp_buf);
      xp = xp_buf;
    }
    input_offsets(g, &d, off);
    /* dw (oc, ckk) (+)= dwide (oc, L) . X^T */
    offset_dots(g->oc, d.ckk, d.L, gpad + d.shift, d.gstride, xp, off, dw_acc, d.ckk, accumulate);
  }
  if (dx) {
    /* dxp[ci][q] = sum over (o, t) of wt[ci][o*taps + t] * dwide[o][q - tap_t] */
    for (int o = 0; o < g->oc; o++)
      for (int t = 0; t < d.taps; t++)
        off[o * d.taps + t] = o * d.gstride + d.shift - ((t / g->kw) * d.wp + t % g->kw);
    float *out = d.padded ? dxp : dx;
    offset_gemm(g->c, d.plane, g->oc * d.taps, wt, g->oc * d.taps, gpad, off, NULL, out, d.plane);
    if (d.padded)
      for (int ci = 0; ci < g->c; ci++)
        for (int iy = 0; iy < g->h; iy++)
          memcpy(dx + ((int64_t)ci * g->h + iy) * g->w,
                 dxp + (int64_t)ci * d.plane + (int64_t)(iy + g->ph) * d.wp + g->pw,
                 (size_t)g->w * sizeof(float));
  }
}
