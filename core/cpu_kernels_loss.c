/* CPU kernels of the loss family (core/ops_loss.c): the fused log-softmax
 * + NLL cross-entropy and the fused classifier (LM-head loss). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/cpu_internal.h"
#include "core/half.h"

/* ---- cross-entropy ---- */

/* Rejects a target dtype other than i32/i64 and any target outside [0, c)
 * that is not ignore_index; *count (when not NULL): the rows not ignored. */
static dt_status check_targets(const char *op, const void *target, dt_dtype dt, int64_t n,
                               int64_t c, int64_t ignore_index, float *count) {
  int64_t kept = 0;
  for (int64_t i = 0; i < n; i++) {
    int64_t t = dt_cpu_index_at(target, dt, i);
    if (t == ignore_index)
      continue;
    if (t < 0 || t >= c)
      return DT_ERROR(DT_ERR_INVALID_ARG,
                      "%s: target %lld at row %lld is outside [0, %lld) and is not "
                      "ignore_index (%lld): check the labels against the number of classes",
                      op, (long long)t, (long long)i, (long long)c, (long long)ignore_index);
    kept++;
  }
  if (count)
    *count = (float)kept;
  return DT_OK;
}

// logits (n,c), target (n) -> loss_rows (n), lse (n), *count (rows kept, f32)
dt_status dt_cpu_cross_entropy_forward(const dt_exec *ex, const float *logits, const void *target,
                                       dt_dtype target_dtype, int64_t n, int64_t c,
                                       int64_t ignore_index, float *loss_rows, float *lse,
                                       float *count_out) {
  (void)ex;
  DT_CHECK(
      check_targets("cross_entropy_forward", target, target_dtype, n, c, ignore_index, count_out));
  DT_CPU_PARALLEL_FOR(i, n, n * c, DT_CPU_PAR_MIN / 4) {
    const float *xr = logits + i * c;
    float mx = dt_cpu_row_max(xr, c);
    double l = (double)mx + log(dt_cpu_row_exp_sum(xr, c, mx, NULL));
    if (lse)
      lse[i] = (float)l;
    int64_t t = dt_cpu_index_at(target, target_dtype, i);
    loss_rows[i] = t == ignore_index ? 0.0f : (float)(l - (double)xr[t]);
  }
  return DT_OK;
}

// logits (n,c), target (n), lse (n), dloss_rows (n) -> dlogits (n,c)
dt_status dt_cpu_cross_entropy_backward(const dt_exec *ex, const float *logits, const void *target,
                                        dt_dtype target_dtype, const float *lse,
                                        const float *dloss_rows, float *dlogits, int64_t n,
                                        int64_t c, int64_t ignore_index) {
  (void)ex;
  DT_CHECK(check_targets("cross_entropy_backward", target, target_dtype, n, c, ignore_index, NULL));
  DT_CPU_PARALLEL_FOR(i, n, n * c, DT_CPU_PAR_MIN / 4) {
    const float *xr = logits + i * c;
    float *dr = dlogits + i * c;
    int64_t t = dt_cpu_index_at(target, target_dtype, i);
    if (t == ignore_index) {
      memset(dr, 0, (size_t)c * sizeof(float));
      continue;
    }
    dt_cpu_exp_shifted(xr, lse[i], dloss_rows[i], dr, c);
    dr[t] -= dloss_rows[i];
  }
  return DT_OK;
}

/* ---- fused classifier (LM-head loss) ---- */

/* One row of the fused classifier: the loss of xr (vp) at target t, and
 * when dr is not NULL dr (vp) = softmax - onehot, 0 past `classes` (dr may
 * be xr). */
static float classifier_row(const float *xr, float *dr, int64_t t, int64_t vp, int64_t classes) {
  /* the loss as cross_entropy_forward computes it, so that the two agree
   * bit for bit; the exponentials are kept for the gradient */
  float xt = xr[t], mx = dt_cpu_row_max(xr, classes);
  double s = dt_cpu_row_exp_sum(xr, classes, mx, dr);
  if (dr) {
    dt_cpu_row_scale(dr, (float)(1.0 / s), classes);
    dr[t] -= 1.0f;
    memset(dr + classes, 0, (size_t)(vp - classes) * sizeof(float));
  }
  return (float)((double)mx + log(s) - (double)xt);
}

/* The 16-bit classifier: each row widened to f32 (a row buffer per
 * thread), classifier_row, its gradient rounded once into dlogits. */
static dt_status classifier_forward_half(dt_dtype dtype, const uint16_t *logits, const void *target,
                                         dt_dtype target_dtype, int64_t n, int64_t vp,
                                         int64_t classes, int64_t ignore_index, float *loss_rows,
                                         uint16_t *dlogits, float dlogits_scale) {
  dt_status st = DT_OK;
#pragma omp parallel if (n * vp >= DT_CPU_PAR_MIN / 4) num_threads(dt_cpu_threads())
  {
    float *w = malloc((size_t)vp * sizeof(float));
    if (w == NULL) {
#pragma omp critical(dt_cpu_classifier_half)
      st = DT_ERROR(DT_ERR_OOM, "classifier_loss_forward: a row buffer of %lld f32", (long long)vp);
    }
#pragma omp for schedule(static)
    for (int64_t i = 0; i < n; i++) {
      int64_t t = dt_cpu_index_at(target, target_dtype, i);
      if (w == NULL)
        continue;
      if (t == ignore_index) {
        loss_rows[i] = 0.0f;
        if (dlogits)
          memset(dlogits + i * vp, 0, (size_t)vp * sizeof(uint16_t));
        continue;
      }
      (void)dt_half_to_f32(dtype, logits + i * vp, w, vp);
      loss_rows[i] = classifier_row(w, dlogits ? w : NULL, t, vp, classes);
      if (dlogits && dlogits_scale != 1.0f)
        dt_cpu_row_scale(w, dlogits_scale, classes);
      if (dlogits)
        (void)dt_half_from_f32(dtype, w, dlogits + i * vp, vp);
    }
    free(w);
  }
  return st;
}

// logits (n,vp), target (n) -> loss_rows (n), dlogits (n,vp) or NULL, *count (rows kept, f32);
// logits and dlogits hold ex->dtype (f32, or 16-bit: f32 math)
dt_status dt_cpu_classifier_loss_forward(const dt_exec *ex, const float *logits, const void *target,
                                         dt_dtype target_dtype, int64_t n, int64_t vp,
                                         int64_t classes, int64_t ignore_index, float *loss_rows,
                                         float *dlogits, float dlogits_scale, float *count_out) {
  DT_CHECK(check_targets("classifier_loss_forward", target, target_dtype, n, classes, ignore_index,
                         count_out));
  if (dt_dtype_is_half(ex->dtype))
    return classifier_forward_half(ex->dtype, (const uint16_t *)logits, target, target_dtype, n, vp,
                                   classes, ignore_index, loss_rows, (uint16_t *)dlogits,
                                   dlogits_scale);
  int nt = dt_cpu_threads();
#pragma omp parallel for if (n * vp >= DT_CPU_PAR_MIN / 4) num_threads(nt) schedule(static)
  for (int64_t i = 0; i < n; i++) {
    const float *xr = logits + i * vp;
    float *dr = dlogits ? dlogits + i * vp : NULL;
    int64_t t = dt_cpu_index_at(target, target_dtype, i);
    if (t == ignore_index) {
      loss_rows[i] = 0.0f;
      if (dr)
        memset(dr, 0, (size_t)vp * sizeof(float));
      continue;
    }
    loss_rows[i] = classifier_row(xr, dr, t, vp, classes);
    if (dr && dlogits_scale != 1.0f)
      dt_cpu_row_scale(dr, dlogits_scale, classes);
  }
  return DT_OK;
}

static dt_status classifier_scale_block(const dt_exec *ex32, const void *ctx,
                                        const float *const *in, float *out, int64_t len) {
  return dt_cpu_axpby(ex32, len, *(const float *)ctx, in[0], 0.0f, out);
}

// dlogits (n) *= dloss[0] / count[0] (0 when no row was kept: dlogits is all zero then)
dt_status dt_cpu_classifier_loss_backward(const dt_exec *ex, float *dlogits, const float *dloss,
                                          const float *count, int64_t n) {
  const float a = count[0] > 0.0f ? dloss[0] / count[0] : 0.0f;
  if (dt_dtype_is_half(ex->dtype))
    return dt_cpu_half_blocks(ex, n, 1, (const void *[]){dlogits}, dlogits, classifier_scale_block,
                              &a);
  int nt = dt_cpu_threads();
#pragma omp parallel for if (n >= DT_CPU_PAR_MIN) num_threads(nt) schedule(static)
  for (int64_t i = 0; i < n; i++)
    dlogits[i] *= a;
  return DT_OK;
}
