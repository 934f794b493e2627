/* CPU kernels of the softmax family (core/ops_softmax.c): softmax,
 * log-softmax and the causal softmax, one row at a time (16-bit rows
 * widened by dt_cpu_rows). */
#include <math.h>

#include "core/cpu_internal.h"

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
