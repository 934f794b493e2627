/* CUDA kernel of the rotary position embedding (core/ops_rope.c; the
 * convention is documented at dt_op_rope in core/op_table.def). Semantics
 * follow the CPU reference (core/cpu_kernels_rope.c): the same angle,
 * computed in double. */
#include <math.h>

#include "cuda/kernels_common.cuh"

// x (n, t, c) -> y (n, t, c): a thread per (position, pair) computes its angle once and turns
// that pair in every rotated head of its position in the sequences of blockIdx.y (stride
// gridDim.y), copying the pair's columns of the other heads
template <typename T>
static __global__ void rope_kernel(const T *x, T *y, int64_t n, int64_t t, int64_t c, int64_t hd,
                                   int64_t n_rot, float theta, bool inverse) {
  const int64_t half = hd / 2, heads = c / hd;
  DT_GRID_STRIDE(k, t * half) {
    const int64_t p = k / half, i = k - p * half;
    const double a = (double)p * pow((double)theta, -2.0 * (double)i / (double)hd);
    const float cs = (float)cos(a), sn = inverse ? -(float)sin(a) : (float)sin(a);
    for (int64_t s = blockIdx.y; s < n; s += gridDim.y) {
      const int64_t row = (s * t + p) * c;
      for (int64_t h = 0; h < heads; h++) {
        const int64_t lo = row + h * hd + i, hi = lo + half;
        if (h < n_rot) {
          const float x0 = dt_load_f32(x, lo), x1 = dt_load_f32(x, hi);
          dt_store_f32(y, lo, x0 * cs - x1 * sn);
          dt_store_f32(y, hi, x1 * cs + x0 * sn);
        } else {
          y[lo] = x[lo];
          y[hi] = x[hi];
        }
      }
    }
  }
}

template <typename T>
static dt_status rope_launch(const dt_exec *ex, const T *x, T *y, int64_t n, int64_t t, int64_t c,
                             int64_t hd, int64_t n_rot, float theta, bool inverse) {
  DT_CUDA_EXEC(ex, ctx, stream);
  (void)ctx;
  dim3 grid(dt_grid_for(t * (hd / 2)), (unsigned)(n < 65535 ? n : 65535));
  rope_kernel<T><<<grid, DT_THREADS, 0, stream>>>(x, y, n, t, c, hd, n_rot, theta, inverse);
  DT_CUDA_CHECK_LAUNCH();
  return DT_OK;
}

extern "C" dt_status dt_cuda_rope(const dt_exec *ex, const float *x, float *y, int64_t n, int64_t t,
                                  int64_t c, int64_t hd, int64_t n_rot, float theta, bool inverse) {
  if (n * t * c <= 0)
    return DT_OK;
  DT_CUDA_STORAGE_DISPATCH(
      ex->dtype, T, rope_launch(ex, (const T *)x, (T *)y, n, t, c, hd, n_rot, theta, inverse));
}
