/* CUDA kernels of the optimizers (core/optim_optimizer.c,
 * optim_working_copy.c): the fused SGD and AdamW updates over flat buffers
 * and the 16-bit working copy, following the CPU reference
 * (core/cpu_kernels_optim.c). */
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <math.h>

#include "cuda/kernels_common.cuh"

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
  adamw_kernel<<<dt_grid_for(n), DT_THREADS, 0, stream>>>(
      param, grad, m, v, n, decay, beta2, eps, w1, w2, step_size, bc2_sqrt, half_out_of(half));
  DT_CUDA_CHECK_LAUNCH();
  return DT_OK;
}
