/* CPU kernels of the dropout (core/ops_dropout.c): the keep mask from
 * core/rng.c's counter-based stream, f32 and 16-bit. */
#include <omp.h>

#include "core/cpu_internal.h"
#include "core/half.h"
#include "core/rng.h"

/* ---- dropout ---- */

// x (n) -> y (n), mask (n) u8
dt_status dt_cpu_dropout_forward(const dt_exec *ex, const float *x, float *y, uint8_t *mask,
                                 int64_t n, float p, uint64_t seed, uint64_t offset) {
  if (dt_dtype_is_half(ex->dtype))
    return dt_cpu_half_dropout_forward(ex, x, y, mask, n, p, seed, offset);
  float scale = p < 1.0f ? 1.0f / (1.0f - p) : 0.0f;
  DT_CPU_PARALLEL_FOR(i, n, n, DT_CPU_PAR_MIN / 4) {
    uint8_t keep = dt_rng_uniform(seed, offset + (uint64_t)i) >= p;
    mask[i] = keep;
    y[i] = keep ? x[i] * scale : 0.0f;
  }
  return DT_OK;
}

// dy (n), mask (n) -> dx (n) = dy * mask / (1-p)
dt_status dt_cpu_dropout_backward(const dt_exec *ex, const float *dy, const uint8_t *mask,
                                  float *dx, int64_t n, float p) {
  if (dt_dtype_is_half(ex->dtype))
    return dt_cpu_half_dropout_backward(ex, dy, mask, dx, n, p);
  float scale = p < 1.0f ? 1.0f / (1.0f - p) : 0.0f;
  DT_CPU_PARALLEL_FOR(i, n, n, DT_CPU_PAR_MIN)
  dx[i] = mask[i] ? dy[i] * scale : 0.0f;
  return DT_OK;
}
/* ---- dropout: the mask from the element's global index, so a block
 * loop of its own (the keep test and the scaling are the f32 kernel's) ---- */

// x (n) -> y (n), mask (n) u8, x and y 16-bit
dt_status dt_cpu_half_dropout_forward(const dt_exec *ex, const void *x, void *y, uint8_t *mask,
                                      int64_t n, float p, uint64_t seed, uint64_t offset) {
  const dt_dtype dtype = ex->dtype;
  const float scale = p < 1.0f ? 1.0f / (1.0f - p) : 0.0f;
  const int64_t blocks = (n + DT_CPU_HALF_BLOCK - 1) / DT_CPU_HALF_BLOCK;
#pragma omp parallel for if (n >= DT_CPU_PAR_MIN / 4) num_threads(dt_cpu_threads()) schedule(static)
  for (int64_t b = 0; b < blocks; b++) {
    float buf[DT_CPU_HALF_BLOCK];
    const int64_t i0 = b * DT_CPU_HALF_BLOCK,
                  len = n - i0 < DT_CPU_HALF_BLOCK ? n - i0 : DT_CPU_HALF_BLOCK;
    (void)dt_half_to_f32(dtype, (const uint16_t *)x + i0, buf, len);
    for (int64_t j = 0; j < len; j++) {
      uint8_t keep = dt_rng_uniform(seed, offset + (uint64_t)(i0 + j)) >= p;
      mask[i0 + j] = keep;
      buf[j] = keep ? buf[j] * scale : 0.0f;
    }
    (void)dt_half_from_f32(dtype, buf, (uint16_t *)y + i0, len);
  }
  return DT_OK;
}

// dy (n), mask (n) -> dx (n) = dy * mask / (1-p), dy and dx 16-bit
dt_status dt_cpu_half_dropout_backward(const dt_exec *ex, const void *dy, const uint8_t *mask,
                                       void *dx, int64_t n, float p) {
  const dt_dtype dtype = ex->dtype;
  const float scale = p < 1.0f ? 1.0f / (1.0f - p) : 0.0f;
  const int64_t blocks = (n + DT_CPU_HALF_BLOCK - 1) / DT_CPU_HALF_BLOCK;
#pragma omp parallel for if (n >= DT_CPU_PAR_MIN) num_threads(dt_cpu_threads()) schedule(static)
  for (int64_t b = 0; b < blocks; b++) {
    float buf[DT_CPU_HALF_BLOCK];
    const int64_t i0 = b * DT_CPU_HALF_BLOCK,
                  len = n - i0 < DT_CPU_HALF_BLOCK ? n - i0 : DT_CPU_HALF_BLOCK;
    (void)dt_half_to_f32(dtype, (const uint16_t *)dy + i0, buf, len);
    for (int64_t j = 0; j < len; j++)
      buf[j] = mask[i0 + j] ? buf[j] * scale : 0.0f;
    (void)dt_half_from_f32(dtype, buf, (uint16_t *)dx + i0, len);
  }
  return DT_OK;
}
