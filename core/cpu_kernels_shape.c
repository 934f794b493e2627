/* CPU reductions (core/ops_shape.c's sum and mean, the broadcasts' and the
 * bias's gradients, the gradient norm): they accumulate in double in
 * fixed-size chunks, so a result does not depend on the thread count. */
#include <stdlib.h>

#include "core/cpu_internal.h"
#include "core/half.h"

#define MIN(a, b) ((a) < (b) ? (a) : (b))

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

static dt_status reduce_sum_f32(const float *x, float *y, int64_t outer, int64_t r, int64_t inner,
                                float scale);

/* 16-bit x: widened a slab of whole (r, inner) planes at a time (at most
 * 2^20 floats when a plane fits), each slab reduced as f32 */
static dt_status reduce_sum_half(dt_dtype t, const uint16_t *x, float *y, int64_t outer, int64_t r,
                                 int64_t inner, float scale) {
  int64_t plane = r * inner,
          per = plane > 0 && plane < ((int64_t)1 << 20) ? ((int64_t)1 << 20) / plane : 1;
  int64_t rows = MIN(per, outer);
  float *buf = malloc((size_t)(rows * plane > 0 ? rows * plane : 1) * sizeof(float));
  if (!buf)
    return DT_ERROR(DT_ERR_OOM, "reduce_sum: widening %lld elements: malloc failed",
                    (long long)(rows * plane));
  dt_status st = DT_OK;
  for (int64_t o = 0; o < outer && st == DT_OK; o += rows) {
    int64_t n = MIN(rows, outer - o);
    st = dt_half_to_f32(t, x + o * plane, buf, n * plane);
    if (st == DT_OK)
      st = reduce_sum_f32(buf, y + o * inner, n, r, inner, scale);
  }
  free(buf);
  return st;
}

// x (outer, r, inner) of ex->dtype -> y (outer, inner) f32 = scale * sum_r x
dt_status dt_cpu_reduce_sum(const dt_exec *ex, const float *x, float *y, int64_t outer, int64_t r,
                            int64_t inner, float scale) {
  if (dt_dtype_is_half(ex->dtype) && outer > 0 && inner > 0)
    return reduce_sum_half(ex->dtype, (const uint16_t *)x, y, outer, r, inner, scale);
  return reduce_sum_f32(x, y, outer, r, inner, scale);
}

static dt_status reduce_sum_f32(const float *x, float *y, int64_t outer, int64_t r, int64_t inner,
                                float scale) {
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
