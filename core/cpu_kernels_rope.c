/* CPU kernel of the rotary position embedding (core/ops_rope.c; the
 * convention is documented at dt_op_rope in core/op_table.def). */
#include <math.h>
#include <string.h>

#include "core/cpu_internal.h"

#define MIN(a, b) ((a) < (b) ? (a) : (b))

#define ROPE_CHUNK 128 /* pairs of a head at a time (16-bit: widened on the stack) */

/* cos and sin of the angles of pairs i0 .. i0 + n - 1 at position p:
 * p * theta^(-2i / hd), in double (the CUDA kernel computes the same
 * expression); the sine negated for the inverse rotation. */
static void rope_angles(double p, int64_t i0, int64_t n, int64_t hd, float theta, bool inverse,
                        float *cs, float *sn) {
  for (int64_t k = 0; k < n; k++) {
    const double a = p * pow((double)theta, -2.0 * (double)(i0 + k) / (double)hd);
    cs[k] = (float)cos(a);
    sn[k] = inverse ? -(float)sin(a) : (float)sin(a);
  }
}

// x (n, t, c) -> y (n, t, c): the first n_rot heads of hd columns of each row rotated, the rest
// copied
dt_status dt_cpu_rope(const dt_exec *ex, const float *x, float *y, int64_t n, int64_t t, int64_t c,
                      int64_t hd, int64_t n_rot, float theta, bool inverse) {
  const dt_dtype dt = ex->dtype;
  const size_t esize = dt_dtype_size(dt);
  const int64_t half = hd / 2, rows = n * t, kept = c - n_rot * hd;
  DT_CPU_PARALLEL_FOR(r, rows, rows * c, DT_CPU_PAR_MIN / 4) {
    float cs[ROPE_CHUNK], sn[ROPE_CHUNK], w0[ROPE_CHUNK], w1[ROPE_CHUNK], o0[ROPE_CHUNK],
        o1[ROPE_CHUNK];
    for (int64_t i0 = 0; i0 < half; i0 += ROPE_CHUNK) {
      const int64_t len = MIN(ROPE_CHUNK, half - i0);
      rope_angles((double)(r % t), i0, len, hd, theta, inverse, cs, sn);
      for (int64_t h = 0; h < n_rot; h++) {
        const int64_t off = r * c + h * hd + i0;
        const float *lo = dt_cpu_f32_span(x, dt, off, len, w0);
        const float *hi = dt_cpu_f32_span(x, dt, off + half, len, w1);
        for (int64_t k = 0; k < len; k++) {
          o0[k] = lo[k] * cs[k] - hi[k] * sn[k];
          o1[k] = hi[k] * cs[k] + lo[k] * sn[k];
        }
        dt_cpu_store_span(y, dt, off, len, o0);
        dt_cpu_store_span(y, dt, off + half, len, o1);
      }
    }
    if (kept > 0) {
      const size_t at = (size_t)(r * c + n_rot * hd) * esize;
      memcpy((char *)y + at, (const char *)x + at, (size_t)kept * esize);
    }
  }
  return DT_OK;
}
