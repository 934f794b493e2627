/* CPU kernels for batch, layer and RMS normalisation. Statistics are two-pass in
 * double (a batch-norm plane through 8 running sums); per-channel sums are formed from
 * per-(channel, sample) partials combined in a fixed order, so results do not depend on the thread
 * count. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/cpu_internal.h"

#define MIN(a, b) ((a) < (b) ? (a) : (b))

/* ---- batch normalisation ---- */

static double *bn_partials(const char *op, int64_t count) {
  double *p = malloc((size_t)(count > 0 ? count : 1) * 2 * sizeof(double));
  if (!p)
    DT_ERROR(DT_ERR_OOM, "%s: scratch of %lld doubles: malloc failed: free host memory", op,
             (long long)count * 2);
  return p;
}

/* A plane's sums in double through 8 running sums (element i into sum
 * i % 8, added pairwise at the end): a fixed order, so the results do not
 * depend on the machine or the thread count, and independent additions
 * that vectorise where one running sum waited on each add's latency (a
 * ResNet-18 step spent 5 % in these loops). The AVX-512 clone is chosen
 * at load time; every clone adds in the same order. */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define BN_CLONES __attribute__((target_clones("avx512f", "default")))
#else
#define BN_CLONES
#endif
#define BN_LANES 8

static double lanes_total(const double *v) {
  return ((v[0] + v[1]) + (v[2] + v[3])) + ((v[4] + v[5]) + (v[6] + v[7]));
}

/* sum of x[i] (m 0) or of (x[i] - m)^2 (squares) */
BN_CLONES static double bn_plane_sum(const float *x, int64_t n, double m, int squares) {
  double acc[BN_LANES] = {0};
  int64_t i = 0;
  for (; i + BN_LANES <= n; i += BN_LANES) {
    if (squares) {
#pragma omp simd
      for (int j = 0; j < BN_LANES; j++) {
        double d = (double)x[i + j] - m;
        acc[j] += d * d;
      }
    } else {
#pragma omp simd
      for (int j = 0; j < BN_LANES; j++)
        acc[j] += x[i + j];
    }
  }
  for (int j = 0; i < n; i++, j++) {
    double d = (double)x[i] - m;
    acc[j] += squares ? d * d : (double)x[i];
  }
  return lanes_total(acc);
}

/* *s = sum of g[i], *sx = sum of g[i] (x[i] - m) */
BN_CLONES static void bn_plane_grad_sums(const float *g, const float *x, int64_t n, double m,
                                         double *s, double *sx) {
  double a[BN_LANES] = {0}, b[BN_LANES] = {0};
  int64_t i = 0;
  for (; i + BN_LANES <= n; i += BN_LANES) {
#pragma omp simd
    for (int j = 0; j < BN_LANES; j++) {
      a[j] += g[i + j];
      b[j] += g[i + j] * ((double)x[i + j] - m);
    }
  }
  for (int j = 0; i < n; i++, j++) {
    a[j] += g[i];
    b[j] += g[i] * ((double)x[i] - m);
  }
  *s = lanes_total(a);
  *sx = lanes_total(b);
}

/* The per-channel sums of the (n, c) partials, in sample order. */
static double channel_total(const double *part, int64_t n, int64_t c, int64_t ci) {
  double s = 0.0;
  for (int64_t ni = 0; ni < n; ni++)
    s += part[ni * c + ci];
  return s;
}

/* Each batch-norm kernel is one parallel region whose loops over the
 * (sample, channel) planes are separated by the serial per-channel steps
 * (omp single): one wake-up of the pool per call instead of one per loop
 * (a ResNet-18 step calls them 40 times). The arithmetic is that of
 * separate loops. */

typedef struct bn_forward_args {
  const float *x, *gamma, *beta;
  float *y, *running_mean, *running_var, *save_mean, *save_invstd;
  int64_t n, c, hw;
  float momentum, eps;
  double *part, *mean; /* training: (n*c) partials, (c) means */
  float *scale, *shift;
} bn_forward_args;

/* Training: the batch statistics, scale and shift, the saved and running
 * statistics; runs inside the region (the loops are shared). */
static void bn_forward_stats(const bn_forward_args *a) {
  const int64_t n = a->n, c = a->c, hw = a->hw, cnt = n * hw;
  /* pass 1: sums per (sample, channel) -> mean */
#pragma omp for schedule(static)
  for (int64_t task = 0; task < n * c; task++)
    a->part[task] = bn_plane_sum(a->x + task * hw, hw, 0.0, 0);
#pragma omp single
  for (int64_t ci = 0; ci < c; ci++)
    a->mean[ci] = channel_total(a->part, n, c, ci) / (double)cnt;
    /* pass 2: squared deviations */
#pragma omp for schedule(static)
  for (int64_t task = 0; task < n * c; task++)
    a->part[task] = bn_plane_sum(a->x + task * hw, hw, a->mean[task % c], 1);
#pragma omp single
  for (int64_t ci = 0; ci < c; ci++) {
    double var = channel_total(a->part, n, c, ci) / (double)cnt;
    double invstd = 1.0 / sqrt(var + (double)a->eps), mean = a->mean[ci];
    double g = a->gamma ? a->gamma[ci] : 1.0, b = a->beta ? a->beta[ci] : 0.0;
    a->scale[ci] = (float)(g * invstd);
    a->shift[ci] = (float)(b - mean * g * invstd);
    if (a->save_mean)
      a->save_mean[ci] = (float)mean;
    if (a->save_invstd)
      a->save_invstd[ci] = (float)invstd;
    if (a->running_mean)
      a->running_mean[ci] = (float)((1.0 - a->momentum) * a->running_mean[ci] + a->momentum * mean);
    if (a->running_var)
      a->running_var[ci] = (float)((1.0 - a->momentum) * a->running_var[ci] +
                                   a->momentum * var * (double)cnt / (double)(cnt - 1));
  }
}

/* The f32 forward: x, y f32. */
static dt_status bn_forward_f32(const float *x, float *y, const float *gamma, const float *beta,
                                float *running_mean, float *running_var, float *save_mean,
                                float *save_invstd, int64_t n, int64_t c, int64_t hw, bool training,
                                float momentum, float eps) {
  int nt = dt_cpu_threads();
  int par = n * c * hw >= DT_CPU_PAR_MIN;
  bn_forward_args a = {.x = x,
                       .gamma = gamma,
                       .beta = beta,
                       .y = y,
                       .running_mean = running_mean,
                       .running_var = running_var,
                       .save_mean = save_mean,
                       .save_invstd = save_invstd,
                       .n = n,
                       .c = c,
                       .hw = hw,
                       .momentum = momentum,
                       .eps = eps};
  a.scale = malloc((size_t)(c > 0 ? c : 1) * 2 * sizeof(float));
  if (!a.scale)
    return DT_ERROR(DT_ERR_OOM, "batch_norm2d_forward: scratch of %lld floats: malloc failed",
                    (long long)c * 2);
  a.shift = a.scale + c;
  if (training) {
    a.part = bn_partials("batch_norm2d_forward", n * c);
    if (!a.part) {
      free(a.scale);
      return DT_ERR_OOM;
    }
    a.mean = a.part + n * c; /* the second half */
  } else {
    for (int64_t ci = 0; ci < c; ci++) {
      double invstd = 1.0 / sqrt((double)running_var[ci] + (double)eps);
      double g = gamma ? gamma[ci] : 1.0, b = beta ? beta[ci] : 0.0;
      a.scale[ci] = (float)(g * invstd);
      a.shift[ci] = (float)(b - running_mean[ci] * g * invstd);
      /* So that a backward through eval mode can use the running stats. */
      if (save_mean)
        save_mean[ci] = running_mean[ci];
      if (save_invstd)
        save_invstd[ci] = (float)invstd;
    }
  }
#pragma omp parallel if (par) num_threads(nt)
  {
    if (training)
      bn_forward_stats(&a);
#pragma omp for schedule(static)
    for (int64_t task = 0; task < n * c; task++) {
      const float *xp = x + task * hw;
      float *yp = y + task * hw;
      float sc = a.scale[task % c], sh = a.shift[task % c];
#pragma omp simd /* -O2 alone leaves these loops scalar (the aliasing check) */
      for (int64_t i = 0; i < hw; i++)
        yp[i] = xp[i] * sc + sh;
    }
  }
  free(a.part);
  free(a.scale);
  return DT_OK;
}

/* The f32 backward: x, dy, dx f32. */
static dt_status bn_backward_f32(const float *x, const float *dy, const float *gamma,
                                 const float *save_mean, const float *save_invstd, float *dx,
                                 float *dgamma, float *dbeta, int64_t n, int64_t c, int64_t hw) {
  int64_t cnt = n * hw, total = n * c * hw;
  int nt = dt_cpu_threads();
  int par = total >= DT_CPU_PAR_MIN;
  /* partials: (n*c) sums of dy, then (n*c) sums of dy*(x-mean) */
  double *part = bn_partials("batch_norm2d_backward", n * c);
  if (!part)
    return DT_ERR_OOM;
  double *part_dy = part, *part_dyx = part + n * c;
  float *k_dy = malloc((size_t)(c > 0 ? c : 1) * 3 * sizeof(float));
  if (!k_dy) {
    free(part);
    return DT_ERROR(DT_ERR_OOM, "batch_norm2d_backward: scratch of %lld floats: malloc failed",
                    (long long)c * 3);
  }
  float *k_x = k_dy + c, *k_mul = k_dy + 2 * c;
#pragma omp parallel if (par) num_threads(nt)
  {
#pragma omp for schedule(static)
    for (int64_t task = 0; task < n * c; task++)
      bn_plane_grad_sums(dy + task * hw, x + task * hw, hw, save_mean[task % c], &part_dy[task],
                         &part_dyx[task]);
#pragma omp single
    for (int64_t ci = 0; ci < c; ci++) {
      double s = channel_total(part_dy, n, c, ci), sx = channel_total(part_dyx, n, c, ci);
      double invstd = save_invstd[ci], g = gamma ? gamma[ci] : 1.0;
      if (dgamma)
        dgamma[ci] = (float)(sx * invstd);
      if (dbeta)
        dbeta[ci] = (float)s;
      /* dx = g*invstd * (dy - s/cnt - (x-mean) * invstd^2 * sx/cnt) */
      double inv_cnt = cnt > 0 ? 1.0 / (double)cnt : 0.0;
      k_mul[ci] = (float)(g * invstd);
      k_dy[ci] = (float)(s * inv_cnt);
      k_x[ci] = (float)(sx * inv_cnt * invstd * invstd);
    }
    if (dx) {
#pragma omp for schedule(static)
      for (int64_t task = 0; task < n * c; task++) {
        int64_t ci = task % c;
        const float *xp = x + task * hw, *gp = dy + task * hw;
        float *dp = dx + task * hw;
        float m = save_mean[ci], mul = k_mul[ci], kd = k_dy[ci], kx = k_x[ci];
#pragma omp simd
        for (int64_t i = 0; i < hw; i++)
          dp[i] = mul * (gp[i] - kd - (xp[i] - m) * kx);
      }
    }
  }
  free(part);
  free(k_dy);
  return DT_OK;
}

/* 16-bit operands of the batch norm: each widened into (or, for a result,
 * computed in) an f32 buffer of `total` elements, or used in place when it
 * is f32 already. A 16-bit result is rounded once from the f32 kernel's. */
typedef struct bn_f32_view {
  float *f32;  /* what the f32 kernel reads or writes */
  float *heap; /* the buffer, when one was needed */
} bn_f32_view;

static dt_status bn_view(const char *op, const void *p, dt_dtype t, int64_t total, bool widen,
                         bn_f32_view *v) {
  v->heap = NULL;
  v->f32 = (float *)p;
  if (t == DT_DTYPE_F32 || p == NULL)
    return DT_OK;
  v->heap = malloc((size_t)(total > 0 ? total : 1) * sizeof(float));
  if (!v->heap)
    return DT_ERROR(DT_ERR_OOM, "%s: an f32 copy of %lld 16-bit values: malloc failed", op,
                    (long long)total);
  v->f32 = v->heap;
  return widen ? dt_cpu_cast(NULL, p, t, v->heap, DT_DTYPE_F32, total) : DT_OK; /* threaded */
}

/* The result's f32 values rounded into its 16-bit buffer (none when f32). */
static dt_status bn_view_done(dt_status st, bn_f32_view *v, void *out, dt_dtype t, int64_t total) {
  if (st == DT_OK && v->heap && out)
    st = dt_cpu_cast(NULL, v->heap, DT_DTYPE_F32, out, t, total);
  free(v->heap);
  v->heap = NULL;
  return st;
}

// x (n,c,hw) of ex->dtype -> y (n,c,hw) of y_dtype; batch statistics (training) or running ones
// (eval), in f32 on the widened x; a 16-bit y rounded once
dt_status dt_cpu_batch_norm2d_forward(const dt_exec *ex, const float *x, float *y, dt_dtype y_dtype,
                                      const float *gamma, const float *beta, float *running_mean,
                                      float *running_var, float *save_mean, float *save_invstd,
                                      int64_t n, int64_t c, int64_t hw, bool training,
                                      float momentum, float eps) {
  static const char *op = "batch_norm2d_forward";
  const int64_t total = n * c * hw;
  bn_f32_view vx, vy = {NULL, NULL};
  DT_CHECK(bn_view(op, x, ex->dtype, total, true, &vx));
  dt_status st = bn_view(op, y, y_dtype, total, false, &vy);
  if (st == DT_OK)
    st = bn_forward_f32(vx.f32, vy.f32, gamma, beta, running_mean, running_var, save_mean,
                        save_invstd, n, c, hw, training, momentum, eps);
  st = bn_view_done(st, &vy, y, y_dtype, total);
  return bn_view_done(st, &vx, NULL, ex->dtype, total);
}

// x (n,c,hw) of ex->dtype, dy of dy_dtype, saved mean/invstd (c) -> dx (n,c,hw) of ex->dtype,
// dgamma (c), dbeta (c) (overwrite); f32 on the widened x and dy, a 16-bit dx rounded once
dt_status dt_cpu_batch_norm2d_backward(const dt_exec *ex, const float *x, const float *dy,
                                       dt_dtype dy_dtype, const float *gamma,
                                       const float *save_mean, const float *save_invstd, float *dx,
                                       float *dgamma, float *dbeta, int64_t n, int64_t c,
                                       int64_t hw, float eps) {
  static const char *op = "batch_norm2d_backward";
  (void)eps; /* the saved invstd already holds it */
  const int64_t total = n * c * hw;
  bn_f32_view vx, vdy = {NULL, NULL}, vdx = {NULL, NULL};
  DT_CHECK(bn_view(op, x, ex->dtype, total, true, &vx));
  dt_status st = bn_view(op, dy, dy_dtype, total, true, &vdy);
  if (st == DT_OK)
    st = bn_view(op, dx, ex->dtype, total, false, &vdx);
  if (st == DT_OK)
    st = bn_backward_f32(vx.f32, vdy.f32, gamma, save_mean, save_invstd, vdx.f32, dgamma, dbeta, n,
                         c, hw);
  st = bn_view_done(st, &vdx, dx, ex->dtype, total);
  st = bn_view_done(st, &vdy, NULL, dy_dtype, total);
  return bn_view_done(st, &vx, NULL, ex->dtype, total);
}

/* ---- layer normalisation ---- */

/* x (and residual) hold ex->dtype (and residual_dtype): f32, or 16-bit
 * read a block of rows at a time into f32 (dt_cpu_rows); y holds y_dtype
 * (f32, or 16-bit rounded once from the f32 result) and dy dy_dtype; the
 * statistics, the sum and dx, dgamma, dbeta are f32. */

/* rms: RMS norm, the same arithmetic with the mean taken as 0 (no
 * centring, no beta) */
typedef struct ln_forward_ctx {
  const float *gamma, *beta;
  float *sum;
  void *y;
  dt_dtype y_dtype;
  float *mean, *rstd;
  int64_t cols;
  float eps;
  bool rms;
} ln_forward_ctx;

#define LN_COL_BLOCK 256

/* yr[j0, j0 + len) = (xr - m) * rs * gamma + beta, the f32 values in v */
static void layer_norm_y_span(const ln_forward_ctx *c, const float *xr, float mf, float rs,
                              int64_t j0, int64_t len, float *v) {
  const float *gamma = c->gamma, *beta = c->beta;
  if (gamma && beta)
    for (int64_t j = j0; j < j0 + len; j++)
      v[j - j0] = (xr[j] - mf) * rs * gamma[j] + beta[j];
  else
    for (int64_t j = j0; j < j0 + len; j++)
      v[j - j0] = (xr[j] - mf) * rs * (gamma ? gamma[j] : 1.0f) + (beta ? beta[j] : 0.0f);
}

/* Layer norm of rows [r0, r0 + n) of x (in[0], f32), or of sum = x +
 * residual (in[1]; written) when the context has a sum: the same
 * arithmetic on the same values either way. */
static void layer_norm_rows(const void *ctx, const float *const *in, int64_t r0, int64_t n) {
  const ln_forward_ctx *c = ctx;
  const int64_t cols = c->cols;
  for (int64_t i = 0; i < n; i++) {
    const int64_t r = r0 + i;
    const float *xr = in[0] + i * cols;
    if (c->sum) {
      const float *rr = in[1] + i * cols;
      float *sr = c->sum + r * cols;
#pragma omp simd
      for (int64_t j = 0; j < cols; j++)
        sr[j] = xr[j] + rr[j];
      xr = sr;
    }
    double s = 0.0;
    for (int64_t j = 0; j < cols && !c->rms; j++)
      s += xr[j];
    double m = s / (double)cols, v = 0.0;
    for (int64_t j = 0; j < cols; j++) {
      double dlt = xr[j] - m;
      v += dlt * dlt;
    }
    float mf = (float)m, rs = (float)(1.0 / sqrt(v / (double)cols + (double)c->eps));
    if (c->mean)
      c->mean[r] = mf;
    if (c->rstd)
      c->rstd[r] = rs;
    if (c->y_dtype == DT_DTYPE_F32) {
      layer_norm_y_span(c, xr, mf, rs, 0, cols, (float *)c->y + r * cols);
      continue;
    }
    float yw[LN_COL_BLOCK]; /* a 16-bit y: rounded a block of columns at a time */
    for (int64_t j0 = 0; j0 < cols; j0 += LN_COL_BLOCK) {
      int64_t len = MIN(LN_COL_BLOCK, cols - j0);
      layer_norm_y_span(c, xr, mf, rs, j0, len, yw);
      dt_cpu_store_span(c->y, c->y_dtype, r * cols + j0, len, yw);
    }
  }
}

// x (rows, cols), gamma/beta (cols) -> y (rows, cols), mean (rows), rstd (rows)
dt_status dt_cpu_layer_norm_forward(const dt_exec *ex, const float *x, const float *gamma,
                                    const float *beta, float *y, dt_dtype y_dtype, float *mean,
                                    float *rstd, int64_t rows, int64_t cols, float eps) {
  const ln_forward_ctx c = {gamma, beta, NULL, y, y_dtype, mean, rstd, cols, eps, false};
  return dt_cpu_rows("layer_norm_forward", rows, cols, 1, (const void *[]){x}, &ex->dtype,
                     DT_CPU_PAR_MIN / 4, layer_norm_rows, &c);
}

// x, residual (rows, cols) -> sum = x + residual, y = layer_norm(sum), mean, rstd (rows)
dt_status dt_cpu_residual_layer_norm_forward(const dt_exec *ex, const float *x,
                                             const float *residual, dt_dtype residual_dtype,
                                             const float *gamma, const float *beta, float *sum,
                                             float *y, dt_dtype y_dtype, float *mean, float *rstd,
                                             int64_t rows, int64_t cols, float eps) {
  const ln_forward_ctx c = {gamma, beta, sum, y, y_dtype, mean, rstd, cols, eps, false};
  return dt_cpu_rows("residual_layer_norm_forward", rows, cols, 2, (const void *[]){x, residual},
                     (const dt_dtype[]){ex->dtype, residual_dtype}, DT_CPU_PAR_MIN / 4,
                     layer_norm_rows, &c);
}

// x (rows, cols), weight (cols) -> y (rows, cols), rstd (rows): layer norm's rows without the mean
dt_status dt_cpu_rms_norm_forward(const dt_exec *ex, const float *x, const float *weight, float *y,
                                  dt_dtype y_dtype, float *rstd, int64_t rows, int64_t cols,
                                  float eps) {
  const ln_forward_ctx c = {weight, NULL, NULL, y, y_dtype, NULL, rstd, cols, eps, true};
  return dt_cpu_rows("rms_norm_forward", rows, cols, 1, (const void *[]){x}, &ex->dtype,
                     DT_CPU_PAR_MIN / 4, layer_norm_rows, &c);
}

/* mean NULL: RMS norm (the mean 0, and no mean(g) term) */
typedef struct ln_backward_ctx {
  const float *gamma, *mean, *rstd;
  float *dx;
  int64_t cols;
} ln_backward_ctx;

/* dx of rows [r0, r0 + n) from x (in[0]) and dy (in[1]), f32:
 * dx = rstd * (g - mean(g) - xhat * mean(g * xhat)), g = dy * gamma
 * (RMS norm: dx = rstd * (g - xhat * mean(g * xhat))) */
static void layer_norm_backward_dx_rows(const void *ctx, const float *const *in, int64_t r0,
                                        int64_t n) {
  const ln_backward_ctx *c = ctx;
  const int64_t cols = c->cols;
  const float *gamma = c->gamma;
  for (int64_t i = 0; i < n; i++) {
    const int64_t r = r0 + i;
    const float *xr = in[0] + i * cols, *gr = in[1] + i * cols;
    float *dr = c->dx + r * cols;
    float m = c->mean ? c->mean[r] : 0.0f, rs = c->rstd[r];
    double sg = 0.0, sgx = 0.0;
    for (int64_t j = 0; j < cols; j++) {
      float g = gr[j] * (gamma ? gamma[j] : 1.0f);
      sg += g;
      sgx += (double)g * ((xr[j] - m) * rs);
    }
    float mg = c->mean ? (float)(sg / (double)cols) : 0.0f, mgx = (float)(sgx / (double)cols);
    for (int64_t j = 0; j < cols; j++) {
      float g = gr[j] * (gamma ? gamma[j] : 1.0f);
      dr[j] = rs * (g - mg - (xr[j] - m) * rs * mgx);
    }
  }
}

// x (rows, cols) of ex->dtype, dy (rows, cols) of dy_dtype, mean (NULL: RMS norm)/rstd (rows) ->
// dx (rows, cols) overwritten; dgamma, dbeta (cols) accumulated (+=)
static dt_status norm_backward(const char *op, const dt_exec *ex, const float *x,
                               const float *gamma, const float *mean, const float *rstd,
                               const float *dy, dt_dtype dy_dtype, float *dx, float *dgamma,
                               float *dbeta, int64_t rows, int64_t cols) {
  const dt_dtype xdt = ex->dtype;
  if (dx) {
    const ln_backward_ctx c = {gamma, mean, rstd, dx, cols};
    DT_CHECK(dt_cpu_rows(op, rows, cols, 2, (const void *[]){x, dy},
                         (const dt_dtype[]){xdt, dy_dtype}, DT_CPU_PAR_MIN / 4,
                         layer_norm_backward_dx_rows, &c));
  }
  if (!dgamma && !dbeta)
    return DT_OK;
  /* Column blocks down all rows: race-free, fixed order; a 16-bit x or dy
   * is widened a row's block at a time */
  int64_t blocks = (cols + LN_COL_BLOCK - 1) / LN_COL_BLOCK;
  int par = rows * cols >= DT_CPU_PAR_MIN / 4;
#pragma omp parallel for if (par && blocks > 1) num_threads(dt_cpu_threads()) schedule(static)
  for (int64_t b = 0; b < blocks; b++) {
    int64_t j0 = b * LN_COL_BLOCK, len = MIN(LN_COL_BLOCK, cols - j0);
    double ag[LN_COL_BLOCK], ab[LN_COL_BLOCK];
    float xw[LN_COL_BLOCK], gw[LN_COL_BLOCK];
    for (int64_t j = 0; j < len; j++)
      ag[j] = ab[j] = 0.0;
    for (int64_t r = 0; r < rows; r++) {
      const float *xr = dt_cpu_f32_span(x, xdt, r * cols + j0, len, xw),
                  *gr = dt_cpu_f32_span(dy, dy_dtype, r * cols + j0, len, gw);
      float m = mean ? mean[r] : 0.0f, rs = rstd[r];
      for (int64_t j = 0; j < len; j++) {
        ag[j] += (double)gr[j] * ((xr[j] - m) * rs);
        ab[j] += gr[j];
      }
    }
    for (int64_t j = 0; j < len; j++) {
      if (dgamma)
        dgamma[j0 + j] += (float)ag[j];
      if (dbeta)
        dbeta[j0 + j] += (float)ab[j];
    }
  }
  return DT_OK;
}

dt_status dt_cpu_layer_norm_backward(const dt_exec *ex, const float *x, const float *gamma,
                                     const float *mean, const float *rstd, const float *dy,
                                     dt_dtype dy_dtype, float *dx, float *dgamma, float *dbeta,
                                     int64_t rows, int64_t cols) {
  return norm_backward("layer_norm_backward", ex, x, gamma, mean, rstd, dy, dy_dtype, dx, dgamma,
                       dbeta, rows, cols);
}

dt_status dt_cpu_rms_norm_backward(const dt_exec *ex, const float *x, const float *weight,
                                   const float *rstd, const float *dy, dt_dtype dy_dtype, float *dx,
                                   float *dweight, int64_t rows, int64_t cols) {
  return norm_backward("rms_norm_backward", ex, x, weight, NULL, rstd, dy, dy_dtype, dx, dweight,
                       NULL, rows, cols);
}
