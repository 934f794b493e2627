/* The CPU's 16-bit GEMM: A and B hold f16/bf16 elements, C is f32. The CPU
 * stores 16-bit and computes in f32, so the operands are widened and
 * multiplied by the f32 sgemm, in the backend's kernel scratch
 * (dt_cpu_scratch_acquire): reused from step to step without page faults,
 * given back by dt_empty_cache, and private to the call (data-parallel
 * replicas run GEMMs on several threads at once).
 *
 * When one operand is large, it is widened a panel at a time (columns of C
 * for B, rows of C for A), a panel small enough to stay in cache, and the
 * panel's product is computed right after it is widened: its f32 copy does
 * not go through memory, and the panels run on the kernel threads side by
 * side. Panels split C, never k: every element of C is the same dot product
 * over k, in the same order, as one sgemm of the whole widened operands. */
#include <cblas.h>
#include <omp.h>

#include "core/cpu_internal.h"
#include "core/half.h"

#define MIN(a, b) ((a) < (b) ? (a) : (b))
#define MAX(a, b) ((a) > (b) ? (a) : (b))

/* Below this many elements in A and B together both are widened whole:
 * they fit in cache anyway. */
#define HALF_GEMM_WHOLE_MAX ((int64_t)1 << 19)
/* A panel holds about this many elements (1 MiB of f32, half an L2)... */
#define HALF_GEMM_PANEL_ELEMS ((int64_t)1 << 18)
/* ...and at least this many rows or columns, a multiple of the SIMD width:
 * each panel's sgemm packs the other operand again, so narrow panels
 * would spend their time copying it. */
#define HALF_GEMM_PANEL_MIN 128
#define HALF_GEMM_WIDEN_CHUNK ((int64_t)1 << 16) /* elements per task of a parallel widening */

/* Elements a matrix operand spans: `rows` rows of `ld`, the last one
 * `cols` long, in each of `batch` matrices `stride` apart. */
static int64_t operand_extent(int rows, int cols, int ld, int64_t stride, int batch) {
  if (rows == 0 || cols == 0)
    return 0;
  return (int64_t)(rows - 1) * ld + cols + (int64_t)(batch - 1) * stride;
}

/* x (n) widened into out (n), on the kernel threads when it is long. */
static void widen_parallel(dt_dtype dtype, const uint16_t *x, float *out, int64_t n) {
  int64_t chunks = (n + HALF_GEMM_WIDEN_CHUNK - 1) / HALF_GEMM_WIDEN_CHUNK;
#pragma omp parallel for if (n >= DT_CPU_PAR_MIN) num_threads(dt_cpu_threads()) schedule(static)
  for (int64_t c = 0; c < chunks; c++) {
    int64_t i0 = c * HALF_GEMM_WIDEN_CHUNK;
    (void)dt_half_to_f32(dtype, x + i0, out + i0, MIN(HALF_GEMM_WIDEN_CHUNK, n - i0));
  }
}

/* Lines [i0, i0 + w) of an operand widened into the packed panel `buf`:
 * when the lines are stored rows (A not transposed, B transposed) each is
 * k long, else each of the k stored rows contributes its columns
 * [i0, i0 + w). Returns the panel's leading dimension. */
static int widen_panel(dt_dtype dtype, const uint16_t *x, int ld, bool lines_are_rows, int i0,
                       int w, int k, float *buf) {
  if (lines_are_rows) {
    if (ld == k)
      (void)dt_half_to_f32(dtype, x + (int64_t)i0 * ld, buf, (int64_t)w * k);
    else
      for (int r = 0; r < w; r++)
        (void)dt_half_to_f32(dtype, x + (int64_t)(i0 + r) * ld, buf + (int64_t)r * k, k);
    return k;
  }
  for (int p = 0; p < k; p++)
    (void)dt_half_to_f32(dtype, x + (int64_t)p * ld + i0, buf + (int64_t)p * w, w);
  return w;
}

/* C (m, n) = alpha op(A) op(B) + beta C, one matrix, the larger operand
 * (`panel_b`: B, by columns of C; else A, by rows) widened w lines at a
 * time, the other one (`whole`, widened already) in full. */
static void gemm_panels(dt_dtype dtype, bool ta, bool tb, int m, int n, int k, float alpha,
                        const uint16_t *a, int lda, const uint16_t *b, int ldb, float beta,
                        float *c, int ldc, bool panel_b, const float *whole, int w, int parts,
                        float *panel_ws) {
  const int len = panel_b ? n : m, panels = (len + w - 1) / w;
#pragma omp parallel for num_threads(parts) schedule(static)
  for (int p = 0; p < panels; p++) {
    float *buf = panel_ws + (int64_t)omp_get_thread_num() * w * k;
    int i0 = p * w, cw = MIN(w, len - i0);
    if (panel_b) { /* C[:, i0:i0+cw] = op(A) op(B)[:, i0:i0+cw] */
      int ld = widen_panel(dtype, b, ldb, tb, i0, cw, k, buf);
      cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, m,
                  cw, k, alpha, whole, lda, buf, ld, beta, c + i0, ldc);
    } else { /* C[i0:i0+cw, :] = op(A)[i0:i0+cw, :] op(B) */
      int ld = widen_panel(dtype, a, lda, !ta, i0, cw, k, buf);
      cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, cw,
                  n, k, alpha, buf, ld, whole, ldb, beta, c + (int64_t)i0 * ldc, ldc);
    }
  }
}

// A (m,k) or (k,m) if trans_a, B (k,n) or (n,k) if trans_b, 16-bit -> C (m,n) f32, per batch
dt_status dt_cpu_half_gemm(const dt_exec *ex, bool trans_a, bool trans_b, int m, int n, int k,
                           float alpha, const void *a, int lda, int64_t stride_a, const void *b,
                           int ldb, int64_t stride_b, float beta, float *c, int ldc,
                           int64_t stride_c, int batch) {
  const dt_dtype dtype = ex->dtype;
  dt_exec ex32 = *ex;
  ex32.dtype = DT_DTYPE_F32;
  const int64_t ext_a = operand_extent(trans_a ? k : m, trans_a ? m : k, lda, stride_a, batch);
  const int64_t ext_b = operand_extent(trans_b ? n : k, trans_b ? k : n, ldb, stride_b, batch);
  const bool panel_b = ext_b >= ext_a;
  const int len = panel_b ? n : m;
  const int w = (int)MAX(HALF_GEMM_PANEL_MIN, HALF_GEMM_PANEL_ELEMS / MAX(k, 1) / 16 * 16);
  const int panels = (len + w - 1) / w;
  dt_cpu_scratch *scratch = NULL;
  void *mem = NULL;
  float *ws;
  dt_status st;

  if (batch > 1 || k == 0 || ext_a + ext_b <= HALF_GEMM_WHOLE_MAX || panels < 2) {
    /* both whole: the f32 GEMM (its threading) on the widened operands */
    DT_CHECK(dt_cpu_scratch_acquire((size_t)(ext_a + ext_b) * sizeof(float), &scratch, &mem));
    ws = mem;
    widen_parallel(dtype, a, ws, ext_a);
    widen_parallel(dtype, b, ws + ext_a, ext_b);
    st = dt_cpu_gemm(&ex32, trans_a, trans_b, m, n, k, alpha, ws, lda, stride_a, ws + ext_a, ldb,
                     stride_b, beta, c, ldc, stride_c, batch);
    dt_cpu_scratch_release(scratch);
    return st;
  }
  const int parts = MIN(dt_cpu_threads(), panels);
  const int64_t ext_whole = panel_b ? ext_a : ext_b;
  const int64_t floats = ext_whole + (int64_t)parts * w * k;
  DT_CHECK(dt_cpu_scratch_acquire((size_t)floats * sizeof(float), &scratch, &mem));
  ws = mem;
  widen_parallel(dtype, panel_b ? a : b, ws, ext_whole);
  gemm_panels(dtype, trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc, panel_b, ws, w,
              parts, ws + ext_whole);
  dt_cpu_scratch_release(scratch);
  return DT_OK;
}
