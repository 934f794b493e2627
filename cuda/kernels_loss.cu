/* CUDA kernels of the loss family (core/ops_loss.c): the fused
 * cross-entropy and the fused classifier (LM-head loss), one block per row.
 * Semantics follow the CPU reference (core/cpu_kernels_loss.c). The
 * targets are validated inside the forward kernels (kernels_index.cu): the
 * cross-entropy's kept-row count stays on the device; backward kernels
 * skip invalid targets (the forward already refused them). */
#include <math.h>

#include "cuda/kernels_common.cuh"

/* ---- cross-entropy ---- */

// logits (n,c), target (n) -> loss_rows (n), lse (n); report: first bad row, kept rows
static __global__ void cross_entropy_forward_kernel(const float *logits, const void *target,
                                                    int i32, int64_t n, int64_t c,
                                                    int64_t ignore_index, float *loss_rows,
                                                    float *lse, dt_cuda_index_slot *rep) {
  __shared__ float shf[32];
  __shared__ double shd[32];
  for (int64_t i = blockIdx.x; i < n; i += gridDim.x) {
    const float *xr = logits + i * c;
    double s;
    float mx = dt_block_row_max_sumexp(xr, c, shf, shd, &s);
    if (threadIdx.x == 0) {
      double l = (double)mx + log(s);
      if (lse)
        lse[i] = (float)l;
      int64_t t = index_at(target, i32, i);
      if (t == ignore_index) {
        loss_rows[i] = 0.0f;
      } else if (t < 0 || t >= c) {
        loss_rows[i] = 0.0f;
        atomicMin(&rep->bad, (unsigned long long)i);
      } else {
        loss_rows[i] = (float)(l - (double)xr[t]);
        atomicAdd(&rep->kept, 1ull);
      }
    }
  }
}

extern "C" dt_status dt_cuda_cross_entropy_forward(const dt_exec *ex, const float *logits,
                                                   const void *target, dt_dtype target_dtype,
                                                   int64_t n, int64_t c, int64_t ignore_index,
                                                   float *loss_rows, float *lse, float *count) {
  DT_CUDA_EXEC(ex, ctx, stream);
  int i32 = target_dtype == DT_DTYPE_I32;
  if (n > 0)
    cross_entropy_forward_kernel<<<dt_row_grid(n), dt_row_threads(c), 0, stream>>>(
        logits, target, i32, n, c, ignore_index, loss_rows, lse,
        dt_cuda_index_slot_of(ctx, stream));
  return dt_cuda_index_checked(ctx, stream, true, target, i32, DT_CUDA_INDEX_CROSS_ENTROPY, c,
                               ignore_index, count);
}

// logits (n,c), target (n), lse (n), dloss_rows (n) -> dlogits (n,c)
static __global__ void cross_entropy_backward_kernel(const float *logits, const void *target,
                                                     int i32, const float *lse,
                                                     const float *dloss_rows, float *dlogits,
                                                     int64_t n, int64_t c, int64_t ignore_index) {
  DT_GRID_STRIDE(k, n * c) {
    int64_t i = k / c, j = k - i * c;
    int64_t t = index_at(target, i32, i);
    if (t == ignore_index || t < 0 || t >= c) {
      dlogits[k] = 0.0f;
      continue;
    }
    float g = dloss_rows[i];
    float v = g * expf(logits[k] - lse[i]);
    dlogits[k] = j == t ? v - g : v;
  }
}

extern "C" dt_status dt_cuda_cross_entropy_backward(const dt_exec *ex, const float *logits,
                                                    const void *target, dt_dtype target_dtype,
                                                    const float *lse, const float *dloss_rows,
                                                    float *dlogits, int64_t n, int64_t c,
                                                    int64_t ignore_index) {
  if (n * c == 0)
    return DT_OK;
  return dt_launch_flat(ex, n * c, cross_entropy_backward_kernel, logits, target,
                        target_dtype == DT_DTYPE_I32, lse, dloss_rows, dlogits, n, c, ignore_index);
}

/* ---- fused classifier (LM-head loss) ---- */

/* Adds v to a running (m, s): m the largest value so far, s the sum of
 * exp(value - m); one exp per value (the sum rescaled when v is a new
 * maximum). A NaN v makes s NaN, as the two-pass form's sum does. */
static __device__ __forceinline__ void online_add(float &m, float &s, float v) {
  if (v > m) {
    s = (m == -INFINITY ? 0.0f : s * expf(m - v)) + 1.0f;
    m = v;
  } else {
    s += expf(v - m);
  }
}

/* Merges (m2, s2) into (m, s). */
static __device__ __forceinline__ void online_merge(float &m, float &s, float m2, float s2) {
  float mn = fmaxf(m, m2);
  if (mn == -INFINITY) { /* both empty (or every value -inf) */
    s += s2;
    return;
  }
  s = (m == -INFINITY ? 0.0f : s * expf(m - mn)) + (m2 == -INFINITY ? 0.0f : s2 * expf(m2 - mn));
  m = mn;
}

/* The block's max of row x[0..n) and the sum of exp(x - max) in one read
 * of the row, in f32 (the classifier's 16-bit logits are the largest
 * tensor of a language model's step: two reads in all, this and the
 * gradient's, instead of three; f32 where the two-pass form summed in
 * double); every thread gets both. shm, shs: 32 floats each of shared
 * memory. */
template <typename T>
static __device__ float block_row_online_max_sumexp(const T *x, int64_t n, float *shm, float *shs,
                                                    float *sumexp) {
  float m = -INFINITY, s = 0.0f;
  dt_row_for_each(x, n, [&](int64_t, float v) { online_add(m, s, v); });
  for (int o = 16; o > 0; o >>= 1) {
    float m2 = __shfl_xor_sync(0xffffffffu, m, o), s2 = __shfl_xor_sync(0xffffffffu, s, o);
    online_merge(m, s, m2, s2);
  }
  int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
  __syncthreads(); /* shm, shs may still be read from the previous row */
  if (lane == 0)
    shm[warp] = m, shs[warp] = s;
  __syncthreads();
  m = lane < nwarps ? shm[lane] : -INFINITY;
  s = lane < nwarps ? shs[lane] : 0.0f;
  for (int o = 16; o > 0; o >>= 1) {
    float m2 = __shfl_xor_sync(0xffffffffu, m, o), s2 = __shfl_xor_sync(0xffffffffu, s, o);
    online_merge(m, s, m2, s2);
  }
  *sumexp = s;
  return m;
}

// logits (n,vp), target (n) -> loss_rows (n), dlogits (n,vp) or NULL (may be logits itself);
// report: first bad row, kept rows. T: the storage type of logits and dlogits (f32 math).
template <typename T>
static __global__ void classifier_forward_kernel(const T *logits, const void *target, int i32,
                                                 int64_t n, int64_t vp, int64_t classes,
                                                 int64_t ignore_index, float *loss_rows, T *dlogits,
                                                 float dlogits_scale, dt_cuda_index_slot *rep) {
  __shared__ float shm[32], shs[32];
  for (int64_t i = blockIdx.x; i < n; i += gridDim.x) {
    const T *xr = logits + i * vp;
    T *dr = dlogits ? dlogits + i * vp : NULL;
    int64_t t = index_at(target, i32, i);
    if (t == ignore_index || t < 0 || t >= classes) {
      if (threadIdx.x == 0) {
        loss_rows[i] = 0.0f;
        if (t != ignore_index)
          atomicMin(&rep->bad, (unsigned long long)i);
      }
      for (int64_t j = threadIdx.x; dr && j < vp; j += blockDim.x)
        dt_store_f32(dr, j, 0.0f);
      continue;
    }
    /* read before the barriers of the row's max and sum: dr may overwrite it below */
    float xt = threadIdx.x == 0 ? dt_load_f32(xr, t) : 0.0f;
    float s;
    float mx = block_row_online_max_sumexp(xr, classes, shm, shs, &s);
    if (threadIdx.x == 0) {
      loss_rows[i] = mx + logf(s) - xt;
      atomicAdd(&rep->kept, 1ull);
    }
    float inv = 1.0f / s;
    if (dr) /* dr may be xr: each element is read before it is written, by one thread */
      dt_row_map(xr, dr, vp, [&](int64_t j, float v) {
        return j < classes ? (expf(v - mx) * inv - (j == t ? 1.0f : 0.0f)) * dlogits_scale : 0.0f;
      });
  }
}

template <typename T>
static void classifier_forward_launch(dim3 grid, int threads, cudaStream_t stream,
                                      const void *logits, const void *target, int i32, int64_t n,
                                      int64_t vp, int64_t classes, int64_t ignore_index,
                                      float *loss_rows, void *dlogits, float dlogits_scale,
                                      dt_cuda_index_slot *rep) {
  classifier_forward_kernel<T><<<grid, threads, 0, stream>>>((const T *)logits, target, i32, n, vp,
                                                             classes, ignore_index, loss_rows,
                                                             (T *)dlogits, dlogits_scale, rep);
}

extern "C" dt_status dt_cuda_classifier_loss_forward(const dt_exec *ex, const float *logits,
                                                     const void *target, dt_dtype target_dtype,
                                                     int64_t n, int64_t vp, int64_t classes,
                                                     int64_t ignore_index, float *loss_rows,
                                                     float *dlogits, float dlogits_scale,
                                                     float *count) {
  DT_CUDA_EXEC(ex, ctx, stream);
  int i32 = target_dtype == DT_DTYPE_I32;
  /* cross_entropy_forward's threads per row; the row's max and sum in one
   * f32 pass (cross_entropy's are two, the sum in double) */
  if (n > 0) {
    void (*launch)(dim3, int, cudaStream_t, const void *, const void *, int, int64_t, int64_t,
                   int64_t, int64_t, float *, void *, float, dt_cuda_index_slot *) =
        ex->dtype == DT_DTYPE_F16    ? classifier_forward_launch<__half>
        : ex->dtype == DT_DTYPE_BF16 ? classifier_forward_launch<__nv_bfloat16>
                                     : classifier_forward_launch<float>;
    launch(dt_row_grid(n), dt_row_threads(vp), stream, logits, target, i32, n, vp, classes,
           ignore_index, loss_rows, dlogits, dlogits_scale, dt_cuda_index_slot_of(ctx, stream));
  }
  return dt_cuda_index_checked(ctx, stream, true, target, i32, DT_CUDA_INDEX_CLASSIFIER, classes,
                               ignore_index, count);
}

// dlogits (n) *= dloss[0] / count[0] (0 when no row was kept: every row of
// dlogits is then zero already); T: dlogits' storage type
template <typename T>
static __global__ void classifier_backward_kernel(T *dlogits, const float *dloss,
                                                  const float *count, int64_t n) {
  const float c = count[0];
  const float a = c > 0.0f ? dloss[0] / c : 0.0f;
  DT_GRID_STRIDE(k, n) { dt_store_f32(dlogits, k, dt_load_f32(dlogits, k) * a); }
}

extern "C" dt_status dt_cuda_classifier_loss_backward(const dt_exec *ex, float *dlogits,
                                                      const float *dloss, const float *count,
                                                      int64_t n) {
  if (n == 0)
    return DT_OK;
  DT_CUDA_STORAGE_DISPATCH(
      ex->dtype, T,
      dt_launch_flat(ex, n, classifier_backward_kernel<T>, (T *)dlogits, dloss, count, n));
}
