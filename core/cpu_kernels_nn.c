/* CPU kernels for softmax, cross-entropy, embedding and dropout. */
#include <math.h>
#include <string.h>

#include "core/cpu_internal.h"
#include "core/rng.h"

#define MIN(a, b) ((a) < (b) ? (a) : (b))

/* ---- softmax ---- */

/* max and log(sum(exp(x - max))) of one row (NaN and all -inf rows give
 * NaN, as PyTorch). */
static void row_max_logsum(const float *x, int64_t cols, float *max_out, double *logsum_out) {
  float mx = -INFINITY;
  for (int64_t j = 0; j < cols; j++)
    mx = x[j] > mx ? x[j] : mx;
  double s = 0.0;
  for (int64_t j = 0; j < cols; j++)
    s += expf(x[j] - mx);
  *max_out = mx;
  *logsum_out = log(s);
}

// x (rows, cols) -> y (rows, cols) = softmax or log_softmax over cols
dt_status dt_cpu_softmax_forward(const dt_exec *ex, const float *x, float *y, int64_t rows,
                                 int64_t cols, bool log_) {
  (void)ex;
  int nt = dt_cpu_threads();
#pragma omp parallel for if (rows * cols >= DT_CPU_PAR_MIN / 4) num_threads(nt) schedule(static)
  for (int64_t r = 0; r < rows; r++) {
    const float *xr = x + r * cols;
    float *yr = y + r * cols;
    if (log_) {
      float mx;
      double ls;
      row_max_logsum(xr, cols, &mx, &ls);
      float lsf = (float)ls;
      for (int64_t j = 0; j < cols; j++)
        yr[j] = (xr[j] - mx) - lsf;
    } else {
      float mx = -INFINITY;
      for (int64_t j = 0; j < cols; j++)
        mx = xr[j] > mx ? xr[j] : mx;
      double s = 0.0;
      for (int64_t j = 0; j < cols; j++) {
        float e = expf(xr[j] - mx);
        yr[j] = e;
        s += e;
      }
      float inv = (float)(1.0 / s);
      for (int64_t j = 0; j < cols; j++)
        yr[j] *= inv;
    }
  }
  return DT_OK;
}

// y, dy (rows, cols) -> dx (rows, cols); y is the forward output
dt_status dt_cpu_softmax_backward(const dt_exec *ex, const float *y, const float *dy, float *dx,
                                  int64_t rows, int64_t cols, bool log_) {
  (void)ex;
  int nt = dt_cpu_threads();
#pragma omp parallel for if (rows * cols >= DT_CPU_PAR_MIN / 4) num_threads(nt) schedule(static)
  for (int64_t r = 0; r < rows; r++) {
    const float *yr = y + r * cols, *gr = dy + r * cols;
    float *dr = dx + r * cols;
    double s = 0.0;
    if (log_) { /* dx = dy - exp(y) * sum(dy) */
      for (int64_t j = 0; j < cols; j++)
        s += gr[j];
      float sf = (float)s;
      for (int64_t j = 0; j < cols; j++)
        dr[j] = gr[j] - expf(yr[j]) * sf;
    } else { /* dx = y * (dy - sum(dy * y)) */
      for (int64_t j = 0; j < cols; j++)
        s += (double)gr[j] * yr[j];
      float sf = (float)s;
      for (int64_t j = 0; j < cols; j++)
        dr[j] = yr[j] * (gr[j] - sf);
    }
  }
  return DT_OK;
}

// x (rows, t) -> y (rows, t): row r softmax over columns 0..r%t, the rest 0
dt_status dt_cpu_causal_softmax_forward(const dt_exec *ex, const float *x, float *y, int64_t rows,
                                        int64_t t) {
  (void)ex;
  int nt = dt_cpu_threads();
#pragma omp parallel for if (rows * t >= DT_CPU_PAR_MIN / 4) num_threads(nt) schedule(static)
  for (int64_t r = 0; r < rows; r++) {
    const float *xr = x + r * t;
    float *yr = y + r * t;
    int64_t keep = r % t + 1;
    float mx = -INFINITY;
    for (int64_t j = 0; j < keep; j++)
      mx = xr[j] > mx ? xr[j] : mx;
    double s = 0.0;
    for (int64_t j = 0; j < keep; j++) {
      float e = expf(xr[j] - mx);
      yr[j] = e;
      s += e;
    }
    float inv = (float)(1.0 / s);
    for (int64_t j = 0; j < keep; j++)
      yr[j] *= inv;
    for (int64_t j = keep; j < t; j++)
      yr[j] = 0.0f;
  }
  return DT_OK;
}

// y, dy (rows, t) -> dx (rows, t) = y * (dy - sum(dy * y)) over the kept columns
dt_status dt_cpu_causal_softmax_backward(const dt_exec *ex, const float *y, const float *dy,
                                         float *dx, int64_t rows, int64_t t) {
  (void)ex;
  int nt = dt_cpu_threads();
#pragma omp parallel for if (rows * t >= DT_CPU_PAR_MIN / 4) num_threads(nt) schedule(static)
  for (int64_t r = 0; r < rows; r++) {
    const float *yr = y + r * t, *gr = dy + r * t;
    float *dr = dx + r * t;
    int64_t keep = r % t + 1;
    double s = 0.0;
    for (int64_t j = 0; j < keep; j++)
      s += (double)gr[j] * yr[j];
    float sf = (float)s;
    for (int64_t j = 0; j < keep; j++)
      dr[j] = yr[j] * (gr[j] - sf);
    for (int64_t j = keep; j < t; j++)
      dr[j] = 0.0f;
  }
  return DT_OK;
}

/* ---- cross-entropy ---- */

static int64_t target_at(const void *t, dt_dtype dt, int64_t i) {
  return dt == DT_DTYPE_I32 ? (int64_t)((const int32_t *)t)[i] : ((const int64_t *)t)[i];
}

/* Rejects a target dtype other than i32/i64 and any target outside [0, c)
 * that is not ignore_index; counts the rows not ignored. */
static dt_status check_targets(const char *op, const void *target, dt_dtype dt, int64_t n,
                               int64_t c, int64_t ignore_index, int64_t *count) {
  int64_t kept = 0;
  for (int64_t i = 0; i < n; i++) {
    int64_t t = target_at(target, dt, i);
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
    *count = kept;
  return DT_OK;
}

// logits (n,c), target (n) -> loss_rows (n), lse (n), *out_count (host)
dt_status dt_cpu_cross_entropy_forward(const dt_exec *ex, const float *logits, const void *target,
                                       dt_dtype target_dtype, int64_t n, int64_t c,
                                       int64_t ignore_index, float *loss_rows, float *lse,
                                       int64_t *out_count) {
  (void)ex;
  int64_t count = 0;
  DT_CHECK(
      check_targets("cross_entropy_forward", target, target_dtype, n, c, ignore_index, &count));
  int nt = dt_cpu_threads();
#pragma omp parallel for if (n * c >= DT_CPU_PAR_MIN / 4) num_threads(nt) schedule(static)
  for (int64_t i = 0; i < n; i++) {
    const float *xr = logits + i * c;
    float mx;
    double ls;
    row_max_logsum(xr, c, &mx, &ls);
    double l = (double)mx + ls;
    if (lse)
      lse[i] = (float)l;
    int64_t t = target_at(target, target_dtype, i);
    loss_rows[i] = t == ignore_index ? 0.0f : (float)(l - (double)xr[t]);
  }
  if (out_count)
    *out_count = count;
  return DT_OK;
}

// logits (n,c), target (n), lse (n), dloss_rows (n) -> dlogits (n,c)
dt_status dt_cpu_cross_entropy_backward(const dt_exec *ex, const float *logits, const void *target,
                                        dt_dtype target_dtype, const float *lse,
                                        const float *dloss_rows, float *dlogits, int64_t n,
                                        int64_t c, int64_t ignore_index) {
  (void)ex;
  DT_CHECK(check_targets("cross_entropy_backward", target, target_dtype, n, c, ignore_index, NULL));
  int nt = dt_cpu_threads();
#pragma omp parallel for if (n * c >= DT_CPU_PAR_MIN / 4) num_threads(nt) schedule(static)
  for (int64_t i = 0; i < n; i++) {
    const float *xr = logits + i * c;
    float *dr = dlogits + i * c;
    int64_t t = target_at(target, target_dtype, i);
    if (t == ignore_index) {
      memset(dr, 0, (size_t)c * sizeof(float));
      continue;
    }
    float g = dloss_rows[i], l = lse[i];
    for (int64_t j = 0; j < c; j++)
      dr[j] = g * expf(xr[j] - l);
    dr[t] -= g;
  }
  return DT_OK;
}

/* ---- fused classifier (LM-head loss) ---- */

// logits (n,vp), target (n) -> loss_rows (n), dlogits (n,vp) or NULL, *out_count (host)
dt_status dt_cpu_classifier_forward(const dt_exec *ex, const float *logits, const void *target,
                                    dt_dtype target_dtype, int64_t n, int64_t vp, int64_t classes,
                                    int64_t ignore_index, float *loss_rows, float *dlogits,
                                    int64_t *out_count) {
  (void)ex;
  int64_t count = 0;
  DT_CHECK(
      check_targets("classifier_forward", target, target_dtype, n, classes, ignore_index, &count));
  int nt = dt_cpu_threads();
#pragma omp parallel for if (n * vp >= DT_CPU_PAR_MIN / 4) num_threads(nt) schedule(static)
  for (int64_t i = 0; i < n; i++) {
    const float *xr = logits + i * vp;
    float *dr = dlogits ? dlogits + i * vp : NULL;
    int64_t t = target_at(target, target_dtype, i);
    if (t == ignore_index) {
      loss_rows[i] = 0.0f;
      if (dr)
        memset(dr, 0, (size_t)vp * sizeof(float));
      continue;
    }
    /* the loss in cross_entropy_forward's order, so that the two agree bit
     * for bit; the exponentials are kept for the gradient (dr may be xr) */
    float mx = -INFINITY, xt = xr[t];
    for (int64_t j = 0; j < classes; j++)
      mx = xr[j] > mx ? xr[j] : mx;
    double s = 0.0;
    if (dr) {
      for (int64_t j = 0; j < classes; j++) {
        float e = expf(xr[j] - mx);
        dr[j] = e;
        s += e;
      }
      float inv = (float)(1.0 / s);
#pragma omp simd
      for (int64_t j = 0; j < classes; j++)
        dr[j] *= inv;
      dr[t] -= 1.0f;
      for (int64_t j = classes; j < vp; j++)
        dr[j] = 0.0f;
    } else {
      for (int64_t j = 0; j < classes; j++)
        s += expf(xr[j] - mx);
    }
    loss_rows[i] = (float)((double)mx + log(s) - (double)xt);
  }
  if (out_count)
    *out_count = count;
  return DT_OK;
}

// dlogits (n) *= scale * dloss[0]
dt_status dt_cpu_classifier_backward(const dt_exec *ex, float *dlogits, const float *dloss,
                                     float scale, int64_t n) {
  (void)ex;
  const float a = scale * dloss[0];
  int nt = dt_cpu_threads();
#pragma omp parallel for if (n >= DT_CPU_PAR_MIN) num_threads(nt) schedule(static)
  for (int64_t i = 0; i < n; i++)
    dlogits[i] *= a;
  return DT_OK;
}

/* ---- embedding ---- */

static dt_status check_indices(const char *op, const void *idx, dt_dtype dt, int64_t n, int64_t v) {
  for (int64_t i = 0; i < n; i++) {
    int64_t k = target_at(idx, dt, i);
    if (k < 0 || k >= v)
      return DT_ERROR(DT_ERR_INVALID_ARG,
                      "%s: index %lld at position %lld is outside [0, %lld): check the token "
                      "ids against the vocabulary size",
                      op, (long long)k, (long long)i, (long long)v);
  }
  return DT_OK;
}

// idx (n), table (v,d) -> y (n,d)
dt_status dt_cpu_embedding_forward(const dt_exec *ex, const void *idx, dt_dtype idx_dtype,
                                   const float *table, float *y, int64_t n, int64_t v, int64_t d) {
  (void)ex;
  DT_CHECK(check_indices("embedding_forward", idx, idx_dtype, n, v));
  int nt = dt_cpu_threads();
#pragma omp parallel for if (n * d >= DT_CPU_PAR_MIN) num_threads(nt) schedule(static)
  for (int64_t i = 0; i < n; i++)
    memcpy(y + i * d, table + target_at(idx, idx_dtype, i) * d, (size_t)d * sizeof(float));
  return DT_OK;
}

#define EMB_COL_BLOCK 64

// dy (n,d) -> dtable (v,d) += scatter by idx (n)
dt_status dt_cpu_embedding_backward(const dt_exec *ex, const void *idx, dt_dtype idx_dtype,
                                    const float *dy, float *dtable, int64_t n, int64_t v,
                                    int64_t d) {
  (void)ex;
  DT_CHECK(check_indices("embedding_backward", idx, idx_dtype, n, v));
  /* Threads own disjoint column blocks, so repeated indices never race and
   * the summation order (by position) is fixed. */
  int64_t blocks = (d + EMB_COL_BLOCK - 1) / EMB_COL_BLOCK;
  int nt = dt_cpu_threads();
#pragma omp parallel for if (n * d >= DT_CPU_PAR_MIN && blocks > 1) num_threads(nt) schedule(static)
  for (int64_t b = 0; b < blocks; b++) {
    int64_t j0 = b * EMB_COL_BLOCK, len = MIN(EMB_COL_BLOCK, d - j0);
    for (int64_t i = 0; i < n; i++) {
      float *dst = dtable + target_at(idx, idx_dtype, i) * d + j0;
      const float *src = dy + i * d + j0;
      for (int64_t j = 0; j < len; j++)
        dst[j] += src[j];
    }
  }
  return DT_OK;
}

/* ---- dropout ---- */

// x (n) -> y (n), mask (n) u8
dt_status dt_cpu_dropout_forward(const dt_exec *ex, const float *x, float *y, uint8_t *mask,
                                 int64_t n, float p, uint64_t seed, uint64_t offset) {
  (void)ex;
  float scale = p < 1.0f ? 1.0f / (1.0f - p) : 0.0f;
  int nt = dt_cpu_threads();
#pragma omp parallel for if (n >= DT_CPU_PAR_MIN / 4) num_threads(nt) schedule(static)
  for (int64_t i = 0; i < n; i++) {
    uint8_t keep = dt_rng_uniform(seed, offset + (uint64_t)i) >= p;
    mask[i] = keep;
    y[i] = keep ? x[i] * scale : 0.0f;
  }
  return DT_OK;
}

// dy (n), mask (n) -> dx (n) = dy * mask / (1-p)
dt_status dt_cpu_dropout_backward(const dt_exec *ex, const float *dy, const uint8_t *mask,
                                  float *dx, int64_t n, float p) {
  (void)ex;
  float scale = p < 1.0f ? 1.0f / (1.0f - p) : 0.0f;
  int nt = dt_cpu_threads();
#pragma omp parallel for if (n >= DT_CPU_PAR_MIN) num_threads(nt) schedule(static)
  for (int64_t i = 0; i < n; i++)
    dx[i] = mask[i] ? dy[i] * scale : 0.0f;
  return DT_OK;
}
