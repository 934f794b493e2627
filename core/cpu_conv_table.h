/* Pieces of the CPU convolution (core/cpu_kernels_conv.c): for its batched
 * path, im2col and col2im of small planes through a (tap, output pixel) ->
 * input offset table, and a GEMM split among threads; its
 * 16-bit storage forms.
 * Private to the CPU backend. */
#ifndef DT_CORE_CPU_CONV_TABLE_H
#define DT_CORE_CPU_CONV_TABLE_H

#include <cblas.h>
#include <stdint.h>

#include "core/backend.h"

#ifdef __cplusplus
extern "C" {
#endif

#define DT_CONV_TABLE_MAX 4096 /* kh*kw*oh*ow entries */

/* 1 when g's table has at most DT_CONV_TABLE_MAX entries. */
int dt_cpu_conv_table_fits(const dt_conv2d_geom *g);

/* tab (kh*kw, oh*ow): the offset iy*w + ix in an input plane that each
 * (tap, output pixel) reads, or -1 where it reads the padding. */
void dt_cpu_conv_tap_table(const dt_conv2d_geom *g, int32_t *tab);

/* x (c,h,w) -> col (c*kh*kw, oh*ow), rows ld floats apart. */
void dt_cpu_conv_table_im2col(const dt_conv2d_geom *g, const int32_t *tab, const float *x,
                              float *col, int64_t ld);

/* col (c*kh*kw, oh*ow), rows ld floats apart -> x (c,h,w) overwritten with
 * the sum of the entries that read each input, added tap by tap (the
 * order im2col's inverse adds in, so the sums are the same). */
void dt_cpu_conv_table_col2im(const dt_conv2d_geom *g, const int32_t *tab, const float *col,
                              int64_t ld, float *x);

/* C (M, N) = op(A) op(B) + beta C, row-major, the longer of M (rows) and
 * N (columns) split among nt threads, each a single-threaded sgemm. */
void dt_cpu_split_sgemm(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int M, int N, int K, const float *A,
                        int lda, const float *B, int ldb, float beta, float *C, int ldc, int nt);

/* The widest C that the convolution hands dt_cpu_skinny_sgemm: beyond it
 * the sgemm's packing pays for itself. */
#define DT_SKINNY_MAX_N 256

/* C (M, N) = op(A) B, row-major, overwritten, without packing
 * (core/cpu_skinny_gemm.c), for a short N: op(A) is A (M, K), lda floats
 * a row, or with trans_a A^T where A is (K, M); B is (K, N). The rows are
 * split among nt threads; every element is the same sum, in k order,
 * whatever nt is. Returns 1 when done, 0 when the CPU has no AVX-512F (or
 * dt_cpu_set_gemm_skinny switched it off): the caller then runs a sgemm. */
int dt_cpu_skinny_sgemm(int trans_a, int M, int N, int K, const float *A, int lda, const float *B,
                        int ldb, float *C, int ldc, int nt);

/* 1 when the CPU has AVX-512F and dt_cpu_set_gemm_skinny has not switched
 * the unpacked kernels (this one and the small-plane ones below) off. */
int dt_cpu_gemm_skinny_on(void);

/* The small-plane convolution that skips the padding (core/cpu_conv_small.c):
 * 1 when it takes g's forward (dx: its dx) (the unpacked kernels on, at
 * least 8 images, g's tap table and its inverse within DT_CONV_TABLE_MAX
 * entries, at most 64 taps, at least a fifth of the (tap, output pixel)
 * pairs on the padding; dx only at stride 1: at stride 2 each input pixel
 * takes a quarter of the taps, and the broadcasts outnumber the products,
 * 31 against 25 ms for resnet18-small's 7x7 -> 4x4 layer at batch 64). */
int dt_cpu_conv_small_usable(const dt_conv2d_geom *g, int dx);
/* y (n, oc, oh, ow) = conv(x, w) (+ bias) for the whole batch. */
dt_status dt_cpu_conv_small_forward(const dt_conv2d_geom *g, const float *x, const float *w,
                                    const float *bias, float *y, int nt);
/* dx (n, c, h, w) = the transposed convolution of dy with w, overwritten. */
dt_status dt_cpu_conv_small_dx(const dt_conv2d_geom *g, const float *w, const float *dy, float *dx,
                               int nt);

/* conv2d_forward / conv2d_backward on 16-bit x, w, y, dy, dx, dw
 * (cpu_kernels_conv_half.c): the f32 kernels on widened copies. */
dt_status dt_cpu_conv2d_half_forward(const dt_exec *ex, const dt_conv2d_geom *g, const void *x,
                                     const void *w, const float *bias, void *y, void *workspace);
dt_status dt_cpu_conv2d_half_backward(const dt_exec *ex, const dt_conv2d_geom *g, const void *x,
                                      const void *w, const void *dy, void *dx, void *dw, float *db,
                                      void *workspace);

#ifdef __cplusplus
}
#endif
#endif
