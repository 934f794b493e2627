/* The vector kernels behind core/half.h's array conversions, one set per
 * instruction set (core/half_simd.c), chosen at run time by core/half.c.
 * Each converts whole vectors and leaves the tail (n % width elements, the
 * return value's complement) to the caller's scalar loop, so every path is
 * bit-identical to the scalar functions of core/half.h by construction of
 * the tests (tests/half_test.cc compares them over every 16-bit code and a
 * large f32 sample). */
#ifndef DT_CORE_HALF_INTERNAL_H
#define DT_CORE_HALF_INTERNAL_H

#include <stdint.h>

#include "core/half.h"

/* Return how many leading elements they converted (a multiple of the
 * vector width, at most n). */
typedef int64_t (*dt_half_narrow_fn)(const float *in, uint16_t *out, int64_t n);
typedef int64_t (*dt_half_widen_fn)(const uint16_t *in, float *out, int64_t n);

typedef struct dt_half_kernels {
  dt_half_narrow_fn bf16_from_f32, f16_from_f32;
  dt_half_widen_fn bf16_to_f32, f16_to_f32;
} dt_half_kernels;

/* 1 when this CPU (and the OS: the register state) runs `isa`'s kernels. */
int dt_half_simd_supported(dt_half_isa isa);
/* The kernels of `isa` (NULL entries for DT_HALF_ISA_SCALAR: no vectors).
 * Call only for a supported isa. */
dt_half_kernels dt_half_simd_kernels(dt_half_isa isa);

#endif
