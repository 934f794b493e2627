/* CPU optimizer updates over flat buffers, following the operation order of
 * PyTorch's single-tensor torch.optim.SGD and torch.optim.AdamW so that the
 * results agree to rounding. */
#include <math.h>

#include "core/cpu_internal.h"
#include "core/half.h"

/* The update runs in blocks, each block's 16-bit working copy written
 * right after it (while the block is in cache) with the vector
 * conversions of core/half.h. */
#define OPTIM_BLOCK 2048

static int64_t block_count(int64_t n) { return (n + OPTIM_BLOCK - 1) / OPTIM_BLOCK; }
static int64_t block_end(int64_t bi, int64_t n) {
  return (bi + 1) * OPTIM_BLOCK < n ? (bi + 1) * OPTIM_BLOCK : n;
}

/* half (when given) of param[lo, hi) */
static void write_half(const dt_half_out *half, const float *param, int64_t lo, int64_t hi) {
  if (half == NULL)
    return;
  if (half->stochastic)
    (void)dt_half_from_f32_stochastic(half->dtype, param + lo, half->data + lo, hi - lo, half->seed,
                                      half->offset + (uint64_t)lo);
  else
    (void)dt_half_from_f32(half->dtype, param + lo, half->data + lo, hi - lo);
}

// param, grad, momentum_buf, half->data (n)
dt_status dt_cpu_sgd_update(const dt_exec *ex, float *param, const float *grad, float *momentum_buf,
                            int64_t n, float lr, float momentum, float dampening,
                            float weight_decay, bool nesterov, bool first_step,
                            const dt_half_out *half) {
  (void)ex;
  float keep = 1.0f - dampening;
  int nt = dt_cpu_threads();
  int64_t blocks = block_count(n);
  if (momentum != 0.0f && weight_decay == 0.0f && !nesterov && !first_step) {
    /* The common case on its own, branch-free, so that it vectorizes (GCC
     * keeps the invariant flags below as branches: the arithmetic they
     * guard may trap). Same arithmetic as the general loop. */
#pragma omp parallel for if (n >= DT_CPU_PAR_MIN) num_threads(nt) schedule(static)
    for (int64_t bi = 0; bi < blocks; bi++) {
      int64_t lo = bi * OPTIM_BLOCK, hi = block_end(bi, n);
#pragma omp simd
      for (int64_t i = lo; i < hi; i++) {
        float b = momentum * momentum_buf[i] + keep * grad[i];
        momentum_buf[i] = b;
        param[i] = param[i] - lr * b;
      }
      write_half(half, param, lo, hi);
    }
    return DT_OK;
  }
#pragma omp parallel for if (n >= DT_CPU_PAR_MIN) num_threads(nt) schedule(static)
  for (int64_t bi = 0; bi < blocks; bi++) {
    int64_t lo = bi * OPTIM_BLOCK, hi = block_end(bi, n);
    for (int64_t i = lo; i < hi; i++) {
      float g = grad[i];
      if (weight_decay != 0.0f)
        g = g + weight_decay * param[i];
      if (momentum != 0.0f) {
        float b = first_step ? g : momentum * momentum_buf[i] + keep * g;
        momentum_buf[i] = b;
        g = nesterov ? g + momentum * b : b;
      }
      param[i] = param[i] - lr * g;
    }
    write_half(half, param, lo, hi);
  }
  return DT_OK;
}

// param, grad, m, v, half->data (n); step counts from 1
dt_status dt_cpu_adamw_update(const dt_exec *ex, float *param, const float *grad, float *m,
                              float *v, int64_t n, float lr, float beta1, float beta2, float eps,
                              float weight_decay, int step, const dt_half_out *half) {
  (void)ex;
  /* Scalars in double, as PyTorch computes them in Python floats. */
  float decay = (float)(1.0 - (double)lr * (double)weight_decay);
  double bc1 = 1.0 - pow((double)beta1, step), bc2 = 1.0 - pow((double)beta2, step);
  float step_size = (float)((double)lr / bc1);
  float bc2_sqrt = (float)sqrt(bc2);
  float w1 = 1.0f - beta1, w2 = 1.0f - beta2;
  int nt = dt_cpu_threads();
  int64_t blocks = block_count(n);
#pragma omp parallel for if (n >= DT_CPU_PAR_MIN / 4) num_threads(nt) schedule(static)
  for (int64_t bi = 0; bi < blocks; bi++) {
    int64_t lo = bi * OPTIM_BLOCK, hi = block_end(bi, n);
    for (int64_t i = lo; i < hi; i++) {
      float g = grad[i];
      float p = param[i] * decay;
      /* m.lerp_(g, 1-b1): PyTorch's lerp picks the form by the weight */
      float mi = w1 < 0.5f ? m[i] + w1 * (g - m[i]) : g - (g - m[i]) * (1.0f - w1);
      float vi = v[i] * beta2 + w2 * g * g;
      m[i] = mi;
      v[i] = vi;
      float denom = sqrtf(vi) / bc2_sqrt + eps;
      param[i] = p - step_size * (mi / denom);
    }
    write_half(half, param, lo, hi);
  }
  return DT_OK;
}

// x, half->data (n)
dt_status dt_cpu_half_copy(const dt_exec *ex, const float *x, int64_t n, const dt_half_out *half) {
  (void)ex;
  int nt = dt_cpu_threads();
  int64_t blocks = block_count(n);
#pragma omp parallel for if (n >= DT_CPU_PAR_MIN) num_threads(nt) schedule(static)
  for (int64_t bi = 0; bi < blocks; bi++)
    write_half(half, x, bi * OPTIM_BLOCK, block_end(bi, n));
  return DT_OK;
}
