#include "core/rng.h"

#include <math.h>

uint64_t dt_rng_bits(uint64_t seed, uint64_t counter) {
  uint64_t z = seed ^ (counter * 0x9E3779B97F4A7C15ull);
  z += 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

float dt_rng_uniform(uint64_t seed, uint64_t counter) {
  return (float)(dt_rng_bits(seed, counter) >> 40) * (1.0f / 16777216.0f);
}

void dt_generator_init(dt_generator *g, uint64_t seed) {
  g->seed = seed;
  g->offset = 0;
}

uint64_t dt_generator_advance(dt_generator *g, uint64_t n) {
  uint64_t first = g->offset;
  g->offset += n;
  return first;
}

float dt_generator_uniform(dt_generator *g) {
  return dt_rng_uniform(g->seed, dt_generator_advance(g, 1));
}

float dt_generator_normal(dt_generator *g) {
  double u1 = ((double)(dt_rng_bits(g->seed, dt_generator_advance(g, 1)) >> 11) + 1.0) *
              (1.0 / 9007199254740993.0);
  double u2 =
      (double)(dt_rng_bits(g->seed, dt_generator_advance(g, 1)) >> 11) * (1.0 / 9007199254740992.0);
  return (float)(sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
}

uint64_t dt_generator_below(dt_generator *g, uint64_t n) {
  /* Lemire's multiply-shift; bias is below 2^-32 for the sizes used here. */
  uint64_t x = dt_rng_bits(g->seed, dt_generator_advance(g, 1)) >> 32;
  return (x * n) >> 32;
}
