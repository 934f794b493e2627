/* CPU dense kernels: GEMM (OpenBLAS), elementwise ops, reductions, casts and
 * strided copies. Reductions accumulate in double in fixed-size chunks, so a
 * result does not depend on the thread count. */
#include <cblas.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/cpu_internal.h"
#include "core/half.h"

#define MIN(a, b) ((a) < (b) ? (a) : (b))
#define MAX(a, b) ((a) > (b) ? (a) : (b))

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
// f16/bf16 A and B are widened to f32 (core/cpu_kernels_gemm_half.c; C is f32 for every
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
static dt_status gemm_rows_rounded(const dt_exec *ex, const char *what, bool trans_a,
                                   bool trans_b, int m, int n, int k, float alpha, const void *a,
                                   int lda, const void *b, int ldb, const void *bias, void *c,
                                   int ldc) {
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

/* ---- strided iteration shared by binary and copy_strided ---- */

/* Position of the iteration at flat index `start`: multi-index and the
 * three operand offsets. */
typedef struct strided_cursor {
  int64_t idx[DT_MAX_DIMS];
  int64_t o0, o1, o2;
} strided_cursor;

static void cursor_seek(const dt_strided_plan *p, int64_t start, strided_cursor *c) {
  c->o0 = c->o1 = c->o2 = 0;
  for (int d = p->ndim - 1; d >= 0; d--) {
    c->idx[d] = start % p->shape[d];
    start /= p->shape[d];
    c->o0 += c->idx[d] * p->s[0][d];
    c->o1 += c->idx[d] * p->s[1][d];
    c->o2 += c->idx[d] * p->s[2][d];
  }
}

/* Advances by `len` elements along the innermost dim (never past its end). */
static void cursor_advance(const dt_strided_plan *p, strided_cursor *c, int64_t len) {
  int last = p->ndim - 1;
  c->idx[last] += len;
  c->o0 += len * p->s[0][last];
  c->o1 += len * p->s[1][last];
  c->o2 += len * p->s[2][last];
  if (c->idx[last] < p->shape[last])
    return;
  for (int d = last; d >= 0; d--) {
    if (d < last) {
      c->idx[d]++;
      c->o0 += p->s[0][d];
      c->o1 += p->s[1][d];
      c->o2 += p->s[2][d];
    }
    if (c->idx[d] < p->shape[d])
      return;
    c->o0 -= c->idx[d] * p->s[0][d];
    c->o1 -= c->idx[d] * p->s[1][d];
    c->o2 -= c->idx[d] * p->s[2][d];
    c->idx[d] = 0;
  }
}

/* Number of equal flat ranges to split `numel` elements into: none smaller
 * than half the parallel threshold, a few per thread for balance. */
static int64_t flat_chunks(int64_t numel, int nt) {
  int64_t c = numel / (DT_CPU_PAR_MIN / 2);
  return MAX(1, MIN(c, (int64_t)nt * 4));
}

/* ---- binary ---- */

#define BIN_LOOP(EXPR)                      \
  do {                                      \
    if (sa == 1 && sb == 1)                 \
      for (int64_t i = 0; i < len; i++) {   \
        float u = a[i], v = b[i];           \
        out[i] = (EXPR);                    \
      }                                     \
    else if (sa == 1 && sb == 0) {          \
      float v = b[0];                       \
      for (int64_t i = 0; i < len; i++) {   \
        float u = a[i];                     \
        out[i] = (EXPR);                    \
      }                                     \
    } else if (sa == 0 && sb == 1) {        \
      float u = a[0];                       \
      for (int64_t i = 0; i < len; i++) {   \
        float v = b[i];                     \
        out[i] = (EXPR);                    \
      }                                     \
    } else                                  \
      for (int64_t i = 0; i < len; i++) {   \
        float u = a[i * sa], v = b[i * sb]; \
        out[i] = (EXPR);                    \
      }                                     \
  } while (0)

static void binary_inner(dt_binary_op op, const float *a, int64_t sa, const float *b, int64_t sb,
                         float *out, int64_t len) {
  switch (op) {
    case DT_BINARY_ADD: BIN_LOOP(u + v); break;
    case DT_BINARY_SUB: BIN_LOOP(u - v); break;
    case DT_BINARY_MUL: BIN_LOOP(u * v); break;
    case DT_BINARY_DIV: BIN_LOOP(u / v); break;
  }
}

static void binary_range(const dt_strided_plan *p, dt_binary_op op, const float *a, const float *b,
                         float *out, int64_t start, int64_t end) {
  strided_cursor c;
  cursor_seek(p, start, &c);
  int last = p->ndim - 1;
  for (int64_t pos = start; pos < end;) {
    int64_t len = MIN(p->shape[last] - c.idx[last], end - pos);
    binary_inner(op, a + c.o1, p->s[1][last], b + c.o2, p->s[2][last], out + pos, len);
    pos += len;
    cursor_advance(p, &c, len);
  }
}

// out (shape) = a (shape, a_strides) op b (shape, b_strides), out contiguous
dt_status dt_cpu_binary(const dt_exec *ex, const dt_binary_args *args, const float *a,
                        const float *b, float *out) {
  (void)ex;
  dt_strided_plan p;
  dt_binary_plan(args, &p);
  if (p.numel == 0)
    return DT_OK;
  if (p.numel < DT_CPU_PAR_MIN) {
    binary_range(&p, args->op, a, b, out, 0, p.numel);
    return DT_OK;
  }
  int nt = dt_cpu_threads();
  int64_t chunks = flat_chunks(p.numel, nt);
#pragma omp parallel for num_threads(nt) schedule(static)
  for (int64_t ci = 0; ci < chunks; ci++)
    binary_range(&p, args->op, a, b, out, p.numel * ci / chunks, p.numel * (ci + 1) / chunks);
  return DT_OK;
}

/* ---- elementwise ---- */

// x (n) = value
dt_status dt_cpu_fill(const dt_exec *ex, float *x, float value, int64_t n) {
  (void)ex;
  int nt = dt_cpu_threads();
#pragma omp parallel for simd if (parallel : n >= DT_CPU_PAR_MIN) num_threads(nt) schedule(static)
  for (int64_t i = 0; i < n; i++)
    x[i] = value;
  return DT_OK;
}

// y (n) = alpha * x + beta * y
dt_status dt_cpu_axpby(const dt_exec *ex, int64_t n, float alpha, const float *x, float beta,
                       float *y) {
  if (dt_dtype_is_half(ex->dtype))
    return dt_cpu_half_axpby(ex, n, alpha, x, beta, y);
  int nt = dt_cpu_threads();
  if (beta == 0.0f) {
#pragma omp parallel for simd if (parallel : n >= DT_CPU_PAR_MIN) num_threads(nt) schedule(static)
    for (int64_t i = 0; i < n; i++)
      y[i] = alpha * x[i];
  } else {
#pragma omp parallel for simd if (parallel : n >= DT_CPU_PAR_MIN) num_threads(nt) schedule(static)
    for (int64_t i = 0; i < n; i++)
      y[i] = alpha * x[i] + beta * y[i];
  }
  return DT_OK;
}

#define UNARY_BLOCK 4096 /* elements per call of a vectorised function (core/cpu_math.c) */

// y (n) = f(x)
dt_status dt_cpu_unary_forward(const dt_exec *ex, dt_unary_op op, int64_t n, const float *x,
                               float *y) {
  if (dt_dtype_is_half(ex->dtype))
    return dt_cpu_half_unary_forward(ex, op, n, x, y);
  int nt = dt_cpu_threads();
  switch (op) {
    case DT_UNARY_RELU:
#pragma omp parallel for simd if (parallel : n >= DT_CPU_PAR_MIN) num_threads(nt) schedule(static)
      for (int64_t i = 0; i < n; i++)
        y[i] = x[i] < 0.0f ? 0.0f : x[i]; /* NaN propagates, as torch.relu */
      return DT_OK;
    case DT_UNARY_GELU:
#pragma omp parallel for if (n >= DT_CPU_PAR_MIN / 8) num_threads(nt) schedule(static)
      for (int64_t i0 = 0; i0 < n; i0 += UNARY_BLOCK)
        dt_cpu_gelu(x + i0, y + i0, MIN(UNARY_BLOCK, n - i0));
      return DT_OK;
    case DT_UNARY_TANH:
#pragma omp parallel for if (n >= DT_CPU_PAR_MIN / 8) num_threads(nt) schedule(static)
      for (int64_t i = 0; i < n; i++)
        y[i] = tanhf(x[i]);
      return DT_OK;
  }
  return DT_ERROR(DT_ERR_INVALID_ARG, "unary_forward: unknown op %d", (int)op);
}

// dx (n) = dy * f'(x), overwritten
dt_status dt_cpu_unary_backward(const dt_exec *ex, dt_unary_op op, int64_t n, const float *x,
                                const float *dy, float *dx) {
  if (dt_dtype_is_half(ex->dtype))
    return dt_cpu_half_unary_backward(ex, op, n, x, dy, dx);
  int nt = dt_cpu_threads();
  switch (op) {
    case DT_UNARY_RELU:
#pragma omp parallel for simd if (parallel : n >= DT_CPU_PAR_MIN) num_threads(nt) schedule(static)
      for (int64_t i = 0; i < n; i++) {
        float g = dy[i]; /* loaded unconditionally so that the select vectorizes */
        dx[i] = x[i] > 0.0f ? g : 0.0f;
      }
      return DT_OK;
    case DT_UNARY_GELU:
#pragma omp parallel for if (n >= DT_CPU_PAR_MIN / 8) num_threads(nt) schedule(static)
      for (int64_t i0 = 0; i0 < n; i0 += UNARY_BLOCK)
        dt_cpu_gelu_backward(x + i0, dy + i0, dx + i0, MIN(UNARY_BLOCK, n - i0));
      return DT_OK;
    case DT_UNARY_TANH:
#pragma omp parallel for if (n >= DT_CPU_PAR_MIN / 8) num_threads(nt) schedule(static)
      for (int64_t i = 0; i < n; i++) {
        float t = tanhf(x[i]);
        dx[i] = dy[i] * (1.0f - t * t);
      }
      return DT_OK;
  }
  return DT_ERROR(DT_ERR_INVALID_ARG, "unary_backward: unknown op %d", (int)op);
}

/* ---- reductions ---- */

/* Sum of a contiguous run in double, four accumulators for throughput
 * (lane j sums x[i + j]; the lanes are independent, so they vectorize
 * without reassociating anything). */
double dt_cpu_sum_contiguous(const float *x, int64_t n) {
  double s[4] = {0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 4 <= n; i += 4) {
#pragma omp simd
    for (int j = 0; j < 4; j++)
      s[j] += x[i + j];
  }
  for (; i < n; i++)
    s[0] += x[i];
  return (s[0] + s[1]) + (s[2] + s[3]);
}

static double sum_squares_contiguous(const float *x, int64_t n) {
  double s0 = 0, s1 = 0, s2 = 0, s3 = 0;
  int64_t i = 0;
  for (; i + 4 <= n; i += 4) {
    s0 += (double)x[i] * x[i];
    s1 += (double)x[i + 1] * x[i + 1];
    s2 += (double)x[i + 2] * x[i + 2];
    s3 += (double)x[i + 3] * x[i + 3];
  }
  for (; i < n; i++)
    s0 += (double)x[i] * x[i];
  return (s0 + s1) + (s2 + s3);
}

#define RED_CHUNK 65536 /* elements per partial sum of a long run */
#define RED_BLOCK 256   /* inner elements per task of a strided reduction */

/* A long contiguous run summed as fixed chunks in parallel, then the chunk
 * sums in order: the result is independent of the thread count. */
static dt_status sum_long_run(const float *x, int64_t n, int squares, double *out) {
  int64_t chunks = (n + RED_CHUNK - 1) / RED_CHUNK;
  if (chunks <= 1) {
    *out = squares ? sum_squares_contiguous(x, n) : dt_cpu_sum_contiguous(x, n);
    return DT_OK;
  }
  double *part = malloc((size_t)chunks * sizeof *part);
  if (!part)
    return DT_ERROR(DT_ERR_OOM, "reduction scratch of %lld doubles: malloc failed",
                    (long long)chunks);
  int nt = dt_cpu_threads();
#pragma omp parallel for num_threads(nt) schedule(static)
  for (int64_t ci = 0; ci < chunks; ci++) {
    int64_t s = ci * RED_CHUNK, len = MIN(RED_CHUNK, n - s);
    part[ci] = squares ? sum_squares_contiguous(x + s, len) : dt_cpu_sum_contiguous(x + s, len);
  }
  double acc = 0;
  for (int64_t ci = 0; ci < chunks; ci++)
    acc += part[ci];
  free(part);
  *out = acc;
  return DT_OK;
}

// x (outer, r, inner) -> y (outer, inner) = scale * sum_r x
dt_status dt_cpu_reduce_sum(const dt_exec *ex, const float *x, float *y, int64_t outer, int64_t r,
                            int64_t inner, float scale) {
  (void)ex;
  if (outer == 0 || inner == 0)
    return DT_OK;
  int nt = dt_cpu_threads();
  int par = outer * r * inner >= DT_CPU_PAR_MIN;
  if (inner == 1) {
    if (outer == 1) {
      double s;
      DT_CHECK(sum_long_run(x, r, 0, &s));
      y[0] = (float)(s * scale);
      return DT_OK;
    }
#pragma omp parallel for if (par) num_threads(nt) schedule(static)
    for (int64_t o = 0; o < outer; o++)
      y[o] = (float)(dt_cpu_sum_contiguous(x + o * r, r) * scale);
    return DT_OK;
  }
  /* Tasks: (outer index, block of RED_BLOCK inner columns), each summing
   * down r with double accumulators. */
  int64_t blocks = (inner + RED_BLOCK - 1) / RED_BLOCK;
#pragma omp parallel for if (par) num_threads(nt) schedule(static)
  for (int64_t task = 0; task < outer * blocks; task++) {
    int64_t o = task / blocks, i0 = (task % blocks) * RED_BLOCK;
    int64_t len = MIN(RED_BLOCK, inner - i0);
    double acc[RED_BLOCK];
    for (int64_t i = 0; i < len; i++)
      acc[i] = 0.0;
    const float *base = x + o * r * inner + i0;
    for (int64_t k = 0; k < r; k++) {
      const float *row = base + k * inner;
#pragma omp simd
      for (int64_t i = 0; i < len; i++)
        acc[i] += row[i];
    }
    float *dst = y + o * inner + i0;
    for (int64_t i = 0; i < len; i++)
      dst[i] = (float)(acc[i] * scale);
  }
  return DT_OK;
}

// y (outer, inner) -> x (outer, r, inner) = scale * y
dt_status dt_cpu_broadcast_axis(const dt_exec *ex, const float *y, float *x, int64_t outer,
                                int64_t r, int64_t inner, float scale) {
  (void)ex;
  int nt = dt_cpu_threads();
#pragma omp parallel for if (outer * r * inner >= DT_CPU_PAR_MIN) num_threads(nt) schedule(static)
  for (int64_t row = 0; row < outer * r; row++) {
    const float *src = y + (row / (r ? r : 1)) * inner;
    float *dst = x + row * inner;
#pragma omp simd
    for (int64_t i = 0; i < inner; i++)
      dst[i] = scale * src[i];
  }
  return DT_OK;
}

// x (n) -> *out = sum x^2 (double)
dt_status dt_cpu_sum_squares(const dt_exec *ex, const float *x, int64_t n, double *out) {
  (void)ex;
  return sum_long_run(x, n, 1, out);
}

/* ---- casts ---- */

#define CAST_BLOCK 1024

static int dtype_is_int(dt_dtype t) {
  return t == DT_DTYPE_I32 || t == DT_DTYPE_I64 || t == DT_DTYPE_U8;
}

/* Float to integer truncates toward zero like C and PyTorch, saturating at
 * the int64 range (NaN -> 0) instead of invoking undefined behaviour. */
static int64_t f64_to_i64(double v) {
  if (v != v)
    return 0;
  if (v >= 9223372036854775807.0)
    return INT64_MAX;
  if (v <= -9223372036854775808.0)
    return INT64_MIN;
  return (int64_t)v;
}

static void load_f64(const void *in, dt_dtype t, int64_t s, int64_t n, double *v) {
  switch (t) {
    case DT_DTYPE_F32:
      for (int64_t i = 0; i < n; i++)
        v[i] = ((const float *)in)[s + i];
      break;
    case DT_DTYPE_F16:
      for (int64_t i = 0; i < n; i++)
        v[i] = dt_f16_to_f32(((const uint16_t *)in)[s + i]);
      break;
    case DT_DTYPE_BF16:
      for (int64_t i = 0; i < n; i++)
        v[i] = dt_bf16_to_f32(((const uint16_t *)in)[s + i]);
      break;
    default: break;
  }
}

static void load_i64(const void *in, dt_dtype t, int64_t s, int64_t n, int64_t *v) {
  switch (t) {
    case DT_DTYPE_I32:
      for (int64_t i = 0; i < n; i++)
        v[i] = ((const int32_t *)in)[s + i];
      break;
    case DT_DTYPE_I64:
      for (int64_t i = 0; i < n; i++)
        v[i] = ((const int64_t *)in)[s + i];
      break;
    case DT_DTYPE_U8:
      for (int64_t i = 0; i < n; i++)
        v[i] = ((const uint8_t *)in)[s + i];
      break;
    default: break;
  }
}

/* Stores float values; `fv` holds them as f32 already rounded once. */
static void store_float(void *out, dt_dtype t, int64_t s, int64_t n, const float *fv) {
  switch (t) {
    case DT_DTYPE_F32: memcpy((float *)out + s, fv, (size_t)n * sizeof(float)); break;
    case DT_DTYPE_F16:
    case DT_DTYPE_BF16: (void)dt_half_from_f32(t, fv, (uint16_t *)out + s, n); break;
    default: break;
  }
}

/* Integers wrap modulo 2^bits when narrowed, as PyTorch. */
static void store_int(void *out, dt_dtype t, int64_t s, int64_t n, const int64_t *iv) {
  switch (t) {
    case DT_DTYPE_I32:
      for (int64_t i = 0; i < n; i++)
        ((int32_t *)out)[s + i] = (int32_t)(uint32_t)iv[i];
      break;
    case DT_DTYPE_I64: memcpy((int64_t *)out + s, iv, (size_t)n * sizeof(int64_t)); break;
    case DT_DTYPE_U8:
      for (int64_t i = 0; i < n; i++)
        ((uint8_t *)out)[s + i] = (uint8_t)iv[i];
      break;
    default: break;
  }
}

static void cast_block(const void *in, dt_dtype src, void *out, dt_dtype dst, int64_t s,
                       int64_t n) {
  double dv[CAST_BLOCK];
  int64_t iv[CAST_BLOCK];
  float fv[CAST_BLOCK];
  if (src == DT_DTYPE_F32 && !dtype_is_int(dst)) { /* the hot f32 -> f16/bf16 path */
    store_float(out, dst, s, n, (const float *)in + s);
    return;
  }
  if (dst == DT_DTYPE_F32 && dt_dtype_is_half(src)) { /* and back: exact, no need for f64 */
    (void)dt_half_to_f32(src, (const uint16_t *)in + s, (float *)out + s, n);
    return;
  }
  if (dtype_is_int(src)) {
    load_i64(in, src, s, n, iv);
    if (dtype_is_int(dst)) {
      store_int(out, dst, s, n, iv);
      return;
    }
    for (int64_t i = 0; i < n; i++)
      fv[i] = (float)iv[i];
    store_float(out, dst, s, n, fv);
    return;
  }
  load_f64(in, src, s, n, dv);
  if (dtype_is_int(dst)) {
    for (int64_t i = 0; i < n; i++)
      iv[i] = f64_to_i64(dv[i]);
    store_int(out, dst, s, n, iv);
    return;
  }
  for (int64_t i = 0; i < n; i++)
    fv[i] = (float)dv[i];
  store_float(out, dst, s, n, fv);
}

// in (n, src dtype) -> out (n, dst dtype)
dt_status dt_cpu_cast(const dt_exec *ex, const void *in, dt_dtype src, void *out, dt_dtype dst,
                      int64_t n) {
  (void)ex;
  if (n <= 0)
    return DT_OK;
  if (src == dst) {
    if (in != out)
      memmove(out, in, (size_t)n * dt_dtype_size(src));
    return DT_OK;
  }
  int nt = dt_cpu_threads();
  int64_t blocks = (n + CAST_BLOCK - 1) / CAST_BLOCK;
#pragma omp parallel for if (n >= DT_CPU_PAR_MIN) num_threads(nt) schedule(static)
  for (int64_t bi = 0; bi < blocks; bi++)
    cast_block(in, src, out, dst, bi * CAST_BLOCK, MIN(CAST_BLOCK, n - bi * CAST_BLOCK));
  return DT_OK;
}

/* ---- strided copy ---- */

#define COPY_LOOP(T)                         \
  do {                                       \
    T *d = (T *)dst;                         \
    const T *s = (const T *)src;             \
    if (ds == 1 && ss == 1)                  \
      memcpy(d, s, (size_t)len * sizeof(T)); \
    else                                     \
      for (int64_t i = 0; i < len; i++)      \
        d[i * ds] = s[i * ss];               \
  } while (0)

static void copy_inner(char *dst, int64_t ds, const char *src, int64_t ss, int64_t len, size_t es) {
  switch (es) {
    case 1: COPY_LOOP(uint8_t); break;
    case 2: COPY_LOOP(uint16_t); break;
    case 4: COPY_LOOP(uint32_t); break;
    case 8: COPY_LOOP(uint64_t); break;
    default:
      for (int64_t i = 0; i < len; i++)
        memcpy(dst + i * ds * (int64_t)es, src + i * ss * (int64_t)es, es);
      break;
  }
}

static void copy_range(const dt_strided_plan *p, char *dst, const char *src, size_t es,
                       int64_t start, int64_t end) {
  strided_cursor c;
  cursor_seek(p, start, &c);
  int last = p->ndim - 1;
  for (int64_t pos = start; pos < end;) {
    int64_t len = MIN(p->shape[last] - c.idx[last], end - pos);
    copy_inner(dst + c.o0 * (int64_t)es, p->s[0][last], src + c.o1 * (int64_t)es, p->s[1][last],
               len, es);
    pos += len;
    cursor_advance(p, &c, len);
  }
}

// src (shape, src_strides) -> dst (shape, dst_strides), elements of elem_size bytes
dt_status dt_cpu_copy_strided(const dt_exec *ex, void *dst, const int64_t *dst_strides,
                              const void *src, const int64_t *src_strides, const int64_t *shape,
                              int ndim, size_t elem_size) {
  (void)ex;
  int64_t zeros[DT_MAX_DIMS] = {0};
  dt_strided_plan p;
  dt_strided_plan_build(&p, ndim, shape, dst_strides, src_strides, zeros);
  if (p.numel == 0)
    return DT_OK;
  if (p.numel < DT_CPU_PAR_MIN) {
    copy_range(&p, dst, src, elem_size, 0, p.numel);
    return DT_OK;
  }
  int nt = dt_cpu_threads();
  int64_t chunks = flat_chunks(p.numel, nt);
#pragma omp parallel for num_threads(nt) schedule(static)
  for (int64_t ci = 0; ci < chunks; ci++)
    copy_range(&p, dst, src, elem_size, p.numel * ci / chunks, p.numel * (ci + 1) / chunks);
  return DT_OK;
}
