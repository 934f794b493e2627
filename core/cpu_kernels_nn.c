/* CPU kernels for softmax, cross-entropy, embedding and dropout. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/cpu_internal.h"
#include "core/half.h"
#include "core/rng.h"

#define MIN(a, b) ((a) < (b) ? (a) : (b))

/* ---- row helpers, vectorised (the exponentials: core/cpu_math.c) ---- */

#define EXP_BLOCK 512 /* elements per block of a row's exponentials */

/* max of x[0..n) (NaN propagates as in the reference loops: ignored) */
DT_CPU_CLONES static float row_max(const float *x, int64_t n) {
  float mx = -INFINITY;
#pragma omp simd reduction(max : mx)
  for (int64_t j = 0; j < n; j++)
    mx = x[j] > mx ? x[j] : mx;
  return mx;
}

/* sum over j < n of exp(x[j] - mx), in double with eight lanes (lane l
 * sums j = l mod 8 of each block; a fixed order), the exponentials written
 * to e (which may be x) when e is not NULL. */
DT_CPU_CLONES static double row_exp_sum(const float *x, int64_t n, float mx, float *e) {
  double acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  float tmp[EXP_BLOCK];
  for (int64_t j0 = 0; j0 < n; j0 += EXP_BLOCK) {
    int64_t len = MIN(EXP_BLOCK, n - j0);
    float *eb = e ? e + j0 : tmp;
    const float *xb = x + j0;
    dt_cpu_exp_shifted(xb, mx, 1.0f, eb, len);
    int64_t k = 0;
    for (; k + 8 <= len; k += 8) {
#pragma omp simd
      for (int l = 0; l < 8; l++)
        acc[l] += eb[k + l];
    }
    for (; k < len; k++)
      acc[k & 7] += eb[k];
  }
  return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

/* x[j] *= a */
DT_CPU_CLONES static void row_scale(float *x, float a, int64_t n) {
#pragma omp simd
  for (int64_t j = 0; j < n; j++)
    x[j] *= a;
}

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

// x (n) -> y (n) = softmax(x) (one row; inlined into the row loops)
static inline void softmax_row(const float *x, float *y, int64_t n) {
  float mx = -INFINITY;
  for (int64_t j = 0; j < n; j++)
    mx = x[j] > mx ? x[j] : mx;
  double s = 0.0;
  for (int64_t j = 0; j < n; j++) {
    float e = expf(x[j] - mx);
    y[j] = e;
    s += e;
  }
  float inv = (float)(1.0 / s);
  for (int64_t j = 0; j < n; j++)
    y[j] *= inv;
}

// y, dy (n) -> dx (n) = y * (dy - sum(dy * y)): softmax backward of one row
static inline void softmax_row_backward(const float *y, const float *dy, float *dx, int64_t n) {
  double s = 0.0;
  for (int64_t j = 0; j < n; j++)
    s += (double)dy[j] * y[j];
  float sf = (float)s;
  for (int64_t j = 0; j < n; j++)
    dx[j] = y[j] * (dy[j] - sf);
}

/* The forward softmaxes run on dt_cpu_rows: x holds ex->dtype (f32, or
 * 16-bit widened a block of rows at a time), y is f32. */
typedef struct softmax_rows_ctx {
  float *y;
  int64_t cols;
  bool log_;
} softmax_rows_ctx;

// rows [r0, r0 + n): x (n, cols) -> y (n, cols) = softmax or log_softmax over cols
static void softmax_forward_rows(const void *ctx, const float *const *x, int64_t r0, int64_t n) {
  const softmax_rows_ctx *c = ctx;
  const int64_t cols = c->cols;
  for (int64_t i = 0; i < n; i++) {
    const float *xr = x[0] + i * cols;
    float *yr = c->y + (r0 + i) * cols;
    if (c->log_) {
      float mx;
      double ls;
      row_max_logsum(xr, cols, &mx, &ls);
      float lsf = (float)ls;
      for (int64_t j = 0; j < cols; j++)
        yr[j] = (xr[j] - mx) - lsf;
    } else {
      softmax_row(xr, yr, cols);
    }
  }
}

// x (rows, cols) -> y (rows, cols) = softmax or log_softmax over cols
dt_status dt_cpu_softmax_forward(const dt_exec *ex, const float *x, float *y, int64_t rows,
                                 int64_t cols, bool log_) {
  const softmax_rows_ctx c = {y, cols, log_};
  if (rows * cols == 0)
    return DT_OK;
  return dt_cpu_rows("softmax_forward", rows, cols, 1, (const void *[]){x}, &ex->dtype,
                     DT_CPU_PAR_MIN / 4, softmax_forward_rows, &c);
}

// y, dy (rows, cols) -> dx (rows, cols); y is the forward output
dt_status dt_cpu_softmax_backward(const dt_exec *ex, const float *y, const float *dy, float *dx,
                                  int64_t rows, int64_t cols, bool log_) {
  (void)ex;
  DT_CPU_PARALLEL_FOR(r, rows, rows * cols, DT_CPU_PAR_MIN / 4) {
    const float *yr = y + r * cols, *gr = dy + r * cols;
    float *dr = dx + r * cols;
    if (log_) { /* dx = dy - exp(y) * sum(dy) */
      double s = 0.0;
      for (int64_t j = 0; j < cols; j++)
        s += gr[j];
      float sf = (float)s;
      for (int64_t j = 0; j < cols; j++)
        dr[j] = gr[j] - expf(yr[j]) * sf;
    } else {
      softmax_row_backward(yr, gr, dr, cols);
    }
  }
  return DT_OK;
}

// rows [r0, r0 + n): x (n, t) -> y (n, t), row r softmax over columns 0..r%t, the rest 0
static void causal_softmax_forward_rows(const void *ctx, const float *const *x, int64_t r0,
                                        int64_t n) {
  const softmax_rows_ctx *c = ctx;
  const int64_t t = c->cols;
  for (int64_t i = 0; i < n; i++) {
    const float *xr = x[0] + i * t;
    float *yr = c->y + (r0 + i) * t;
    int64_t keep = (r0 + i) % t + 1;
    softmax_row(xr, yr, keep);
    for (int64_t j = keep; j < t; j++)
      yr[j] = 0.0f;
  }
}

// x (rows, t) -> y (rows, t): row r softmax over columns 0..r%t, the rest 0
dt_status dt_cpu_causal_softmax_forward(const dt_exec *ex, const float *x, float *y, int64_t rows,
                                        int64_t t) {
  const softmax_rows_ctx c = {y, t, false};
  if (rows * t == 0)
    return DT_OK;
  return dt_cpu_rows("causal_softmax_forward", rows, t, 1, (const void *[]){x}, &ex->dtype,
                     DT_CPU_PAR_MIN / 4, causal_softmax_forward_rows, &c);
}

// y, dy (rows, t) -> dx (rows, t) = y * (dy - sum(dy * y)) over the kept columns
dt_status dt_cpu_causal_softmax_backward(const dt_exec *ex, const float *y, const float *dy,
                                         float *dx, int64_t rows, int64_t t) {
  (void)ex;
  DT_CPU_PARALLEL_FOR(r, rows, rows * t, DT_CPU_PAR_MIN / 4) {
    const float *yr = y + r * t, *gr = dy + r * t;
    float *dr = dx + r * t;
    int64_t keep = r % t + 1;
    softmax_row_backward(yr, gr, dr, keep);
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
 * that is not ignore_index; *count (when not NULL): the rows not ignored. */
static dt_status check_targets(const char *op, const void *target, dt_dtype dt, int64_t n,
                               int64_t c, int64_t ignore_index, float *count) {
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
    float mx = row_max(xr, c);
    double l = (double)mx + log(row_exp_sum(xr, c, mx, NULL));
    if (lse)
      lse[i] = (float)l;
    int64_t t = target_at(target, target_dtype, i);
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
    int64_t t = target_at(target, target_dtype, i);
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
  float xt = xr[t], mx = row_max(xr, classes);
  double s = row_exp_sum(xr, classes, mx, dr);
  if (dr) {
    row_scale(dr, (float)(1.0 / s), classes);
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
      st = DT_ERROR(DT_ERR_OOM, "classifier_forward: a row buffer of %lld f32", (long long)vp);
    }
#pragma omp for schedule(static)
    for (int64_t i = 0; i < n; i++) {
      int64_t t = target_at(target, target_dtype, i);
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
        row_scale(w, dlogits_scale, classes);
      if (dlogits)
        (void)dt_half_from_f32(dtype, w, dlogits + i * vp, vp);
    }
    free(w);
  }
  return st;
}

// logits (n,vp), target (n) -> loss_rows (n), dlogits (n,vp) or NULL, *count (rows kept, f32);
// logits and dlogits hold ex->dtype (f32, or 16-bit: f32 math)
dt_status dt_cpu_classifier_forward(const dt_exec *ex, const float *logits, const void *target,
                                    dt_dtype target_dtype, int64_t n, int64_t vp, int64_t classes,
                                    int64_t ignore_index, float *loss_rows, float *dlogits,
                                    float dlogits_scale, float *count_out) {
  DT_CHECK(check_targets("classifier_forward", target, target_dtype, n, classes, ignore_index,
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
    int64_t t = target_at(target, target_dtype, i);
    if (t == ignore_index) {
      loss_rows[i] = 0.0f;
      if (dr)
        memset(dr, 0, (size_t)vp * sizeof(float));
      continue;
    }
    loss_rows[i] = classifier_row(xr, dr, t, vp, classes);
    if (dr && dlogits_scale != 1.0f)
      row_scale(dr, dlogits_scale, classes);
  }
  return DT_OK;
}

static dt_status classifier_scale_block(const dt_exec *ex32, const void *ctx,
                                        const float *const *in, float *out, int64_t len) {
  return dt_cpu_axpby(ex32, len, *(const float *)ctx, in[0], 0.0f, out);
}

// dlogits (n) *= dloss[0] / count[0] (0 when no row was kept: dlogits is all zero then)
dt_status dt_cpu_classifier_backward(const dt_exec *ex, float *dlogits, const float *dloss,
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
  DT_CPU_PARALLEL_FOR(i, n, n * d, DT_CPU_PAR_MIN)
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
  if (dt_dtype_is_half(ex->dtype))
    return dt_cpu_half_dropout_forward(ex, x, y, mask, n, p, seed, offset);
  float scale = p < 1.0f ? 1.0f / (1.0f - p) : 0.0f;
  DT_CPU_PARALLEL_FOR(i, n, n, DT_CPU_PAR_MIN / 4) {
    uint8_t keep = dt_rng_uniform(seed, offset + (uint64_t)i) >= p;
    mask[i] = keep;
    y[i] = keep ? x[i] * scale : 0.0f;
  }
  return DT_OK;
}

// dy (n), mask (n) -> dx (n) = dy * mask / (1-p)
dt_status dt_cpu_dropout_backward(const dt_exec *ex, const float *dy, const uint8_t *mask,
                                  float *dx, int64_t n, float p) {
  if (dt_dtype_is_half(ex->dtype))
    return dt_cpu_half_dropout_backward(ex, dy, mask, dx, n, p);
  float scale = p < 1.0f ? 1.0f / (1.0f - p) : 0.0f;
  DT_CPU_PARALLEL_FOR(i, n, n, DT_CPU_PAR_MIN)
  dx[i] = mask[i] ? dy[i] * scale : 0.0f;
  return DT_OK;
}
