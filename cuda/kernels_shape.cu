/* CUDA reductions (core/ops_shape.c's sum and mean, the broadcasts' and
 * the bias's gradients, the gradient norm). They accumulate in double in a
 * fixed order, so results do not depend on timing; semantics follow the
 * CPU reference (core/cpu_kernels_shape.c). */
#include "cuda/kernels_common.cuh"

/* ---- reductions ---- */

// x (outer, r) of T -> y (outer) = scale * sum_r x; one block per row
template <typename T>
static __global__ void reduce_rows_kernel(const T *x, float *y, int64_t outer, int64_t r,
                                          float scale) {
  __shared__ double sh[32];
  for (int64_t o = blockIdx.x; o < outer; o += gridDim.x) {
    const T *row = x + o * r;
    double acc = 0.0;
    for (int64_t k = threadIdx.x; k < r; k += blockDim.x)
      acc += dt_load_f32(row, k);
    acc = dt_block_sum(acc, sh);
    if (threadIdx.x == 0)
      y[o] = (float)(acc * scale);
  }
}

// x (outer, r, inner) of T -> part (outer, splits, inner): sums of r-chunks;
// grid (inner/32, splits, min(outer, 65535)), grid-stride over outer in z
template <typename T>
static __global__ void reduce_cols_partial_kernel(const T *x, double *part, int64_t outer,
                                                  int64_t r, int64_t inner, int64_t chunk) {
  int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  int64_t split = blockIdx.y;
  if (i >= inner)
    return;
  int64_t k0 = split * chunk, k1 = k0 + chunk < r ? k0 + chunk : r;
  for (int64_t o = blockIdx.z; o < outer; o += gridDim.z) {
    const T *base = x + o * r * inner + i;
    double acc = 0.0;
    for (int64_t k = k0; k < k1; k++)
      acc += dt_load_f32(base, k * inner);
    part[(o * gridDim.y + split) * inner + i] = acc;
  }
}

// part (outer, splits, inner) -> y (outer, inner) = scale * sum over splits, in order
static __global__ void reduce_cols_final_kernel(const double *part, float *y, int64_t outer,
                                                int64_t splits, int64_t inner, float scale) {
  DT_GRID_STRIDE(t, outer * inner) {
    int64_t o = t / inner, i = t - o * inner;
    double acc = 0.0;
    for (int64_t s = 0; s < splits; s++)
      acc += part[(o * splits + s) * inner + i];
    y[t] = (float)(acc * scale);
  }
}

/* x of T, y f32: the 16-bit x (a 16-bit linear's bias gradient) is read
 * as it is, widened per element, with no f32 copy of it */
template <typename T>
static dt_status reduce_sum_of(dt_cuda_ctx *ctx, cudaStream_t stream, const T *x, float *y,
                               int64_t outer, int64_t r, int64_t inner, float scale) {
  if (inner == 1) {
    unsigned grid = (unsigned)(outer < 65536 ? outer : 65536);
    reduce_rows_kernel<<<grid, DT_THREADS, 0, stream>>>(x, y, outer, r, scale);
    DT_CUDA_CHECK_LAUNCH();
    return DT_OK;
  }
  /* Split r into chunks so that enough blocks run; partials in double. */
  int64_t splits = r < 64 ? 1 : (r + 63) / 64;
  if (splits > 128)
    splits = 128;
  int64_t chunk = r ? (r + splits - 1) / splits : 0;
  double *part = NULL;
  DT_CHECK(dt_cuda_scratch_alloc(ctx, (size_t)(outer * splits * inner) * sizeof(double),
                                 (void **)&part));
  dim3 grid((unsigned)((inner + 31) / 32), (unsigned)splits,
            (unsigned)(outer < 65535 ? outer : 65535));
  reduce_cols_partial_kernel<<<grid, 32, 0, stream>>>(x, part, outer, r, inner, chunk);
  cudaError_t e = cudaGetLastError();
  if (e == cudaSuccess) {
    reduce_cols_final_kernel<<<dt_grid_for(outer * inner), DT_THREADS, 0, stream>>>(
        part, y, outer, splits, inner, scale);
    e = cudaGetLastError();
  }
  dt_cuda_scratch_free(ctx, part); /* stream-ordered: reused only after these kernels */
  DT_CUDA_CHECK(e);
  return DT_OK;
}

extern "C" dt_status dt_cuda_reduce_sum(const dt_exec *ex, const float *x, float *y, int64_t outer,
                                        int64_t r, int64_t inner, float scale) {
  if (outer == 0 || inner == 0)
    return DT_OK;
  DT_CUDA_EXEC(ex, ctx, stream);
  if (ex->dtype == DT_DTYPE_F16)
    return reduce_sum_of(ctx, stream, (const __half *)x, y, outer, r, inner, scale);
  if (ex->dtype == DT_DTYPE_BF16)
    return reduce_sum_of(ctx, stream, (const __nv_bfloat16 *)x, y, outer, r, inner, scale);
  return reduce_sum_of(ctx, stream, x, y, outer, r, inner, scale);
}

// y (outer, inner) -> x (outer, r, inner) = scale * y
static __global__ void broadcast_axis_kernel(const float *y, float *x, int64_t r, int64_t inner,
                                             int64_t total, float scale) {
  DT_GRID_STRIDE(t, total) {
    int64_t i = t % inner, o = t / (inner * r);
    x[t] = scale * y[o * inner + i];
  }
}

extern "C" dt_status dt_cuda_broadcast_axis(const dt_exec *ex, const float *y, float *x,
                                            int64_t outer, int64_t r, int64_t inner, float scale) {
  int64_t total = outer * r * inner;
  if (total == 0)
    return DT_OK;
  return dt_launch_flat(ex, total, broadcast_axis_kernel, y, x, r, inner, total, scale);
}

#define SUMSQ_BLOCKS 1024

// x (n) -> part (gridDim.x) = per-block sums of squares
static __global__ void sum_squares_partial_kernel(const float *x, int64_t n, double *part) {
  __shared__ double sh[32];
  double acc = 0.0;
  DT_GRID_STRIDE(i, n) acc += (double)x[i] * x[i];
  acc = dt_block_sum(acc, sh);
  if (threadIdx.x == 0)
    part[blockIdx.x] = acc;
}

// part (m) -> *out = sum, one block
static __global__ void sum_final_kernel(const double *part, int m, double *out) {
  __shared__ double sh[32];
  double acc = 0.0;
  for (int i = threadIdx.x; i < m; i += blockDim.x)
    acc += part[i];
  acc = dt_block_sum(acc, sh);
  if (threadIdx.x == 0)
    *out = acc;
}

extern "C" dt_status dt_cuda_sum_squares(const dt_exec *ex, const float *x, int64_t n,
                                         double *out) {
  *out = 0.0;
  if (n == 0)
    return DT_OK;
  DT_CUDA_EXEC(ex, ctx, stream);
  unsigned blocks = dt_grid_for(n, DT_THREADS * 8);
  if (blocks > SUMSQ_BLOCKS)
    blocks = SUMSQ_BLOCKS;
  pthread_mutex_lock(&ctx->scratch_lock);
  double *part = (double *)ctx->dev_scratch;
  double *result = part + SUMSQ_BLOCKS;
  sum_squares_partial_kernel<<<blocks, DT_THREADS, 0, stream>>>(x, n, part);
  sum_final_kernel<<<1, DT_THREADS, 0, stream>>>(part, (int)blocks, result);
  cudaError_t e = cudaGetLastError();
  if (e == cudaSuccess)
    e = cudaMemcpyAsync(ctx->host_scratch, result, sizeof(double), cudaMemcpyDeviceToHost, stream);
  if (e == cudaSuccess)
    e = cudaStreamSynchronize(stream);
  if (e == cudaSuccess)
    *out = *(const double *)ctx->host_scratch;
  pthread_mutex_unlock(&ctx->scratch_lock);
  DT_CUDA_CHECK(e);
  return DT_OK;
}
