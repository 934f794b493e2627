/* CUDA kernels for softmax, cross-entropy, layer norm, embedding, dropout
 * and pooling. Semantics follow the CPU reference (core/cpu_kernels_nn.c,
 * cpu_kernels_norm.c, cpu_kernels_pool.c). Row kernels use one block per
 * row; pooling backward gathers in the CPU's summation order, so it matches
 * bit for bit; the dropout mask is core/rng.c's counter-based stream.
 *
 * Index validation (cross-entropy targets, embedding ids) runs inside the
 * forward kernels and never waits for the host: the first bad position
 * becomes the device's index error (cuda_internal.h), which the host
 * reports at its next synchronisation with the CPU's message; the
 * cross-entropy's kept-row count stays on the device. Backward kernels
 * skip invalid indices (the forward already refused them). The embedding
 * backward is in kernels_embedding.cu. */
#include <math.h>

#include "cuda/kernels_common.cuh"

static unsigned row_grid(int64_t rows) { return (unsigned)(rows < 65536 ? rows : 65536); }

/* A row kernel (a block per row, grid-stride over the rows) on ex's stream. */
template <typename... Params, typename... Args>
static dt_status launch_rows(const dt_exec *ex, int64_t rows, int64_t cols,
                             void (*kernel)(Params...), Args... args) {
  DT_CUDA_EXEC(ex, ctx, stream);
  (void)ctx;
  kernel<<<row_grid(rows), dt_row_threads(cols), 0, stream>>>(args...);
  DT_CUDA_CHECK_LAUNCH();
  return DT_OK;
}

/* The block's max of row x[0..n) and sum of exp(x - max) into *sumexp;
 * every thread gets both. shf and shd: 32 floats and 32 doubles of shared
 * memory. */
template <typename T>
static __device__ __forceinline__ float block_row_max_sumexp(const T *x, int64_t n, float *shf,
                                                             double *shd, double *sumexp) {
  float mx = -INFINITY;
  for (int64_t j = threadIdx.x; j < n; j += blockDim.x)
    mx = fmaxf(mx, dt_load_f32(x, j));
  mx = dt_block_max(mx, shf);
  double s = 0.0;
  for (int64_t j = threadIdx.x; j < n; j += blockDim.x)
    s += expf(dt_load_f32(x, j) - mx);
  *sumexp = dt_block_sum(s, shd);
  return mx;
}

/* The slot of index checks for kernels on `stream` (one per stream kind:
 * kernels on one stream run in order, so a slot serves one launch at a
 * time). */
static dt_cuda_index_slot *index_slot(dt_cuda_ctx *ctx, cudaStream_t stream) {
  int k = DT_STREAM_COMPUTE;
  for (int i = 0; i < 3; i++)
    if (ctx->streams[i].s == stream)
      k = i;
  return &ctx->index_check.slots[k];
}

// slot of the launch just checked -> the device's index error (the first
// one claims it), *count = rows kept (cross-entropy); resets the slot
static __global__ void index_report_kernel(dt_cuda_index_slot *slot, int *claim,
                                           dt_cuda_index_error *err, const void *idx, int i32,
                                           int kind, long long bound, long long ignore,
                                           float *count) {
  unsigned long long bad = slot->bad;
  if (count)
    *count = (float)slot->kept;
  slot->kept = 0;
  if (bad == ~0ull)
    return;
  slot->bad = ~0ull;
  if (atomicCAS(claim, 0, 1) != 0)
    return; /* an earlier failure is waiting for the host */
  err->kind = kind;
  err->position = (long long)bad;
  err->value = (long long)index_at(idx, i32, (int64_t)bad);
  err->bound = bound;
  err->ignore_index = ignore;
  __threadfence_system();
  *(volatile int *)&err->set = 1;
}

/* The end of an index-checking launch on `stream`: its launch error, else
 * (when `report`) the report of its slot queued behind it (no host wait). */
static dt_status index_checked(dt_cuda_ctx *ctx, cudaStream_t stream, bool report, const void *idx,
                               int i32, dt_cuda_index_kind kind, int64_t bound, int64_t ignore,
                               float *count) {
  cudaError_t e = cudaGetLastError();
  if (e == cudaSuccess && report) {
    index_report_kernel<<<1, 1, 0, stream>>>(index_slot(ctx, stream), ctx->index_check.claim,
                                             ctx->index_check.error_dev, idx, i32, (int)kind,
                                             (long long)bound, (long long)ignore, count);
    e = cudaGetLastError();
  }
  DT_CUDA_CHECK(e);
  return DT_OK;
}

/* ---- softmax ---- */

// x (rows, cols) of T -> y (rows, cols) f32 = softmax or log_softmax over cols
template <typename T>
static __global__ void softmax_forward_kernel(const T *x, float *y, int64_t rows, int64_t cols,
                                              int log_) {
  __shared__ float shf[32];
  __shared__ double shd[32];
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const T *xr = x + r * cols;
    float *yr = y + r * cols;
    double s;
    float mx = block_row_max_sumexp(xr, cols, shf, shd, &s);
    if (log_) {
      float lsf = (float)log(s);
      for (int64_t j = threadIdx.x; j < cols; j += blockDim.x)
        yr[j] = (dt_load_f32(xr, j) - mx) - lsf;
    } else {
      float inv = (float)(1.0 / s);
      for (int64_t j = threadIdx.x; j < cols; j += blockDim.x)
        yr[j] = expf(dt_load_f32(xr, j) - mx) * inv;
    }
  }
}

// y, dy (rows, cols) -> dx (rows, cols); y is the forward output
static __global__ void softmax_backward_kernel(const float *y, const float *dy, float *dx,
                                               int64_t rows, int64_t cols, int log_) {
  __shared__ double shd[32];
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const float *yr = y + r * cols, *gr = dy + r * cols;
    float *dr = dx + r * cols;
    double s = 0.0;
    for (int64_t j = threadIdx.x; j < cols; j += blockDim.x)
      s += log_ ? (double)gr[j] : (double)gr[j] * yr[j];
    float sf = (float)dt_block_sum(s, shd);
    for (int64_t j = threadIdx.x; j < cols; j += blockDim.x)
      dr[j] = log_ ? gr[j] - expf(yr[j]) * sf : yr[j] * (gr[j] - sf);
  }
}

extern "C" dt_status dt_cuda_softmax_forward(const dt_exec *ex, const float *x, float *y,
                                             int64_t rows, int64_t cols, bool log_) {
  if (rows == 0 || cols == 0)
    return DT_OK;
  DT_CUDA_STORAGE_DISPATCH(ex->dtype, T,
                           launch_rows(ex, rows, cols, softmax_forward_kernel<T>, (const T *)x, y,
                                       rows, cols, (int)log_));
}

extern "C" dt_status dt_cuda_softmax_backward(const dt_exec *ex, const float *y, const float *dy,
                                              float *dx, int64_t rows, int64_t cols, bool log_) {
  if (rows == 0 || cols == 0)
    return DT_OK;
  return launch_rows(ex, rows, cols, softmax_backward_kernel, y, dy, dx, rows, cols, log_);
}

/* ---- causal softmax (attention scores) ---- */

// x (rows, t) of T -> y (rows, t) f32: row r softmax over columns 0..r%t, the rest 0
template <typename T>
static __global__ void causal_softmax_forward_kernel(const T *x, float *y, int64_t rows,
                                                     int64_t t) {
  __shared__ float shf[32];
  __shared__ double shd[32];
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const T *xr = x + r * t;
    float *yr = y + r * t;
    int64_t keep = r % t + 1;
    double s;
    float mx = block_row_max_sumexp(xr, keep, shf, shd, &s);
    float inv = (float)(1.0 / s);
    for (int64_t j = threadIdx.x; j < t; j += blockDim.x)
      yr[j] = j < keep ? expf(dt_load_f32(xr, j) - mx) * inv : 0.0f;
  }
}

// y, dy (rows, t) -> dx (rows, t); masked entries get 0
static __global__ void causal_softmax_backward_kernel(const float *y, const float *dy, float *dx,
                                                      int64_t rows, int64_t t) {
  __shared__ double shd[32];
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const float *yr = y + r * t, *gr = dy + r * t;
    float *dr = dx + r * t;
    int64_t keep = r % t + 1;
    double s = 0.0;
    for (int64_t j = threadIdx.x; j < keep; j += blockDim.x)
      s += (double)gr[j] * yr[j];
    float sf = (float)dt_block_sum(s, shd);
    for (int64_t j = threadIdx.x; j < t; j += blockDim.x)
      dr[j] = j < keep ? yr[j] * (gr[j] - sf) : 0.0f;
  }
}

extern "C" dt_status dt_cuda_causal_softmax_forward(const dt_exec *ex, const float *x, float *y,
                                                    int64_t rows, int64_t t) {
  if (rows == 0 || t == 0)
    return DT_OK;
  DT_CUDA_STORAGE_DISPATCH(
      ex->dtype, T,
      launch_rows(ex, rows, t, causal_softmax_forward_kernel<T>, (const T *)x, y, rows, t));
}

extern "C" dt_status dt_cuda_causal_softmax_backward(const dt_exec *ex, const float *y,
                                                     const float *dy, float *dx, int64_t rows,
                                                     int64_t t) {
  if (rows == 0 || t == 0)
    return DT_OK;
  return launch_rows(ex, rows, t, causal_softmax_backward_kernel, y, dy, dx, rows, t);
}

/* ---- the attention as GEMMs: its row kernels (core/ops_attention.c) ---- */

// s (rows, t) f32 -> p (rows, t) of T: row r keeps columns 0..r%t, p = exp(s - lse), the rest 0;
// lse (rows) written (the max and the sum of exponentials in double), or read when lse_in
template <typename T>
static __global__ void attention_probs_kernel(const float *s, T *p, float *lse, bool lse_in,
                                              int64_t rows, int64_t t) {
  __shared__ float shf[32];
  __shared__ double shd[32];
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const float *sr = s + r * t;
    T *pr = p + r * t;
    const int64_t keep = r % t + 1;
    float l;
    if (lse_in) {
      l = lse[r];
    } else {
      double sum;
      float mx = block_row_max_sumexp(sr, keep, shf, shd, &sum);
      l = (float)((double)mx + log(sum));
      if (threadIdx.x == 0)
        lse[r] = l;
    }
    for (int64_t j = threadIdx.x; j < t; j += blockDim.x)
      dt_store_f32(pr, j, j < keep ? expf(sr[j] - l) : 0.0f);
  }
}

// p (rows, t) of T, dp (rows, t) f32 -> ds (rows, t) of T = p (dp - sum p dp), masked entries 0;
// ds may be p: each thread reads its elements before it writes them
template <typename T>
static __global__ void attention_dscores_kernel(const T *p, const float *dp, T *ds, int64_t rows,
                                                int64_t t) {
  __shared__ double shd[32];
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const T *pr = p + r * t;
    const float *gr = dp + r * t;
    T *dr = ds + r * t;
    const int64_t keep = r % t + 1;
    double acc = 0.0;
    for (int64_t j = threadIdx.x; j < keep; j += blockDim.x)
      acc += (double)dt_load_f32(pr, j) * gr[j];
    const float d = (float)dt_block_sum(acc, shd);
    for (int64_t j = threadIdx.x; j < t; j += blockDim.x)
      dt_store_f32(dr, j, j < keep ? dt_load_f32(pr, j) * (gr[j] - d) : 0.0f);
  }
}

extern "C" dt_status dt_cuda_attention_probs(const dt_exec *ex, const float *s, float *p,
                                             float *lse, bool lse_in, int64_t n, int64_t t) {
  if (n == 0 || t == 0)
    return DT_OK;
  DT_CUDA_STORAGE_DISPATCH(ex->dtype, T,
                           launch_rows(ex, n * t, t, attention_probs_kernel<T>, s, (T *)p, lse,
                                       lse_in, n * t, t));
}

extern "C" dt_status dt_cuda_attention_dscores(const dt_exec *ex, const float *p, const float *dp,
                                               float *ds, int64_t n, int64_t t) {
  if (n == 0 || t == 0)
    return DT_OK;
  DT_CUDA_STORAGE_DISPATCH(ex->dtype, T,
                           launch_rows(ex, n * t, t, attention_dscores_kernel<T>, (const T *)p, dp,
                                       (T *)ds, n * t, t));
}

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
    float mx = block_row_max_sumexp(xr, c, shf, shd, &s);
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
    cross_entropy_forward_kernel<<<row_grid(n), dt_row_threads(c), 0, stream>>>(
        logits, target, i32, n, c, ignore_index, loss_rows, lse, index_slot(ctx, stream));
  return index_checked(ctx, stream, true, target, i32, DT_CUDA_INDEX_CROSS_ENTROPY, c, ignore_index,
                       count);
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

// logits (n,vp), target (n) -> loss_rows (n), dlogits (n,vp) or NULL (may be logits itself);
// report: first bad row, kept rows. T: the storage type of logits and dlogits (f32 math).
template <typename T>
static __global__ void classifier_forward_kernel(const T *logits, const void *target, int i32,
                                                 int64_t n, int64_t vp, int64_t classes,
                                                 int64_t ignore_index, float *loss_rows, T *dlogits,
                                                 float dlogits_scale, dt_cuda_index_slot *rep) {
  __shared__ float shf[32];
  __shared__ double shd[32];
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
    double s;
    float mx = block_row_max_sumexp(xr, classes, shf, shd, &s);
    if (threadIdx.x == 0) {
      loss_rows[i] = (float)((double)mx + log(s) - (double)xt);
      atomicAdd(&rep->kept, 1ull);
    }
    float inv = (float)(1.0 / s);
    for (int64_t j = threadIdx.x; dr && j < vp; j += blockDim.x)
      dt_store_f32(dr, j,
                   j < classes ? (expf(dt_load_f32(xr, j) - mx) * inv - (j == t ? 1.0f : 0.0f)) *
                                     dlogits_scale
                               : 0.0f);
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

extern "C" dt_status dt_cuda_classifier_forward(const dt_exec *ex, const float *logits,
                                                const void *target, dt_dtype target_dtype,
                                                int64_t n, int64_t vp, int64_t classes,
                                                int64_t ignore_index, float *loss_rows,
                                                float *dlogits, float dlogits_scale,
                                                float *count) {
  DT_CUDA_EXEC(ex, ctx, stream);
  int i32 = target_dtype == DT_DTYPE_I32;
  /* cross_entropy_forward's threads: with classes == vp the loss is its bit for bit */
  if (n > 0) {
    void (*launch)(dim3, int, cudaStream_t, const void *, const void *, int, int64_t, int64_t,
                   int64_t, int64_t, float *, void *, float, dt_cuda_index_slot *) =
        ex->dtype == DT_DTYPE_F16    ? classifier_forward_launch<__half>
        : ex->dtype == DT_DTYPE_BF16 ? classifier_forward_launch<__nv_bfloat16>
                                     : classifier_forward_launch<float>;
    launch(row_grid(n), dt_row_threads(vp), stream, logits, target, i32, n, vp, classes,
           ignore_index, loss_rows, dlogits, dlogits_scale, index_slot(ctx, stream));
  }
  return index_checked(ctx, stream, true, target, i32, DT_CUDA_INDEX_CLASSIFIER, classes,
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

extern "C" dt_status dt_cuda_classifier_backward(const dt_exec *ex, float *dlogits,
                                                 const float *dloss, const float *count,
                                                 int64_t n) {
  if (n == 0)
    return DT_OK;
  DT_CUDA_STORAGE_DISPATCH(
      ex->dtype, T,
      dt_launch_flat(ex, n, classifier_backward_kernel<T>, (T *)dlogits, dloss, count, n));
}
/* ---- layer norm ---- */
/* x holds TX (the kernel's ex->dtype), the residual TR; the statistics,
 * the sum, y and every gradient are f32 (op_table.def). */

// the layer norm of one row xr (cols) of T, by the block -> yr, mean[r], rstd[r]
template <typename T>
static __device__ __forceinline__ void layernorm_row(const T *xr, const float *gamma,
                                                     const float *beta, float *yr, float *mean,
                                                     float *rstd, int64_t r, int64_t cols,
                                                     float eps, double *shd) {
  double s = 0.0;
  for (int64_t j = threadIdx.x; j < cols; j += blockDim.x)
    s += dt_load_f32(xr, j);
  double m = dt_block_sum(s, shd) / (double)cols;
  double v = 0.0;
  for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) {
    double d = dt_load_f32(xr, j) - m;
    v += d * d;
  }
  v = dt_block_sum(v, shd);
  float mf = (float)m, rs = (float)(1.0 / sqrt(v / (double)cols + (double)eps));
  if (threadIdx.x == 0) {
    if (mean)
      mean[r] = mf;
    if (rstd)
      rstd[r] = rs;
  }
  for (int64_t j = threadIdx.x; j < cols; j += blockDim.x)
    yr[j] = (dt_load_f32(xr, j) - mf) * rs * (gamma ? gamma[j] : 1.0f) + (beta ? beta[j] : 0.0f);
}

// x (rows, cols) (+ residual -> sum, when residual is not NULL), gamma/beta (cols) or NULL ->
// y (rows, cols), mean, rstd (rows)
template <typename TX, typename TR>
static __global__ void layernorm_forward_kernel(const TX *x, const TR *residual,
                                                const float *gamma, const float *beta, float *sum,
                                                float *y, float *mean, float *rstd, int64_t rows,
                                                int64_t cols, float eps) {
  __shared__ double shd[32];
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const TX *xr = x + r * cols;
    float *yr = y + r * cols;
    if (residual) { /* each thread reads back only the sums it wrote */
      const TR *rr = residual + r * cols;
      float *sr = sum + r * cols;
      for (int64_t j = threadIdx.x; j < cols; j += blockDim.x)
        sr[j] = dt_load_f32(xr, j) + dt_load_f32(rr, j);
      layernorm_row(sr, gamma, beta, yr, mean, rstd, r, cols, eps, shd);
    } else {
      layernorm_row(xr, gamma, beta, yr, mean, rstd, r, cols, eps, shd);
    }
  }
}

// the launch for x of TX: the residual's storage type from its dtype
template <typename TX>
static dt_status layernorm_launch(const dt_exec *ex, const TX *x, const void *residual,
                                  dt_dtype residual_dtype, const float *gamma, const float *beta,
                                  float *sum, float *y, float *mean, float *rstd, int64_t rows,
                                  int64_t cols, float eps) {
  DT_CUDA_STORAGE_DISPATCH(residual_dtype, TR,
                           launch_rows(ex, rows, cols, layernorm_forward_kernel<TX, TR>, x,
                                       (const TR *)residual, gamma, beta, sum, y, mean, rstd, rows,
                                       cols, eps));
}

extern "C" dt_status dt_cuda_layernorm_forward(const dt_exec *ex, const float *x,
                                               const float *gamma, const float *beta, float *y,
                                               float *mean, float *rstd, int64_t rows, int64_t cols,
                                               float eps) {
  if (rows == 0)
    return DT_OK;
  /* no residual: TR float, the instantiation the f32 residual shares */
  DT_CUDA_STORAGE_DISPATCH(ex->dtype, TX,
                           layernorm_launch(ex, (const TX *)x, NULL, DT_DTYPE_F32, gamma, beta,
                                            NULL, y, mean, rstd, rows, cols, eps));
}

extern "C" dt_status dt_cuda_residual_layernorm_forward(const dt_exec *ex, const float *x,
                                                        const float *residual,
                                                        dt_dtype residual_dtype,
                                                        const float *gamma, const float *beta,
                                                        float *sum, float *y, float *mean,
                                                        float *rstd, int64_t rows, int64_t cols,
                                                        float eps) {
  if (rows == 0)
    return DT_OK;
  DT_CUDA_STORAGE_DISPATCH(ex->dtype, TX,
                           layernorm_launch(ex, (const TX *)x, residual, residual_dtype, gamma,
                                            beta, sum, y, mean, rstd, rows, cols, eps));
}

// x (rows, cols) of T, dy (rows, cols), mean/rstd (rows), gamma (cols) -> dx (rows, cols)
// overwritten
template <typename T>
static __global__ void layernorm_backward_dx_kernel(const T *x, const float *gamma,
                                                    const float *mean, const float *rstd,
                                                    const float *dy, float *dx, int64_t rows,
                                                    int64_t cols) {
  __shared__ double shd[32];
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const T *xr = x + r * cols;
    const float *gr = dy + r * cols;
    float *dr = dx + r * cols;
    float m = mean[r], rs = rstd[r];
    double sg = 0.0, sgx = 0.0;
    for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) {
      float g = gr[j] * (gamma ? gamma[j] : 1.0f);
      sg += g;
      sgx += (double)g * ((dt_load_f32(xr, j) - m) * rs);
    }
    sg = dt_block_sum(sg, shd);
    sgx = dt_block_sum(sgx, shd);
    float mg = (float)(sg / (double)cols), mgx = (float)(sgx / (double)cols);
    for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) {
      float g = gr[j] * (gamma ? gamma[j] : 1.0f);
      dr[j] = rs * (g - mg - (dt_load_f32(xr, j) - m) * rs * mgx);
    }
  }
}

// x (rows, cols) of T, dy (rows, cols) -> part (splits, 2, cols): per row-chunk sums of
// dy*xhat and dy
template <typename T>
static __global__ void layernorm_backward_param_partial_kernel(const T *x, const float *mean,
                                                               const float *rstd, const float *dy,
                                                               double *part, int64_t rows,
                                                               int64_t cols, int64_t chunk) {
  int64_t j = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  int64_t split = blockIdx.y;
  if (j >= cols)
    return;
  int64_t r0 = split * chunk, r1 = r0 + chunk < rows ? r0 + chunk : rows;
  double ag = 0.0, ab = 0.0;
  for (int64_t r = r0; r < r1; r++) {
    float g = dy[r * cols + j];
    ag += (double)g * ((dt_load_f32(x, r * cols + j) - mean[r]) * rstd[r]);
    ab += g;
  }
  part[(split * 2) * cols + j] = ag;
  part[(split * 2 + 1) * cols + j] = ab;
}

// part (splits, 2, cols) -> dgamma, dbeta (cols) += sums over splits, in order
static __global__ void layernorm_backward_param_final_kernel(const double *part, int64_t splits,
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

template <typename T>
static dt_status layernorm_backward_as(const dt_exec *ex, const T *x, const float *gamma,
                                       const float *mean, const float *rstd, const float *dy,
                                       float *dx, float *dgamma, float *dbeta, int64_t rows,
                                       int64_t cols) {
  DT_CUDA_EXEC(ex, ctx, stream);
  if (dx) {
    layernorm_backward_dx_kernel<T><<<row_grid(rows), dt_row_threads(cols), 0, stream>>>(
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
  layernorm_backward_param_partial_kernel<T><<<grid, 32, 0, stream>>>(x, mean, rstd, dy, part,
                                                                      rows, cols, chunk);
  cudaError_t e = cudaGetLastError();
  if (e == cudaSuccess) {
    layernorm_backward_param_final_kernel<<<dt_grid_for(cols), DT_THREADS, 0, stream>>>(
        part, splits, cols, dgamma, dbeta);
    e = cudaGetLastError();
  }
  dt_cuda_scratch_free(ctx, part);
  DT_CUDA_CHECK(e);
  return DT_OK;
}

extern "C" dt_status dt_cuda_layernorm_backward(const dt_exec *ex, const float *x,
                                                const float *gamma, const float *mean,
                                                const float *rstd, const float *dy, float *dx,
                                                float *dgamma, float *dbeta, int64_t rows,
                                                int64_t cols) {
  if (rows == 0)
    return DT_OK;
  DT_CUDA_STORAGE_DISPATCH(ex->dtype, T,
                           layernorm_backward_as(ex, (const T *)x, gamma, mean, rstd, dy, dx,
                                                 dgamma, dbeta, rows, cols));
}

/* ---- embedding ---- */

// idx (n), table (v,d) -> y (n,d); report: first bad position
static __global__ void embedding_forward_kernel(const void *idx, int i32, const float *table,
                                                float *y, int64_t n, int64_t v, int64_t d,
                                                dt_cuda_index_slot *rep) {
  DT_GRID_STRIDE(k, n * d) {
    int64_t i = k / d, j = k - i * d;
    int64_t t = index_at(idx, i32, i);
    if (t < 0 || t >= v) {
      if (j == 0)
        atomicMin(&rep->bad, (unsigned long long)i);
      y[k] = 0.0f;
    } else {
      y[k] = table[t * d + j];
    }
  }
}

extern "C" dt_status dt_cuda_embedding_forward(const dt_exec *ex, const void *idx,
                                               dt_dtype idx_dtype, const float *table, float *y,
                                               int64_t n, int64_t v, int64_t d) {
  if (n == 0)
    return DT_OK;
  DT_CUDA_EXEC(ex, ctx, stream);
  int i32 = idx_dtype == DT_DTYPE_I32;
  if (d > 0)
    embedding_forward_kernel<<<dt_grid_for(n * d), DT_THREADS, 0, stream>>>(
        idx, i32, table, y, n, v, d, index_slot(ctx, stream));
  return index_checked(ctx, stream, d > 0, idx, i32, DT_CUDA_INDEX_EMBEDDING, v, 0, NULL);
}

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
  DT_CUDA_STORAGE_DISPATCH(ex->dtype, T,
                           dt_launch_flat(ex, n, dropout_backward_kernel<T>, (const T *)dy, mask,
                                          (T *)dx, n, scale));
}

/* ---- pooling ---- */

/* Output rows oy whose window [oy*s - p, oy*s - p + k) contains input iy. */
static __device__ __forceinline__ void covering(int iy, int s, int p, int k, int on, int *lo,
                                                int *hi) {
  int a = iy + p - k + 1; /* oy*s >= a */
  int l = a <= 0 ? 0 : (a + s - 1) / s;
  int h = (iy + p) / s; /* oy*s <= iy + p */
  *lo = l;
  *hi = h < on - 1 ? h : on - 1;
}

// x (n,c,h,w) -> y (n,c,oh,ow) of T, argmax (n,c,oh,ow) flat index into h*w or NULL
template <typename T>
static __global__ void maxpool_forward_kernel(dt_conv2d_geom g, const T *x, T *y, int32_t *argmax,
                                              int64_t total) {
  DT_GRID_STRIDE(t, total) {
    int64_t plane = t / ((int64_t)g.oh * g.ow);
    int rem = (int)(t - plane * g.oh * g.ow), oy = rem / g.ow, ox = rem - oy * g.ow;
    const T *xp = x + plane * g.h * g.w;
    int y0 = oy * g.sh - g.ph, y1 = min(y0 + g.kh, g.h);
    int x0 = ox * g.sw - g.pw, x1 = min(x0 + g.kw, g.w);
    y0 = max(y0, 0);
    x0 = max(x0, 0);
    float best = -INFINITY;
    int32_t at = y0 * g.w + x0;
    bool nan = false;
    for (int iy = y0; iy < y1 && !nan; iy++)
      for (int ix = x0; ix < x1; ix++) {
        float v = dt_load_f32(xp, iy * g.w + ix);
        if (v > best || v != v) { /* NaN wins, as PyTorch */
          best = v;
          at = iy * g.w + ix;
          if (v != v) {
            nan = true;
            break;
          }
        }
      }
    dt_store_f32(y, t, best); /* exact: best is one of the inputs */
    if (argmax)
      argmax[t] = at;
  }
}

// dy (n,c,oh,ow), argmax -> dx (n,c,h,w) of T: gathers in output order, as the CPU
// scatter, in f32, rounded once
template <typename T>
static __global__ void maxpool_backward_kernel(dt_conv2d_geom g, const T *dy,
                                               const int32_t *argmax, T *dx, int64_t total) {
  DT_GRID_STRIDE(t, total) {
    int64_t plane = t / ((int64_t)g.h * g.w);
    int pos = (int)(t - plane * g.h * g.w), iy = pos / g.w, ix = pos - iy * g.w;
    const T *gp = dy + plane * g.oh * g.ow;
    const int32_t *ap = argmax + plane * g.oh * g.ow;
    int oy0, oy1, ox0, ox1;
    covering(iy, g.sh, g.ph, g.kh, g.oh, &oy0, &oy1);
    covering(ix, g.sw, g.pw, g.kw, g.ow, &ox0, &ox1);
    float s = 0.0f;
    for (int oy = oy0; oy <= oy1; oy++)
      for (int ox = ox0; ox <= ox1; ox++)
        if (ap[oy * g.ow + ox] == pos)
          s += dt_load_f32(gp, oy * g.ow + ox);
    dt_store_f32(dx, t, s);
  }
}

/* Divisor of output (oy, ox): the window clipped to the padded input. */
static __device__ __forceinline__ float avg_divisor(const dt_conv2d_geom &g, int oy, int ox) {
  int y0 = oy * g.sh - g.ph, x0 = ox * g.sw - g.pw;
  int y1 = min(y0 + g.kh, g.h + g.ph), x1 = min(x0 + g.kw, g.w + g.pw);
  return (float)((y1 - y0) * (x1 - x0));
}

// x (n,c,h,w) -> y (n,c,oh,ow) of T, padding counted in the divisor; sums in f32
template <typename T>
static __global__ void avgpool_forward_kernel(dt_conv2d_geom g, const T *x, T *y, int64_t total) {
  DT_GRID_STRIDE(t, total) {
    int64_t plane = t / ((int64_t)g.oh * g.ow);
    int rem = (int)(t - plane * g.oh * g.ow), oy = rem / g.ow, ox = rem - oy * g.ow;
    const T *xp = x + plane * g.h * g.w;
    int y0 = max(oy * g.sh - g.ph, 0), y1 = min(oy * g.sh - g.ph + g.kh, g.h);
    int x0 = max(ox * g.sw - g.pw, 0), x1 = min(ox * g.sw - g.pw + g.kw, g.w);
    float s = 0.0f;
    for (int iy = y0; iy < y1; iy++)
      for (int ix = x0; ix < x1; ix++)
        s += dt_load_f32(xp, iy * g.w + ix);
    dt_store_f32(y, t, s / avg_divisor(g, oy, ox));
  }
}

// dy (n,c,oh,ow) -> dx (n,c,h,w) of T: gathers in output order, as the CPU scatter
template <typename T>
static __global__ void avgpool_backward_kernel(dt_conv2d_geom g, const T *dy, T *dx,
                                               int64_t total) {
  DT_GRID_STRIDE(t, total) {
    int64_t plane = t / ((int64_t)g.h * g.w);
    int pos = (int)(t - plane * g.h * g.w), iy = pos / g.w, ix = pos - iy * g.w;
    const T *gp = dy + plane * g.oh * g.ow;
    int oy0, oy1, ox0, ox1;
    covering(iy, g.sh, g.ph, g.kh, g.oh, &oy0, &oy1);
    covering(ix, g.sw, g.pw, g.kw, g.ow, &ox0, &ox1);
    float s = 0.0f;
    for (int oy = oy0; oy <= oy1; oy++)
      for (int ox = ox0; ox <= ox1; ox++)
        s += dt_load_f32(gp, oy * g.ow + ox) / avg_divisor(g, oy, ox);
    dt_store_f32(dx, t, s);
  }
}

extern "C" dt_status dt_cuda_maxpool2d_forward(const dt_exec *ex, const dt_conv2d_geom *g,
                                               const float *x, float *y, int32_t *argmax) {
  int64_t total = (int64_t)g->n * g->c * g->oh * g->ow;
  if (total == 0)
    return DT_OK;
  DT_CUDA_STORAGE_DISPATCH(ex->dtype, T,
                           dt_launch_flat(ex, total, maxpool_forward_kernel<T>, *g, (const T *)x,
                                          (T *)y, argmax, total));
}

extern "C" dt_status dt_cuda_maxpool2d_backward(const dt_exec *ex, const dt_conv2d_geom *g,
                                                const float *dy, const int32_t *argmax, float *dx) {
  int64_t total = (int64_t)g->n * g->c * g->h * g->w;
  if (total == 0)
    return DT_OK;
  DT_CUDA_STORAGE_DISPATCH(ex->dtype, T,
                           dt_launch_flat(ex, total, maxpool_backward_kernel<T>, *g,
                                          (const T *)dy, argmax, (T *)dx, total));
}

extern "C" dt_status dt_cuda_avgpool2d_forward(const dt_exec *ex, const dt_conv2d_geom *g,
                                               const float *x, float *y) {
  int64_t total = (int64_t)g->n * g->c * g->oh * g->ow;
  if (total == 0)
    return DT_OK;
  DT_CUDA_STORAGE_DISPATCH(ex->dtype, T,
                           dt_launch_flat(ex, total, avgpool_forward_kernel<T>, *g, (const T *)x,
                                          (T *)y, total));
}

extern "C" dt_status dt_cuda_avgpool2d_backward(const dt_exec *ex, const dt_conv2d_geom *g,
                                                const float *dy, float *dx) {
  int64_t total = (int64_t)g->n * g->c * g->h * g->w;
  if (total == 0)
    return DT_OK;
  DT_CUDA_STORAGE_DISPATCH(ex->dtype, T,
                           dt_launch_flat(ex, total, avgpool_backward_kernel<T>, *g,
                                          (const T *)dy, (T *)dx, total));
}
