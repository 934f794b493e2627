/* CUDA kernels of the fused causal self-attention (core/op_table.def:
 * attention_forward / attention_backward), flash-attention 2 style in f32:
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
 * qkv may be f16 or bf16 (ex->dtype, mixed precision): the kernels read it
 * into the f32 shared tiles, so softmax and accumulation stay f32 while the
 * largest input moves half the bytes (llm.c's bf16 attention).
 * Shared tiles are (32, hd + 1) floats (the +1 keeps the lanes reading a
 * column of a row-major tile on distinct banks); above 48 KiB the kernels
 * opt in to the larger dynamic shared memory of the device.
 *
 * A 16-bit qkv whose head size is 16, 32, 64 or 128 runs the same passes on
 * the tensor cores instead (WMMA, below: "16-bit qkv on the tensor
 * cores"). Under autocast core/ops_attention.c runs a 16-bit attention on a
 * GPU as the heads' batched GEMMs unless DT_ATTENTION=fused asks for these
 * kernels (docs/decisions.md). */
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <math.h>
#include <mma.h>

#include <type_traits>

#include "cuda/kernels_common.cuh"

#define ATT_TILE 32
#define ATT_WARPS 4
#define ATT_ROWS 8 /* rows per warp: ATT_TILE / ATT_WARPS */
#define ATT_THREADS (32 * ATT_WARPS)
#define ATT_MAX_HD 128

/* The geometry of a launch: b sequences of t positions, h heads of hd. */
struct att_dims {
  int64_t b, t, h, hd, c, row; /* c = h * hd, row = 3c (qkv's row stride) */
  int tiles;                   /* ceil(t / ATT_TILE) */
  float scale;
};

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

/* Row r0 + r (r < ATT_ROWS, below t) of dst (rows `stride` apart) =
 * acc[r] * mul[r] (mul NULL: acc[r]). */
template <int HPL>
static __device__ __forceinline__ void store_rows(const float (&acc)[ATT_ROWS][HPL],
                                                  const float *mul, float *dst, int64_t stride,
                                                  int64_t r0, const att_dims &g) {
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int r = 0; r < ATT_ROWS; r++) {
    if (r0 + r >= g.t)
      continue;
    float *row = dst + (r0 + r) * stride;
#pragma unroll
    for (int e = 0; e < HPL; e++) {
      int d = lane + 32 * e;
      if (d < g.hd)
        row[d] = mul ? acc[r][e] * mul[r] : acc[r][e];
    }
  }
}

/* The number of rows of a tile starting at r0 that lie below t. */
static __device__ __forceinline__ int rows_below(int64_t r0, int64_t t) {
  return (int)(t - r0 < ATT_TILE ? t - r0 : ATT_TILE);
}

// qkv (b, t, 3c) of T -> out (b, t, c), lse (b, h, t) or NULL
template <typename T, int HPL>
static __global__ void __launch_bounds__(ATT_THREADS)
    attention_forward_kernel(const T *qkv, float *out, float *lse, att_dims g) {
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

// out, dout (b, t, c) -> dsum (b, h, t) = rowsum over each head's columns of dout * out
static __global__ void attention_rowdot_kernel(const float *out, const float *dout, float *dsum,
                                               att_dims g) {
  const int lane = threadIdx.x & 31;
  const int64_t warps = (int64_t)gridDim.x * (blockDim.x >> 5);
  const int64_t rows = g.b * g.h * g.t;
  for (int64_t w = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5; w < rows; w += warps) {
    int64_t bh = w / g.t, i = w - bh * g.t, bi = bh / g.h, hi = bh % g.h;
    const int64_t off = (bi * g.t + i) * g.c + hi * g.hd;
    float s = 0.0f;
    for (int64_t d = lane; d < g.hd; d += 32)
      s += dout[off + d] * out[off + d];
    s = dt_warp_sum(s);
    if (lane == 0)
      dsum[w] = s;
  }
}

// dQ of one query tile: dq = scale * sum_j dS_ij k_j over the key tiles <= the diagonal
template <typename T, int HPL>
static __global__ void __launch_bounds__(ATT_THREADS)
    attention_backward_dq_kernel(const T *qkv, const float *lse, const float *dsum,
                                 const float *dout, float *dqkv, att_dims g) {
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
    attention_backward_dkv_kernel(const T *qkv, const float *lse, const float *dsum,
                                  const float *dout, float *dqkv, att_dims g) {
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
  const float *gbase = dout + bi * g.t * g.c + hi * hd;
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
  float *drow = dqkv + bi * g.t * g.row + hi * hd;
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

/* ---- 16-bit qkv on the tensor cores (WMMA) ----
 *
 * For f16/bf16 qkv and a head size of 16, 32, 64 or 128 the same three
 * passes run on the tensor cores: flash attention 2 with blocks of 64
 * queries (forward, dQ) or 64 keys (dK, dV) and 4 warps of 16 rows, the
 * products as 16 x 16 x 16 WMMA tiles with f32 accumulation. The operands
 * sit in shared memory in qkv's type; the softmax statistics, the output
 * and the gradients accumulate in f32; the probabilities P, dO and dS are
 * rounded to qkv's type where a product reads them (as flash attention
 * does). The forward keeps the running output in shared memory (its rows
 * are rescaled by the online softmax); the backward's accumulators are
 * fragments. No atomics: each gradient element is summed by one warp in a
 * fixed order. Other head sizes keep the f32 tiles above. */
namespace wm = nvcuda::wmma;

#define MMA_TILE 64 /* rows of a block (queries or keys), and of an inner tile */
#define MMA_PAD 8   /* padding of a row of a 16-bit shared tile (elements) */
#define MMA_FPAD 4  /* of an f32 one */
#define MMA_LDS (MMA_TILE + MMA_FPAD)
#define MMA_LDP (MMA_TILE + MMA_PAD)

template <typename T>
using mma_a = wm::fragment<wm::matrix_a, 16, 16, 16, T, wm::row_major>;
template <typename T>
using mma_b_row = wm::fragment<wm::matrix_b, 16, 16, 16, T, wm::row_major>;
template <typename T>
using mma_b_col = wm::fragment<wm::matrix_b, 16, 16, 16, T, wm::col_major>;
using mma_acc = wm::fragment<wm::accumulator, 16, 16, 16, float>;

static bool mma_head(int64_t hd) { return hd == 16 || hd == 32 || hd == 64 || hd == 128; }

/* Rows [r0, r0 + MMA_TILE) of a head's HD columns (rows `stride` apart, of
 * S: qkv's type or f32) into a shared tile of T with leading dimension ld;
 * rows past t are 0. */
template <typename T, typename S>
static __device__ __forceinline__ void mma_load(T *dst, int ld, const S *src, int64_t stride,
                                                int64_t r0, int64_t t, int hd) {
  for (int k = threadIdx.x; k < MMA_TILE * hd; k += blockDim.x) {
    const int r = k / hd, d = k - r * hd;
    const int64_t i = r0 + r;
    dt_store_f32(dst, r * ld + d, i < t ? dt_load_f32(src, i * stride + d) : 0.0f);
  }
}

/* c (16 x 64, f32, ldc) = the warp's 16 rows of `rows` (ld ldr) times the
 * transpose of the 64 rows of `cols` (ld ldc2): scores, one row per query
 * (or key) of the warp, one column per row of `cols`. */
template <typename T, int HD>
static __device__ __forceinline__ void mma_rows_by_rows(float *c, const T *rows, int ldr,
                                                        const T *cols, int ldcols) {
#pragma unroll
  for (int cb = 0; cb < MMA_TILE / 16; cb++) {
    mma_acc acc;
    wm::fill_fragment(acc, 0.0f);
#pragma unroll
    for (int kk = 0; kk < HD / 16; kk++) {
      mma_a<T> a;
      mma_b_col<T> b; /* cols^T as a column-major (HD x 64) operand */
      wm::load_matrix_sync(a, rows + kk * 16, ldr);
      wm::load_matrix_sync(b, cols + cb * 16 * ldcols + kk * 16, ldcols);
      wm::mma_sync(acc, a, b, acc);
    }
    wm::store_matrix_sync(c + cb * 16, acc, MMA_LDS, wm::mem_row_major);
  }
}

/* acc[ob] += w (16 x 64, T, MMA_LDP) times the 64 rows of `tile` (HD
 * columns, ld ldt): the warp's weights times a shared tile. */
template <typename T, int HD>
static __device__ __forceinline__ void mma_weights_by_tile(mma_acc (&acc)[HD / 16], const T *w,
                                                           const T *tile, int ldt) {
#pragma unroll
  for (int kk = 0; kk < MMA_TILE / 16; kk++) {
    mma_a<T> a;
    wm::load_matrix_sync(a, w + kk * 16, MMA_LDP);
#pragma unroll
    for (int ob = 0; ob < HD / 16; ob++) {
      mma_b_row<T> b;
      wm::load_matrix_sync(b, tile + kk * 16 * ldt + ob * 16, ldt);
      wm::mma_sync(acc[ob], a, b, acc[ob]);
    }
  }
}

/* Rows r0.. (below t) of dst (rows `stride` apart) = mul * acc (16 x HD):
 * each fragment through the warp's f32 scratch (16 x MMA_LDS). */
template <int HD>
static __device__ __forceinline__ void mma_store_rows(mma_acc (&acc)[HD / 16], float *scratch,
                                                      float *dst, int64_t stride, int64_t r0,
                                                      int64_t t, float mul) {
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int ob = 0; ob < HD / 16; ob++) {
    wm::store_matrix_sync(scratch, acc[ob], MMA_LDS, wm::mem_row_major);
    __syncwarp();
    for (int k = lane; k < 256; k += 32) {
      const int r = k >> 4, d = k & 15;
      if (r0 + r < t)
        dst[(r0 + r) * stride + ob * 16 + d] = mul * scratch[r * MMA_LDS + d];
    }
    __syncwarp();
  }
}

/* Where a block of the tensor-core kernels works: its warp and lane, the
 * (sequence, head) and the first of its 64 rows (queries or keys). */
struct mma_block {
  int warp, lane;
  int64_t bh, bi, hi, r0;
};

static __device__ __forceinline__ mma_block mma_block_of(const att_dims &g) {
  mma_block m;
  m.warp = threadIdx.x >> 5, m.lane = threadIdx.x & 31;
  m.bh = blockIdx.x / g.tiles, m.bi = m.bh / g.h, m.hi = m.bh % g.h;
  m.r0 = (int64_t)(blockIdx.x % g.tiles) * MMA_TILE;
  return m;
}

// qkv (b, t, 3c) of T -> out (b, t, c), lse (b, h, t) or NULL; a block per 64 queries of a head
template <typename T, int HD>
static __global__ void __launch_bounds__(ATT_THREADS)
    flash_forward_kernel(const T *qkv, float *out, float *lse, att_dims g) {
  extern __shared__ __align__(128) unsigned char mma_smem[];
  constexpr int LDT = HD + MMA_PAD, LDO = HD + MMA_FPAD;
  T *sq = (T *)mma_smem, *sk = sq + MMA_TILE * LDT, *sv = sk + MMA_TILE * LDT;
  T *sp = sv + MMA_TILE * LDT;                  /* 4 x (16, MMA_LDP): P */
  float *ss = (float *)(sp + MMA_TILE * MMA_LDP); /* 4 x (16, MMA_LDS): scores */
  float *so = ss + MMA_TILE * MMA_LDS;           /* 4 x (16, LDO): the running output */
  float *sm = so + MMA_TILE * LDO, *sl = sm + MMA_TILE; /* running max and sum per row */
  const mma_block m = mma_block_of(g);
  const int warp = m.warp, lane = m.lane;
  const int64_t bh = m.bh, bi = m.bi, hi = m.hi, q0 = m.r0;
  const T *base = qkv + bi * g.t * g.row + hi * HD;
  T *wp = sp + warp * 16 * MMA_LDP;
  float *ws = ss + warp * 16 * MMA_LDS, *wo = so + warp * 16 * LDO;
  mma_load(sq, LDT, base, g.row, q0, g.t, HD);
  for (int k = lane; k < 16 * LDO; k += 32)
    wo[k] = 0.0f;
  if (lane < 16) {
    sm[warp * 16 + lane] = -INFINITY;
    sl[warp * 16 + lane] = 0.0f;
  }
  const int64_t last = (q0 + MMA_TILE < g.t ? q0 + MMA_TILE : g.t) - 1; /* the block's last query */
  for (int64_t k0 = 0; k0 <= last; k0 += MMA_TILE) {
    __syncthreads(); /* the previous K and V are read */
    mma_load(sk, LDT, base + g.c, g.row, k0, g.t, HD);
    mma_load(sv, LDT, base + 2 * g.c, g.row, k0, g.t, HD);
    __syncthreads();
    mma_rows_by_rows<T, HD>(ws, sq + warp * 16 * LDT, LDT, sk, LDT); /* S = q k^T */
    __syncwarp();
    for (int r = 0; r < 16; r++) { /* the online softmax; lane: columns lane, lane + 32 */
      const int64_t i = q0 + warp * 16 + r;
      float s[2], mx = -INFINITY;
#pragma unroll
      for (int e = 0; e < 2; e++) {
        const int64_t j = k0 + lane + 32 * e;
        s[e] = i < g.t && j <= i ? ws[r * MMA_LDS + lane + 32 * e] * g.scale : -INFINITY;
        mx = fmaxf(mx, s[e]);
      }
      mx = dt_warp_max(mx);
      const float m_old = sm[warp * 16 + r], m_new = fmaxf(m_old, mx);
      const bool none = m_new == -INFINITY; /* a row past t */
      float sum = 0.0f;
#pragma unroll
      for (int e = 0; e < 2; e++) {
        const float p = none ? 0.0f : expf(s[e] - m_new);
        sum += p;
        dt_store_f32(wp, r * MMA_LDP + lane + 32 * e, p);
      }
      sum = dt_warp_sum(sum);
      const float alpha = none ? 1.0f : expf(m_old - m_new); /* the first tile: 0 */
      for (int d = lane; d < HD; d += 32)
        wo[r * LDO + d] *= alpha;
      __syncwarp(); /* every lane has read sm[r] */
      if (lane == 0) {
        sm[warp * 16 + r] = m_new;
        sl[warp * 16 + r] = sl[warp * 16 + r] * alpha + sum;
      }
    }
    __syncwarp();
    mma_acc acc[HD / 16]; /* O += P v */
#pragma unroll
    for (int ob = 0; ob < HD / 16; ob++)
      wm::load_matrix_sync(acc[ob], wo + ob * 16, LDO, wm::mem_row_major);
    mma_weights_by_tile<T, HD>(acc, wp, sv, LDT);
#pragma unroll
    for (int ob = 0; ob < HD / 16; ob++)
      wm::store_matrix_sync(wo + ob * 16, acc[ob], LDO, wm::mem_row_major);
    __syncwarp();
  }
  for (int r = 0; r < 16; r++) {
    const int64_t i = q0 + warp * 16 + r;
    if (i >= g.t)
      break;
    const float l = sl[warp * 16 + r], inv = 1.0f / l;
    float *orow = out + (bi * g.t + i) * g.c + hi * HD;
    for (int d = lane; d < HD; d += 32)
      orow[d] = wo[r * LDO + d] * inv;
    if (lse && lane == 0)
      lse[bh * g.t + i] = sm[warp * 16 + r] + logf(l);
  }
}

// dQ of 64 queries of a head: dq = scale * sum over the keys up to the diagonal of dS_ij k_j
template <typename T, int HD>
static __global__ void __launch_bounds__(ATT_THREADS)
    flash_backward_dq_kernel(const T *qkv, const float *lse, const float *dsum, const float *dout,
                             float *dqkv, att_dims g) {
  extern __shared__ __align__(128) unsigned char mma_smem[];
  constexpr int LDT = HD + MMA_PAD;
  T *sq = (T *)mma_smem, *sdo = sq + MMA_TILE * LDT, *sk = sdo + MMA_TILE * LDT,
    *sv = sk + MMA_TILE * LDT;
  T *sds = sv + MMA_TILE * LDT;                    /* 4 x (16, MMA_LDP): dS */
  float *ss = (float *)(sds + MMA_TILE * MMA_LDP); /* 4 x (16, MMA_LDS): S */
  float *sdp = ss + MMA_TILE * MMA_LDS;            /* 4 x (16, MMA_LDS): dP */
  const mma_block m = mma_block_of(g);
  const int warp = m.warp, lane = m.lane;
  const int64_t bh = m.bh, bi = m.bi, hi = m.hi, q0 = m.r0;
  const T *base = qkv + bi * g.t * g.row + hi * HD;
  T *wds = sds + warp * 16 * MMA_LDP;
  float *ws = ss + warp * 16 * MMA_LDS, *wdp = sdp + warp * 16 * MMA_LDS;
  mma_load(sq, LDT, base, g.row, q0, g.t, HD);
  mma_load(sdo, LDT, dout + bi * g.t * g.c + hi * HD, g.c, q0, g.t, HD);
  mma_acc dq[HD / 16];
#pragma unroll
  for (int ob = 0; ob < HD / 16; ob++)
    wm::fill_fragment(dq[ob], 0.0f);
  const int64_t last = (q0 + MMA_TILE < g.t ? q0 + MMA_TILE : g.t) - 1;
  for (int64_t k0 = 0; k0 <= last; k0 += MMA_TILE) {
    __syncthreads();
    mma_load(sk, LDT, base + g.c, g.row, k0, g.t, HD);
    mma_load(sv, LDT, base + 2 * g.c, g.row, k0, g.t, HD);
    __syncthreads();
    mma_rows_by_rows<T, HD>(ws, sq + warp * 16 * LDT, LDT, sk, LDT);   /* S = q k^T */
    mma_rows_by_rows<T, HD>(wdp, sdo + warp * 16 * LDT, LDT, sv, LDT); /* dP = dO v^T */
    __syncwarp();
    for (int r = 0; r < 16; r++) {
      const int64_t i = q0 + warp * 16 + r;
      const float l = i < g.t ? lse[bh * g.t + i] : 0.0f, d = i < g.t ? dsum[bh * g.t + i] : 0.0f;
#pragma unroll
      for (int e = 0; e < 2; e++) {
        const int c = lane + 32 * e;
        const int64_t j = k0 + c;
        const float p = i < g.t && j <= i ? expf(ws[r * MMA_LDS + c] * g.scale - l) : 0.0f;
        dt_store_f32(wds, r * MMA_LDP + c, p * (wdp[r * MMA_LDS + c] - d));
      }
    }
    __syncwarp();
    mma_weights_by_tile<T, HD>(dq, wds, sk, LDT); /* dQ += dS k */
    __syncwarp();
  }
  mma_store_rows<HD>(dq, ws, dqkv + bi * g.t * g.row + hi * HD, g.row, q0 + warp * 16, g.t,
                     g.scale);
}

// dK, dV of 64 keys of a head, over the query tiles from the diagonal on
template <typename T, int HD>
static __global__ void __launch_bounds__(ATT_THREADS)
    flash_backward_dkv_kernel(const T *qkv, const float *lse, const float *dsum,
                              const float *dout, float *dqkv, att_dims g) {
  extern __shared__ __align__(128) unsigned char mma_smem[];
  constexpr int LDT = HD + MMA_PAD;
  T *sk = (T *)mma_smem, *sv = sk + MMA_TILE * LDT, *sq = sv + MMA_TILE * LDT,
    *sdo = sq + MMA_TILE * LDT;
  T *spt = sdo + MMA_TILE * LDT, *sdst = spt + MMA_TILE * MMA_LDP; /* 4 x (16, MMA_LDP) each */
  float *ss = (float *)(sdst + MMA_TILE * MMA_LDP);                 /* 4 x (16, MMA_LDS): S^T */
  float *sdp = ss + MMA_TILE * MMA_LDS;                             /* 4 x (16, MMA_LDS): dP^T */
  float *sl = sdp + MMA_TILE * MMA_LDS, *sd = sl + MMA_TILE;        /* the queries' lse and D */
  const mma_block m = mma_block_of(g);
  const int warp = m.warp, lane = m.lane;
  const int64_t bh = m.bh, bi = m.bi, hi = m.hi, k0 = m.r0;
  const T *base = qkv + bi * g.t * g.row + hi * HD;
  T *wpt = spt + warp * 16 * MMA_LDP, *wdst = sdst + warp * 16 * MMA_LDP;
  float *ws = ss + warp * 16 * MMA_LDS, *wdp = sdp + warp * 16 * MMA_LDS;
  mma_load(sk, LDT, base + g.c, g.row, k0, g.t, HD);
  mma_load(sv, LDT, base + 2 * g.c, g.row, k0, g.t, HD);
  mma_acc dk[HD / 16], dv[HD / 16];
#pragma unroll
  for (int ob = 0; ob < HD / 16; ob++) {
    wm::fill_fragment(dk[ob], 0.0f);
    wm::fill_fragment(dv[ob], 0.0f);
  }
  for (int64_t q0 = k0; q0 < g.t; q0 += MMA_TILE) { /* queries before k0 see none of the keys */
    __syncthreads();
    mma_load(sq, LDT, base, g.row, q0, g.t, HD);
    mma_load(sdo, LDT, dout + bi * g.t * g.c + hi * HD, g.c, q0, g.t, HD);
    for (int r = threadIdx.x; r < MMA_TILE; r += blockDim.x) {
      const int64_t i = q0 + r;
      sl[r] = i < g.t ? lse[bh * g.t + i] : 0.0f;
      sd[r] = i < g.t ? dsum[bh * g.t + i] : 0.0f;
    }
    __syncthreads();
    mma_rows_by_rows<T, HD>(ws, sk + warp * 16 * LDT, LDT, sq, LDT);   /* S^T = k q^T */
    mma_rows_by_rows<T, HD>(wdp, sv + warp * 16 * LDT, LDT, sdo, LDT); /* dP^T = v dO^T */
    __syncwarp();
    for (int r = 0; r < 16; r++) {
      const int64_t j = k0 + warp * 16 + r;
#pragma unroll
      for (int e = 0; e < 2; e++) {
        const int c = lane + 32 * e;
        const int64_t i = q0 + c;
        const float p = i < g.t && j <= i ? expf(ws[r * MMA_LDS + c] * g.scale - sl[c]) : 0.0f;
        dt_store_f32(wpt, r * MMA_LDP + c, p);
        dt_store_f32(wdst, r * MMA_LDP + c, p * (wdp[r * MMA_LDS + c] - sd[c]));
      }
    }
    __syncwarp();
    mma_weights_by_tile<T, HD>(dv, wpt, sdo, LDT); /* dV += P^T dO */
    mma_weights_by_tile<T, HD>(dk, wdst, sq, LDT); /* dK += dS^T q */
    __syncwarp();
  }
  float *drow = dqkv + bi * g.t * g.row + hi * HD;
  mma_store_rows<HD>(dk, ws, drow + g.c, g.row, k0 + warp * 16, g.t, g.scale);
  mma_store_rows<HD>(dv, ws, drow + 2 * g.c, g.row, k0 + warp * 16, g.t, 1.0f);
}

/* Launches kernel over the (64-row tiles) x (b, h) blocks with `smem` bytes
 * of dynamic shared memory. */
template <typename... Params, typename... Args>
static dt_status mma_launch(void (*kernel)(Params...), const att_dims &g, size_t smem,
                            cudaStream_t stream, Args... args) {
  if (smem > 48 * 1024)
    DT_CUDA_CHECK(
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
  kernel<<<(unsigned)(g.b * g.h * g.tiles), ATT_THREADS, smem, stream>>>(args...);
  DT_CUDA_CHECK_LAUNCH();
  return DT_OK;
}

/* The shared bytes of each kernel: tiles of T with rows of hd + MMA_PAD,
 * the warps' (16, 64) tiles, and the f32 row values. */
template <typename T>
static size_t mma_smem(int64_t hd, int tiles_t, int probs_t, int scores_f32, int64_t extra_f32) {
  return ((size_t)tiles_t * MMA_TILE * (size_t)(hd + MMA_PAD) +
          (size_t)probs_t * MMA_TILE * MMA_LDP) * sizeof(T) +
         ((size_t)scores_f32 * MMA_TILE * MMA_LDS + (size_t)extra_f32) * sizeof(float);
}

/* The geometry with tiles of MMA_TILE rows. */
static att_dims mma_dims(att_dims g) {
  g.tiles = (int)((g.t + MMA_TILE - 1) / MMA_TILE);
  return g;
}

template <typename T, int HD>
static dt_status flash_forward_hd(const T *qkv, float *out, float *lse, const att_dims &g,
                                  cudaStream_t stream) {
  const size_t smem = mma_smem<T>(HD, 3, 1, 1, (int64_t)MMA_TILE * (HD + MMA_FPAD) + 2 * MMA_TILE);
  return mma_launch(flash_forward_kernel<T, HD>, g, smem, stream, qkv, out, lse, g);
}

template <typename T, int HD>
static dt_status flash_backward_hd(const T *qkv, const float *lse, const float *dsum,
                                   const float *dout, float *dqkv, const att_dims &g,
                                   cudaStream_t stream) {
  DT_CHECK(mma_launch(flash_backward_dq_kernel<T, HD>, g, mma_smem<T>(HD, 4, 1, 2, 0), stream, qkv,
                      lse, dsum, dout, dqkv, g));
  return mma_launch(flash_backward_dkv_kernel<T, HD>, g, mma_smem<T>(HD, 4, 2, 2, 2 * MMA_TILE),
                    stream, qkv, lse, dsum, dout, dqkv, g);
}

/* The tensor-core forward of a 16-bit qkv with a head size mma_head takes. */
template <typename T>
static dt_status flash_forward(const T *qkv, float *out, float *lse, att_dims g,
                               cudaStream_t stream) {
  g = mma_dims(g);
  switch (g.hd) {
    case 16: return flash_forward_hd<T, 16>(qkv, out, lse, g, stream);
    case 32: return flash_forward_hd<T, 32>(qkv, out, lse, g, stream);
    case 64: return flash_forward_hd<T, 64>(qkv, out, lse, g, stream);
    default: return flash_forward_hd<T, 128>(qkv, out, lse, g, stream);
  }
}

template <typename T>
static dt_status flash_backward(const T *qkv, const float *lse, const float *dsum,
                                const float *dout, float *dqkv, att_dims g, cudaStream_t stream) {
  g = mma_dims(g);
  switch (g.hd) {
    case 16: return flash_backward_hd<T, 16>(qkv, lse, dsum, dout, dqkv, g, stream);
    case 32: return flash_backward_hd<T, 32>(qkv, lse, dsum, dout, dqkv, g, stream);
    case 64: return flash_backward_hd<T, 64>(qkv, lse, dsum, dout, dqkv, g, stream);
    default: return flash_backward_hd<T, 128>(qkv, lse, dsum, dout, dqkv, g, stream);
  }
}

template <typename T>
static dt_status attention_forward_as(const T *qkv, float *out, float *lse, const att_dims &g,
                                      cudaStream_t stream) {
  if constexpr (!std::is_same<T, float>::value)
    if (mma_head(g.hd))
      return flash_forward(qkv, out, lse, g, stream);
  static void (*const kernels[4])(const T *, float *, float *, att_dims) = {
      attention_forward_kernel<T, 1>, attention_forward_kernel<T, 2>,
      attention_forward_kernel<T, 3>, attention_forward_kernel<T, 4>};
  return attention_launch(kernels, g, 3, ATT_TILE * 32, stream, qkv, out, lse, g);
}

extern "C" dt_status dt_cuda_attention_forward(const dt_exec *ex, const float *qkv, float *out,
                                               float *lse, int64_t b, int64_t t, int64_t h,
                                               int64_t hd) {
  if (b * t == 0)
    return DT_OK;
  att_dims g;
  DT_CHECK(attention_dims("attention_forward", b, t, h, hd, &g));
  DT_CUDA_EXEC(ex, ctx, stream);
  (void)ctx;
  switch (ex->dtype) {
    case DT_DTYPE_F16: return attention_forward_as((const __half *)qkv, out, lse, g, stream);
    case DT_DTYPE_BF16:
      return attention_forward_as((const __nv_bfloat16 *)qkv, out, lse, g, stream);
    default: return attention_forward_as(qkv, out, lse, g, stream);
  }
}

/* dQ, then dK and dV, from the row sums dsum (b, h, t). */
template <typename T>
static dt_status attention_backward_as(const T *qkv, const float *lse, const float *dsum,
                                       const float *dout, float *dqkv, const att_dims &g,
                                       cudaStream_t stream) {
  if constexpr (!std::is_same<T, float>::value)
    if (mma_head(g.hd))
      return flash_backward(qkv, lse, dsum, dout, dqkv, g, stream);
  typedef void (*bwd_kernel)(const T *, const float *, const float *, const float *, float *,
                             att_dims);
  static const bwd_kernel dq[4] = {
      attention_backward_dq_kernel<T, 1>, attention_backward_dq_kernel<T, 2>,
      attention_backward_dq_kernel<T, 3>, attention_backward_dq_kernel<T, 4>};
  static const bwd_kernel dkv[4] = {
      attention_backward_dkv_kernel<T, 1>, attention_backward_dkv_kernel<T, 2>,
      attention_backward_dkv_kernel<T, 3>, attention_backward_dkv_kernel<T, 4>};
  DT_CHECK(attention_launch(dq, g, 4, ATT_WARPS * ATT_ROWS * 32, stream, qkv, lse, dsum, dout,
                            dqkv, g));
  return attention_launch(dkv, g, 4, 2 * ATT_TILE * 32 + 2 * ATT_TILE, stream, qkv, lse, dsum,
                          dout, dqkv, g);
}

extern "C" dt_status dt_cuda_attention_backward(const dt_exec *ex, const float *qkv,
                                                const float *out, const float *lse,
                                                const float *dout, float *dqkv, int64_t b,
                                                int64_t t, int64_t h, int64_t hd) {
  if (b * t == 0)
    return DT_OK;
  att_dims g;
  DT_CHECK(attention_dims("attention_backward", b, t, h, hd, &g));
  DT_CUDA_EXEC(ex, ctx, stream);
  float *dsum = NULL;
  DT_CHECK(dt_cuda_scratch_alloc(ctx, (size_t)(b * h * t) * sizeof(float), (void **)&dsum));
  dt_status st = DT_OK;
  attention_rowdot_kernel<<<dt_grid_for(b * h * t * 32), DT_THREADS, 0, stream>>>(out, dout, dsum,
                                                                                  g);
  DT_CUDA_CHECK_GOTO(cudaGetLastError(), st, free_dsum);
  switch (ex->dtype) {
    case DT_DTYPE_F16:
      st = attention_backward_as((const __half *)qkv, lse, dsum, dout, dqkv, g, stream);
      break;
    case DT_DTYPE_BF16:
      st = attention_backward_as((const __nv_bfloat16 *)qkv, lse, dsum, dout, dqkv, g, stream);
      break;
    default: st = attention_backward_as(qkv, lse, dsum, dout, dqkv, g, stream); break;
  }
free_dsum:
  dt_cuda_scratch_free(ctx, dsum);
  return st;
}
