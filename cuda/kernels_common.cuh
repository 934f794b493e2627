/* Helpers shared by the .cu files of cuda/: launch sizing, the context and
 * stream of a device, block reductions. Internal; CUDA C++ only. */
#ifndef DT_CUDA_KERNELS_COMMON_CUH
#define DT_CUDA_KERNELS_COMMON_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include "cuda/cuda_internal.h"

#define DT_THREADS 256

/* Blocks for a grid-stride loop over n elements: enough to fill the GPU,
 * few enough that each thread does several elements. */
static inline unsigned dt_grid_for(int64_t n, int threads = DT_THREADS) {
  int64_t b = (n + threads - 1) / threads;
  if (b < 1)
    b = 1;
  if (b > 65536)
    b = 65536;
  return (unsigned)b;
}

/* Threads per block for a row of `cols` processed by one block: a multiple
 * of 32 between 32 and 256. */
static inline int dt_row_threads(int64_t cols) {
  int t = 32;
  while (t < 256 && t < cols)
    t *= 2;
  return t;
}

#define DT_GRID_STRIDE(i, n)                                                \
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n); \
       i += (int64_t)blockDim.x * gridDim.x)

/* Launches `kernel` (a grid-stride loop over n elements) with `args` on
 * the kernel's stream: the common tail of the elementwise kernels. */
template <typename... Params, typename... Args>
static dt_status dt_launch_flat(const dt_exec *ex, int64_t n, void (*kernel)(Params...),
                                Args... args) {
  DT_CUDA_EXEC(ex, ctx, stream);
  (void)ctx;
  kernel<<<dt_grid_for(n), DT_THREADS, 0, stream>>>(args...);
  DT_CUDA_CHECK_LAUNCH();
  return DT_OK;
}

/* Mixed precision: kernels templated over the storage type T (float,
 * __half, __nv_bfloat16) load T, compute in f32 and store T. */
__device__ __forceinline__ float dt_load_f32(const float *p, int64_t i) { return p[i]; }
__device__ __forceinline__ float dt_load_f32(const __half *p, int64_t i) {
  return __half2float(p[i]);
}
__device__ __forceinline__ float dt_load_f32(const __nv_bfloat16 *p, int64_t i) {
  return __bfloat162float(p[i]);
}
__device__ __forceinline__ void dt_store_f32(float *p, int64_t i, float v) { p[i] = v; }
__device__ __forceinline__ void dt_store_f32(__half *p, int64_t i, float v) {
  p[i] = __float2half_rn(v);
}
__device__ __forceinline__ void dt_store_f32(__nv_bfloat16 *p, int64_t i, float v) {
  p[i] = __float2bfloat16_rn(v);
}

/* `return EXPR;` with the type name T bound to the storage type of the
 * float dtype `dtype` (f16 -> __half, bf16 -> __nv_bfloat16, else float):
 *   DT_CUDA_STORAGE_DISPATCH(ex->dtype, T, launch<T>((const T *)x));
 */
#define DT_CUDA_STORAGE_DISPATCH(dtype, T, ...) \
  do {                                          \
    switch (dtype) {                            \
      case DT_DTYPE_F16: {                      \
        using T = __half;                       \
        return __VA_ARGS__;                     \
      }                                         \
      case DT_DTYPE_BF16: {                     \
        using T = __nv_bfloat16;                \
        return __VA_ARGS__;                     \
      }                                         \
      default: {                                \
        using T = float;                        \
        return __VA_ARGS__;                     \
      }                                         \
    }                                           \
  } while (0)

template <typename T>
__device__ __forceinline__ T dt_warp_sum(T v) {
  for (int o = 16; o > 0; o >>= 1)
    v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

__device__ __forceinline__ float dt_warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1)
    v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

/* Sum over the block (blockDim.x a multiple of 32, <= 1024); every thread
 * gets the result. `shared` holds 32 T. */
template <typename T>
__device__ T dt_block_sum(T v, T *shared) {
  int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
  v = dt_warp_sum(v);
  __syncthreads(); /* shared may still be read from a previous call */
  if (lane == 0)
    shared[warp] = v;
  __syncthreads();
  T r = lane < nwarps ? shared[lane] : (T)0;
  return dt_warp_sum(r);
}

__device__ inline float dt_block_max(float v, float *shared) {
  int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
  v = dt_warp_max(v);
  __syncthreads();
  if (lane == 0)
    shared[warp] = v;
  __syncthreads();
  float r = lane < nwarps ? shared[lane] : -INFINITY;
  return dt_warp_max(r);
}

/* Blocks for a row kernel over `rows` rows (grid-stride beyond 65536). */
static inline unsigned dt_row_grid(int64_t rows) { return (unsigned)(rows < 65536 ? rows : 65536); }

/* A row kernel (a block per row, grid-stride over the rows) on ex's stream. */
template <typename... Params, typename... Args>
static dt_status dt_launch_rows(const dt_exec *ex, int64_t rows, int64_t cols,
                                void (*kernel)(Params...), Args... args) {
  DT_CUDA_EXEC(ex, ctx, stream);
  (void)ctx;
  kernel<<<dt_row_grid(rows), dt_row_threads(cols), 0, stream>>>(args...);
  DT_CUDA_CHECK_LAUNCH();
  return DT_OK;
}

/* f(j, v) for the calling thread's share of the row x[0..n), v element j
 * as f32: 16 bytes (8 16-bit or 4 f32 elements) a load when x is 16-byte
 * aligned, the tail and an unaligned row an element at a time. Which
 * thread sees which element differs between the two, so a reduction over
 * f's calls adds in another order. */
template <typename T, typename F>
static __device__ __forceinline__ void dt_row_for_each(const T *x, int64_t n, F &&f) {
  constexpr int V = 16 / (int)sizeof(T);
  int64_t j0 = 0;
  if (((uintptr_t)x & 15) == 0) {
    const int64_t nv = n / V;
    const uint4 *xv = reinterpret_cast<const uint4 *>(x);
    for (int64_t v = threadIdx.x; v < nv; v += blockDim.x) {
      const uint4 u = xv[v];
      const T *e = reinterpret_cast<const T *>(&u);
#pragma unroll
      for (int k = 0; k < V; k++)
        f(v * V + k, dt_load_f32(e, k));
    }
    j0 = nv * V;
  }
  for (int64_t j = j0 + threadIdx.x; j < n; j += blockDim.x)
    f(j, dt_load_f32(x, j));
}

/* y[j] = f(j, x[j]) (as f32, rounded once to T) over the calling thread's
 * share of a row of n elements; y may be x. 16 bytes a load and a store
 * when both are 16-byte aligned, else an element at a time. */
template <typename T, typename F>
static __device__ __forceinline__ void dt_row_map(const T *x, T *y, int64_t n, F &&f) {
  constexpr int V = 16 / (int)sizeof(T);
  int64_t j0 = 0;
  if ((((uintptr_t)x | (uintptr_t)y) & 15) == 0) {
    const int64_t nv = n / V;
    for (int64_t v = threadIdx.x; v < nv; v += blockDim.x) {
      uint4 u = reinterpret_cast<const uint4 *>(x)[v];
      T *e = reinterpret_cast<T *>(&u);
#pragma unroll
      for (int k = 0; k < V; k++)
        dt_store_f32(e, k, f(v * V + k, dt_load_f32(e, k)));
      reinterpret_cast<uint4 *>(y)[v] = u;
    }
    j0 = nv * V;
  }
  for (int64_t j = j0 + threadIdx.x; j < n; j += blockDim.x)
    dt_store_f32(y, j, f(j, dt_load_f32(x, j)));
}

/* The block's max of row x[0..n) and sum of exp(x - max) into *sumexp;
 * every thread gets both. shf and shd: 32 floats and 32 doubles of shared
 * memory. */
template <typename T>
static __device__ __forceinline__ float dt_block_row_max_sumexp(const T *x, int64_t n, float *shf,
                                                                double *shd, double *sumexp) {
  float mx = -INFINITY;
  dt_row_for_each(x, n, [&](int64_t, float v) { mx = fmaxf(mx, v); });
  mx = dt_block_max(mx, shf);
  double s = 0.0;
  dt_row_for_each(x, n, [&](int64_t, float v) { s += expf(v - mx); });
  *sumexp = dt_block_sum(s, shd);
  return mx;
}

/* Index validation in the forward kernels (cuda/kernels_index.cu): the slot
 * of index checks for kernels on `stream` (one per stream kind: kernels on
 * one stream run in order, so a slot serves one launch at a time), and the
 * end of an index-checking launch: its launch error, else (when `report`)
 * the report of its slot queued behind it (no host wait): the first bad
 * position becomes the device's index error; *count (when not NULL) = the
 * rows kept. */
dt_cuda_index_slot *dt_cuda_index_slot_of(dt_cuda_ctx *ctx, cudaStream_t stream);
dt_status dt_cuda_index_checked(dt_cuda_ctx *ctx, cudaStream_t stream, bool report, const void *idx,
                                int i32, dt_cuda_index_kind kind, int64_t bound, int64_t ignore,
                                float *count);

/* Element i of an i32 (i32 != 0) or i64 index array. */
static __device__ __forceinline__ int64_t index_at(const void *p, int i32, int64_t i) {
  return i32 ? (int64_t)((const int32_t *)p)[i] : ((const int64_t *)p)[i];
}

/* dt_rng_bits / dt_rng_uniform of core/rng.c, bit for bit. */
__device__ __forceinline__ uint64_t dt_rng_bits_dev(uint64_t seed, uint64_t counter) {
  uint64_t z = seed ^ (counter * 0x9E3779B97F4A7C15ull);
  z += 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

__device__ __forceinline__ float dt_rng_uniform_dev(uint64_t seed, uint64_t counter) {
  return (float)(dt_rng_bits_dev(seed, counter) >> 40) * (1.0f / 16777216.0f);
}

#endif
