/* CUDA kernels of the softmax family (core/ops_softmax.c): softmax,
 * log-softmax and the causal softmax, one block per row; the causal
 * backward also serves causal_attention_dscores (core/ops_attention.c's
 * GEMM path, 16-bit P and dS). Semantics follow the CPU reference
 * (core/cpu_kernels_softmax.c, core/cpu_kernels_attention.c). */
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
        yr[j] = !CAUSAL || j < keep ? expf(dt_load_f32(xr, j) - mx) * inv : 0.0f;
    }
  }
}

// y (rows, cols) of T, dy (rows, cols) f32 -> dx (rows, cols) of TD; y is the forward output;
// masked entries get 0; dx may be y: each thread reads its elements before it writes them
template <typename T, typename TD, bool CAUSAL>
static __global__ void softmax_backward_kernel(const T *y, const float *dy, TD *dx, int64_t rows,
                                               int64_t cols, int log_) {
  __shared__ double shd[32];
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const T *yr = y + r * cols;
    const float *gr = dy + r * cols;
    TD *dr = dx + r * cols;
    const int64_t keep = kept_cols<CAUSAL>(r, cols);
    double s = 0.0;
    for (int64_t j = threadIdx.x; j < keep; j += blockDim.x)
      s += log_ ? (double)gr[j] : (double)gr[j] * dt_load_f32(yr, j);
    float sf = (float)dt_block_sum(s, shd);
    for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) {
      const float yj = dt_load_f32(yr, j);
      dt_store_f32(dr, j,
                   CAUSAL && j >= keep ? 0.0f
                   : log_              ? gr[j] - expf(yj) * sf
                                       : yj * (gr[j] - sf));
    }
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
  return dt_launch_rows(ex, rows, cols, softmax_backward_kernel<float, float, false>, y, dy, dx,
                        rows, cols, log_);
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
  return dt_launch_rows(ex, rows, t, softmax_backward_kernel<float, float, true>, y, dy, dx, rows,
                        t, 0);
}

// p (rows, t) of T, dp (rows, t) f32 -> ds (rows, t) of T = p (dp - sum p dp), masked entries 0
// (the causal softmax backward of the attention scores); ds may be p
extern "C" dt_status dt_cuda_causal_attention_dscores(const dt_exec *ex, const float *p,
                                                      const float *dp, float *ds, int64_t n,
                                                      int64_t t) {
  if (n == 0 || t == 0)
    return DT_OK;
  DT_CUDA_STORAGE_DISPATCH(ex->dtype, T,
                           dt_launch_rows(ex, n * t, t, softmax_backward_kernel<T, T, true>,
                                          (const T *)p, dp, (T *)ds, n * t, t, 0));
}
