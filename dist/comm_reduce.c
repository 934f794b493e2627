/* The host backends' reductions of f32, f16 and bf16 data: sums in f32 in
 * rank order, one rounding to the data's type at the end. */
#include <string.h>

#include "core/half.h"
#include "dist/comm_internal.h"

int dt_comm_is_reduce_dtype(dt_dtype t) {
  return t == DT_DTYPE_F32 || t == DT_DTYPE_F16 || t == DT_DTYPE_BF16;
}

static void add_part(float *acc, const void *src, dt_dtype t, int64_t n, int first) {
  if (t == DT_DTYPE_F32) {
    const float *p = src;
    if (first)
      memcpy(acc, p, (size_t)n * sizeof(float));
    else
      for (int64_t i = 0; i < n; i++)
        acc[i] += p[i];
    return;
  }
  const uint16_t *h = src;
  int bf16 = t == DT_DTYPE_BF16;
  for (int64_t i = 0; i < n; i++) {
    float v = bf16 ? dt_bf16_to_f32(h[i]) : dt_f16_to_f32(h[i]);
    acc[i] = first ? v : acc[i] + v;
  }
}

void dt_comm_sum_f32(const void *const *parts, int nparts, dt_dtype t, int64_t n, int avg,
                     float *acc) {
  for (int k = 0; k < nparts; k++)
    add_part(acc, parts[k], t, n, k == 0);
  if (avg)
    for (int64_t i = 0; i < n; i++)
      acc[i] /= (float)nparts;
}

void dt_comm_from_f32(const float *src, dt_dtype t, void *dst, int64_t n) {
  if (t == DT_DTYPE_F32) {
    memcpy(dst, src, (size_t)n * sizeof(float));
    return;
  }
  uint16_t *h = dst;
  int bf16 = t == DT_DTYPE_BF16;
  for (int64_t i = 0; i < n; i++)
    h[i] = bf16 ? dt_f32_to_bf16(src[i]) : dt_f32_to_f16(src[i]);
}
