/* CPU kernels of the linear family (core/ops_linear.c): the f32 GEMM
 * (OpenBLAS), the 16-bit linear forward and gemm_rounded (16-bit results
 * through an f32 accumulator). The 16-bit GEMM is cpu_kernels_linear_half.c. */
#include <cblas.h>
#include <stdlib.h>
#include <string.h>

#include "core/cpu_internal.h"
#include "core/half.h"

#define MIN(a, b) ((a) < (b) ? (a) : (b))

/* ---- GEMM ---- */

static void gemm_one(int ta, int tb, int m, int n, int k, float alpha, const float *a, int lda,
                     const float *b, int ldb, float beta, float *c, int ldc) {
  if (k == 0) { /* C = beta*C; BLAS implementations disagree on k = 0 */
    for (int i = 0; i < m; i++)
      for (int j = 0; j < n; j++)
        c[(int64_t)i * ldc + j] = beta == 0.0f ? 0.0f : beta * c[(int64_t)i * ldc + j];
    return;
  }
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, m, n,
              k, alpha, a, lda, b, ldb, beta, c, ldc);
}

/* One product on nt threads, each a single-threaded sgemm (OpenBLAS runs
 * single-threaded inside a parallel region) on its share of C: columns
 * when m <= n, else rows, so that the operand each thread packs in full is
 * the smaller one. Up to the size of an MLP's or a small transformer's
 * layers, OpenBLAS's own threading (threads sharing packed panels, a wait
 * per panel) took up to 2x longer for these shapes; the shares need no
 * synchronisation but the region's end. Each element of C is the same dot
 * product over k as in one call. Returns 0 when the product is better left
 * to OpenBLAS (large, or too narrow to share). */
#define GEMM_SPLIT_MAX_MACS ((double)(1 << 27))
#define GEMM_SPLIT_ALIGN 16 /* columns or rows per share: a multiple of the SIMD width */

static int gemm_split(int ta, int tb, int m, int n, int k, float alpha, const float *a, int lda,
                      const float *b, int ldb, float beta, float *c, int ldc, int nt) {
  int by_cols = m <= n, len = by_cols ? n : m;
  if ((double)m * n * k > GEMM_SPLIT_MAX_MACS || len < 2 * GEMM_SPLIT_ALIGN)
    return 0;
  int parts = MIN(nt, len / GEMM_SPLIT_ALIGN);
#pragma omp parallel for num_threads(parts) schedule(static)
  for (int t = 0; t < parts; t++) {
    int i0 = (int)((int64_t)len * t / parts / GEMM_SPLIT_ALIGN * GEMM_SPLIT_ALIGN);
    int i1 = t + 1 == parts
                 ? len
                 : (int)((int64_t)len * (t + 1) / parts / GEMM_SPLIT_ALIGN * GEMM_SPLIT_ALIGN);
    if (by_cols) /* C[:, i0:i1] = op(A) op(B)[:, i0:i1] */
      gemm_one(ta, tb, m, i1 - i0, k, alpha, a, lda, b + (tb ? (int64_t)i0 * ldb : i0), ldb, beta,
               c + i0, ldc);
    else /* C[i0:i1, :] = op(A)[i0:i1, :] op(B) */
      gemm_one(ta, tb, i1 - i0, n, k, alpha, a + (ta ? i0 : (int64_t)i0 * lda), lda, b, ldb, beta,
               c + (int64_t)i0 * ldc, ldc);
  }
  return 1;
}

// A (m,k) or (k,m) if trans_a, B (k,n) or (n,k) if trans_b -> C (m,n), per batch;
// f16/bf16 A and B are widened to f32 (core/cpu_kernels_linear_half.c; C is f32 for every
// ex->dtype)
dt_status dt_cpu_gemm(const dt_exec *ex, bool trans_a, bool trans_b, int m, int n, int k,
                      float alpha, const float *a, int lda, int64_t stride_a, const float *b,
                      int ldb, int64_t stride_b, float beta, float *c, int ldc, int64_t stride_c,
                      int batch) {
  if (m == 0 || n == 0 || batch == 0)
    return DT_OK;
  if (dt_dtype_is_half(ex->dtype))
    return dt_cpu_half_gemm(ex, trans_a, trans_b, m, n, k, alpha, a, lda, stride_a, b, ldb,
                            stride_b, beta, c, ldc, stride_c, batch);
  int nt = dt_cpu_threads();
  /* Many small products (attention heads): one single-threaded sgemm per
   * OpenMP thread beats threading each small product. */
  if (batch > 1 && nt > 1 && batch >= nt && (double)m * n * k < (double)(1 << 24)) {
#pragma omp parallel for num_threads(nt) schedule(static)
    for (int i = 0; i < batch; i++)
      gemm_one(trans_a, trans_b, m, n, k, alpha, a + i * stride_a, lda, b + i * stride_b, ldb, beta,
               c + i * stride_c, ldc);
    return DT_OK;
  }
  if (batch == 1 && nt > 1 && k > 0 &&
      gemm_split(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc, nt))
    return DT_OK;
  for (int i = 0; i < batch; i++)
    gemm_one(trans_a, trans_b, m, n, k, alpha, a + i * stride_a, lda, b + i * stride_b, ldb, beta,
             c + i * stride_c, ldc);
  return DT_OK;
}

/* Rows per slice of the 16-bit linear forward: an eighth of y when it is
 * large (a language model's logits), so that its f32 accumulator and the
 * widened operands stay small next to y. */
static int64_t linear_slice_rows(int64_t m, int64_t n) {
  return m * n > ((int64_t)1 << 20) ? (m + 7) / 8 : m;
}

/* C (m, n) of ex->dtype (16-bit, leading dimension ldc) = alpha op(A)
 * op(B) (+ bias (n), 16-bit, or NULL), A and B 16-bit: per slice of rows an
 * f32 accumulator = bias, += the product (dt_cpu_gemm widens the
 * operands), rounded once into C. */
static dt_status gemm_rows_rounded(const dt_exec *ex, const char *what, bool trans_a, bool trans_b,
                                   int m, int n, int k, float alpha, const void *a, int lda,
                                   const void *b, int ldb, const void *bias, void *c, int ldc) {
  if (m == 0 || n == 0)
    return DT_OK;
  const dt_dtype dtype = ex->dtype;
  const size_t esize = dt_dtype_size(dtype);
  const int64_t chunk = linear_slice_rows(m, n);
  float *acc = malloc((size_t)(chunk * n) * sizeof(float));
  float *b32 = bias ? malloc((size_t)n * sizeof(float)) : NULL;
  dt_status st = DT_OK;
  if (!acc || (bias && !b32)) {
    st = DT_ERROR(DT_ERR_OOM, "%s: an f32 accumulator of %lld x %d: malloc failed", what,
                  (long long)chunk, n);
    goto done;
  }
  if (b32)
    DT_CHECK_GOTO(dt_half_to_f32(dtype, (const uint16_t *)bias, b32, n), st, done);
  for (int64_t r0 = 0; r0 < m; r0 += chunk) {
    const int rows = (int)(m - r0 < chunk ? m - r0 : chunk);
    if (b32)
      for (int i = 0; i < rows; i++)
        memcpy(acc + (int64_t)i * n, b32, (size_t)n * sizeof(float));
    if (k == 0 && !b32)
      memset(acc, 0, (size_t)rows * (size_t)n * sizeof(float));
    /* op(A)'s rows r0..: rows of A, or columns of A (k, m) when transposed */
    const size_t a_off = (size_t)(trans_a ? r0 : r0 * lda) * esize;
    if (k > 0)
      DT_CHECK_GOTO(dt_cpu_gemm(ex, trans_a, trans_b, rows, n, k, alpha,
                                (const float *)((const char *)a + a_off), lda, 0, b, ldb, 0,
                                b32 ? 1.0f : 0.0f, acc, n, 0, 1),
                    st, done);
    uint16_t *crow = (uint16_t *)((char *)c + (size_t)(r0 * ldc) * esize);
    if (ldc == n)
      DT_CHECK_GOTO(dt_half_from_f32(dtype, acc, crow, (int64_t)rows * n), st, done);
    else
      for (int i = 0; i < rows; i++)
        DT_CHECK_GOTO(dt_half_from_f32(dtype, acc + (int64_t)i * n, crow + (int64_t)i * ldc, n), st,
                      done);
  }
done:
  free(b32);
  free(acc);
  return st;
}

// x (m,k), w (n,k), bias (n) or NULL -> y (m,n), all 16-bit (ex->dtype); per slice of rows an
// f32 accumulator = bias, += x w^T (dt_cpu_gemm widens the operands), rounded once into y
dt_status dt_cpu_linear_forward(const dt_exec *ex, int m, int n, int k, const float *x,
                                const float *w, const float *bias, float *y) {
  return gemm_rows_rounded(ex, "linear_forward", false, true, m, n, k, 1.0f, x, k, w, k, bias, y,
                           n);
}

// A (m,k) or (k,m) if trans_a, B (k,n) or (n,k) if trans_b, 16-bit -> C (m,n) of ex->dtype,
// rounded once from an f32 accumulator per slice of rows
dt_status dt_cpu_gemm_rounded(const dt_exec *ex, bool trans_a, bool trans_b, int m, int n, int k,
                              float alpha, const float *a, int lda, const float *b, int ldb,
                              float *c, int ldc) {
  return gemm_rows_rounded(ex, "gemm_rounded", trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb,
                           NULL, c, ldc);
}

// x (m,k), w (n,k), bias (n) or NULL -> pre (m,n) as linear_forward, y (m,n) = gelu(pre), 16-bit:
// the two kernels the unfused ops run, so the same values bit for bit
dt_status dt_cpu_linear_gelu_forward(const dt_exec *ex, int m, int n, int k, const float *x,
                                     const float *w, const float *bias, float *pre, float *y) {
  DT_CHECK(dt_cpu_linear_forward(ex, m, n, k, x, w, bias, pre));
  return dt_cpu_unary_forward(ex, DT_UNARY_GELU, (int64_t)m * n, pre, y);
}

// g (m,k) @ w (k,n) rounded to 16 bits (gemm_rounded), then dpre (m,n) = that * gelu'(pre) rounded
// once more (unary_backward, in place): the unfused ops' values bit for bit
dt_status dt_cpu_gemm_dgelu(const dt_exec *ex, int m, int n, int k, const float *g, const float *w,
                            const float *pre, float *dpre) {
  DT_CHECK(dt_cpu_gemm_rounded(ex, false, false, m, n, k, 1.0f, g, k, w, n, dpre, n));
  return dt_cpu_unary_backward(ex, DT_UNARY_GELU, (int64_t)m * n, pre, dpre, dpre);
}
