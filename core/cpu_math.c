/* Vectorised transcendental functions of the CPU kernels: exp for the
 * softmax-shaped rows (cross-entropy, the fused classifier, attention) and
 * GELU's tanh. Each loop is compiled per ISA (DT_CPU_CLONES). */
#include <math.h>
#include <stdint.h>

#include "core/cpu_internal.h"

/* exp(x) for x <= 88 (Cephes' expf: a degree-6 polynomial on [-ln2/2,
 * ln2/2] after reduction by powers of two; within 1 ulp of glibc's expf on
 * [-87.3, 0], measured), written so that the loops calling it vectorise; x
 * below -87.3 (or -inf) gives 0, NaN gives NaN. */
static inline float exp_small(float x) {
  const float lo = -87.33654f;
  float xc = x < lo ? lo : x;
  float fx = xc * 1.44269504088896341f;
  fx = (fx - 12582912.0f) + 12582912.0f; /* round to nearest: the sum drops the fraction */
  float r = xc - fx * 0.693359375f;
  r = r - fx * -2.12194440e-4f;
  float z = r * r;
  float y =
      ((((1.9875691500e-4f * r + 1.3981999507e-3f) * r + 8.3334519073e-3f) * r + 4.1665795894e-2f) *
           r +
       1.6666665459e-1f) *
          r +
      5.0000001201e-1f;
  y = y * z + r + 1.0f;
  union {
    int32_t i;
    float f;
  } pow2 = {((int32_t)fx + 127) << 23};
  return x < lo ? 0.0f : y * pow2.f;
}

/* tanh(u) = sign(u) (1 - e) / (1 + e) with e = exp(-2|u|) <= 1; below
 * |u| = 1/16, where 1 - e cancels, its series u - u^3/3 + 2u^5/15 */
static inline float tanh_small(float u) {
  float e = exp_small(-2.0f * fabsf(u)), u2 = u * u;
  float series = u * (1.0f + u2 * (-1.0f / 3.0f + u2 * (2.0f / 15.0f)));
  return fabsf(u) < 0.0625f ? series : copysignf((1.0f - e) / (1.0f + e), u);
}

DT_CPU_CLONES void dt_cpu_exp_shifted(const float *x, float shift, float scale, float *y,
                                      int64_t n) {
#pragma omp simd
  for (int64_t j = 0; j < n; j++)
    y[j] = scale * exp_small(x[j] - shift);
}

#define GELU_SCALE 0.7978845608028654f /* sqrt(2/pi) */
#define GELU_CUBIC 0.044715f

DT_CPU_CLONES void dt_cpu_gelu(const float *x, float *y, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; i++) {
    float v = x[i];
    y[i] = 0.5f * v * (1.0f + tanh_small(GELU_SCALE * (v + GELU_CUBIC * v * v * v)));
  }
}

DT_CPU_CLONES void dt_cpu_gelu_backward(const float *x, const float *dy, float *dx, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; i++) {
    float v = x[i];
    float t = tanh_small(GELU_SCALE * (v + GELU_CUBIC * v * v * v));
    float sech2 = 1.0f - t * t;
    float grad =
        0.5f * (1.0f + t) + 0.5f * v * sech2 * GELU_SCALE * (1.0f + 3.0f * GELU_CUBIC * v * v);
    dx[i] = dy[i] * grad;
  }
}
