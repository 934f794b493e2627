/* CUDA elementwise kernels (core/ops_elementwise.c and the tensor
 * layer): casts, strided copies, fill, binary and unary ops, axpby, SwiGLU.
 * Semantics follow the CPU reference (core/cpu_kernels_elementwise.c). */
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

static __device__ __forceinline__ int64_t f64_to_i64(double v) { return DT_CAST_F64_TO_I64(v); }

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

/* Offsets of flat index i in operands 0..2 (first `nops` computed), the
 * index split per dimension in the integer type I. */
template <typename I>
static __device__ __forceinline__ void plan_offsets_in(const dt_strided_plan &p, I i, int nops,
                                                       int64_t *o) {
  o[0] = o[1] = o[2] = 0;
  for (int d = p.ndim - 1; d >= 0; d--) {
    I sz = (I)p.shape[d];
    I q = d ? i / sz : 0;
    I idx = d ? i - q * sz : i;
    for (int k = 0; k < nops; k++)
      o[k] += (int64_t)idx * p.s[k][d];
    i = q;
  }
}

/* A 64-bit division is a long software sequence on the GPU, one per
 * dimension per element (the attention's 5-D permutes): tensors under
 * 2^32 elements, nearly all, split the index in 32 bits. The test is on
 * the kernel's argument, the same for every thread. */
static __device__ __forceinline__ void plan_offsets(const dt_strided_plan &p, int64_t i, int nops,
                                                    int64_t *o) {
  if (p.numel <= (int64_t)UINT32_MAX)
    plan_offsets_in<uint32_t>(p, (uint32_t)i, nops, o);
  else
    plan_offsets_in<int64_t>(p, i, nops, o);
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

/* ---- SwiGLU: x (rows, 2f) = [a | b] ---- */

// y (rows, f) = silu(a) * b
template <typename T>
static __global__ void swiglu_forward_kernel(const T *x, T *y, int64_t rows, int64_t f) {
  DT_GRID_STRIDE(i, rows * f) {
    const int64_t r = i / f, j = i - r * f;
    const float a = dt_load_f32(x, r * 2 * f + j), b = dt_load_f32(x, r * 2 * f + f + j);
    dt_store_f32(y, i, a * (1.0f / (1.0f + expf(-a))) * b);
  }
}

// dx (rows, 2f) = [dy * b * silu'(a) | dy * silu(a)] from x (rows, 2f), dy (rows, f)
template <typename T>
static __global__ void swiglu_backward_kernel(const T *x, const T *dy, T *dx, int64_t rows,
                                              int64_t f) {
  DT_GRID_STRIDE(i, rows * f) {
    const int64_t r = i / f, j = i - r * f, ia = r * 2 * f + j, ib = ia + f;
    const float a = dt_load_f32(x, ia), b = dt_load_f32(x, ib), g = dt_load_f32(dy, i);
    const float s = 1.0f / (1.0f + expf(-a));
    dt_store_f32(dx, ia, g * b * s * (1.0f + a * (1.0f - s)));
    dt_store_f32(dx, ib, g * a * s);
  }
}

extern "C" dt_status dt_cuda_swiglu_forward(const dt_exec *ex, const float *x, float *y,
                                            int64_t rows, int64_t f) {
  if (rows * f <= 0)
    return DT_OK;
  DT_CUDA_STORAGE_DISPATCH(
      ex->dtype, T,
      dt_launch_flat(ex, rows * f, swiglu_forward_kernel<T>, (const T *)x, (T *)y, rows, f));
}

extern "C" dt_status dt_cuda_swiglu_backward(const dt_exec *ex, const float *x, const float *dy,
                                             float *dx, int64_t rows, int64_t f) {
  if (rows * f <= 0)
    return DT_OK;
  DT_CUDA_STORAGE_DISPATCH(ex->dtype, T,
                           dt_launch_flat(ex, rows * f, swiglu_backward_kernel<T>, (const T *)x,
                                          (const T *)dy, (T *)dx, rows, f));
}
