/* CPU optimizer updates over flat buffers, following the operation order of
 * PyTorch's single-tensor torch.optim.SGD and torch.optim.AdamW so that the
 * results agree to rounding. */
#include <math.h>

#include "core/cpu_internal.h"

// param, grad, momentum_buf (n)
dt_status dt_cpu_sgd_update(const dt_exec *ex, float *param, const float *grad, float *momentum_buf,
                            int64_t n, float lr, float momentum, float dampening,
                            float weight_decay, bool nesterov, bool first_step) {
  (void)ex;
  float keep = 1.0f - dampening;
  int nt = dt_cpu_threads();
  if (momentum != 0.0f && weight_decay == 0.0f && !nesterov && !first_step) {
    /* The common case on its own, branch-free, so that it vectorizes (GCC
     * keeps the invariant flags below as branches: the arithmetic they
     * guard may trap). Same arithmetic as the general loop. */
#pragma omp parallel for simd if (parallel : n >= DT_CPU_PAR_MIN) num_threads(nt) schedule(static)
    for (int64_t i = 0; i < n; i++) {
      float b = momentum * momentum_buf[i] + keep * grad[i];
      momentum_buf[i] = b;
      param[i] = param[i] - lr * b;
    }
    return DT_OK;
  }
#pragma omp parallel for if (n >= DT_CPU_PAR_MIN) num_threads(nt) schedule(static)
  for (int64_t i = 0; i < n; i++) {
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
  return DT_OK;
}

// param, grad, m, v (n); step counts from 1
dt_status dt_cpu_adamw_update(const dt_exec *ex, float *param, const float *grad, float *m,
                              float *v, int64_t n, float lr, float beta1, float beta2, float eps,
                              float weight_decay, int step) {
  (void)ex;
  /* Scalars in double, as PyTorch computes them in Python floats. */
  float decay = (float)(1.0 - (double)lr * (double)weight_decay);
  double bc1 = 1.0 - pow((double)beta1, step), bc2 = 1.0 - pow((double)beta2, step);
  float step_size = (float)((double)lr / bc1);
  float bc2_sqrt = (float)sqrt(bc2);
  float w1 = 1.0f - beta1, w2 = 1.0f - beta2;
  int nt = dt_cpu_threads();
#pragma omp parallel for if (n >= DT_CPU_PAR_MIN / 4) num_threads(nt) schedule(static)
  for (int64_t i = 0; i < n; i++) {
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
  return DT_OK;
}
