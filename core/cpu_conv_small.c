/* Convolutions of small planes that skip the padding (core/cpu_conv_table.h).
 *
 * ResNet's last layers at small images see planes of 2x2 and 4x4 pixels:
 * with a 3x3 kernel and a padding of 1, of the 9 taps of each output pixel
 * of a 2x2 plane only 4 read an input, the 5 others the padding. im2col
 * writes those zeros into its columns and the GEMM multiplies them: 5/9 of
 * the products of ResNet-18's 512-channel layers at 64 px, 31% at 4x4.
 *
 * Here the batch is the vector: the images are transposed, by blocks of
 * 16, into (channel, block, pixel, image) order, so that one AVX-512
 * register holds one pixel of one channel for 16 images. A block of 6
 * output rows by 4 output pixels (of any image blocks) stays in 24
 * registers while the loop runs over the input channels and, inside, the
 * taps: for each tap only the pixels whose input is inside the plane take
 * a product (the tap table says which), each weight broadcast to the 6
 * rows. The weights are read where they lie, once for a run of image
 * blocks whose vectors fit in 16 MB (all of ResNet-18's batch of 16; a
 * block's rows stay in L2 across its pixels).
 *
 * The same loop gives dx, the transposed convolution: its rows are the
 * input channels, its pixels the input pixels, its loop the output
 * channels and the taps, through the inverse table (for each tap, the
 * output pixel that reads an input pixel, if any). The weight gradient
 * stays on im2col and sgemm (core/cpu_kernels_conv.c).
 *
 * Each output is a sum over the channels in order and, within a channel,
 * over the taps in order: the same at every thread count (the threads
 * split the rows). */
#include <stdint.h>

#include "core/cpu.h"
#include "core/cpu_conv_table.h"
#include "core/cpu_internal.h"

#define MR 6  /* rows a block */
#define PG 4  /* output pixels a block */
#define VB 16 /* images a vector */
#define MIN(a, b) ((a) < (b) ? (a) : (b))
#define MAX(a, b) ((a) > (b) ? (a) : (b))
#define RUN_FLOATS ((int64_t)1 << 22) /* a run's vectors: 16 MB */

/* Valid (tap, pixel) pairs of g's table, and all of them. */
static void count_valid(const dt_conv2d_geom *g, const int32_t *tab, int64_t *valid, int64_t *all) {
  int64_t n = (int64_t)g->kh * g->kw * g->oh * g->ow, v = 0;
  for (int64_t i = 0; i < n; i++)
    v += tab[i] >= 0;
  *valid = v, *all = n;
}

int dt_cpu_conv_small_usable(const dt_conv2d_geom *g, int dx) {
  if ((dx && (g->sh != 1 || g->sw != 1)) || g->n < VB / 2 || g->kh * g->kw > 64 ||
      !dt_cpu_conv_table_fits(g) || (int64_t)g->kh * g->kw * g->h * g->w > DT_CONV_TABLE_MAX ||
      !dt_cpu_gemm_skinny_on())
    return 0;
  /* the gathers' 32-bit offsets (16 images of a plane set apart) */
  if ((int64_t)VB * MAX(g->c, g->oc) * MAX(g->h * g->w, g->oh * g->ow) > INT32_MAX)
    return 0;
  int32_t tab[DT_CONV_TABLE_MAX];
  int64_t valid, all;
  dt_cpu_conv_tap_table(g, tab);
  count_valid(g, tab, &valid, &all);
  return valid * 5 <= all * 4; /* at least a fifth of the products skipped */
}

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>

#define TARGET_AVX512 __attribute__((target("avx512f")))
#define UNROLL _Pragma("GCC unroll 8")

/* out[r][p][16] = sum over k1 < K1, t < taps with idx[t][p] >= 0 of
 * A[r rs + k1 ks + t] * S[k1][idx[t][p]][16], for rows r < R and pixels
 * p < P. */
typedef struct pv_job {
  const float *A;
  int64_t rs, ks;
  int taps, K1, R, P;
  const float *S;
  int sp; /* positions of S a k1 */
  const int32_t *idx;
  float *out;
} pv_job;

/* Rows r0 .. r0 + mr - 1 (mr <= MR; the others repeat the last and are
 * not stored) by pixels p0 .. p0 + np - 1 (np <= PG), over k1 in [k0,
 * k1e), adding to what out holds when `add`. */
TARGET_AVX512 static void pv_block(const pv_job *j, int r0, int mr, int p0, int np, int k0, int k1e,
                                   int add) {
  int64_t off[64][PG]; /* the taps' source offsets in S's k1 slice, -1: padding */
  unsigned mask[64];
  for (int t = 0; t < j->taps; t++) {
    mask[t] = 0;
    for (int q = 0; q < PG; q++) {
      int32_t s = q < np ? j->idx[(int64_t)t * j->P + p0 + q] : -1;
      off[t][q] = s < 0 ? 0 : (int64_t)s * VB;
      mask[t] |= (unsigned)(s >= 0) << q;
    }
  }
  int64_t ro[MR];
  UNROLL for (int i = 0; i < MR; i++) ro[i] = (int64_t)(r0 + (i < mr ? i : mr - 1)) * j->rs;
  __m512 c[MR][PG];
  UNROLL for (int i = 0; i < MR; i++) UNROLL for (int q = 0; q < PG; q++) c[i][q] =
      add && i < mr && q < np ? _mm512_loadu_ps(j->out + ((int64_t)(r0 + i) * j->P + p0 + q) * VB)
                              : _mm512_setzero_ps();
  for (int k1 = k0; k1 < k1e; k1++) {
    const float *a = j->A + (int64_t)k1 * j->ks, *s = j->S + (int64_t)k1 * j->sp * VB;
    for (int t = 0; t < j->taps; t++) {
      unsigned m = mask[t];
      if (!m)
        continue;
      __m512 b[MR];
      UNROLL for (int i = 0; i < MR; i++) b[i] = _mm512_set1_ps(a[ro[i] + t]);
      UNROLL for (int q = 0; q < PG; q++) {
        if (m & (1u << q)) {
          __m512 v = _mm512_loadu_ps(s + off[t][q]);
          UNROLL for (int i = 0; i < MR; i++) c[i][q] = _mm512_fmadd_ps(b[i], v, c[i][q]);
        }
      }
    }
  }
  UNROLL for (int i = 0; i < MR; i++) UNROLL for (int q = 0; q < PG; q++) {
    if (i < mr && q < np)
      _mm512_storeu_ps(j->out + ((int64_t)(r0 + i) * j->P + p0 + q) * VB, c[i][q]);
  }
}

/* Each thread a run of row blocks; k1 in slices of kc, each slice over
 * all the thread's blocks, the sums carried in out from slice to slice
 * (so the same sums in the same order as one slice). */
static void pv_run(const pv_job *j, int kc, int nt) {
  int blocks = (j->R + MR - 1) / MR, parts = MIN(nt, blocks);
#pragma omp parallel for if (parts > 1) num_threads(parts) schedule(static)
  for (int t = 0; t < parts; t++) {
    int b0 = (int)((int64_t)blocks * t / parts), b1 = (int)((int64_t)blocks * (t + 1) / parts);
    for (int k0 = 0; k0 < j->K1; k0 += kc)
      for (int b = b0; b < b1; b++)
        for (int p0 = 0; p0 < j->P; p0 += PG)
          pv_block(j, b * MR, MIN(MR, j->R - b * MR), p0, MIN(PG, j->P - p0), k0,
                   MIN(j->K1, k0 + kc), k0 > 0);
  }
}

/* t[c][b * pos + q][16] = image 16 b + lane of x (n, ch, pos) at (c, q),
 * for the nb blocks of 16 images; lanes past n are 0. */
TARGET_AVX512 static void to_vectors(const float *x, int n, int64_t ch, int64_t pos, int nb,
                                     float *t) {
  __m512i lane =
      _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                         _mm512_set1_epi32((int)(ch * pos)));
  for (int b = 0; b < nb; b++) {
    int m = MIN(VB, n - b * VB);
    __mmask16 in = (__mmask16)(m >= VB ? 0xffff : (1u << m) - 1);
    const float *base = x + (int64_t)b * VB * ch * pos;
    for (int64_t c = 0; c < ch; c++)
      for (int64_t q = 0; q < pos; q++)
        _mm512_storeu_ps(
            t + ((c * nb + b) * pos + q) * VB,
            _mm512_mask_i32gather_ps(_mm512_setzero_ps(), in, lane, base + c * pos + q, 4));
  }
}

/* y (n, ch, pos) = t[c][b * pos + q][16] (+ bias[c]), to_vectors' inverse. */
static void from_vectors(const float *t, int n, int64_t ch, int64_t pos, int nb, const float *bias,
                         float *y, int nt) {
#pragma omp parallel for if (nt > 1 && ch * pos * nb >= 1024) num_threads(nt) schedule(static)
  for (int64_t c = 0; c < ch; c++) {
    float bc = bias ? bias[c] : 0.0f;
    for (int i = 0; i < n; i++) {
      float *dst = y + ((int64_t)i * ch + c) * pos;
      const float *src = t + ((c * nb + i / VB) * pos) * VB + i % VB;
      for (int64_t q = 0; q < pos; q++)
        dst[q] = src[q * VB] + bc;
    }
  }
}

/* The blocks of 16 images side by side: pixel b * P + p of the job reads
 * position b * pos + idx[t][p] of S. One pass over the weights for the
 * whole batch. */
static dt_status small_run(const char *op, const dt_conv2d_geom *g, const float *w, const float *in,
                           int64_t in_ch, int64_t in_pos, const float *bias, float *out,
                           int64_t out_ch, int64_t out_pos, int dx, int nt) {
  int taps = g->kh * g->kw, nb = (g->n + VB - 1) / VB;
  int32_t tab[DT_CONV_TABLE_MAX], inv[DT_CONV_TABLE_MAX];
  dt_cpu_conv_tap_table(g, tab);
  const int32_t *idx = tab; /* forward: for tap t and output pixel p, the input pixel */
  if (dx) { /* the inverse: for tap t and input pixel q, the output pixel reading it */
    int64_t hw = (int64_t)g->h * g->w, ohw = (int64_t)g->oh * g->ow;
    for (int64_t e = 0; e < taps * hw; e++)
      inv[e] = -1;
    for (int t = 0; t < taps; t++)
      for (int64_t p = 0; p < ohw; p++)
        if (tab[t * ohw + p] >= 0)
          inv[t * hw + tab[t * ohw + p]] = (int32_t)p;
    idx = inv;
  }
  /* runs of whole blocks whose vectors fit in RUN_FLOATS (one run at
   * ResNet-18's batch 16; an evaluation batch of thousands in several) */
  int64_t per_block = (in_ch * in_pos + out_ch * out_pos) * VB;
  int nbr = (int)MIN((int64_t)nb, MAX((int64_t)1, RUN_FLOATS / per_block));
  size_t bytes = (sizeof(float) * (size_t)per_block + sizeof(int32_t) * (size_t)(taps * out_pos)) *
                 (size_t)nbr;
  dt_cpu_scratch *s = NULL;
  void *data = NULL;
  if (dt_cpu_scratch_acquire(bytes, &s, &data) != DT_OK)
    return DT_ERROR(DT_ERR_OOM, "%s: image-vector buffers of %zu bytes: malloc failed", op, bytes);
  float *sv = data, *ov = sv + in_ch * in_pos * nbr * VB;
  int32_t *bidx = (int32_t *)(ov + out_ch * out_pos * nbr * VB);
  int64_t ckk = (int64_t)g->c * taps;
  for (int b0 = 0; b0 < nb; b0 += nbr) {
    int m = MIN(nbr, nb - b0), n = MIN(g->n - b0 * VB, m * VB);
    int64_t P = m * out_pos;
    for (int t = 0; t < taps; t++)
      for (int b = 0; b < m; b++)
        for (int64_t p = 0; p < out_pos; p++) {
          int32_t v = idx[t * out_pos + p];
          bidx[t * P + b * out_pos + p] = v < 0 ? -1 : (int32_t)(b * in_pos + v);
        }
    pv_job j = {.A = w,
                .rs = dx ? taps : ckk,
                .ks = dx ? ckk : taps,
                .taps = taps,
                .K1 = (int)in_ch,
                .R = (int)out_ch,
                .P = (int)P,
                .S = sv,
                .sp = (int)(m * in_pos),
                .idx = bidx,
                .out = ov};
    to_vectors(in + (int64_t)b0 * VB * in_ch * in_pos, n, in_ch, in_pos, m, sv);
    /* dx reads w across its rows (output channels), 54 floats of each a
     * block: in slices of 16 rows, 16 streams the prefetcher follows */
    pv_run(&j, dx ? 16 : j.K1, nt);
    from_vectors(ov, n, out_ch, out_pos, m, bias, out + (int64_t)b0 * VB * out_ch * out_pos, nt);
  }
  dt_cpu_scratch_release(s);
  return DT_OK;
}

dt_status dt_cpu_conv_small_forward(const dt_conv2d_geom *g, const float *x, const float *w,
                                    const float *bias, float *y, int nt) {
  return small_run("conv2d_forward", g, w, x, g->c, (int64_t)g->h * g->w, bias, y, g->oc,
                   (int64_t)g->oh * g->ow, 0, nt);
}

dt_status dt_cpu_conv_small_dx(const dt_conv2d_geom *g, const float *w, const float *dy, float *dx,
                               int nt) {
  return small_run("conv2d_backward", g, w, dy, g->oc, (int64_t)g->oh * g->ow, NULL, dx, g->c,
                   (int64_t)g->h * g->w, 1, nt);
}

#else
dt_status dt_cpu_conv_small_forward(const dt_conv2d_geom *g, const float *x, const float *w,
                                    const float *bias, float *y, int nt) {
  (void)g, (void)x, (void)w, (void)bias, (void)y, (void)nt;
  return DT_ERROR(DT_ERR_UNSUPPORTED, "conv2d_forward: the small-plane kernels need AVX-512");
}
dt_status dt_cpu_conv_small_dx(const dt_conv2d_geom *g, const float *w, const float *dy, float *dx,
                               int nt) {
  (void)g, (void)w, (void)dy, (void)dx, (void)nt;
  return DT_ERROR(DT_ERR_UNSUPPORTED, "conv2d_backward: the small-plane kernels need AVX-512");
}
#endif
