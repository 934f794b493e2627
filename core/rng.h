/* Counter-based random numbers: the value for (seed, counter) is a pure
 * function, so every backend (and every rank) draws identical streams and a
 * CUDA kernel can reproduce the CPU's dropout mask exactly.
 *
 * The mix is SplitMix64 applied to seed ^ (counter * golden ratio).
 */
#ifndef DT_CORE_RNG_H
#define DT_CORE_RNG_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

uint64_t dt_rng_bits(uint64_t seed, uint64_t counter);
/* Uniform in [0, 1) with 24 random bits (exactly representable in f32). */
float dt_rng_uniform(uint64_t seed, uint64_t counter);

/* A generator: a seed and how many values have been drawn. */
typedef struct dt_generator {
  uint64_t seed;
  uint64_t offset;
} dt_generator;

void dt_generator_init(dt_generator *g, uint64_t seed);
/* Reserves n counters; returns the first. */
uint64_t dt_generator_advance(dt_generator *g, uint64_t n);
float dt_generator_uniform(dt_generator *g);              /* [0,1) */
float dt_generator_normal(dt_generator *g);               /* N(0,1), Box-Muller */
uint64_t dt_generator_below(dt_generator *g, uint64_t n); /* [0,n) */

#ifdef __cplusplus
}
#endif
#endif
