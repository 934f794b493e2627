/* CUDA kernels of the norm family (core/ops_norm.c): layer norm (and the
 * fused residual + layer norm) and RMS norm, one block per row; batch norm is cuDNN's
 * (cuda/dnn.c), with its eval-mode statistics here. Semantics follow the
 * CPU reference (core/cpu_kernels_norm.c). */
#include <math.h>

#include "cuda/kernels_common.cuh"

/* ---- layer norm, RMS norm ---- */
/* x holds TX (the kernel's ex->dtype), the residual TR, y TY and dy TD
 * (f32, or 16-bit under autocast: y rounded once from f32); the
 * statistics, the sum, dx, dgamma and dbeta are f32 (op_table.def). RMS
 * norm is layer norm's arithmetic with the mean 0 (rms; mean NULL in the
 * backward). */

// the layer norm of one row xr (cols) of T, by the block -> yr, mean[r], rstd[r]
template <typename T, typename TY>
static __device__ __forceinline__ void layer_norm_row(const T *xr, const float *gamma,
                                                      const float *beta, TY *yr, float *mean,
                                                      float *rstd, int64_t r, int64_t cols,
                                                      float eps, bool rms, double *shd) {
  double s = 0.0;
  if (!rms)
    dt_row_for_each(xr, cols, [&](int64_t, float x) { s += x; });
  double m = rms ? 0.0 : dt_block_sum(s, shd) / (double)cols;
  double v = 0.0;
  dt_row_for_each(xr, cols, [&](int64_t, float x) {
    double d = x - m;
    v += d * d;
  });
  v = dt_block_sum(v, shd);
  float mf = (float)m, rs = (float)(1.0 / sqrt(v / (double)cols + (double)eps));
  if (threadIdx.x == 0) {
    if (mean)
      mean[r] = mf;
    if (rstd)
      rstd[r] = rs;
  }
  for (int64_t j = threadIdx.x; j < cols; j += blockDim.x)
    dt_store_f32(
        yr, j,
        (dt_load_f32(xr, j) - mf) * rs * (gamma ? gamma[j] : 1.0f) + (beta ? beta[j] : 0.0f));
}

// x (rows, cols) (+ residual -> sum, when residual is not NULL), gamma/beta (cols) or NULL ->
// y (rows, cols), mean, rstd (rows)
template <typename TX, typename TR, typename TY>
static __global__ void layer_norm_forward_kernel(const TX *x, const TR *residual,
                                                 const float *gamma, const float *beta, float *sum,
                                                 TY *y, float *mean, float *rstd, int64_t rows,
                                                 int64_t cols, float eps, bool rms) {
  __shared__ double shd[32];
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const TX *xr = x + r * cols;
    TY *yr = y + r * cols;
    if (residual) {
      const TR *rr = residual + r * cols;
      float *sr = sum + r * cols;
      for (int64_t j = threadIdx.x; j < cols; j += blockDim.x)
        sr[j] = dt_load_f32(xr, j) + dt_load_f32(rr, j);
      __syncthreads(); /* the row's statistics read the sums 16 bytes at a time, across threads */
      layer_norm_row(sr, gamma, beta, yr, mean, rstd, r, cols, eps, rms, shd);
    } else {
      layer_norm_row(xr, gamma, beta, yr, mean, rstd, r, cols, eps, rms, shd);
    }
  }
}

// the launch for x of TX and y of TY: the residual's storage type from its dtype
template <typename TX, typename TY>
static dt_status layer_norm_launch_y(const dt_exec *ex, const TX *x, const void *residual,
                                     dt_dtype residual_dtype, const float *gamma, const float *beta,
                                     float *sum, TY *y, float *mean, float *rstd, int64_t rows,
                                     int64_t cols, float eps, bool rms) {
  DT_CUDA_STORAGE_DISPATCH(
      residual_dtype, TR,
      dt_launch_rows(ex, rows, cols, layer_norm_forward_kernel<TX, TR, TY>, x, (const TR *)residual,
                     gamma, beta, sum, y, mean, rstd, rows, cols, eps, rms));
}

// the launch for x of TX: y's storage type from its dtype
template <typename TX>
static dt_status layer_norm_launch(const dt_exec *ex, const TX *x, const void *residual,
                                   dt_dtype residual_dtype, const float *gamma, const float *beta,
                                   float *sum, void *y, dt_dtype y_dtype, float *mean, float *rstd,
                                   int64_t rows, int64_t cols, float eps, bool rms) {
  DT_CUDA_STORAGE_DISPATCH(y_dtype, TY,
                           layer_norm_launch_y(ex, x, residual, residual_dtype, gamma, beta, sum,
                                               (TY *)y, mean, rstd, rows, cols, eps, rms));
}

extern "C" dt_status dt_cuda_layer_norm_forward(const dt_exec *ex, const float *x,
                                                const float *gamma, const float *beta, float *y,
                                                dt_dtype y_dtype, float *mean, float *rstd,
                                                int64_t rows, int64_t cols, float eps) {
  if (rows == 0)
    return DT_OK;
  /* no residual: TR float, the instantiation the f32 residual shares */
  DT_CUDA_STORAGE_DISPATCH(ex->dtype, TX,
                           layer_norm_launch(ex, (const TX *)x, NULL, DT_DTYPE_F32, gamma, beta,
                                             NULL, y, y_dtype, mean, rstd, rows, cols, eps, false));
}

extern "C" dt_status dt_cuda_rms_norm_forward(const dt_exec *ex, const float *x,
                                              const float *weight, float *y, dt_dtype y_dtype,
                                              float *rstd, int64_t rows, int64_t cols, float eps) {
  if (rows == 0)
    return DT_OK;
  DT_CUDA_STORAGE_DISPATCH(ex->dtype, TX,
                           layer_norm_launch(ex, (const TX *)x, NULL, DT_DTYPE_F32, weight, NULL,
                                             NULL, y, y_dtype, NULL, rstd, rows, cols, eps, true));
}

extern "C" dt_status dt_cuda_residual_layer_norm_forward(
    const dt_exec *ex, const float *x, const float *residual, dt_dtype residual_dtype,
    const float *gamma, const float *beta, float *sum, float *y, dt_dtype y_dtype, float *mean,
    float *rstd, int64_t rows, int64_t cols, float eps) {
  if (rows == 0)
    return DT_OK;
  DT_CUDA_STORAGE_DISPATCH(
      ex->dtype, TX,
      layer_norm_launch(ex, (const TX *)x, residual, residual_dtype, gamma, beta, sum, y, y_dtype,
                        mean, rstd, rows, cols, eps, false));
}

// x (rows, cols) of T, dy (rows, cols) of TD, mean (NULL: RMS norm)/rstd (rows), gamma (cols) ->
// dx (rows, cols) overwritten
template <typename T, typename TD>
static __global__ void layer_norm_backward_dx_kernel(const T *x, const float *gamma,
                                                     const float *mean, const float *rstd,
                                                     const TD *dy, float *dx, int64_t rows,
                                                     int64_t cols) {
  __shared__ double shd[32];
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const T *xr = x + r * cols;
    const TD *gr = dy + r * cols;
    float *dr = dx + r * cols;
    float m = mean ? mean[r] : 0.0f, rs = rstd[r];
    double sg = 0.0, sgx = 0.0;
    for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) {
      float g = dt_load_f32(gr, j) * (gamma ? gamma[j] : 1.0f);
      sg += g;
      sgx += (double)g * ((dt_load_f32(xr, j) - m) * rs);
    }
    sg = dt_block_sum(sg, shd);
    sgx = dt_block_sum(sgx, shd);
    float mg = mean ? (float)(sg / (double)cols) : 0.0f, mgx = (float)(sgx / (double)cols);
    for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) {
      float g = dt_load_f32(gr, j) * (gamma ? gamma[j] : 1.0f);
      dr[j] = rs * (g - mg - (dt_load_f32(xr, j) - m) * rs * mgx);
    }
  }
}

// x (rows, cols) of T, dy (rows, cols) of TD -> part (splits, 2, cols): per row-chunk sums of
// dy*xhat and dy
template <typename T, typename TD>
static __global__ void layer_norm_backward_param_partial_kernel(const T *x, const float *mean,
                                                                const float *rstd, const TD *dy,
                                                                double *part, int64_t rows,
                                                                int64_t cols, int64_t chunk) {
  int64_t j = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  int64_t split = blockIdx.y;
  if (j >= cols)
    return;
  int64_t r0 = split * chunk, r1 = r0 + chunk < rows ? r0 + chunk : rows;
  double ag = 0.0, ab = 0.0;
  for (int64_t r = r0; r < r1; r++) {
    float g = dt_load_f32(dy, r * cols + j);
    ag += (double)g * ((dt_load_f32(x, r * cols + j) - (mean ? mean[r] : 0.0f)) * rstd[r]);
    ab += g;
  }
  part[(split * 2) * cols + j] = ag;
  part[(split * 2 + 1) * cols + j] = ab;
}

// part (splits, 2, cols) -> dgamma, dbeta (cols) += sums over splits, in order
static __global__ void layer_norm_backward_param_final_kernel(const double *part, int64_t splits,
                                                              int64_t cols, float *dgamma,
                                                              float *dbeta) {
  DT_GRID_STRIDE(j, cols) {
    double ag = 0.0, ab = 0.0;
    for (int64_t s = 0; s < splits; s++) {
      ag += part[(s * 2) * cols + j];
      ab += part[(s * 2 + 1) * cols + j];
    }
    if (dgamma)
      dgamma[j] += (float)ag;
    if (dbeta)
      dbeta[j] += (float)ab;
  }
}

template <typename T, typename TD>
static dt_status layer_norm_backward_as(const dt_exec *ex, const T *x, const float *gamma,
                                        const float *mean, const float *rstd, const TD *dy,
                                        float *dx, float *dgamma, float *dbeta, int64_t rows,
                                        int64_t cols) {
  DT_CUDA_EXEC(ex, ctx, stream);
  if (dx) {
    layer_norm_backward_dx_kernel<T, TD><<<dt_row_grid(rows), dt_row_threads(cols), 0, stream>>>(
        x, gamma, mean, rstd, dy, dx, rows, cols);
    DT_CUDA_CHECK_LAUNCH();
  }
  if (!dgamma && !dbeta)
    return DT_OK;
  int64_t splits = rows < 64 ? 1 : (rows + 63) / 64;
  if (splits > 256)
    splits = 256;
  int64_t chunk = (rows + splits - 1) / splits;
  double *part = NULL;
  DT_CHECK(
      dt_cuda_scratch_alloc(ctx, (size_t)(splits * 2 * cols) * sizeof(double), (void **)&part));
  dim3 grid((unsigned)((cols + 31) / 32), (unsigned)splits);
  layer_norm_backward_param_partial_kernel<T, TD>
      <<<grid, 32, 0, stream>>>(x, mean, rstd, dy, part, rows, cols, chunk);
  cudaError_t e = cudaGetLastError();
  if (e == cudaSuccess) {
    layer_norm_backward_param_final_kernel<<<dt_grid_for(cols), DT_THREADS, 0, stream>>>(
        part, splits, cols, dgamma, dbeta);
    e = cudaGetLastError();
  }
  dt_cuda_scratch_free(ctx, part);
  DT_CUDA_CHECK(e);
  return DT_OK;
}

// x of T: dy's storage type from its dtype
template <typename T>
static dt_status layer_norm_backward_dy(const dt_exec *ex, const T *x, const float *gamma,
                                        const float *mean, const float *rstd, const void *dy,
                                        dt_dtype dy_dtype, float *dx, float *dgamma, float *dbeta,
                                        int64_t rows, int64_t cols) {
  DT_CUDA_STORAGE_DISPATCH(dy_dtype, TD,
                           layer_norm_backward_as(ex, x, gamma, mean, rstd, (const TD *)dy, dx,
                                                  dgamma, dbeta, rows, cols));
}

extern "C" dt_status dt_cuda_layer_norm_backward(const dt_exec *ex, const float *x,
                                                 const float *gamma, const float *mean,
                                                 const float *rstd, const float *dy,
                                                 dt_dtype dy_dtype, float *dx, float *dgamma,
                                                 float *dbeta, int64_t rows, int64_t cols) {
  if (rows == 0)
    return DT_OK;
  DT_CUDA_STORAGE_DISPATCH(ex->dtype, T,
                           layer_norm_backward_dy(ex, (const T *)x, gamma, mean, rstd, dy, dy_dtype,
                                                  dx, dgamma, dbeta, rows, cols));
}

extern "C" dt_status dt_cuda_rms_norm_backward(const dt_exec *ex, const float *x,
                                               const float *weight, const float *rstd,
                                               const float *dy, dt_dtype dy_dtype, float *dx,
                                               float *dweight, int64_t rows, int64_t cols) {
  if (rows == 0)
    return DT_OK;
  DT_CUDA_STORAGE_DISPATCH(ex->dtype, T,
                           layer_norm_backward_dy(ex, (const T *)x, weight, NULL, rstd, dy,
                                                  dy_dtype, dx, dweight, NULL, rows, cols));
}

/* ---- batchnorm eval statistics (for cuda/dnn.c) ---- */

// rm, rv (c) -> save_mean = rm, save_invstd = 1/sqrt(rv + eps), each (c)
static __global__ void bn_eval_stats_kernel(const float *rm, const float *rv, float *save_mean,
                                            float *save_invstd, int64_t c, float eps) {
  DT_GRID_STRIDE(i, c) {
    if (save_mean)
      save_mean[i] = rm[i];
    if (save_invstd)
      save_invstd[i] = (float)(1.0 / sqrt((double)rv[i] + (double)eps));
  }
}

extern "C" dt_status dt_cuda_bn_eval_stats(dt_cuda_ctx *ctx, const float *rm, const float *rv,
                                           float *save_mean, float *save_invstd, int64_t c,
                                           float eps) {
  if (c <= 0 || (!save_mean && !save_invstd))
    return DT_OK;
  bn_eval_stats_kernel<<<dt_grid_for(c), DT_THREADS, 0, dt_cuda_compute_stream(ctx)>>>(
      rm, rv, save_mean, save_invstd, c, eps);
  DT_CUDA_CHECK_LAUNCH();
  return DT_OK;
}
