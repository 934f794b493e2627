/* CUDA kernels of the fused causal self-attention (core/op_table.def:
 * causal_attention_forward / causal_attention_backward), flash-attention 2 style in f32:
 * the (T, T) scores of a head are never stored. Semantics follow the CPU
 * reference (core/cpu_kernels_attention.c).
 *
 * Every kernel works on 32 x 32 tiles of (queries, keys) with 128 threads:
 * warp w owns 8 rows of its tile; in the score phase lane l owns column l of
 * the tile, in the accumulation phase lane l owns the head columns l, l+32,
 * ... (HPL = ceil(hd / 32) of them, a template parameter: hd <= 128).
 *   forward   grid (query tiles) x (b, h): online softmax over the key
 *             tiles up to the diagonal; writes out and the row logsumexp.
 *   backward  D = rowsum(dout * out); then dK, dV with a grid over key tiles
 *             (each looping over the query tiles at or below the diagonal)
 *             and dQ with a grid over query tiles (looping over the key
 *             tiles), both recomputing P = exp(S - lse). Every gradient
 *             element is summed by one thread in a fixed order: no atomics,
 *             so the backward is deterministic.
 * qkv, out, dout and dqkv may be f16 or bf16 (ex->dtype, mixed precision):
 * the kernels read them into the f32 shared tiles and round out and dqkv
 * once, so softmax and accumulation stay f32 while every tensor but lse
 * moves half the bytes (llm.c's bf16 attention).
 * Shared tiles are (32, hd + 1) floats (the +1 keeps the lanes reading a
 * column of a row-major tile on distinct banks); above 48 KiB the kernels
 * opt in to the larger dynamic shared memory of the device.
 *
 * A 16-bit qkv whose head size is 16, 32, 64 or 128 runs the same passes on
 * the tensor cores instead (kernels_attention_mma.cu). Under autocast
 * core/ops_attention.c runs a 16-bit attention on a GPU as the heads'
 * batched GEMMs unless DT_ATTENTION=fused asks for these kernels
 * (docs/decisions.md); that path's two row kernels are at the end of this
 * file. */
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <math.h>

#include "cuda/kernels_attention.cuh"

static __device__ __forceinline__ float att_f32(float x) { return x; }
static __device__ __forceinline__ float att_f32(__half x) { return __half2float(x); }
static __device__ __forceinline__ float att_f32(__nv_bfloat16 x) { return __bfloat162float(x); }

/* Loads rows [r0, r0 + ATT_TILE) of a head's hd columns (rows `stride`
 * apart; rows past t read as 0) into a (ATT_TILE, hd + 1) f32 shared tile. */
template <typename T>
static __device__ __forceinline__ void load_tile(float *dst, const T *src, int64_t stride,
                                                 int64_t r0, const att_dims &g) {
  const int hd = (int)g.hd, ld = hd + 1;
  for (int k = threadIdx.x; k < ATT_TILE * hd; k += blockDim.x) {
    int r = k / hd, d = k - r * hd;
    int64_t i = r0 + r;
    dst[r * ld + d] = i < g.t ? att_f32(src[i * stride + d]) : 0.0f;
  }
}

/* s[r] = row (warp * ATT_ROWS + r) of `rows` . row `lane` of `cols` (both
 * (ATT_TILE, hd + 1) shared tiles): the warp's 8 x 32 block of scores. */
static __device__ __forceinline__ void tile_dots(float (&s)[ATT_ROWS], const float *rows,
                                                 const float *cols, int hd) {
  const int ld = hd + 1, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const float *own = rows + warp * ATT_ROWS * ld;
#pragma unroll
  for (int r = 0; r < ATT_ROWS; r++)
    s[r] = 0.0f;
  for (int d = 0; d < hd; d++) {
    float c = cols[lane * ld + d];
#pragma unroll
    for (int r = 0; r < ATT_ROWS; r++)
      s[r] += own[r * ld + d] * c;
  }
}

/* acc[r][e] += sum over jj < n of w[r][jj] * tile[jj][lane + 32e]: the
 * warp's rows times a shared tile (w is the warp's (ATT_ROWS, 32) weights). */
template <int HPL>
static __device__ __forceinline__ void accumulate_tile(float (&acc)[ATT_ROWS][HPL], const float *w,
                                                       const float *tile, int n, int hd) {
  const int ld = hd + 1, lane = threadIdx.x & 31;
  for (int jj = 0; jj < n; jj++) {
    float x[HPL];
#pragma unroll
    for (int e = 0; e < HPL; e++) {
      int d = lane + 32 * e;
      x[e] = d < hd ? tile[jj * ld + d] : 0.0f;
    }
#pragma unroll
    for (int r = 0; r < ATT_ROWS; r++) {
      float wr = w[r * 32 + jj];
#pragma unroll
      for (int e = 0; e < HPL; e++)
        acc[r][e] += wr * x[e];
    }
  }
}

/* Row r0 + r (r < ATT_ROWS, below t) of dst (rows `stride` apart, of T) =
 * acc[r] * mul[r] (mul NULL: acc[r]), rounded once to T. */
template <int HPL, typename T>
static __device__ __forceinline__ void store_rows(const float (&acc)[ATT_ROWS][HPL],
                                                  const float *mul, T *dst, int64_t stride,
                                                  int64_t r0, const att_dims &g) {
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int r = 0; r < ATT_ROWS; r++) {
    if (r0 + r >= g.t)
      continue;
    T *row = dst + (r0 + r) * stride;
#pragma unroll
    for (int e = 0; e < HPL; e++) {
      int d = lane + 32 * e;
      if (d < g.hd)
        dt_store_f32(row, d, mul ? acc[r][e] * mul[r] : acc[r][e]);
    }
  }
}

/* The number of rows of a tile starting at r0 that lie below t. */
static __device__ __forceinline__ int rows_below(int64_t r0, int64_t t) {
  return (int)(t - r0 < ATT_TILE ? t - r0 : ATT_TILE);
}

// qkv (b, t, 3c) of T -> out (b, t, c) of T, lse (b, h, t) or NULL
template <typename T, int HPL>
static __global__ void __launch_bounds__(ATT_THREADS)
    attention_forward_kernel(const T *qkv, T *out, float *lse, att_dims g) {
  extern __shared__ float sm[];
  const int hd = (int)g.hd, ld = hd + 1, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  float *sq = sm, *sk = sq + ATT_TILE * ld, *sv = sk + ATT_TILE * ld, *sp = sv + ATT_TILE * ld;
  /* the heaviest tiles (most keys) first */
  const int qt = g.tiles - 1 - (int)(blockIdx.x % g.tiles);
  const int64_t bh = blockIdx.x / g.tiles, bi = bh / g.h, hi = bh % g.h;
  const int64_t q0 = (int64_t)qt * ATT_TILE;
  const T *base = qkv + bi * g.t * g.row + hi * hd;
  load_tile(sq, base, g.row, q0, g);
  float m[ATT_ROWS], l[ATT_ROWS], acc[ATT_ROWS][HPL];
#pragma unroll
  for (int r = 0; r < ATT_ROWS; r++) {
    m[r] = -INFINITY;
    l[r] = 0.0f;
#pragma unroll
    for (int e = 0; e < HPL; e++)
      acc[r][e] = 0.0f;
  }
  float *wp = sp + warp * ATT_ROWS * 32; /* this warp's P (ATT_ROWS, 32) */
  for (int kt = 0; kt <= qt; kt++) {
    const int64_t k0 = (int64_t)kt * ATT_TILE;
    __syncthreads(); /* the previous key tile is no longer read */
    load_tile(sk, base + g.c, g.row, k0, g);
    load_tile(sv, base + 2 * g.c, g.row, k0, g);
    __syncthreads();
    float s[ATT_ROWS];
    tile_dots(s, sq, sk, hd);
    const int64_t j = k0 + lane;
#pragma unroll
    for (int r = 0; r < ATT_ROWS; r++) {
      const int64_t i = q0 + warp * ATT_ROWS + r;
      const bool keep = j <= i && i < g.t; /* j <= i < t: j is a real key */
      float x = keep ? s[r] * g.scale : -INFINITY;
      float mx = fmaxf(m[r], dt_warp_max(x));
      /* mx is -inf only for rows past t, which keep nothing */
      float p = keep ? expf(x - mx) : 0.0f;
      float alpha = mx == -INFINITY ? 1.0f : expf(m[r] - mx);
      l[r] = l[r] * alpha + dt_warp_sum(p);
      m[r] = mx;
#pragma unroll
      for (int e = 0; e < HPL; e++)
        acc[r][e] *= alpha;
      wp[r * 32 + lane] = p;
    }
    __syncwarp();
    accumulate_tile<HPL>(acc, wp, sv, rows_below(k0, g.t), hd);
    __syncwarp();
  }
  float inv[ATT_ROWS];
#pragma unroll
  for (int r = 0; r < ATT_ROWS; r++) {
    const int64_t i = q0 + warp * ATT_ROWS + r;
    inv[r] = 1.0f / l[r];
    if (lse && lane == 0 && i < g.t)
      lse[bh * g.t + i] = m[r] + logf(l[r]);
  }
  store_rows<HPL>(acc, inv, out + bi * g.t * g.c + hi * hd, g.c, q0 + warp * ATT_ROWS, g);
}

// out, dout (b, t, c) of T -> dsum (b, h, t) = rowsum over each head's columns of dout * out
template <typename T>
static __global__ void attention_rowdot_kernel(const T *out, const T *dout, float *dsum,
                                               att_dims g) {
  const int lane = threadIdx.x & 31;
  const int64_t warps = (int64_t)gridDim.x * (blockDim.x >> 5);
  const int64_t rows = g.b * g.h * g.t;
  for (int64_t w = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5; w < rows; w += warps) {
    int64_t bh = w / g.t, i = w - bh * g.t, bi = bh / g.h, hi = bh % g.h;
    const int64_t off = (bi * g.t + i) * g.c + hi * g.hd;
    float s = 0.0f;
    for (int64_t d = lane; d < g.hd; d += 32)
      s += dt_load_f32(dout, off + d) * dt_load_f32(out, off + d);
    s = dt_warp_sum(s);
    if (lane == 0)
      dsum[w] = s;
  }
}

// dQ of one query tile: dq = scale * sum_j dS_ij k_j over the key tiles <= the diagonal
template <typename T, int HPL>
static __global__ void __launch_bounds__(ATT_THREADS)
    attention_backward_dq_kernel(const T *qkv, const float *lse, const float *dsum, const T *dout,
                                 T *dqkv, att_dims g) {
  extern __shared__ float sm[];
  const int hd = (int)g.hd, ld = hd + 1, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  float *sq = sm, *sdo = sq + ATT_TILE * ld, *sk = sdo + ATT_TILE * ld, *sv = sk + ATT_TILE * ld,
        *sds = sv + ATT_TILE * ld;
  const int qt = g.tiles - 1 - (int)(blockIdx.x % g.tiles);
  const int64_t bh = blockIdx.x / g.tiles, bi = bh / g.h, hi = bh % g.h;
  const int64_t q0 = (int64_t)qt * ATT_TILE;
  const T *base = qkv + bi * g.t * g.row + hi * hd;
  load_tile(sq, base, g.row, q0, g);
  load_tile(sdo, dout + bi * g.t * g.c + hi * hd, g.c, q0, g);
  float li[ATT_ROWS], di[ATT_ROWS], dq[ATT_ROWS][HPL];
#pragma unroll
  for (int r = 0; r < ATT_ROWS; r++) {
    const int64_t i = q0 + warp * ATT_ROWS + r;
    li[r] = i < g.t ? lse[bh * g.t + i] : 0.0f;
    di[r] = i < g.t ? dsum[bh * g.t + i] : 0.0f;
#pragma unroll
    for (int e = 0; e < HPL; e++)
      dq[r][e] = 0.0f;
  }
  float *wds = sds + warp * ATT_ROWS * 32;
  for (int kt = 0; kt <= qt; kt++) {
    const int64_t k0 = (int64_t)kt * ATT_TILE;
    __syncthreads();
    load_tile(sk, base + g.c, g.row, k0, g);
    load_tile(sv, base + 2 * g.c, g.row, k0, g);
    __syncthreads();
    float s[ATT_ROWS], dp[ATT_ROWS];
    tile_dots(s, sq, sk, hd);
    tile_dots(dp, sdo, sv, hd);
    const int64_t j = k0 + lane;
#pragma unroll
    for (int r = 0; r < ATT_ROWS; r++) {
      const int64_t i = q0 + warp * ATT_ROWS + r;
      float p = j <= i && i < g.t ? expf(s[r] * g.scale - li[r]) : 0.0f;
      wds[r * 32 + lane] = p * (dp[r] - di[r]) * g.scale;
    }
    __syncwarp();
    accumulate_tile<HPL>(dq, wds, sk, rows_below(k0, g.t), hd);
    __syncwarp();
  }
  store_rows<HPL>(dq, NULL, dqkv + bi * g.t * g.row + hi * hd, g.row, q0 + warp * ATT_ROWS, g);
}

// dK, dV of one key tile: dv = sum_i P_ij dout_i, dk = scale * sum_i dS_ij q_i over the
// query tiles >= the diagonal
template <typename T, int HPL>
static __global__ void __launch_bounds__(ATT_THREADS)
    attention_backward_dkv_kernel(const T *qkv, const float *lse, const float *dsum, const T *dout,
                                  T *dqkv, att_dims g) {
  extern __shared__ float sm[];
  const int hd = (int)g.hd, ld = hd + 1, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  float *sk = sm, *sv = sk + ATT_TILE * ld, *sq = sv + ATT_TILE * ld, *sdo = sq + ATT_TILE * ld,
        *sp = sdo + ATT_TILE * ld, *sds = sp + ATT_TILE * 32, *sl = sds + ATT_TILE * 32,
        *sd = sl + ATT_TILE;
  /* the key tiles with the most queries (the first) first */
  const int kt = (int)(blockIdx.x % g.tiles);
  const int64_t bh = blockIdx.x / g.tiles, bi = bh / g.h, hi = bh % g.h;
  const int64_t k0 = (int64_t)kt * ATT_TILE;
  const T *base = qkv + bi * g.t * g.row + hi * hd;
  const T *gbase = dout + bi * g.t * g.c + hi * hd;
  load_tile(sk, base + g.c, g.row, k0, g);
  load_tile(sv, base + 2 * g.c, g.row, k0, g);
  float dk[ATT_ROWS][HPL], dv[ATT_ROWS][HPL];
#pragma unroll
  for (int r = 0; r < ATT_ROWS; r++)
#pragma unroll
    for (int e = 0; e < HPL; e++)
      dk[r][e] = dv[r][e] = 0.0f;
  float *wp = sp + warp * ATT_ROWS * 32, *wds = sds + warp * ATT_ROWS * 32;
  for (int qt = kt; qt < g.tiles; qt++) {
    const int64_t q0 = (int64_t)qt * ATT_TILE;
    __syncthreads();
    load_tile(sq, base, g.row, q0, g);
    load_tile(sdo, gbase, g.c, q0, g);
    if (threadIdx.x < ATT_TILE) {
      int64_t i = q0 + threadIdx.x;
      sl[threadIdx.x] = i < g.t ? lse[bh * g.t + i] : 0.0f;
      sd[threadIdx.x] = i < g.t ? dsum[bh * g.t + i] : 0.0f;
    }
    __syncthreads();
    float s[ATT_ROWS], dp[ATT_ROWS];
    tile_dots(s, sk, sq, hd); /* rows: the warp's keys; lanes: queries */
    tile_dots(dp, sv, sdo, hd);
    const int64_t i = q0 + lane; /* lane = query */
#pragma unroll
    for (int r = 0; r < ATT_ROWS; r++) {
      const int64_t j = k0 + warp * ATT_ROWS + r;
      float p = j <= i && i < g.t ? expf(s[r] * g.scale - sl[lane]) : 0.0f;
      wp[r * 32 + lane] = p;
      wds[r * 32 + lane] = p * (dp[r] - sd[lane]) * g.scale;
    }
    __syncwarp();
    accumulate_tile<HPL>(dv, wp, sdo, rows_below(q0, g.t), hd);
    accumulate_tile<HPL>(dk, wds, sq, rows_below(q0, g.t), hd);
    __syncwarp();
  }
  T *drow = dqkv + bi * g.t * g.row + hi * hd;
  store_rows<HPL>(dk, NULL, drow + g.c, g.row, k0 + warp * ATT_ROWS, g);
  store_rows<HPL>(dv, NULL, drow + 2 * g.c, g.row, k0 + warp * ATT_ROWS, g);
}

/* The launch geometry, or an error for what the kernels do not cover. */
static dt_status attention_dims(const char *op, int64_t b, int64_t t, int64_t h, int64_t hd,
                                att_dims *g) {
  if (hd > ATT_MAX_HD)
    return DT_ERROR(DT_ERR_UNSUPPORTED,
                    "%s: head size %lld: the CUDA kernels take heads of at most %d columns "
                    "(use more heads, or the CPU)",
                    op, (long long)hd, ATT_MAX_HD);
  int64_t tiles = (t + ATT_TILE - 1) / ATT_TILE;
  if (b * h * tiles > 0x7fffffff)
    return DT_ERROR(DT_ERR_UNSUPPORTED,
                    "%s: %lld sequences x %lld heads x %lld tiles is beyond one grid", op,
                    (long long)b, (long long)h, (long long)tiles);
  g->b = b, g->t = t, g->h = h, g->hd = hd, g->c = h * hd, g->row = 3 * h * hd;
  g->tiles = (int)tiles;
  g->scale = (float)(1.0 / sqrt((double)hd));
  g->vec = false; /* the tensor-core launch decides (kernels_attention_mma.cu) */
  return DT_OK;
}

/* Launches kernel<HPL> for hd with `tile_floats` (ATT_TILE, hd + 1) tiles
 * plus `extra` floats of dynamic shared memory. */
template <typename... Params, typename... Args>
static dt_status attention_launch(void (*const *kernels)(Params...), const att_dims &g,
                                  int tiles_in_smem, int extra, cudaStream_t stream, Args... args) {
  void (*kernel)(Params...) = kernels[(g.hd + 31) / 32 - 1];
  size_t smem =
      ((size_t)tiles_in_smem * ATT_TILE * (size_t)(g.hd + 1) + (size_t)extra) * sizeof(float);
  if (smem > 48 * 1024)
    DT_CUDA_CHECK(
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
  unsigned blocks = (unsigned)(g.b * g.h * g.tiles);
  kernel<<<blocks, ATT_THREADS, smem, stream>>>(args...);
  DT_CUDA_CHECK_LAUNCH();
  return DT_OK;
}

template <typename T>
static dt_status attention_forward_as(const T *qkv, T *out, float *lse, const att_dims &g,
                                      cudaStream_t stream) {
  static void (*const kernels[4])(const T *, T *, float *, att_dims) = {
      attention_forward_kernel<T, 1>, attention_forward_kernel<T, 2>,
      attention_forward_kernel<T, 3>, attention_forward_kernel<T, 4>};
  return attention_launch(kernels, g, 3, ATT_TILE * 32, stream, qkv, out, lse, g);
}

extern "C" dt_status dt_cuda_causal_attention_forward(const dt_exec *ex, const float *qkv,
                                                      float *out, float *lse, int64_t b, int64_t t,
                                                      int64_t h, int64_t hd) {
  if (b * t == 0)
    return DT_OK;
  att_dims g;
  DT_CHECK(attention_dims("causal_attention_forward", b, t, h, hd, &g));
  DT_CUDA_EXEC(ex, ctx, stream);
  (void)ctx;
  if (ex->dtype != DT_DTYPE_F32 && dt_attention_mma_head(hd))
    return dt_attention_mma_forward(ex->dtype, qkv, out, lse, g, stream);
  DT_CUDA_STORAGE_DISPATCH(ex->dtype, T,
                           attention_forward_as((const T *)qkv, (T *)out, lse, g, stream));
}

/* dQ, then dK and dV, from the row sums dsum (b, h, t). */
template <typename T>
static dt_status attention_backward_as(const T *qkv, const float *lse, const float *dsum,
                                       const T *dout, T *dqkv, const att_dims &g,
                                       cudaStream_t stream) {
  typedef void (*bwd_kernel)(const T *, const float *, const float *, const T *, T *, att_dims);
  static const bwd_kernel dq[4] = {
      attention_backward_dq_kernel<T, 1>, attention_backward_dq_kernel<T, 2>,
      attention_backward_dq_kernel<T, 3>, attention_backward_dq_kernel<T, 4>};
  static const bwd_kernel dkv[4] = {
      attention_backward_dkv_kernel<T, 1>, attention_backward_dkv_kernel<T, 2>,
      attention_backward_dkv_kernel<T, 3>, attention_backward_dkv_kernel<T, 4>};
  DT_CHECK(
      attention_launch(dq, g, 4, ATT_WARPS * ATT_ROWS * 32, stream, qkv, lse, dsum, dout, dqkv, g));
  return attention_launch(dkv, g, 4, 2 * ATT_TILE * 32 + 2 * ATT_TILE, stream, qkv, lse, dsum, dout,
                          dqkv, g);
}

/* dsum = rowsum(dout * out), then dQ, dK and dV: on the tensor cores for
 * a 16-bit qkv whose head size they take, else on the f32 tiles. */
template <typename T>
static dt_status attention_backward_rows(dt_dtype dtype, const T *qkv, const T *out,
                                         const float *lse, float *dsum, const T *dout, T *dqkv,
                                         const att_dims &g, cudaStream_t stream) {
  attention_rowdot_kernel<T>
      <<<dt_grid_for(g.b * g.h * g.t * 32), DT_THREADS, 0, stream>>>(out, dout, dsum, g);
  DT_CUDA_CHECK_LAUNCH();
  if (dtype != DT_DTYPE_F32 && dt_attention_mma_head(g.hd))
    return dt_attention_mma_backward(dtype, qkv, lse, dsum, dout, dqkv, g, stream);
  return attention_backward_as(qkv, lse, dsum, dout, dqkv, g, stream);
}

extern "C" dt_status dt_cuda_causal_attention_backward(const dt_exec *ex, const float *qkv,
                                                       const float *out, const float *lse,
                                                       const float *dout, float *dqkv, int64_t b,
                                                       int64_t t, int64_t h, int64_t hd) {
  if (b * t == 0)
    return DT_OK;
  att_dims g;
  DT_CHECK(attention_dims("causal_attention_backward", b, t, h, hd, &g));
  DT_CUDA_EXEC(ex, ctx, stream);
  float *dsum = NULL;
  DT_CHECK(dt_cuda_scratch_alloc(ctx, (size_t)(b * h * t) * sizeof(float), (void **)&dsum));
  dt_status st = DT_OK;
  switch (ex->dtype) { /* every pointer but lse holds ex->dtype's elements */
    case DT_DTYPE_F16:
      st = attention_backward_rows(ex->dtype, (const __half *)qkv, (const __half *)out, lse, dsum,
                                   (const __half *)dout, (__half *)dqkv, g, stream);
      break;
    case DT_DTYPE_BF16:
      st = attention_backward_rows(ex->dtype, (const __nv_bfloat16 *)qkv,
                                   (const __nv_bfloat16 *)out, lse, dsum,
                                   (const __nv_bfloat16 *)dout, (__nv_bfloat16 *)dqkv, g, stream);
      break;
    default: st = attention_backward_rows(ex->dtype, qkv, out, lse, dsum, dout, dqkv, g, stream);
  }
  dt_cuda_scratch_free(ctx, dsum);
  return st;
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
      float mx = dt_block_row_max_sumexp(sr, keep, shf, shd, &sum);
      l = (float)((double)mx + log(sum));
      if (threadIdx.x == 0)
        lse[r] = l;
    }
    for (int64_t j = threadIdx.x; j < t; j += blockDim.x)
      dt_store_f32(pr, j, j < keep ? expf(sr[j] - l) : 0.0f);
  }
}

extern "C" dt_status dt_cuda_causal_attention_probs(const dt_exec *ex, const float *s, float *p,
                                                    float *lse, bool lse_in, int64_t n, int64_t t) {
  if (n == 0 || t == 0)
    return DT_OK;
  DT_CUDA_STORAGE_DISPATCH(
      ex->dtype, T,
      dt_launch_rows(ex, n * t, t, attention_probs_kernel<T>, s, (T *)p, lse, lse_in, n * t, t));
}
