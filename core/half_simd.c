/* x86 vector kernels for the f32 <-> f16/bf16 array conversions
 * (core/half_internal.h). Each function carries its own target attribute,
 * so the build needs no -m flag and a CPU without the instructions never
 * runs them (core/half.c dispatches on __builtin_cpu_supports).
 *
 * bf16 narrowing is the scalar reference's integer rounding (add 0x7fff
 * plus the lowest kept bit, NaN -> quiet NaN) in vector registers; the
 * AVX512-BF16 instruction rounds the same way but flushes f32 subnormal
 * inputs to zero, so a vector holding one takes the integer path. f16 uses
 * the F16C / AVX512F conversion instructions with round-to-nearest-even,
 * whose NaN results (quiet, sign and the payload's top bits kept) the
 * scalar reference reproduces. */
#include "core/half_internal.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>

#define TARGET_AVX2 __attribute__((target("avx2,f16c")))
#define TARGET_AVX512 __attribute__((target("avx512f")))
#define TARGET_AVX512_BF16 __attribute__((target("avx512f,avx512bf16")))

int dt_half_simd_supported(dt_half_isa isa) {
  __builtin_cpu_init();
  switch (isa) {
    case DT_HALF_ISA_SCALAR: return 1;
    case DT_HALF_ISA_AVX2: return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c");
    case DT_HALF_ISA_AVX512: return __builtin_cpu_supports("avx512f");
    case DT_HALF_ISA_AVX512_BF16:
      return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bf16");
    default: return 0;
  }
}

/* ---- AVX2 + F16C: 8 lanes ---- */

/* u: 8 f32 bit patterns -> 8 bf16 codes in the low halves of 32-bit lanes */
TARGET_AVX2 static __m256i bf16_round8(__m256i u) {
  const __m256i abs_mask = _mm256_set1_epi32(0x7fffffff), inf = _mm256_set1_epi32(0x7f800000);
  const __m256i bias = _mm256_set1_epi32(0x7fff), one = _mm256_set1_epi32(1);
  const __m256i quiet = _mm256_set1_epi32(0x40);
  __m256i hi = _mm256_srli_epi32(u, 16);
  __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(u, abs_mask), inf);
  __m256i rounded =
      _mm256_srli_epi32(_mm256_add_epi32(u, _mm256_add_epi32(bias, _mm256_and_si256(hi, one))), 16);
  return _mm256_blendv_epi8(rounded, _mm256_or_si256(hi, quiet), nan);
}

TARGET_AVX2 static int64_t bf16_from_f32_avx2(const float *in, uint16_t *out, int64_t n) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    __m256i a = bf16_round8(_mm256_loadu_si256((const __m256i *)(in + i)));
    __m256i b = bf16_round8(_mm256_loadu_si256((const __m256i *)(in + i + 8)));
    /* packus interleaves the 128-bit halves: a0 b0 a1 b1 -> a0 a1 b0 b1 */
    __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(a, b), 0xd8);
    _mm256_storeu_si256((__m256i *)(out + i), packed);
  }
  return i;
}

TARGET_AVX2 static int64_t bf16_to_f32_avx2(const uint16_t *in, float *out, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(in + i)));
    _mm256_storeu_si256((__m256i *)(out + i), _mm256_slli_epi32(w, 16));
  }
  return i;
}

TARGET_AVX2 static int64_t f16_from_f32_avx2(const float *in, uint16_t *out, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm_storeu_si128((__m128i *)(out + i),
                     _mm256_cvtps_ph(_mm256_loadu_ps(in + i), _MM_FROUND_TO_NEAREST_INT));
  return i;
}

TARGET_AVX2 static int64_t f16_to_f32_avx2(const uint16_t *in, float *out, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(out + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(in + i))));
  return i;
}

/* ---- AVX512F: 16 lanes ---- */

TARGET_AVX512 static __m256i bf16_round16(__m512i u) {
  const __m512i abs_mask = _mm512_set1_epi32(0x7fffffff), inf = _mm512_set1_epi32(0x7f800000);
  const __m512i bias = _mm512_set1_epi32(0x7fff), one = _mm512_set1_epi32(1);
  const __m512i quiet = _mm512_set1_epi32(0x40);
  __m512i hi = _mm512_srli_epi32(u, 16);
  __mmask16 nan = _mm512_cmpgt_epi32_mask(_mm512_and_si512(u, abs_mask), inf);
  __m512i rounded =
      _mm512_srli_epi32(_mm512_add_epi32(u, _mm512_add_epi32(bias, _mm512_and_si512(hi, one))), 16);
  return _mm512_cvtepi32_epi16(_mm512_mask_blend_epi32(nan, rounded, _mm512_or_si512(hi, quiet)));
}

TARGET_AVX512 static int64_t bf16_from_f32_avx512(const float *in, uint16_t *out, int64_t n) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16)
    _mm256_storeu_si256((__m256i *)(out + i), bf16_round16(_mm512_loadu_si512(in + i)));
  return i;
}

TARGET_AVX512 static int64_t bf16_to_f32_avx512(const uint16_t *in, float *out, int64_t n) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    __m512i w = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(in + i)));
    _mm512_storeu_si512(out + i, _mm512_slli_epi32(w, 16));
  }
  return i;
}

TARGET_AVX512 static int64_t f16_from_f32_avx512(const float *in, uint16_t *out, int64_t n) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16)
    _mm256_storeu_si256((__m256i *)(out + i),
                        _mm512_cvtps_ph(_mm512_loadu_ps(in + i), _MM_FROUND_TO_NEAREST_INT));
  return i;
}

TARGET_AVX512 static int64_t f16_to_f32_avx512(const uint16_t *in, float *out, int64_t n) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16)
    _mm512_storeu_ps(out + i, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(in + i))));
  return i;
}

/* ---- AVX512-BF16: vcvtne2ps2bf16, 32 lanes ---- */

/* lanes holding an f32 subnormal (exponent bits 0, mantissa not 0) */
TARGET_AVX512 static __mmask16 subnormal_lanes(__m512i u) {
  return _mm512_testn_epi32_mask(u, _mm512_set1_epi32(0x7f800000)) &
         _mm512_test_epi32_mask(u, _mm512_set1_epi32(0x007fffff));
}

TARGET_AVX512_BF16 static int64_t bf16_from_f32_avx512_bf16(const float *in, uint16_t *out,
                                                            int64_t n) {
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    __m512 lo = _mm512_loadu_ps(in + i), hi = _mm512_loadu_ps(in + i + 16);
    __m512i ulo = _mm512_castps_si512(lo), uhi = _mm512_castps_si512(hi);
    if (subnormal_lanes(ulo) | subnormal_lanes(uhi)) { /* the instruction flushes them */
      _mm256_storeu_si256((__m256i *)(out + i), bf16_round16(ulo));
      _mm256_storeu_si256((__m256i *)(out + i + 16), bf16_round16(uhi));
      continue;
    }
    __m512bh h = _mm512_cvtne2ps_pbh(hi, lo); /* lo in the low half */
    _mm512_storeu_si512(out + i, (__m512i)h);
  }
  return i + bf16_from_f32_avx512(in + i, out + i, n - i);
}

dt_half_kernels dt_half_simd_kernels(dt_half_isa isa) {
  dt_half_kernels k = {0};
  switch (isa) {
    case DT_HALF_ISA_AVX2:
      k = (dt_half_kernels){bf16_from_f32_avx2, f16_from_f32_avx2, bf16_to_f32_avx2,
                            f16_to_f32_avx2};
      break;
    case DT_HALF_ISA_AVX512:
      k = (dt_half_kernels){bf16_from_f32_avx512, f16_from_f32_avx512, bf16_to_f32_avx512,
                            f16_to_f32_avx512};
      break;
    case DT_HALF_ISA_AVX512_BF16:
      k = (dt_half_kernels){bf16_from_f32_avx512_bf16, f16_from_f32_avx512, bf16_to_f32_avx512,
                            f16_to_f32_avx512};
      break;
    default: break;
  }
  return k;
}

#else /* not x86: the scalar loops only */

int dt_half_simd_supported(dt_half_isa isa) { return isa == DT_HALF_ISA_SCALAR; }

dt_half_kernels dt_half_simd_kernels(dt_half_isa isa) {
  (void)isa;
  return (dt_half_kernels){0};
}

#endif
