/* CUDA dense kernels: casts, strided copies, fill, binary and unary ops,
 * axpby, reductions and the fused optimizer updates. Semantics follow the
 * CPU reference (core/cpu_kernels_dense.c); reductions accumulate in double
 * in a fixed order, so results do not depend on timing. */
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <math.h>

#include "cuda/kernels_common.cuh"

/* ---- casts ---- */

static __device__ __forceinline__ bool dtype_is_int(int t) {
  return t == DT_DTYPE_I32 || t == DT_DTYPE_I64 || t == DT_DTYPE_U8;
}

static __device__ __forceinline__ double load_float(const void *p, int t, int64_t i) {
  switch (t) {
    case DT_DTYPE_F32: return ((const float *)p)[i];
    case DT_DTYPE_F16: return __half2float(((const __half *)p)[i]);
    default: return __bfloat162float(((const __nv_bfloat16 *)p)[i]);
  }
}

static __device__ __forceinline__ int64_t load_int(const void *p, int t, int64_t i) {
  switch (t) {
    case DT_DTYPE_I32: return ((const int32_t *)p)[i];
    case DT_DTYPE_I64: return ((const int64_t *)p)[i];
    default: return ((const uint8_t *)p)[i];
  }
}

static __device__ __forceinline__ void store_float(void *p, int t, int64_t i, float v) {
  switch (t) {
    case DT_DTYPE_F32: ((float *)p)[i] = v; break;
    case DT_DTYPE_F16: ((__half *)p)[i] = __float2half_rn(v); break;
    default: ((__nv_bfloat16 *)p)[i] = __float2bfloat16_rn(v); break;
  }
}

/* Narrowing wraps modulo 2^bits, as the CPU (and PyTorch). */
static __device__ __forceinline__ void store_int(void *p, int t, int64_t i, int64_t v) {
  switch (t) {
    case DT_DTYPE_I32: ((int32_t *)p)[i] = (int32_t)(uint32_t)v; break;
    case DT_DTYPE_I64: ((int64_t *)p)[i] = v; break;
    default: ((uint8_t *)p)[i] = (uint8_t)v; break;
  }
}

/* Truncation toward zero, saturating at the int64 range, NaN -> 0. */
static __device__ __forceinline__ int64_t f64_to_i64(double v) {
  if (v != v)
    return 0;
  if (v >= 9223372036854775807.0)
    return INT64_MAX;
  if (v <= -9223372036854775808.0)
    return INT64_MIN;
  return (int64_t)v;
}

// in (n, src dtype) -> out (n, dst dtype)
static __global__ void cast_kernel(const void *in, int src, void *out, int dst, int64_t n) {
  bool src_int = dtype_is_int(src), dst_int = dtype_is_int(dst);
  DT_GRID_STRIDE(i, n) {
    if (src_int) {
      int64_t v = load_int(in, src, i);
      if (dst_int)
        store_int(out, dst, i, v);
      else
        store_float(out, dst, i, (float)v);
    } else {
      double v = load_float(in, src, i);
      if (dst_int)
        store_int(out, dst, i, f64_to_i64(v));
      else
        store_float(out, dst, i, (float)v);
    }
  }
}

extern "C" dt_status dt_cuda_cast(const dt_exec *ex, const void *in, dt_dtype src, void *out,
                                  dt_dtype dst, int64_t n) {
  if (n <= 0)
    return DT_OK;
  DT_CUDA_EXEC(ex, ctx, stream);
  if (src == dst) {
    if (in != out)
      DT_CUDA_CHECK(cudaMemcpyAsync(out, in, (size_t)n * dt_dtype_size(src),
                                    cudaMemcpyDeviceToDevice, stream));
    return DT_OK;
  }
  cast_kernel<<<dt_grid_for(n), DT_THREADS, 0, stream>>>(in, (int)src, out, (int)dst, n);
  DT_CUDA_CHECK_LAUNCH();
  return DT_OK;
}

/* ---- strided iteration ---- */

/* Offsets of flat index i in operands 0..2 (first `nops` computed). */
static __device__ __forceinline__ void plan_offsets(const dt_strided_plan &p, int64_t i, int nops,
                                                    int64_t *o) {
  o[0] = o[1] = o[2] = 0;
  for (int d = p.ndim - 1; d >= 0; d--) {
    int64_t sz = p.shape[d];
    int64_t q = d ? i / sz : 0;
    int64_t idx = d ? i - q * sz : i;
    for (int k = 0; k < nops; k++)
      o[k] += idx * p.s[k][d];
    i = q;
  }
}

// src (shape, strides s[1]) -> dst (shape, strides s[0]), elements of T
template <typename T>
static __global__ void copy_strided_kernel(T *dst, const T *src, dt_strided_plan p) {
  DT_GRID_STRIDE(i, p.numel) {
    int64_t o[3];
    plan_offsets(p, i, 2, o);
    dst[o[0]] = src[o[1]];
  }
}

static __global__ void copy_strided_bytes_kernel(char *dst, const char *src, dt_strided_plan p,
                                                 int64_t es) {
  DT_GRID_STRIDE(i, p.numel) {
    int64_t o[3];
    plan_offsets(p, i, 2, o);
    for (int64_t b = 0; b < es; b++)
      dst[o[0] * es + b] = src[o[1] * es + b];
  }
}

extern "C" dt_status dt_cuda_copy_strided(const dt_exec *ex, void *dst, const int64_t *dst_strides,
                                          const void *src, const int64_t *src_strides,
                                          const int64_t *shape, int ndim, size_t elem_size) {
  int64_t zeros[DT_MAX_DIMS] = {0};
  dt_strided_plan p;
  dt_strided_plan_build(&p, ndim, shape, dst_strides, src_strides, zeros);
  if (p.numel == 0)
    return DT_OK;
  DT_CUDA_EXEC(ex, ctx, stream);
  if (p.ndim == 1 && p.s[0][0] == 1 && p.s[1][0] == 1) {
    DT_CUDA_CHECK(
        cudaMemcpyAsync(dst, src, (size_t)p.numel * elem_size, cudaMemcpyDeviceToDevice, stream));
    return DT_OK;
  }
  unsigned grid = dt_grid_for(p.numel);
  switch (elem_size) {
    case 1:
      copy_strided_kernel<<<grid, DT_THREADS, 0, stream>>>((uint8_t *)dst, (const uint8_t *)src, p);
      break;
    case 2:
      copy_strided_kernel<<<grid, DT_THREADS, 0, stream>>>((uint16_t *)dst, (const uint16_t *)src,
                                                           p);
      break;
    case 4:
      copy_strided_kernel<<<grid, DT_THREADS, 0, stream>>>((uint32_t *)dst, (const uint32_t *)src,
                                                           p);
      break;
    case 8:
      copy_strided_kernel<<<grid, DT_THREADS, 0, stream>>>((uint64_t *)dst, (const uint64_t *)src,
                                                           p);
      break;
    default:
      copy_strided_bytes_kernel<<<grid, DT_THREADS, 0, stream>>>((char *)dst, (const char *)src, p,
                                                                 (int64_t)elem_size);
      break;
  }
  DT_CUDA_CHECK_LAUNCH();
  return DT_OK;
}

/* ---- elementwise ---- */

// x (n) = value
static __global__ void fill_kernel(float *x, float value, int64_t n) {
  DT_GRID_STRIDE(i, n) x[i] = value;
}

extern "C" dt_status dt_cuda_fill(const dt_exec *ex, float *x, float value, int64_t n) {
  if (n <= 0)
    return DT_OK;
  return dt_launch_flat(ex, n, fill_kernel, x, value, n);
}

// out (numel) = a (strides s[1]) op b (strides s[2]); out strides s[0] are contiguous
static __global__ void binary_kernel(int op, const float *a, const float *b, float *out,
                                     dt_strided_plan p) {
  DT_GRID_STRIDE(i, p.numel) {
    int64_t o[3];
    plan_offsets(p, i, 3, o);
    float u = a[o[1]], v = b[o[2]];
    out[o[0]] = op == DT_BINARY_ADD   ? u + v
                : op == DT_BINARY_SUB ? u - v
                : op == DT_BINARY_MUL ? u * v
                                      : u / v;
  }
}

extern "C" dt_status dt_cuda_binary(const dt_exec *ex, const dt_binary_args *args, const float *a,
                                    const float *b, float *out) {
  dt_strided_plan p;
  dt_binary_plan(args, &p);
  if (p.numel == 0)
    return DT_OK;
  return dt_launch_flat(ex, p.numel, binary_kernel, (int)args->op, a, b, out, p);
}

// y (n) = alpha * x + beta * y (beta 0: y not read); T: the storage type
template <typename T>
static __global__ void axpby_kernel(int64_t n, float alpha, const T *x, float beta, T *y) {
  if (beta == 0.0f) {
    DT_GRID_STRIDE(i, n) dt_store_f32(y, i, alpha * dt_load_f32(x, i));
  } else {
    DT_GRID_STRIDE(i, n)
    dt_store_f32(y, i, alpha * dt_load_f32(x, i) + beta * dt_load_f32(y, i));
  }
}

extern "C" dt_status dt_cuda_axpby(const dt_exec *ex, int64_t n, float alpha, const float *x,
                                   float beta, float *y) {
  if (n <= 0)
    return DT_OK;
  DT_CUDA_STORAGE_DISPATCH(
      ex->dtype, T, dt_launch_flat(ex, n, axpby_kernel<T>, n, alpha, (const T *)x, beta, (T *)y));
}

#define GELU_SCALE 0.7978845608028654f /* sqrt(2/pi) */
#define GELU_CUBIC 0.044715f

// y (n) = f(x)
template <typename T>
static __global__ void unary_forward_kernel(int op, int64_t n, const T *x, T *y) {
  DT_GRID_STRIDE(i, n) {
    float v = dt_load_f32(x, i), r;
    if (op == DT_UNARY_RELU)
      r = v < 0.0f ? 0.0f : v;
    else if (op == DT_UNARY_GELU)
      r = 0.5f * v * (1.0f + tanhf(GELU_SCALE * (v + GELU_CUBIC * v * v * v)));
    else
      r = tanhf(v);
    dt_store_f32(y, i, r);
  }
}

// dx (n) = dy * f'(x), overwritten
template <typename T>
static __global__ void unary_backward_kernel(int op, int64_t n, const T *x, const T *dy, T *dx) {
  DT_GRID_STRIDE(i, n) {
    float v = dt_load_f32(x, i), d = dt_load_f32(dy, i), r;
    if (op == DT_UNARY_RELU) {
      r = v > 0.0f ? d : 0.0f;
    } else if (op == DT_UNARY_GELU) {
      float t = tanhf(GELU_SCALE * (v + GELU_CUBIC * v * v * v));
      float sech2 = 1.0f - t * t;
      float grad =
          0.5f * (1.0f + t) + 0.5f * v * sech2 * GELU_SCALE * (1.0f + 3.0f * GELU_CUBIC * v * v);
      r = d * grad;
    } else {
      float t = tanhf(v);
      r = d * (1.0f - t * t);
    }
    dt_store_f32(dx, i, r);
  }
}

extern "C" dt_status dt_cuda_unary_forward(const dt_exec *ex, dt_unary_op op, int64_t n,
                                           const float *x, float *y) {
  if (n <= 0)
    return DT_OK;
  DT_CUDA_STORAGE_DISPATCH(
      ex->dtype, T,
      dt_launch_flat(ex, n, unary_forward_kernel<T>, (int)op, n, (const T *)x, (T *)y));
}

extern "C" dt_status dt_cuda_unary_backward(const dt_exec *ex, dt_unary_op op, int64_t n,
                                            const float *x, const float *dy, float *dx) {
  if (n <= 0)
    return DT_OK;
  DT_CUDA_STORAGE_DISPATCH(ex->dtype, T,
                           dt_launch_flat(ex, n, unary_backward_kernel<T>, (int)op, n, (const T *)x,
                                          (const T *)dy, (T *)dx));
}

/* ---- reductions ---- */

// x (outer, r) -> y (outer) = scale * sum_r x; one block per row
static __global__ void reduce_rows_kernel(const float *x, float *y, int64_t outer, int64_t r,
                                          float scale) {
  __shared__ double sh[32];
  for (int64_t o = blockIdx.x; o < outer; o += gridDim.x) {
    const float *row = x + o * r;
    double acc = 0.0;
    for (int64_t k = threadIdx.x; k < r; k += blockDim.x)
      acc += row[k];
    acc = dt_block_sum(acc, sh);
    if (threadIdx.x == 0)
      y[o] = (float)(acc * scale);
  }
}

// x (outer, r, inner) -> part (outer, splits, inner): sums of r-chunks;
// grid (inner/32, splits, min(outer, 65535)), grid-stride over outer in z
static __global__ void reduce_cols_partial_kernel(const float *x, double *part, int64_t outer,
                                                  int64_t r, int64_t inner, int64_t chunk) {
  int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  int64_t split = blockIdx.y;
  if (i >= inner)
    return;
  int64_t k0 = split * chunk, k1 = k0 + chunk < r ? k0 + chunk : r;
  for (int64_t o = blockIdx.z; o < outer; o += gridDim.z) {
    const float *base = x + o * r * inner + i;
    double acc = 0.0;
    for (int64_t k = k0; k < k1; k++)
      acc += base[k * inner];
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

extern "C" dt_status dt_cuda_reduce_sum(const dt_exec *ex, const float *x, float *y, int64_t outer,
                                        int64_t r, int64_t inner, float scale) {
  if (outer == 0 || inner == 0)
    return DT_OK;
  DT_CUDA_EXEC(ex, ctx, stream);
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

/* ---- optimizers ---- */

/* The 16-bit working copy an update writes beside the f32 parameter
 * (dt_half_out), by value for the kernels; data NULL = none. */
struct half_out_args {
  uint16_t *data;
  int f16;
  int stochastic;
  uint64_t seed, offset;
};

static half_out_args half_out_of(const dt_half_out *h) {
  half_out_args a = {NULL, 0, 0, 0, 0};
  if (h != NULL && h->data != NULL)
    a = half_out_args{h->data, h->dtype == DT_DTYPE_F16, h->stochastic ? 1 : 0, h->seed, h->offset};
  return a;
}

/* core/half.c's nearest-even conversions, bit for bit on finite values and
 * Inf (NaN stays NaN). */
static __device__ __forceinline__ uint16_t f32_to_half_dev(int f16, float f) {
  if (f16)
    return __half_as_ushort(__float2half_rn(f));
  uint32_t u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u)
    return (uint16_t)((u >> 16) | 0x0040u);
  return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

static __device__ __forceinline__ float half_to_f32_dev(int f16, uint16_t h) {
  return f16 ? __half2float(__ushort_as_half(h)) : __uint_as_float((uint32_t)h << 16);
}

/* dt_f32_to_half_stochastic of core/half.c, the same arithmetic. */
static __device__ uint16_t f32_to_half_stochastic_dev(int f16, float f, float u) {
  uint16_t near = f32_to_half_dev(f16, f);
  float vnear = half_to_f32_dev(f16, near);
  if (vnear == f || !isfinite(vnear))
    return near;
  uint16_t other = fabsf(vnear) > fabsf(f) ? (uint16_t)(near - 1) : (uint16_t)(near + 1);
  float vother = half_to_f32_dev(f16, other);
  if (!isfinite(vother))
    return near;
  float p_other = __fdiv_rn(fabsf(__fsub_rn(f, vnear)), fabsf(__fsub_rn(vother, vnear)));
  return u < p_other ? other : near;
}

static __device__ __forceinline__ void write_half_dev(const half_out_args &h, int64_t i, float p) {
  if (h.data == NULL)
    return;
  h.data[i] = h.stochastic ? f32_to_half_stochastic_dev(
                                 h.f16, p, dt_rng_uniform_dev(h.seed, h.offset + (uint64_t)i))
                           : f32_to_half_dev(h.f16, p);
}

// x, half.data (n)
static __global__ void half_copy_kernel(const float *x, int64_t n, half_out_args half) {
  DT_GRID_STRIDE(i, n) { write_half_dev(half, i, x[i]); }
}

extern "C" dt_status dt_cuda_half_copy(const dt_exec *ex, const float *x, int64_t n,
                                       const dt_half_out *half) {
  if (n == 0)
    return DT_OK;
  return dt_launch_flat(ex, n, half_copy_kernel, x, n, half_out_of(half));
}

// param, grad, momentum_buf, half.data (n): PyTorch SGD
static __global__ void sgd_kernel(float *param, const float *grad, float *buf, int64_t n, float lr,
                                  float momentum, float dampening, float wd, int nesterov,
                                  int first_step, half_out_args half) {
  DT_GRID_STRIDE(i, n) {
    float p = param[i];
    float g = grad[i];
    if (wd != 0.0f)
      g = __fadd_rn(g, __fmul_rn(wd, p));
    if (momentum != 0.0f) {
      float b =
          first_step ? g : __fadd_rn(__fmul_rn(momentum, buf[i]), __fmul_rn(1.0f - dampening, g));
      buf[i] = b;
      g = nesterov ? __fadd_rn(g, __fmul_rn(momentum, b)) : b;
    }
    float updated = __fsub_rn(p, __fmul_rn(lr, g));
    param[i] = updated;
    write_half_dev(half, i, updated);
  }
}

extern "C" dt_status dt_cuda_sgd_update(const dt_exec *ex, float *param, const float *grad,
                                        float *momentum_buf, int64_t n, float lr, float momentum,
                                        float dampening, float weight_decay, bool nesterov,
                                        bool first_step, const dt_half_out *half) {
  if (n == 0)
    return DT_OK;
  return dt_launch_flat(ex, n, sgd_kernel, param, grad, momentum_buf, n, lr, momentum, dampening,
                        weight_decay, (int)nesterov, (int)first_step, half_out_of(half));
}

// param, grad, m, v, half.data (n): PyTorch AdamW, the CPU's operation order
// (core/cpu_kernels_optim.c); explicit _rn intrinsics keep nvcc from
// contracting into FMAs, so that the result matches the CPU bit for bit.
static __global__ void adamw_kernel(float *param, const float *grad, float *m, float *v, int64_t n,
                                    float decay, float b2, float eps, float w1, float w2,
                                    float step_size, float bc2_sqrt, half_out_args half) {
  DT_GRID_STRIDE(i, n) {
    float g = grad[i];
    float p = __fmul_rn(param[i], decay);
    float mo = m[i];
    /* m.lerp_(g, 1-b1): PyTorch's lerp picks the form by the weight */
    float mi = w1 < 0.5f ? __fadd_rn(mo, __fmul_rn(w1, __fsub_rn(g, mo)))
                         : __fsub_rn(g, __fmul_rn(__fsub_rn(g, mo), 1.0f - w1));
    float vi = __fadd_rn(__fmul_rn(v[i], b2), __fmul_rn(__fmul_rn(w2, g), g));
    m[i] = mi;
    v[i] = vi;
    float denom = __fadd_rn(__fdiv_rn(__fsqrt_rn(vi), bc2_sqrt), eps);
    float updated = __fsub_rn(p, __fmul_rn(step_size, __fdiv_rn(mi, denom)));
    param[i] = updated;
    write_half_dev(half, i, updated);
  }
}

extern "C" dt_status dt_cuda_adamw_update(const dt_exec *ex, float *param, const float *grad,
                                          float *m, float *v, int64_t n, float lr, float beta1,
                                          float beta2, float eps, float weight_decay, int step,
                                          const dt_half_out *half) {
  if (n == 0)
    return DT_OK;
  DT_CUDA_EXEC(ex, ctx, stream);
  /* Scalars in double, as the CPU (and PyTorch's Python floats). */
  float decay = (float)(1.0 - (double)lr * (double)weight_decay);
  double bc1 = 1.0 - pow((double)beta1, step), bc2 = 1.0 - pow((double)beta2, step);
  float step_size = (float)((double)lr / bc1);
  float bc2_sqrt = (float)sqrt(bc2);
  float w1 = 1.0f - beta1, w2 = 1.0f - beta2;
  adamw_kernel<<<dt_grid_for(n), DT_THREADS, 0, stream>>>(param, grad, m, v, n, decay, beta2, eps,
                                                          w1, w2, step_size, bc2_sqrt,
                                                          half_out_of(half));
  DT_CUDA_CHECK_LAUNCH();
  return DT_OK;
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

/* ---- the bias epilogue of the 16-bit linear forward (cuda/blas.c) ---- */

// acc (m,n) f32, bias (n) of T -> y (m,n) of T = round(acc + bias)
template <typename T>
static __global__ void add_bias_rows_kernel(const float *acc, const T *bias, T *y, int64_t m,
                                            int64_t n) {
  DT_GRID_STRIDE(i, m * n) { dt_store_f32(y, i, acc[i] + dt_load_f32(bias, i % n)); }
}

extern "C" dt_status dt_cuda_add_bias_rows(cudaStream_t stream, dt_dtype dtype, const float *acc,
                                           const void *bias, void *y, int64_t m, int64_t n) {
  if (m * n == 0)
    return DT_OK;
  if (dtype == DT_DTYPE_F16)
    add_bias_rows_kernel<<<dt_grid_for(m * n), DT_THREADS, 0, stream>>>(
        acc, (const __half *)bias, (__half *)y, m, n);
  else
    add_bias_rows_kernel<<<dt_grid_for(m * n), DT_THREADS, 0, stream>>>(
        acc, (const __nv_bfloat16 *)bias, (__nv_bfloat16 *)y, m, n);
  DT_CUDA_CHECK_LAUNCH();
  return DT_OK;
}

/* ---- the bias of a 16-bit convolution (cuda/dnn.c) ---- */

// y (n, oc, hw) of T += bias (oc) f32: the sum in f32, rounded once
template <typename T>
static __global__ void conv_bias_forward_kernel(const float *bias, T *y, int64_t oc, int64_t hw,
                                                int64_t total) {
  DT_GRID_STRIDE(i, total) { dt_store_f32(y, i, dt_load_f32(y, i) + bias[(i / hw) % oc]); }
}

// dy (n, oc, hw) of T -> db (oc) f32 = the sum over n and hw, in double; a block per channel
template <typename T>
static __global__ void conv_bias_backward_kernel(const T *dy, float *db, int64_t n, int64_t oc,
                                                 int64_t hw) {
  __shared__ double sh[32];
  for (int64_t o = blockIdx.x; o < oc; o += gridDim.x) {
    double s = 0.0;
    for (int64_t k = threadIdx.x; k < n * hw; k += blockDim.x) {
      int64_t i = k / hw, j = k - i * hw;
      s += (double)dt_load_f32(dy, (i * oc + o) * hw + j);
    }
    s = dt_block_sum(s, sh);
    if (threadIdx.x == 0)
      db[o] = (float)s;
  }
}

extern "C" dt_status dt_cuda_conv_bias_forward(cudaStream_t stream, dt_dtype dtype,
                                               const float *bias, void *y, int64_t n, int64_t oc,
                                               int64_t hw) {
  const int64_t total = n * oc * hw;
  if (total == 0)
    return DT_OK;
  if (dtype == DT_DTYPE_F16)
    conv_bias_forward_kernel<<<dt_grid_for(total), DT_THREADS, 0, stream>>>(bias, (__half *)y, oc,
                                                                            hw, total);
  else
    conv_bias_forward_kernel<<<dt_grid_for(total), DT_THREADS, 0, stream>>>(
        bias, (__nv_bfloat16 *)y, oc, hw, total);
  DT_CUDA_CHECK_LAUNCH();
  return DT_OK;
}

extern "C" dt_status dt_cuda_conv_bias_backward(cudaStream_t stream, dt_dtype dtype,
                                                const void *dy, float *db, int64_t n, int64_t oc,
                                                int64_t hw) {
  if (oc == 0)
    return DT_OK;
  unsigned blocks = (unsigned)(oc < 65535 ? oc : 65535);
  if (dtype == DT_DTYPE_F16)
    conv_bias_backward_kernel<<<blocks, DT_THREADS, 0, stream>>>((const __half *)dy, db, n, oc,
                                                                 hw);
  else
    conv_bias_backward_kernel<<<blocks, DT_THREADS, 0, stream>>>((const __nv_bfloat16 *)dy, db,
                                                                 n, oc, hw);
  DT_CUDA_CHECK_LAUNCH();
  return DT_OK;
}
