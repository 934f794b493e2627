/* CUDA kernels of the linear family (core/ops_linear.c) beside cuBLAS
 * (cuda/blas.c): the bias epilogue of the 16-bit linear forward. */
#include "cuda/kernels_common.cuh"

/* ---- the bias epilogue of the 16-bit linear forward (cuda/blas.c) ---- */

// acc (m,n) f32, bias (n) of T -> y (m,n) of T = round(acc + bias)
template <typename T>
static __global__ void add_bias_rows_kernel(const float *acc, const T *bias, T *y, int64_t m,
                                            int64_t n) {
  DT_GRID_STRIDE(i, m * n) { dt_store_f32(y, i, acc[i] + dt_load_f32(bias, i % n)); }
}

extern "C" dt_status dt_cuda_add_bias_rows(cudaStream_t stream, dt_dtype dtype, const float *acc,
                                           const void *bias, void *y, int64_t m, int64_t n) {
  if (m * n == 0)
    return DT_OK;
  if (dtype == DT_DTYPE_F16)
    add_bias_rows_kernel<<<dt_grid_for(m * n), DT_THREADS, 0, stream>>>(acc, (const __half *)bias,
                                                                        (__half *)y, m, n);
  else
    add_bias_rows_kernel<<<dt_grid_for(m * n), DT_THREADS, 0, stream>>>(
        acc, (const __nv_bfloat16 *)bias, (__nv_bfloat16 *)y, m, n);
  DT_CUDA_CHECK_LAUNCH();
  return DT_OK;
}
