/* CUDA kernels of the fused causal self-attention for a 16-bit qkv on the
 * tensor cores (WMMA); the f32 tiles, the dispatch and the contract are in
 * kernels_attention.cu. */
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <math.h>
#include <mma.h>

#include "cuda/kernels_attention.cuh"

/* ---- 16-bit qkv on the tensor cores (WMMA) ----
 *
 * For f16/bf16 qkv and a head size of 16, 32, 64 or 128 the same three
 * passes run on the tensor cores: flash attention 2 with blocks of 64
 * queries (forward, dQ) or 64 keys (dK, dV) and 4 warps of 16 rows, the
 * products as 16 x 16 x 16 WMMA tiles with f32 accumulation. qkv, out,
 * dout and dqkv are of one 16-bit type T; the operands sit in shared memory
 * in T; the softmax statistics, the output and the gradients accumulate in
 * f32 and are rounded once where they are stored; the probabilities P, dO and dS are
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

bool dt_attention_mma_head(int64_t hd) { return hd == 16 || hd == 32 || hd == 64 || hd == 128; }

/* Rows [r0, r0 + MMA_TILE) of a head's HD columns (rows `stride` apart, of
 * S: qkv's type or f32) into a shared tile of T with leading dimension ld;
 * rows past t are 0. Synchronous, an element per thread at a time. */
template <typename T, typename S>
static __device__ __forceinline__ void mma_load(T *dst, int ld, const S *src, int64_t stride,
                                                int64_t r0, int64_t t, int hd) {
  for (int k = threadIdx.x; k < MMA_TILE * hd; k += blockDim.x) {
    const int r = k / hd, d = k - r * hd;
    const int64_t i = r0 + r;
    dt_store_f32(dst, r * ld + d, i < t ? dt_load_f32(src, i * stride + d) : 0.0f);
  }
}

/* The asynchronous copies (sm_80 and later): 16 bytes from global to
 * shared memory, zero-filled when !valid (nothing is read then; src must
 * still be a mapped address); a commit closes the thread's group, a wait
 * leaves at most N of its groups in flight. */
static __device__ __forceinline__ void mma_cp_async16(void *dst, const void *src, bool valid) {
  const unsigned d = (unsigned)__cvta_generic_to_shared(dst);
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(d), "l"(src),
               "r"(valid ? 16 : 0));
}
static __device__ __forceinline__ void mma_cp_async_commit() {
  asm volatile("cp.async.commit_group;\n" ::);
}
template <int N>
static __device__ __forceinline__ void mma_cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

/* mma_load's tile of qkv or dO (S = T), started: with g.vec (qkv and dO,
 * their rows and their head offsets 16-byte aligned, which the launch
 * checks) as 16-byte asynchronous copies of 8 elements, which the caller
 * commits and waits for; else synchronously (the commit and the wait find
 * nothing). */
template <typename T>
static __device__ __forceinline__ void mma_load_async(T *dst, int ld, const T *src, int64_t stride,
                                                      int64_t r0, int64_t t, int hd, bool vec) {
  if (!vec) {
    mma_load(dst, ld, src, stride, r0, t, hd);
    return;
  }
  const int per_row = hd / 8;
  for (int k = threadIdx.x; k < MMA_TILE * per_row; k += blockDim.x) {
    const int r = k / per_row, d = (k - r * per_row) * 8;
    const int64_t i = r0 + r;
    mma_cp_async16(dst + r * ld + d, src + (i < t ? i * stride + d : 0), i < t);
  }
}

/* The double-buffered K and V of the forward and dQ passes: skv holds two
 * (K, V) pairs of tiles. mma_kv_first starts tile 0's copies into the
 * first pair (the caller commits them). mma_kv_tile, at key tile kt (rows
 * k0..) of a loop up to key `last` and after a barrier that ends the reads
 * of the other pair, starts the next tile's copies into that pair, waits
 * for this tile's (not the next's) and returns this tile's K (V follows
 * it); the caller's barrier then makes them visible to every warp. */
template <typename T, int HD>
static __device__ __forceinline__ void mma_kv_first(T *skv, const T *base, const att_dims &g) {
  constexpr int LDT = HD + MMA_PAD;
  mma_load_async(skv, LDT, base + g.c, g.row, 0, g.t, HD, g.vec);
  mma_load_async(skv + MMA_TILE * LDT, LDT, base + 2 * g.c, g.row, 0, g.t, HD, g.vec);
}

template <typename T, int HD>
static __device__ __forceinline__ T *mma_kv_tile(T *skv, int64_t kt, int64_t k0, int64_t last,
                                                 const T *base, const att_dims &g) {
  constexpr int LDT = HD + MMA_PAD;
  if (k0 + MMA_TILE <= last) {
    T *nk = skv + ((kt + 1) & 1) * 2 * MMA_TILE * LDT;
    mma_load_async(nk, LDT, base + g.c, g.row, k0 + MMA_TILE, g.t, HD, g.vec);
    mma_load_async(nk + MMA_TILE * LDT, LDT, base + 2 * g.c, g.row, k0 + MMA_TILE, g.t, HD, g.vec);
    mma_cp_async_commit();
    mma_cp_async_wait<1>();
  } else {
    mma_cp_async_wait<0>();
  }
  return skv + (kt & 1) * 2 * MMA_TILE * LDT;
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

/* Rows r0.. (below t) of dst (rows `stride` apart, of T) = mul * acc (16 x
 * HD), rounded once: each fragment through the warp's f32 scratch (16 x
 * MMA_LDS). */
template <int HD, typename T>
static __device__ __forceinline__ void mma_store_rows(mma_acc (&acc)[HD / 16], float *scratch,
                                                      T *dst, int64_t stride, int64_t r0, int64_t t,
                                                      float mul) {
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int ob = 0; ob < HD / 16; ob++) {
    wm::store_matrix_sync(scratch, acc[ob], MMA_LDS, wm::mem_row_major);
    __syncwarp();
    for (int k = lane; k < 256; k += 32) {
      const int r = k >> 4, d = k & 15;
      if (r0 + r < t)
        dt_store_f32(dst, (r0 + r) * stride + ob * 16 + d, mul * scratch[r * MMA_LDS + d]);
    }
    __syncwarp();
  }
}

/* Where a block of the tensor-core kernels works: its warp and lane, the
 * (sequence, head) and the first of its 64 rows (queries or keys). The
 * blocks run heaviest first: the grid is tile-major, every (sequence, head)
 * of one tile before the next tile, and the GPU starts blocks in about
 * their order, so the longest blocks do not start last and leave the
 * machine idle behind them. `late_heavy`: the last tiles carry the most
 * work (the forward and dQ: queries late in the sequence see the most
 * keys), else the first (dK, dV: early keys are seen by the most queries). */
struct mma_block {
  int warp, lane;
  int64_t bh, bi, hi, r0;
};

static __device__ __forceinline__ mma_block mma_block_of(const att_dims &g, bool late_heavy) {
  mma_block m;
  /* 32-bit: the grid is below 2^31 blocks (attention_dims) */
  const unsigned nbh = (unsigned)(g.b * g.h), tile = blockIdx.x / nbh, bh = blockIdx.x - tile * nbh;
  m.warp = threadIdx.x >> 5, m.lane = threadIdx.x & 31;
  m.bh = bh, m.bi = bh / (unsigned)g.h, m.hi = bh - (unsigned)m.bi * (unsigned)g.h;
  m.r0 = (int64_t)(late_heavy ? (unsigned)g.tiles - 1 - tile : tile) * MMA_TILE;
  return m;
}

// qkv (b, t, 3c) of T -> out (b, t, c) of T, lse (b, h, t) or NULL; a block per 64 queries of a
// head
template <typename T, int HD>
static __global__ void __launch_bounds__(ATT_THREADS)
    flash_forward_kernel(const T *qkv, T *out, float *lse, att_dims g) {
  extern __shared__ __align__(128) unsigned char mma_smem[];
  constexpr int LDT = HD + MMA_PAD, LDO = HD + MMA_FPAD;
  /* q, then K and V twice: the next tile's copies run during this one's products */
  T *sq = (T *)mma_smem, *skv = sq + MMA_TILE * LDT;
  T *sp = skv + 4 * MMA_TILE * LDT;                     /* 4 x (16, MMA_LDP): P */
  float *ss = (float *)(sp + MMA_TILE * MMA_LDP);       /* 4 x (16, MMA_LDS): scores */
  float *so = ss + MMA_TILE * MMA_LDS;                  /* 4 x (16, LDO): the running output */
  float *sm = so + MMA_TILE * LDO, *sl = sm + MMA_TILE; /* running max and sum per row */
  const mma_block m = mma_block_of(g, true);
  const int warp = m.warp, lane = m.lane;
  const int64_t bh = m.bh, bi = m.bi, hi = m.hi, q0 = m.r0;
  const T *base = qkv + bi * g.t * g.row + hi * HD;
  T *wp = sp + warp * 16 * MMA_LDP;
  float *ws = ss + warp * 16 * MMA_LDS, *wo = so + warp * 16 * LDO;
  mma_load_async(sq, LDT, base, g.row, q0, g.t, HD, g.vec);
  mma_kv_first<T, HD>(skv, base, g);
  mma_cp_async_commit();
  for (int k = lane; k < 16 * LDO; k += 32)
    wo[k] = 0.0f;
  if (lane < 16) {
    sm[warp * 16 + lane] = -INFINITY;
    sl[warp * 16 + lane] = 0.0f;
  }
  const int64_t last = (q0 + MMA_TILE < g.t ? q0 + MMA_TILE : g.t) - 1; /* the block's last query */
  for (int64_t k0 = 0, kt = 0; k0 <= last; k0 += MMA_TILE, kt++) {
    __syncthreads(); /* the other K and V buffer (the previous tile's) is read */
    T *sk = mma_kv_tile<T, HD>(skv, kt, k0, last, base, g), *sv = sk + MMA_TILE * LDT;
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
    T *orow = out + (bi * g.t + i) * g.c + hi * HD;
    for (int d = lane; d < HD; d += 32)
      dt_store_f32(orow, d, wo[r * LDO + d] * inv);
    if (lse && lane == 0)
      lse[bh * g.t + i] = sm[warp * 16 + r] + logf(l);
  }
}

// dQ of 64 queries of a head: dq = scale * sum over the keys up to the diagonal of dS_ij k_j
template <typename T, int HD>
static __global__ void __launch_bounds__(ATT_THREADS)
    flash_backward_dq_kernel(const T *qkv, const float *lse, const float *dsum, const T *dout,
                             T *dqkv, att_dims g) {
  extern __shared__ __align__(128) unsigned char mma_smem[];
  constexpr int LDT = HD + MMA_PAD;
  /* q, dO, then K and V twice: the next tile's copies run during this one's products */
  T *sq = (T *)mma_smem, *sdo = sq + MMA_TILE * LDT, *skv = sdo + MMA_TILE * LDT;
  T *sds = skv + 4 * MMA_TILE * LDT;               /* 4 x (16, MMA_LDP): dS */
  float *ss = (float *)(sds + MMA_TILE * MMA_LDP); /* 4 x (16, MMA_LDS): S */
  float *sdp = ss + MMA_TILE * MMA_LDS;            /* 4 x (16, MMA_LDS): dP */
  const mma_block m = mma_block_of(g, true);
  const int warp = m.warp, lane = m.lane;
  const int64_t bh = m.bh, bi = m.bi, hi = m.hi, q0 = m.r0;
  const T *base = qkv + bi * g.t * g.row + hi * HD;
  T *wds = sds + warp * 16 * MMA_LDP;
  float *ws = ss + warp * 16 * MMA_LDS, *wdp = sdp + warp * 16 * MMA_LDS;
  mma_load_async(sq, LDT, base, g.row, q0, g.t, HD, g.vec);
  mma_load_async(sdo, LDT, dout + bi * g.t * g.c + hi * HD, g.c, q0, g.t, HD, g.vec);
  mma_kv_first<T, HD>(skv, base, g);
  mma_cp_async_commit();
  mma_acc dq[HD / 16];
#pragma unroll
  for (int ob = 0; ob < HD / 16; ob++)
    wm::fill_fragment(dq[ob], 0.0f);
  const int64_t last = (q0 + MMA_TILE < g.t ? q0 + MMA_TILE : g.t) - 1;
  for (int64_t k0 = 0, kt = 0; k0 <= last; k0 += MMA_TILE, kt++) {
    __syncthreads(); /* the other K and V buffer (the previous tile's) is read */
    T *sk = mma_kv_tile<T, HD>(skv, kt, k0, last, base, g), *sv = sk + MMA_TILE * LDT;
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
    flash_backward_dkv_kernel(const T *qkv, const float *lse, const float *dsum, const T *dout,
                              T *dqkv, att_dims g) {
  extern __shared__ __align__(128) unsigned char mma_smem[];
  constexpr int LDT = HD + MMA_PAD;
  T *sk = (T *)mma_smem, *sv = sk + MMA_TILE * LDT, *sq = sv + MMA_TILE * LDT,
    *sdo = sq + MMA_TILE * LDT;
  T *spt = sdo + MMA_TILE * LDT, *sdst = spt + MMA_TILE * MMA_LDP; /* 4 x (16, MMA_LDP) each */
  float *ss = (float *)(sdst + MMA_TILE * MMA_LDP);                /* 4 x (16, MMA_LDS): S^T */
  float *sdp = ss + MMA_TILE * MMA_LDS;                            /* 4 x (16, MMA_LDS): dP^T */
  float *sl = sdp + MMA_TILE * MMA_LDS, *sd = sl + MMA_TILE;       /* the queries' lse and D */
  const mma_block m = mma_block_of(g, false);
  const int warp = m.warp, lane = m.lane;
  const int64_t bh = m.bh, bi = m.bi, hi = m.hi, k0 = m.r0;
  const T *base = qkv + bi * g.t * g.row + hi * HD;
  T *wpt = spt + warp * 16 * MMA_LDP, *wdst = sdst + warp * 16 * MMA_LDP;
  float *ws = ss + warp * 16 * MMA_LDS, *wdp = sdp + warp * 16 * MMA_LDS;
  mma_load_async(sk, LDT, base + g.c, g.row, k0, g.t, HD, g.vec);
  mma_load_async(sv, LDT, base + 2 * g.c, g.row, k0, g.t, HD, g.vec);
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
  T *drow = dqkv + bi * g.t * g.row + hi * HD;
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
          (size_t)probs_t * MMA_TILE * MMA_LDP) *
             sizeof(T) +
         ((size_t)scores_f32 * MMA_TILE * MMA_LDS + (size_t)extra_f32) * sizeof(float);
}

/* The geometry with tiles of MMA_TILE rows, and whether qkv's tiles can
 * be copied 16 bytes at a time (vec): its address, its rows and its heads
 * at 16-byte boundaries (the heads always are: hd is a multiple of 16). */
template <typename T>
static att_dims mma_dims(att_dims g, const T *qkv) {
  g.tiles = (int)((g.t + MMA_TILE - 1) / MMA_TILE);
  g.vec = (uintptr_t)qkv % 16 == 0 && (g.row * (int64_t)sizeof(T)) % 16 == 0 &&
          (g.c * (int64_t)sizeof(T)) % 16 == 0;
  return g;
}

template <typename T, int HD>
static dt_status flash_forward_hd(const T *qkv, T *out, float *lse, const att_dims &g,
                                  cudaStream_t stream) {
  const size_t smem = mma_smem<T>(HD, 5, 1, 1, (int64_t)MMA_TILE * (HD + MMA_FPAD) + 2 * MMA_TILE);
  return mma_launch(flash_forward_kernel<T, HD>, g, smem, stream, qkv, out, lse, g);
}

template <typename T, int HD>
static dt_status flash_backward_hd(const T *qkv, const float *lse, const float *dsum, const T *dout,
                                   T *dqkv, const att_dims &g, cudaStream_t stream) {
  DT_CHECK(mma_launch(flash_backward_dq_kernel<T, HD>, g, mma_smem<T>(HD, 6, 1, 2, 0), stream, qkv,
                      lse, dsum, dout, dqkv, g));
  return mma_launch(flash_backward_dkv_kernel<T, HD>, g, mma_smem<T>(HD, 4, 2, 2, 2 * MMA_TILE),
                    stream, qkv, lse, dsum, dout, dqkv, g);
}

/* The tensor-core forward of a 16-bit qkv with a head size dt_attention_mma_head takes. */
template <typename T>
static dt_status flash_forward(const T *qkv, T *out, float *lse, att_dims g, cudaStream_t stream) {
  g = mma_dims(g, qkv);
  switch (g.hd) {
    case 16: return flash_forward_hd<T, 16>(qkv, out, lse, g, stream);
    case 32: return flash_forward_hd<T, 32>(qkv, out, lse, g, stream);
    case 64: return flash_forward_hd<T, 64>(qkv, out, lse, g, stream);
    default: return flash_forward_hd<T, 128>(qkv, out, lse, g, stream);
  }
}

template <typename T>
static dt_status flash_backward(const T *qkv, const float *lse, const float *dsum, const T *dout,
                                T *dqkv, att_dims g, cudaStream_t stream) {
  g = mma_dims(g, qkv);
  g.vec = g.vec && (uintptr_t)dout % 16 == 0; /* dO's tiles are copied as qkv's */
  switch (g.hd) {
    case 16: return flash_backward_hd<T, 16>(qkv, lse, dsum, dout, dqkv, g, stream);
    case 32: return flash_backward_hd<T, 32>(qkv, lse, dsum, dout, dqkv, g, stream);
    case 64: return flash_backward_hd<T, 64>(qkv, lse, dsum, dout, dqkv, g, stream);
    default: return flash_backward_hd<T, 128>(qkv, lse, dsum, dout, dqkv, g, stream);
  }
}

dt_status dt_attention_mma_forward(dt_dtype dtype, const void *qkv, void *out, float *lse,
                                   const att_dims &g, cudaStream_t stream) {
  if (dtype == DT_DTYPE_F16)
    return flash_forward((const __half *)qkv, (__half *)out, lse, g, stream);
  return flash_forward((const __nv_bfloat16 *)qkv, (__nv_bfloat16 *)out, lse, g, stream);
}

dt_status dt_attention_mma_backward(dt_dtype dtype, const void *qkv, const float *lse,
                                    const float *dsum, const void *dout, void *dqkv,
                                    const att_dims &g, cudaStream_t stream) {
  if (dtype == DT_DTYPE_F16)
    return flash_backward((const __half *)qkv, lse, dsum, (const __half *)dout, (__half *)dqkv, g,
                          stream);
  return flash_backward((const __nv_bfloat16 *)qkv, lse, dsum, (const __nv_bfloat16 *)dout,
                        (__nv_bfloat16 *)dqkv, g, stream);
}
