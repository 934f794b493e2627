/* CUDA kernels of the softmax family (core/ops_softmax.c): softmax,
 * log-softmax and the causal softmax, one block per row. Semantics follow
 * the CPU reference (core/cpu_kernels_softmax.c). */
#include <math.h>

#include "cuda/kernels_common.cuh"

/* ---- softmax, and the causal softmax of the attention scores ---- */

/* CAUSAL: cols is t and row r keeps columns 0..r%t, the rest 0 (never
 * with log_). */
template <bool CAUSAL>
static __device__ __forceinline__ int64_t kept_cols(int64_t r, int64_t cols) {
  return CAUSAL ? r % cols + 1 : cols;
}

// x (rows, cols) of T -> y (rows, cols) f32 = softmax or log_softmax over the kept columns
template <typename T, bool CAUSAL>
static __global__ void softmax_forward_kernel(const T *x, float *y, int64_t rows, int64_t cols,
                                              int log_) {
  __shared__ float shf[32];
  __shared__ double shd[32];
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const T *xr = x + r * cols;
    float *yr = y + r * cols;
    const int64_t keep = kept_cols<CAUSAL>(r, cols);
    double s;
    float mx = dt_block_row_max_sumexp(xr, keep, shf, shd, &s);
    if (log_) {
      float lsf = (float)log(s);
      for (int64_t j = threadIdx.x; j < cols; j += blockDim.x)
        yr[j] = (dt_load_f32(xr, j) - mx) - lsf;
    } else {
      float inv = (float)(1.0 / s);
      for (int64_t j = threadIdx.x; j < cols; j += blockDim.x)
        yr[j] = j < keep ? expf(dt_load_f32(xr, j) - mx) * inv : 0.0f;
    }
  }
}

// y, dy (rows, cols) -> dx (rows, cols); y is the forward output; masked entries get 0
template <bool CAUSAL>
static __global__ void softmax_backward_kernel(const float *y, const float *dy, float *dx,
                                               int64_t rows, int64_t cols, int log_) {
  __shared__ double shd[32];
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const float *yr = y + r * cols, *gr = dy + r * cols;
    float *dr = dx + r * cols;
    const int64_t keep = kept_cols<CAUSAL>(r, cols);
    double s = 0.0;
    for (int64_t j = threadIdx.x; j < keep; j += blockDim.x)
      s += log_ ? (double)gr[j] : (double)gr[j] * yr[j];
    float sf = (float)dt_block_sum(s, shd);
    for (int64_t j = threadIdx.x; j < cols; j += blockDim.x)
      dr[j] = j >= keep ? 0.0f : log_ ? gr[j] - expf(yr[j]) * sf : yr[j] * (gr[j] - sf);
  }
}

extern "C" dt_status dt_cuda_softmax_forward(const dt_exec *ex, const float *x, float *y,
                                             int64_t rows, int64_t cols, bool log_) {
  if (rows == 0 || cols == 0)
    return DT_OK;
  DT_CUDA_STORAGE_DISPATCH(ex->dtype, T,
                           dt_launch_rows(ex, rows, cols, softmax_forward_kernel<T, false>,
                                          (const T *)x, y, rows, cols, (int)log_));
}

extern "C" dt_status dt_cuda_softmax_backward(const dt_exec *ex, const float *y, const float *dy,
                                              float *dx, int64_t rows, int64_t cols, bool log_) {
  if (rows == 0 || cols == 0)
    return DT_OK;
  return dt_launch_rows(ex, rows, cols, softmax_backward_kernel<false>, y, dy, dx, rows, cols,
                        log_);
}

extern "C" dt_status dt_cuda_causal_softmax_forward(const dt_exec *ex, const float *x, float *y,
                                                    int64_t rows, int64_t t) {
  if (rows == 0 || t == 0)
    return DT_OK;
  DT_CUDA_STORAGE_DISPATCH(
      ex->dtype, T,
      dt_launch_rows(ex, rows, t, softmax_forward_kernel<T, true>, (const T *)x, y, rows, t, 0));
}

extern "C" dt_status dt_cuda_causal_softmax_backward(const dt_exec *ex, const float *y,
                                                     const float *dy, float *dx, int64_t rows,
                                                     int64_t t) {
  if (rows == 0 || t == 0)
    return DT_OK;
  return dt_launch_rows(ex, rows, t, softmax_backward_kernel<true>, y, dy, dx, rows, t, 0);
}
