/* Row helpers shared by the CPU's row kernels (softmax, the losses, the
 * embedding), vectorised; declared in core/cpu_internal.h. */
#include <math.h>

#include "core/cpu_internal.h"

#define MIN(a, b) ((a) < (b) ? (a) : (b))

/* ---- row helpers, vectorised (the exponentials: core/cpu_math.c) ---- */

#define EXP_BLOCK 512 /* elements per block of a row's exponentials */

/* max of x[0..n) (NaN propagates as in the reference loops: ignored) */
DT_CPU_CLONES float dt_cpu_row_max(const float *x, int64_t n) {
  float mx = -INFINITY;
#pragma omp simd reduction(max : mx)
  for (int64_t j = 0; j < n; j++)
    mx = x[j] > mx ? x[j] : mx;
  return mx;
}

/* sum over j < n of exp(x[j] - mx), in double with eight lanes (lane l
 * sums j = l mod 8 of each block; a fixed order), the exponentials written
 * to e (which may be x) when e is not NULL. */
DT_CPU_CLONES double dt_cpu_row_exp_sum(const float *x, int64_t n, float mx, float *e) {
  double acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  float tmp[EXP_BLOCK];
  for (int64_t j0 = 0; j0 < n; j0 += EXP_BLOCK) {
    int64_t len = MIN(EXP_BLOCK, n - j0);
    float *eb = e ? e + j0 : tmp;
    const float *xb = x + j0;
    dt_cpu_exp_shifted(xb, mx, 1.0f, eb, len);
    int64_t k = 0;
    for (; k + 8 <= len; k += 8) {
#pragma omp simd
      for (int l = 0; l < 8; l++)
        acc[l] += eb[k + l];
    }
    for (; k < len; k++)
      acc[k & 7] += eb[k];
  }
  return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

/* x[j] *= a */
DT_CPU_CLONES void dt_cpu_row_scale(float *x, float a, int64_t n) {
#pragma omp simd
  for (int64_t j = 0; j < n; j++)
    x[j] *= a;
}

/* Element i of an i32 or i64 index array (class ids, embedding ids). */
int64_t dt_cpu_index_at(const void *idx, dt_dtype dt, int64_t i) {
  return dt == DT_DTYPE_I32 ? (int64_t)((const int32_t *)idx)[i] : ((const int64_t *)idx)[i];
}
