/* The host backends' reductions of f32, f16 and bf16 data: sums in f32 in
 * rank order, one rounding to the data's type at the end (core/half.h's
 * conversions: round to nearest even). */
#include <string.h>

#include "core/half.h"
#include "dist/comm_internal.h"

int dt_comm_is_reduce_dtype(dt_dtype t) { return t == DT_DTYPE_F32 || dt_dtype_is_half(t); }

/* acc = src (first) or acc += src, src widened to f32. n <= chunk. */
static void add_part(float *acc, const void *src, dt_dtype t, int64_t n, int first) {
  float wide[DT_COMM_REDUCE_CHUNK];
  const float *p = src;
  if (t != DT_DTYPE_F32) {
    dt_half_to_f32(t, src, first ? acc : wide, n);
    if (first)
      return;
    p = wide;
  }
  if (first)
    memcpy(acc, p, (size_t)n * sizeof(float));
  else
    dt_comm_add_f32(acc, p, n, 0, 1);
}

void dt_comm_sum_f32(const void *const *parts, int nparts, dt_dtype t, int64_t n, int avg,
                     float *acc) {
  for (int64_t c0 = 0; c0 < n; c0 += DT_COMM_REDUCE_CHUNK) {
    int64_t len = n - c0 < DT_COMM_REDUCE_CHUNK ? n - c0 : DT_COMM_REDUCE_CHUNK;
    size_t off = (size_t)c0 * dt_dtype_size(t);
    for (int k = 0; k < nparts; k++)
      add_part(acc + c0, (const char *)parts[k] + off, t, len, k == 0);
  }
  if (avg)
    dt_comm_scale_avg_f32(acc, n, nparts);
}

static int is_pow2(int v) { return v > 0 && (v & (v - 1)) == 0; }

/* x / 2^k and x * 2^-k are the same exact quotient rounded once: the same
 * bits (2^-k is exact in f32 for any world size an int holds). */
void dt_comm_scale_avg_f32(float *x, int64_t n, int world) {
  if (is_pow2(world)) {
    const float inv = 1.0f / (float)world;
#pragma omp simd
    for (int64_t i = 0; i < n; i++)
      x[i] *= inv;
  } else {
    const float wf = (float)world;
#pragma omp simd
    for (int64_t i = 0; i < n; i++)
      x[i] /= wf;
  }
}

void dt_comm_add_f32(float *restrict x, const float *restrict y, int64_t n, int avg, int world) {
  if (!avg || world == 1) {
#pragma omp simd
    for (int64_t i = 0; i < n; i++)
      x[i] += y[i];
  } else if (is_pow2(world)) {
    const float inv = 1.0f / (float)world;
#pragma omp simd
    for (int64_t i = 0; i < n; i++)
      x[i] = (x[i] + y[i]) * inv;
  } else {
    const float wf = (float)world;
#pragma omp simd
    for (int64_t i = 0; i < n; i++)
      x[i] = (x[i] + y[i]) / wf;
  }
}

void dt_comm_from_f32(const float *src, dt_dtype t, void *dst, int64_t n) {
  if (t == DT_DTYPE_F32)
    memcpy(dst, src, (size_t)n * sizeof(float));
  else
    dt_half_from_f32(t, src, dst, n);
}

/* Compiled for AVX-512, AVX2 and baseline SSE2, the loader picking what
 * the CPU runs (as core's kernels, core/cpu_internal.h); an addition then
 * a multiplication (no FMA to contract): the same bits on every path. */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define DT_COMM_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define DT_COMM_CLONES
#endif

/* dst = (a + b) * k, vectorised: a store under a condition in the loop,
 * or a dst that might overlap the second destination, kept GCC from
 * vectorising the one loop (it ran scalar, 5x slower than a copy). dst
 * may be a (the reduction in place), so neither is restrict. */
DT_COMM_CLONES static void sum2_into(const float *a, const float *b, float k, int64_t n,
                                     float *dst) {
#pragma omp simd
  for (int64_t i = 0; i < n; i++)
    dst[i] = (a[i] + b[i]) * k;
}

DT_COMM_CLONES static void sum2_into2(const float *a, const float *b, float k, int64_t n,
                                      float *dst, float *dst2) {
#pragma omp simd
  for (int64_t i = 0; i < n; i++) {
    float s = (a[i] + b[i]) * k;
    dst[i] = s;
    dst2[i] = s;
  }
}

void dt_comm_sum_f32_into(const float *const *parts, int nparts, int64_t n, int avg, float *dst,
                          float *dst2) {
  const float *a = parts[0], *b = nparts > 1 ? parts[1] : parts[0];
  int scale = avg && nparts > 1;
  const float inv = 1.0f / (float)nparts, wf = (float)nparts;
  int pow2 = is_pow2(nparts);
  if (nparts == 2 && (!scale || pow2)) { /* the common case, one loop */
    const float k = scale ? inv : 1.0f;  /* x * 1 is x: the same bits */
    if (dst2 != NULL)
      sum2_into2(a, b, k, n, dst, dst2);
    else
      sum2_into(a, b, k, n, dst);
    return;
  }
  for (int64_t c0 = 0; c0 < n; c0 += DT_COMM_REDUCE_CHUNK) {
    int64_t len = n - c0 < DT_COMM_REDUCE_CHUNK ? n - c0 : DT_COMM_REDUCE_CHUNK;
    float acc[DT_COMM_REDUCE_CHUNK];
    memcpy(acc, parts[0] + c0, (size_t)len * sizeof(float));
    for (int k = 1; k < nparts; k++)
      dt_comm_add_f32(acc, parts[k] + c0, len, 0, 1);
    if (scale && pow2) {
#pragma omp simd
      for (int64_t i = 0; i < len; i++)
        acc[i] *= inv;
    } else if (scale) {
#pragma omp simd
      for (int64_t i = 0; i < len; i++)
        acc[i] /= wf;
    }
    memcpy(dst + c0, acc, (size_t)len * sizeof(float));
    if (dst2)
      memcpy(dst2 + c0, acc, (size_t)len * sizeof(float));
  }
}
