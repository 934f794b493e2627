/* The CPU convolution's small-plane pieces (core/cpu_conv_table.h).
 *
 * For the few output pixels of ResNet's deep layers (2x2 to 8x8) per-row
 * im2col loops spend their time on set-up (a memset, the valid columns)
 * for runs of 2 to 8 floats. A table gives, for each (tap, output pixel),
 * the input's offset in the plane or -1 (padding), and each channel is
 * one pass over it: on AVX-512, planes of up to 32 floats by permutes of
 * the plane held in registers (below), larger ones by 16 entries per
 * masked gather; col2im
 * gathers, adds and scatters one tap's entries at a time (within a tap
 * every output pixel reads another input, so a vector has no two lanes
 * on one address). The AVX-512 functions carry their target attribute
 * and run only where the CPU has AVX-512F (and dt_cpu_set_conv_direct has
 * not switched them off); the results are the scalar
 * loops' bit for bit (copies, and the same additions in the same order). */
#include "core/cpu_conv_table.h"

#include <omp.h>
#include <string.h>

#include "core/cpu.h"
#include "core/cpu_conv_direct.h"

#define MIN(a, b) ((a) < (b) ? (a) : (b))

int dt_cpu_conv_table_fits(const dt_conv2d_geom *g) {
  return (int64_t)g->kh * g->kw * g->oh * g->ow <= DT_CONV_TABLE_MAX;
}

void dt_cpu_conv_tap_table(const dt_conv2d_geom *g, int32_t *tab) {
  int ohw = g->oh * g->ow;
  for (int t = 0; t < g->kh * g->kw; t++)
    for (int p = 0; p < ohw; p++) {
      int iy = p / g->ow * g->sh - g->ph + t / g->kw, ix = p % g->ow * g->sw - g->pw + t % g->kw;
      tab[t * ohw + p] = iy >= 0 && iy < g->h && ix >= 0 && ix < g->w ? iy * g->w + ix : -1;
    }
}

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>

#define TARGET_AVX512 __attribute__((target("avx512f")))

static int has_avx512(void) {
  __builtin_cpu_init();
  return dt_cpu_conv_simd_enabled() && __builtin_cpu_supports("avx512f");
}

/* Entries p.. of a tap's row of the table (ohw long): *in the lanes
 * inside the row, *valid those of them that read an input. */
static inline __attribute__((always_inline)) TARGET_AVX512 __m512i table_entries(const int32_t *tt,
                                                                                 int p, int ohw,
                                                                                 __mmask16 *in,
                                                                                 __mmask16 *valid) {
  *in = ohw - p >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (ohw - p)) - 1);
  __m512i idx = _mm512_maskz_loadu_epi32(*in, tt + p);
  *valid = _mm512_mask_cmpgt_epi32_mask(*in, idx, _mm512_set1_epi32(-1));
  return idx;
}

/* One tap's row: dst[p] = plane[tt[p]] (0 for -1). */
TARGET_AVX512 static void gather_row(const int32_t *tt, int ohw, const float *plane, float *dst) {
  for (int p = 0; p < ohw; p += 16) {
    __mmask16 in, valid;
    __m512i idx = table_entries(tt, p, ohw, &in, &valid);
    __m512 v = _mm512_mask_i32gather_ps(_mm512_setzero_ps(), valid, idx, plane, 4);
    _mm512_mask_storeu_ps(dst + p, in, v);
  }
}

/* One tap's row: plane[tt[p]] += src[p] where tt[p] is not -1. */
TARGET_AVX512 static void scatter_add_row(const int32_t *tt, int ohw, const float *src,
                                          float *plane) {
  for (int p = 0; p < ohw; p += 16) {
    __mmask16 in, valid;
    __m512i idx = table_entries(tt, p, ohw, &in, &valid);
    __m512 v = _mm512_mask_i32gather_ps(_mm512_setzero_ps(), valid, idx, plane, 4);
    v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(valid, src + p));
    _mm512_mask_i32scatter_ps(plane, valid, idx, v, 4);
  }
}

/* Planes and tap rows of at most 32 floats (ResNet's 2x2 to 5x5 layers of
 * stride 1, and 5x5 -> 3x3 of stride 2) sit in two registers: a tap's row
 * of im2col is one or two permutes of the plane (zeros where it reads the
 * padding), and col2im's inverse permutes each tap's row onto the plane
 * (zeros where no pixel of the tap reads an input: within a tap every
 * input is read at most once), adding tap by tap in a register. The same
 * copies and the same additions in the same order as the scalar loops
 * (the sum starts at +0 and adding +0 to it changes no bit). */
#define PERM_MAX 32
#define PERM_MAX_TAPS 25

static inline __mmask16 lanes(int n, int from) {
  int k = n - from;
  return k >= 16 ? (__mmask16)0xffff : k <= 0 ? (__mmask16)0 : (__mmask16)((1u << k) - 1);
}

/* A tap's permute: its 32 indices e and lane mask m, into registers. */
typedef struct perm_tap {
  __m512i idx[2];
  __mmask16 valid[2];
} perm_tap;

TARGET_AVX512 static perm_tap perm_load(const int32_t *e, uint32_t m) {
  perm_tap p = {{_mm512_loadu_si512(e), _mm512_loadu_si512(e + 16)},
                {(__mmask16)m, (__mmask16)(m >> 16)}};
  return p;
}

TARGET_AVX512 static void perm_im2col(const dt_conv2d_geom *g, const int32_t *tab, const float *x,
                                      float *col, int64_t ld) {
  int taps = g->kh * g->kw, ohw = g->oh * g->ow, hw = g->h * g->w;
  perm_tap pt[PERM_MAX_TAPS];
  for (int t = 0; t < taps; t++) {
    int32_t e[PERM_MAX];
    uint32_t m = 0;
    for (int p = 0; p < PERM_MAX; p++) {
      int32_t v = p < ohw ? tab[t * ohw + p] : -1;
      e[p] = v < 0 ? 0 : v;
      m |= v < 0 ? 0u : 1u << p;
    }
    pt[t] = perm_load(e, m);
  }
  __mmask16 in0 = lanes(hw, 0), in1 = lanes(hw, 16), out0 = lanes(ohw, 0), out1 = lanes(ohw, 16);
  for (int ci = 0; ci < g->c; ci++) {
    const float *plane = x + (int64_t)ci * hw;
    __m512 a = _mm512_maskz_loadu_ps(in0, plane), b = _mm512_maskz_loadu_ps(in1, plane + 16);
    for (int t = 0; t < taps; t++) {
      float *dst = col + ((int64_t)ci * taps + t) * ld;
      _mm512_mask_storeu_ps(dst, out0,
                            _mm512_maskz_permutex2var_ps(pt[t].valid[0], a, pt[t].idx[0], b));
      if (ohw > 16)
        _mm512_mask_storeu_ps(dst + 16, out1,
                              _mm512_maskz_permutex2var_ps(pt[t].valid[1], a, pt[t].idx[1], b));
    }
  }
}

TARGET_AVX512 static void perm_col2im(const dt_conv2d_geom *g, const int32_t *tab, const float *col,
                                      int64_t ld, float *x) {
  int taps = g->kh * g->kw, ohw = g->oh * g->ow, hw = g->h * g->w;
  perm_tap pt[PERM_MAX_TAPS]; /* the inverse: plane lane -> tap row entry */
  for (int t = 0; t < taps; t++) {
    int32_t e[PERM_MAX] = {0};
    uint32_t m = 0;
    for (int p = 0; p < ohw; p++) {
      int32_t q = tab[t * ohw + p];
      if (q >= 0) {
        e[q] = p;
        m |= 1u << q;
      }
    }
    pt[t] = perm_load(e, m);
  }
  __mmask16 in0 = lanes(hw, 0), in1 = lanes(hw, 16), out0 = lanes(ohw, 0), out1 = lanes(ohw, 16);
  for (int ci = 0; ci < g->c; ci++) {
    __m512 lo = _mm512_setzero_ps(), hi = _mm512_setzero_ps();
    for (int t = 0; t < taps; t++) {
      const float *src = col + ((int64_t)ci * taps + t) * ld;
      __m512 a = _mm512_maskz_loadu_ps(out0, src), b = _mm512_maskz_loadu_ps(out1, src + 16);
      lo = _mm512_add_ps(lo, _mm512_maskz_permutex2var_ps(pt[t].valid[0], a, pt[t].idx[0], b));
      if (hw > 16)
        hi = _mm512_add_ps(hi, _mm512_maskz_permutex2var_ps(pt[t].valid[1], a, pt[t].idx[1], b));
    }
    float *plane = x + (int64_t)ci * hw;
    _mm512_mask_storeu_ps(plane, in0, lo);
    _mm512_mask_storeu_ps(plane + 16, in1, hi);
  }
}
#else
static int has_avx512(void) { return 0; }
static void perm_im2col(const dt_conv2d_geom *g, const int32_t *tab, const float *x, float *col,
                        int64_t ld) {
  (void)g, (void)tab, (void)x, (void)col, (void)ld;
}
static void perm_col2im(const dt_conv2d_geom *g, const int32_t *tab, const float *col, int64_t ld,
                        float *x) {
  (void)g, (void)tab, (void)col, (void)ld, (void)x;
}
static void gather_row(const int32_t *tt, int ohw, const float *plane, float *dst) {
  (void)tt, (void)ohw, (void)plane, (void)dst;
}
static void scatter_add_row(const int32_t *tt, int ohw, const float *src, float *plane) {
  (void)tt, (void)ohw, (void)src, (void)plane;
}
#endif

/* A gather of 16 lanes pays off from 8 output pixels on (8x8 and 4x4:
 * 15-20 % faster; 2x2, 4 lanes of 16: 5 % slower than the scalar loop). */
static int gathers(const dt_conv2d_geom *g) { return g->oh * g->ow >= 8 && has_avx512(); }

static int permutes(const dt_conv2d_geom *g) {
#ifdef PERM_MAX
  return g->h * g->w <= PERM_MAX && g->oh * g->ow <= PERM_MAX && g->kh * g->kw <= PERM_MAX_TAPS &&
         has_avx512();
#else
  (void)g;
  return 0;
#endif
}

void dt_cpu_conv_table_im2col(const dt_conv2d_geom *g, const int32_t *tab, const float *x,
                              float *col, int64_t ld) {
  if (permutes(g)) {
    perm_im2col(g, tab, x, col, ld);
    return;
  }
  int taps = g->kh * g->kw, ohw = g->oh * g->ow, simd = gathers(g);
  for (int ci = 0; ci < g->c; ci++) {
    const float *plane = x + (int64_t)ci * g->h * g->w;
    for (int t = 0; t < taps; t++) {
      float *dst = col + ((int64_t)ci * taps + t) * ld;
      const int32_t *tt = tab + t * ohw;
      if (simd) {
        gather_row(tt, ohw, plane, dst);
        continue;
      }
      for (int p = 0; p < ohw; p++)
        dst[p] = tt[p] >= 0 ? plane[tt[p]] : 0.0f;
    }
  }
}

void dt_cpu_conv_table_col2im(const dt_conv2d_geom *g, const int32_t *tab, const float *col,
                              int64_t ld, float *x) {
  if (permutes(g)) {
    perm_col2im(g, tab, col, ld, x);
    return;
  }
  int taps = g->kh * g->kw, ohw = g->oh * g->ow, simd = gathers(g);
  memset(x, 0, (size_t)g->c * g->h * g->w * sizeof(float));
  for (int ci = 0; ci < g->c; ci++) {
    float *plane = x + (int64_t)ci * g->h * g->w;
    for (int t = 0; t < taps; t++) {
      const float *src = col + ((int64_t)ci * taps + t) * ld;
      const int32_t *tt = tab + t * ohw;
      if (simd) {
        scatter_add_row(tt, ohw, src, plane);
        continue;
      }
      for (int p = 0; p < ohw; p++)
        if (tt[p] >= 0)
          plane[tt[p]] += src[p];
    }
  }
}

/* OpenBLAS's own threading splits N, which is short here (64 columns for
 * ResNet-18's 512-channel layers at batch 16), and ran at about one
 * thread's speed on two; OpenBLAS runs single-threaded inside a parallel
 * region. Each part packs the whole of the operand it does not split, so
 * the split is along the longer of M and N: rows split, every thread
 * packed all of B, which for the 128-channel 8x8 layers (M 128, N 1024)
 * is eight times A (1.72 against 1.42 ms forward, 3.48 against 3.19 ms
 * backward, where the weight gradient's N is c*kh*kw). Every entry of C
 * is one thread's, over the whole of K. */
void dt_cpu_split_sgemm(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int M, int N, int K, const float *A,
                        int lda, const float *B, int ldb, float beta, float *C, int ldc, int nt) {
  int by_cols = N > M, len = by_cols ? N : M;
  int parts = MIN(nt, (len + 15) / 16);
  if (parts <= 1) {
    cblas_sgemm(CblasRowMajor, ta, tb, M, N, K, 1.0f, A, lda, B, ldb, beta, C, ldc);
    return;
  }
#pragma omp parallel for num_threads(parts) schedule(static)
  for (int t = 0; t < parts; t++) {
    int i0 = (int)((int64_t)len * t / parts) / 16 * 16;
    int i1 = t + 1 == parts ? len : (int)((int64_t)len * (t + 1) / parts) / 16 * 16;
    if (i1 <= i0)
      continue;
    if (by_cols) {
      const float *b = tb == CblasNoTrans ? B + i0 : B + (int64_t)i0 * ldb;
      cblas_sgemm(CblasRowMajor, ta, tb, M, i1 - i0, K, 1.0f, A, lda, b, ldb, beta, C + i0, ldc);
    } else {
      const float *a = ta == CblasNoTrans ? A + (int64_t)i0 * lda : A + i0;
      cblas_sgemm(CblasRowMajor, ta, tb, i1 - i0, N, K, 1.0f, a, lda, B, ldb, beta,
                  C + (int64_t)i0 * ldc, ldc);
    }
  }
}
