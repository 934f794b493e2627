/* CUDA kernels of the dropout (core/ops_dropout.c): the keep mask is
 * core/rng.c's counter-based stream, so it matches the CPU's
 * (core/cpu_kernels_dropout.c) bit for bit. */
#include "cuda/kernels_common.cuh"

/* ---- dropout ---- */

// x (n) -> y (n), mask (n) u8: keep i iff uniform(seed, offset + i) >= p;
// x and y of storage type T (f32 math, one rounding)
template <typename T>
static __global__ void dropout_forward_kernel(const T *x, T *y, uint8_t *mask, int64_t n, float p,
                                              float scale, uint64_t seed, uint64_t offset) {
  DT_GRID_STRIDE(i, n) {
    uint8_t keep = dt_rng_uniform_dev(seed, offset + (uint64_t)i) >= p;
    mask[i] = keep;
    dt_store_f32(y, i, keep ? dt_load_f32(x, i) * scale : 0.0f);
  }
}

// dy (n), mask (n) -> dx (n) = dy * mask / (1-p)
template <typename T>
static __global__ void dropout_backward_kernel(const T *dy, const uint8_t *mask, T *dx, int64_t n,
                                               float scale) {
  DT_GRID_STRIDE(i, n) dt_store_f32(dx, i, mask[i] ? dt_load_f32(dy, i) * scale : 0.0f);
}

extern "C" dt_status dt_cuda_dropout_forward(const dt_exec *ex, const float *x, float *y,
                                             uint8_t *mask, int64_t n, float p, uint64_t seed,
                                             uint64_t offset) {
  if (n <= 0)
    return DT_OK;
  float scale = p < 1.0f ? 1.0f / (1.0f - p) : 0.0f;
  DT_CUDA_STORAGE_DISPATCH(ex->dtype, T,
                           dt_launch_flat(ex, n, dropout_forward_kernel<T>, (const T *)x, (T *)y,
                                          mask, n, p, scale, seed, offset));
}

extern "C" dt_status dt_cuda_dropout_backward(const dt_exec *ex, const float *dy,
                                              const uint8_t *mask, float *dx, int64_t n, float p) {
  if (n <= 0)
    return DT_OK;
  float scale = p < 1.0f ? 1.0f / (1.0f - p) : 0.0f;
  DT_CUDA_STORAGE_DISPATCH(
      ex->dtype, T,
      dt_launch_flat(ex, n, dropout_backward_kernel<T>, (const T *)dy, mask, (T *)dx, n, scale));
}
