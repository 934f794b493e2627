/* CPU kernels of the fused causal self-attention: flash attention's tiling
 * on the CPU. For each (sequence, head) and block of ATT_QB queries the keys
 * are visited in blocks of ATT_KB with an online softmax, so nothing of size
 * T x T is ever stored; the backward recomputes the scores block by block
 * from the saved logsumexp. The block sizes are fixed and every output
 * element is summed in one order, so the result does not depend on the
 * number of threads.
 *
 * The inner loops are axpy-shaped (a key block is transposed once, so the
 * scores of one query are hd axpys over the block's keys), which vectorise
 * without reassociating any sum. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/cpu_internal.h"

#define ATT_QB 32 /* queries per forward task */
#define ATT_KB 64 /* keys per block (a multiple of ATT_QB) */
#define ATT_PAR_MIN (1 << 18)

#define MIN(a, b) ((a) < (b) ? (a) : (b))

/* Where a head's rows live: qkv (b, t, 3c) with q, k, v at column offsets
 * 0, c, 2c; the head's hd columns start at h * hd inside each. */
typedef struct att_geom {
  int64_t t, heads, hd, c, row; /* row = 3c, the stride of qkv and dqkv */
  float scale;                  /* 1 / sqrt(hd) */
} att_geom;

static att_geom att_geom_of(int64_t t, int64_t h, int64_t hd) {
  att_geom g = {t, h, hd, h * hd, 3 * h * hd, (float)(1.0 / sqrt((double)hd))};
  return g;
}

/* kt (hd, ATT_KB) = rows[0..n) (each hd wide, `stride` apart) transposed */
static void transpose_block(const float *rows, int64_t stride, int64_t n, int64_t hd, float *kt) {
  for (int64_t j = 0; j < n; j++)
    for (int64_t d = 0; d < hd; d++)
      kt[d * ATT_KB + j] = rows[j * stride + d];
}

/* s (n) = scale * kt^T q: the dot products of q with the block's keys */
static void scores_block(const float *q, const float *kt, int64_t hd, int64_t n, float scale,
                         float *s) {
  for (int64_t j = 0; j < n; j++)
    s[j] = 0.0f;
  for (int64_t d = 0; d < hd; d++) {
    const float qd = q[d], *kr = kt + d * ATT_KB;
#pragma omp simd
    for (int64_t j = 0; j < n; j++)
      s[j] += qd * kr[j];
  }
  for (int64_t j = 0; j < n; j++)
    s[j] *= scale;
}

/* y (n) += a * x (n) */
static void axpy(float a, const float *x, float *y, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; i++)
    y[i] += a * x[i];
}

static float dot(const float *a, const float *b, int64_t n) {
  float s = 0.0f;
#pragma omp simd reduction(+ : s)
  for (int64_t i = 0; i < n; i++)
    s += a[i] * b[i];
  return s;
}

/* What a task of a kernel reads and writes. */
typedef struct att_args {
  att_geom g;
  const float *qkv, *out, *lse, *dout;
  float *y, *lse_out, *dqkv;
  int64_t qblocks;
} att_args;

typedef void (*att_task_fn)(const att_args *a, int64_t task, float *scratch);

/* Runs fn for tasks [0, n) over the kernel threads (parallel when `par`),
 * each thread with its own scratch of `scratch_floats`. */
static dt_status run_tasks(const char *op, const att_args *a, int64_t n, size_t scratch_floats,
                           int par, att_task_fn fn) {
  int failed = 0, nt = dt_cpu_threads();
#pragma omp parallel if (par && n > 1) num_threads(nt)
  {
    float *scratch = malloc(scratch_floats * sizeof(float));
    if (!scratch) {
#pragma omp atomic write
      failed = 1;
    }
#pragma omp for schedule(static)
    for (int64_t task = 0; task < n; task++)
      if (scratch)
        fn(a, task, scratch);
    free(scratch);
  }
  if (failed)
    return DT_ERROR(DT_ERR_OOM, "%s: %zu bytes of scratch per thread: malloc failed", op,
                    scratch_floats * sizeof(float));
  return DT_OK;
}

/* One forward task: queries [i0, i1) of head h of sequence b. scratch:
 * ATT_KB * hd (a key block, transposed) + ATT_KB (scores) + ATT_QB * hd
 * (accumulators) + 2 * ATT_QB (running max, running sum). */
static void attention_forward_block(const att_geom *g, const float *qkv, float *out, float *lse,
                                    int64_t b, int64_t h, int64_t i0, int64_t i1, float *scratch) {
  const int64_t hd = g->hd;
  float *kt = scratch, *s = kt + ATT_KB * hd, *acc = s + ATT_KB, *m = acc + ATT_QB * hd,
        *l = m + ATT_QB;
  const float *base = qkv + b * g->t * g->row + h * hd;
  for (int64_t r = 0; r < i1 - i0; r++) {
    m[r] = -INFINITY;
    l[r] = 0.0f;
  }
  memset(acc, 0, (size_t)(ATT_QB * hd) * sizeof(float));
  for (int64_t j0 = 0; j0 < i1; j0 += ATT_KB) {
    int64_t j1 = MIN(j0 + ATT_KB, i1); /* keys past i1 - 1 are masked for every row */
    transpose_block(base + j0 * g->row + g->c, g->row, j1 - j0, hd, kt);
    const float *v = base + j0 * g->row + 2 * g->c;
    for (int64_t i = i0 > j0 ? i0 : j0; i < i1; i++) {
      int64_t r = i - i0, n = MIN(j1, i + 1) - j0;
      scores_block(base + i * g->row, kt, hd, n, g->scale, s);
      float mx = m[r];
      for (int64_t j = 0; j < n; j++)
        mx = s[j] > mx ? s[j] : mx;
      float alpha = expf(m[r] - mx), sum = 0.0f; /* the first block: exp(-inf) = 0 */
      for (int64_t j = 0; j < n; j++) {
        s[j] = expf(s[j] - mx);
        sum += s[j];
      }
      l[r] = l[r] * alpha + sum;
      m[r] = mx;
      float *ar = acc + r * hd;
#pragma omp simd
      for (int64_t d = 0; d < hd; d++)
        ar[d] *= alpha;
      for (int64_t j = 0; j < n; j++)
        axpy(s[j], v + j * g->row, ar, hd);
    }
  }
  for (int64_t i = i0; i < i1; i++) {
    int64_t r = i - i0;
    float inv = 1.0f / l[r], *orow = out + (b * g->t + i) * g->c + h * hd;
    const float *ar = acc + r * hd;
#pragma omp simd
    for (int64_t d = 0; d < hd; d++)
      orow[d] = ar[d] * inv;
    if (lse)
      lse[(b * g->heads + h) * g->t + i] = m[r] + logf(l[r]);
  }
}

static void forward_task(const att_args *a, int64_t task, float *scratch) {
  int64_t qb = task % a->qblocks, bh = task / a->qblocks, i0 = qb * ATT_QB;
  attention_forward_block(&a->g, a->qkv, a->y, a->lse_out, bh / a->g.heads, bh % a->g.heads, i0,
                          MIN(i0 + ATT_QB, a->g.t), scratch);
}

// qkv (b, t, 3*h*hd) -> out (b, t, h*hd), lse (b, h, t)
dt_status dt_cpu_attention_forward(const dt_exec *ex, const float *qkv, float *out, float *lse,
                                   int64_t b, int64_t t, int64_t h, int64_t hd) {
  (void)ex;
  att_args a = {att_geom_of(t, h, hd), qkv, NULL, NULL, NULL, out, lse, NULL, 0};
  a.qblocks = (t + ATT_QB - 1) / ATT_QB;
  const size_t scratch = (size_t)(ATT_KB * hd + ATT_KB + ATT_QB * hd + 2 * ATT_QB);
  return run_tasks("attention_forward", &a, b * h * a.qblocks, scratch,
                   b * h * t * t * hd >= ATT_PAR_MIN, forward_task);
}

/* The backward of one (sequence, head). scratch: 2 * ATT_KB * hd (a key and
 * a value block, transposed) + 2 * ATT_KB (scores, then probabilities;
 * dP) + t (D = rowsum(dout * out)). */
static void attention_backward_head(const att_geom *g, const float *qkv, const float *out,
                                    const float *lse, const float *dout, float *dqkv, int64_t b,
                                    int64_t h, float *scratch) {
  const int64_t t = g->t, hd = g->hd, c = g->c, row = g->row;
  float *kt = scratch, *vt = kt + ATT_KB * hd, *p = vt + ATT_KB * hd, *dp = p + ATT_KB,
        *dsum = dp + ATT_KB;
  const float *base = qkv + b * t * row + h * hd, *lrow = lse + (b * g->heads + h) * t;
  const float *obase = out + b * t * c + h * hd, *gbase = dout + b * t * c + h * hd;
  float *dbase = dqkv + b * t * row + h * hd;
  for (int64_t i = 0; i < t; i++) {
    dsum[i] = dot(gbase + i * c, obase + i * c, hd);
    for (int part = 0; part < 3; part++)
      memset(dbase + i * row + part * c, 0, (size_t)hd * sizeof(float));
  }
  for (int64_t j0 = 0; j0 < t; j0 += ATT_KB) {
    int64_t j1 = MIN(j0 + ATT_KB, t);
    transpose_block(base + j0 * row + c, row, j1 - j0, hd, kt);
    transpose_block(base + j0 * row + 2 * c, row, j1 - j0, hd, vt);
    const float *k = base + j0 * row + c;
    float *dk = dbase + j0 * row + c, *dv = dbase + j0 * row + 2 * c;
    for (int64_t i = j0; i < t; i++) { /* the queries that see a key of this block */
      int64_t n = MIN(j1, i + 1) - j0;
      const float *q = base + i * row, *gi = gbase + i * c;
      float *dq = dbase + i * row;
      scores_block(q, kt, hd, n, g->scale, p);
      scores_block(gi, vt, hd, n, 1.0f, dp);
      const float li = lrow[i], di = dsum[i];
      for (int64_t j = 0; j < n; j++) {
        p[j] = expf(p[j] - li);
        dp[j] = p[j] * (dp[j] - di) * g->scale; /* dS, times the scale of q k^T */
      }
      for (int64_t j = 0; j < n; j++) {
        axpy(dp[j], k + j * row, dq, hd);
        axpy(dp[j], q, dk + j * row, hd);
        axpy(p[j], gi, dv + j * row, hd);
      }
    }
  }
}

static void backward_task(const att_args *a, int64_t bh, float *scratch) {
  attention_backward_head(&a->g, a->qkv, a->out, a->lse, a->dout, a->dqkv, bh / a->g.heads,
                          bh % a->g.heads, scratch);
}

// qkv, out, lse, dout -> dqkv (b, t, 3*h*hd) overwritten
dt_status dt_cpu_attention_backward(const dt_exec *ex, const float *qkv, const float *out,
                                    const float *lse, const float *dout, float *dqkv, int64_t b,
                                    int64_t t, int64_t h, int64_t hd) {
  (void)ex;
  att_args a = {att_geom_of(t, h, hd), qkv, out, lse, dout, NULL, NULL, dqkv, 0};
  /* one task per (sequence, head): its dq, dk and dv columns are its own */
  const size_t scratch = (size_t)(2 * ATT_KB * hd + 2 * ATT_KB + t);
  return run_tasks("attention_backward", &a, b * h, scratch, b * h * t * t * hd >= ATT_PAR_MIN,
                   backward_task);
}
