/* 16-bit floats: f16 (IEEE binary16) and bf16 (bfloat16) stored as uint16_t
 * bit patterns, converted to and from f32.
 *
 * Every narrowing conversion rounds to nearest, ties to even; NaN stays NaN
 * (quiet, sign kept; f16 keeps the payload's top 9 bits and bf16 its top 7,
 * as the F16C and AVX512-BF16 instructions do), +-Inf stays +-Inf, f32
 * values beyond the 16-bit range become +-Inf (f16: |x| >= 65520), and
 * subnormals are kept (f32 subnormals narrow to bf16 subnormals, not to
 * zero). Widening is exact (an f16 NaN comes out quiet, as from F16C).
 *
 * The array conversions run vector kernels chosen once at run time for this
 * CPU (AVX512-BF16, AVX512F, AVX2 + F16C, else scalar); every path gives
 * the same bits as the scalar functions, for every input. The stochastic variants (llm.c's
 * working-copy rounding) round x to one of its two 16-bit neighbours with probability proportional
 * to closeness, so the expected value is x; the draw for element i is dt_rng_uniform(seed, offset +
 * i), the same on every backend and rank.
 *
 * Used by the cast kernels, mixed precision (core/amp.h) and the 16-bit
 * gradient all-reduce (dist/).
 */
#ifndef DT_CORE_HALF_H
#define DT_CORE_HALF_H

#include <stdint.h>

#include "core/device.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Scalars. */
uint16_t dt_f32_to_f16(float f);
float dt_f16_to_f32(uint16_t h);
uint16_t dt_f32_to_bf16(float f);
float dt_bf16_to_f32(uint16_t h);
/* `u` in [0, 1) (a uniform draw) picks the neighbour: the one farther from
 * f when u < its share of the gap. NaN and +-Inf convert as above. */
uint16_t dt_f32_to_half_stochastic(dt_dtype dtype, float f, float u);

/* 1 for DT_DTYPE_F16 and DT_DTYPE_BF16. */
int dt_dtype_is_half(dt_dtype dtype);

/* Arrays of n elements; `dtype` is DT_DTYPE_F16 or DT_DTYPE_BF16 (anything
 * else is DT_ERR_DTYPE). in and out must not overlap. */
dt_status dt_half_from_f32(dt_dtype dtype, const float *in, uint16_t *out, int64_t n);
dt_status dt_half_to_f32(dt_dtype dtype, const uint16_t *in, float *out, int64_t n);
/* out[i] = dt_f32_to_half_stochastic(dtype, in[i], dt_rng_uniform(seed, offset + i)) */
dt_status dt_half_from_f32_stochastic(dt_dtype dtype, const float *in, uint16_t *out, int64_t n,
                                      uint64_t seed, uint64_t offset);

/* The instruction set the array conversions use. They start on the best
 * this CPU supports; forcing another is for tests and benchmarks (process
 * wide: do it while no conversion runs). Levels are ordered: AVX2 means
 * AVX2 + F16C, AVX512 AVX512F, AVX512_BF16 AVX512F + AVX512-BF16 (its
 * f16 and widening kernels are AVX512's). */
typedef enum dt_half_isa {
  DT_HALF_ISA_SCALAR,
  DT_HALF_ISA_AVX2,
  DT_HALF_ISA_AVX512,
  DT_HALF_ISA_AVX512_BF16,
} dt_half_isa;

dt_half_isa dt_half_isa_best(void);
dt_half_isa dt_half_isa_active(void);
/* DT_ERR_UNSUPPORTED when this CPU lacks `isa`, DT_ERR_INVALID_ARG when it
 * is not one of the above. */
dt_status dt_half_isa_force(dt_half_isa isa);
/* "scalar", "avx2", "avx512", "avx512-bf16" */
const char *dt_half_isa_name(dt_half_isa isa);

#ifdef __cplusplus
}
#endif
#endif
