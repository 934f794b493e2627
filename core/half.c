/* f32 <-> f16/bf16 conversions, scalar and over arrays; the arrays run
 * the best vector kernels of this CPU (core/half_simd.c), chosen once. */
#include "core/half.h"

#include <math.h>
#include <stdatomic.h>
#include <string.h>

#include "core/half_internal.h"
#include "core/rng.h"

static uint32_t f32_bits(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  return u;
}

static float bits_f32(uint32_t u) {
  float f;
  memcpy(&f, &u, 4);
  return f;
}

uint16_t dt_f32_to_bf16(float f) {
  uint32_t u = f32_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) /* NaN: keep it quiet, keep the sign */
    return (uint16_t)((u >> 16) | 0x0040u);
  uint32_t rounding = 0x7fffu + ((u >> 16) & 1u); /* round to nearest even */
  return (uint16_t)((u + rounding) >> 16);
}

float dt_bf16_to_f32(uint16_t h) { return bits_f32((uint32_t)h << 16); }

uint16_t dt_f32_to_f16(float f) {
  uint32_t u = f32_bits(f);
  uint32_t sign = (u >> 16) & 0x8000u;
  uint32_t abs = u & 0x7fffffffu;
  if (abs > 0x7f800000u) /* NaN: quiet, the payload's top 9 bits kept (as F16C) */
    return (uint16_t)(sign | 0x7e00u | ((abs >> 13) & 0x3ffu));
  if (abs >= 0x477ff000u) /* >= 65520 rounds to Inf (and Inf itself) */
    return (uint16_t)(sign | 0x7c00u);
  if (abs < 0x38800000u) { /* below the smallest normal half (2^-14): subnormal */
    /* value = abs_f * 2^24 in units of the smallest subnormal, rounded even */
    float a = bits_f32(abs);
    float scaled = a * 16777216.0f; /* exact: power of two */
    uint32_t q = (uint32_t)scaled;
    float rem = scaled - (float)q;
    if (rem > 0.5f || (rem == 0.5f && (q & 1u)))
      q++;
    return (uint16_t)(sign | q);
  }
  /* normal: rebias exponent 127 -> 15, keep 10 mantissa bits, round even */
  uint32_t mant = abs & 0x7fffffu;
  uint32_t exp = (abs >> 23) - 127 + 15;
  uint32_t h = (exp << 10) | (mant >> 13);
  uint32_t rest = mant & 0x1fffu;
  if (rest > 0x1000u || (rest == 0x1000u && (h & 1u)))
    h++; /* may carry into the exponent, which is correct */
  return (uint16_t)(sign | h);
}

float dt_f16_to_f32(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  if (exp == 0) {
    float v = (float)mant * (1.0f / 16777216.0f); /* mant * 2^-24 */
    return sign ? -v : v;
  }
  if (exp == 31) /* Inf, or NaN made quiet (as F16C) */
    return bits_f32(sign | 0x7f800000u | (mant << 13) | (mant ? 0x400000u : 0u));
  return bits_f32(sign | ((exp - 15 + 127) << 23) | (mant << 13));
}

int dt_dtype_is_half(dt_dtype dtype) { return dtype == DT_DTYPE_F16 || dtype == DT_DTYPE_BF16; }

static uint16_t half_from_f32(dt_dtype dtype, float f) {
  return dtype == DT_DTYPE_F16 ? dt_f32_to_f16(f) : dt_f32_to_bf16(f);
}

static float half_to_f32(dt_dtype dtype, uint16_t h) {
  return dtype == DT_DTYPE_F16 ? dt_f16_to_f32(h) : dt_bf16_to_f32(h);
}

uint16_t dt_f32_to_half_stochastic(dt_dtype dtype, float f, float u) {
  uint16_t near = half_from_f32(dtype, f);
  float vnear = half_to_f32(dtype, near);
  /* exact, NaN, Inf, or beyond the range (rounds to Inf as nearest does) */
  if (vnear == f || !isfinite(vnear))
    return near;
  /* The other neighbour is one code from `near` toward f: codes of one sign
   * are ordered by magnitude (zero, subnormals, normals, Inf). */
  uint16_t other = fabsf(vnear) > fabsf(f) ? (uint16_t)(near - 1) : (uint16_t)(near + 1);
  float vother = half_to_f32(dtype, other);
  if (!isfinite(vother)) /* between the largest finite value and Inf's threshold */
    return near;
  float p_other = fabsf(f - vnear) / fabsf(vother - vnear); /* <= 0.5 */
  return u < p_other ? other : near;
}

static dt_status check_half(const char *what, dt_dtype dtype, const void *in, const void *out,
                            int64_t n) {
  if (!dt_dtype_is_half(dtype))
    return DT_ERROR(DT_ERR_DTYPE, "%s: dtype %s is not a 16-bit float (f16 or bf16)", what,
                    dt_dtype_name(dtype));
  if (n < 0 || (n > 0 && (in == NULL || out == NULL)))
    return DT_ERROR(DT_ERR_INVALID_ARG, "%s: n %lld, in %p, out %p", what, (long long)n, in, out);
  return DT_OK;
}

/* ---- the instruction set of the array conversions ---- */

static const char *const isa_names[] = {"scalar", "avx2", "avx512", "avx512-bf16"};

static _Atomic int active_isa = -1; /* dt_half_isa; -1 until first use */

dt_half_isa dt_half_isa_best(void) {
  dt_half_isa best = DT_HALF_ISA_SCALAR;
  for (int i = DT_HALF_ISA_SCALAR + 1; i <= DT_HALF_ISA_AVX512_BF16; i++)
    if (dt_half_simd_supported((dt_half_isa)i))
      best = (dt_half_isa)i;
  return best;
}

dt_half_isa dt_half_isa_active(void) {
  int isa = atomic_load_explicit(&active_isa, memory_order_relaxed);
  if (isa < 0) { /* racing first calls store the same value */
    isa = (int)dt_half_isa_best();
    atomic_store_explicit(&active_isa, isa, memory_order_relaxed);
  }
  return (dt_half_isa)isa;
}

dt_status dt_half_isa_force(dt_half_isa isa) {
  if ((int)isa < DT_HALF_ISA_SCALAR || (int)isa > DT_HALF_ISA_AVX512_BF16)
    return DT_ERROR(DT_ERR_INVALID_ARG, "dt_half_isa_force: no instruction set %d", (int)isa);
  if (!dt_half_simd_supported(isa))
    return DT_ERROR(DT_ERR_UNSUPPORTED,
                    "dt_half_isa_force: this CPU does not run the %s conversions (best: %s)",
                    isa_names[isa], isa_names[dt_half_isa_best()]);
  atomic_store_explicit(&active_isa, (int)isa, memory_order_relaxed);
  return DT_OK;
}

const char *dt_half_isa_name(dt_half_isa isa) {
  return (int)isa >= DT_HALF_ISA_SCALAR && (int)isa <= DT_HALF_ISA_AVX512_BF16 ? isa_names[isa]
                                                                               : "unknown";
}

/* ---- arrays ---- */

/* f32 -> 16-bit (widen 0) or back (widen 1): the active instruction set's
 * vector kernel converts a prefix, the scalar reference the rest. */
static dt_status convert_array(const char *what, dt_dtype dtype, int widen, const void *in,
                               void *out, int64_t n) {
  DT_CHECK(check_half(what, dtype, in, out, n));
  dt_half_kernels k = dt_half_simd_kernels(dt_half_isa_active());
  int f16 = dtype == DT_DTYPE_F16;
  if (widen) {
    const uint16_t *h = in;
    float *f = out;
    dt_half_widen_fn vec = f16 ? k.f16_to_f32 : k.bf16_to_f32;
    for (int64_t i = vec ? vec(h, f, n) : 0; i < n; i++)
      f[i] = half_to_f32(dtype, h[i]);
  } else {
    const float *f = in;
    uint16_t *h = out;
    dt_half_narrow_fn vec = f16 ? k.f16_from_f32 : k.bf16_from_f32;
    for (int64_t i = vec ? vec(f, h, n) : 0; i < n; i++)
      h[i] = half_from_f32(dtype, f[i]);
  }
  return DT_OK;
}

dt_status dt_half_from_f32(dt_dtype dtype, const float *in, uint16_t *out, int64_t n) {
  return convert_array("dt_half_from_f32", dtype, 0, in, out, n);
}

dt_status dt_half_to_f32(dt_dtype dtype, const uint16_t *in, float *out, int64_t n) {
  return convert_array("dt_half_to_f32", dtype, 1, in, out, n);
}

dt_status dt_half_from_f32_stochastic(dt_dtype dtype, const float *in, uint16_t *out, int64_t n,
                                      uint64_t seed, uint64_t offset) {
  DT_CHECK(check_half("dt_half_from_f32_stochastic", dtype, in, out, n));
  for (int64_t i = 0; i < n; i++)
    out[i] = dt_f32_to_half_stochastic(dtype, in[i], dt_rng_uniform(seed, offset + (uint64_t)i));
  return DT_OK;
}
