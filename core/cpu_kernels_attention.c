/* CPU kernels of the fused causal self-attention: flash attention's tiling
 * on the CPU. For each (sequence, head) and block of ATT_QB queries the keys
 * are visited in blocks of ATT_KB with an online softmax, so nothing of size
 * T x T is ever stored; the backward recomputes the scores block by block
 * from the saved logsumexp. The products of a block (Q K^T, P V and the
 * backward's five) are OpenBLAS sgemm calls on the (strided) rows of qkv;
 * the softmax between them is vectorised (core/cpu_math.c). The block sizes
 * are fixed and every output element is summed in one order, so the result
 * does not depend on the number of threads (OpenBLAS runs single-threaded
 * inside the kernels' parallel region). */
#include <cblas.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/cpu_internal.h"
#include "core/half.h"

#define ATT_QB 64 /* queries per block (ATT_KB is a multiple) */
#define ATT_KB 64 /* keys per block */
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

/* C (m, n) = alpha * op(A) op(B) + beta * C, row-major: a block product. */
static void block_gemm(int ta, int tb, int64_t m, int64_t n, int64_t k, float alpha, const float *a,
                       int64_t lda, const float *b, int64_t ldb, float beta, float *c,
                       int64_t ldc) {
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, (int)m,
              (int)n, (int)k, alpha, a, (int)lda, b, (int)ldb, beta, c, (int)ldc);
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

/* A task of a kernel: task `task` of the kernel's arguments `args`, with
 * the calling thread's scratch. */
typedef dt_status (*att_task_fn)(const void *args, int64_t task, float *scratch);

/* Runs fn for tasks [0, n) over the kernel threads (parallel when `par`),
 * each thread with its own scratch of `scratch_floats`; the first failure
 * is returned. */
static dt_status run_tasks(const char *op, const void *args, int64_t n, size_t scratch_floats,
                           int par, att_task_fn fn) {
  dt_status st = DT_OK;
  int failed = 0;
#pragma omp parallel if (par && n > 1) num_threads(dt_cpu_threads())
  {
    float *scratch = malloc(scratch_floats * sizeof(float));
    dt_status mine = scratch ? DT_OK : DT_ERR_OOM;
#pragma omp for schedule(static)
    for (int64_t task = 0; task < n; task++)
      if (mine == DT_OK)
        mine = fn(args, task, scratch);
    free(scratch);
    if (mine != DT_OK) {
#pragma omp critical(dt_att_tasks)
      if (!failed) {
        failed = 1;
        st = mine;
      }
    }
  }
  if (st == DT_ERR_OOM)
    return DT_ERROR(DT_ERR_OOM, "%s: %zu bytes of scratch per thread: malloc failed", op,
                    scratch_floats * sizeof(float));
  return st;
}

/* One forward task: queries [i0, i1) of head h of sequence b. scratch:
 * ATT_QB * ATT_KB (scores, then probabilities) + ATT_QB * hd (accumulators)
 * + 2 * ATT_QB (running max, running sum). */
DT_CPU_CLONES static void attention_forward_block(const att_geom *g, const float *qkv, float *out,
                                                  float *lse, int64_t b, int64_t h, int64_t i0,
                                                  int64_t i1, float *scratch) {
  const int64_t hd = g->hd, nq = i1 - i0;
  float *s = scratch, *acc = s + ATT_QB * ATT_KB, *m = acc + ATT_QB * hd, *l = m + ATT_QB;
  const float *base = qkv + b * g->t * g->row + h * hd;
  for (int64_t r = 0; r < nq; r++) {
    m[r] = -INFINITY;
    l[r] = 0.0f;
  }
  memset(acc, 0, (size_t)(nq * hd) * sizeof(float));
  for (int64_t j0 = 0; j0 < i1; j0 += ATT_KB) {
    const int64_t nk = MIN(ATT_KB, i1 - j0); /* keys past i1 - 1 are masked for every row */
    /* s (nq, nk) = scale * q k^T */
    block_gemm(0, 1, nq, nk, hd, g->scale, base + i0 * g->row, g->row, base + j0 * g->row + g->c,
               g->row, 0.0f, s, ATT_KB);
    for (int64_t r = 0; r < nq; r++) {
      float *sr = s + r * ATT_KB;
      const int64_t n = MIN(nk, i0 + r + 1 - j0); /* j0 <= i0: at least one key */
      float mx = m[r];
      for (int64_t j = 0; j < n; j++)
        mx = sr[j] > mx ? sr[j] : mx;
      const float alpha = expf(m[r] - mx); /* the first block: exp(-inf) = 0 */
      dt_cpu_exp_shifted(sr, mx, 1.0f, sr, n);
      float sum = 0.0f;
      for (int64_t j = 0; j < n; j++)
        sum += sr[j];
      for (int64_t j = n; j < nk; j++)
        sr[j] = 0.0f;
      l[r] = l[r] * alpha + sum;
      m[r] = mx;
      float *ar = acc + r * hd;
#pragma omp simd
      for (int64_t d = 0; d < hd; d++)
        ar[d] *= alpha;
    }
    /* acc (nq, hd) += p (nq, nk) v (nk, hd) */
    block_gemm(0, 0, nq, hd, nk, 1.0f, s, ATT_KB, base + j0 * g->row + 2 * g->c, g->row, 1.0f, acc,
               hd);
  }
  for (int64_t r = 0; r < nq; r++) {
    const int64_t i = i0 + r;
    float inv = 1.0f / l[r], *orow = out + (b * g->t + i) * g->c + h * hd;
    const float *ar = acc + r * hd;
#pragma omp simd
    for (int64_t d = 0; d < hd; d++)
      orow[d] = ar[d] * inv;
    if (lse)
      lse[(b * g->heads + h) * g->t + i] = m[r] + logf(l[r]);
  }
}

static dt_status forward_task(const void *args, int64_t task, float *scratch) {
  const att_args *a = args;
  int64_t qb = task % a->qblocks, bh = task / a->qblocks, i0 = qb * ATT_QB;
  attention_forward_block(&a->g, a->qkv, a->y, a->lse_out, bh / a->g.heads, bh % a->g.heads, i0,
                          MIN(i0 + ATT_QB, a->g.t), scratch);
  return DT_OK;
}

/* A new f32 buffer of n elements (to free) for a 16-bit `what`. */
static dt_status f32_buffer(const dt_exec *ex, int64_t n, const char *what, float **wide) {
  *wide = malloc((size_t)(n > 0 ? n : 1) * sizeof(float));
  if (*wide == NULL)
    return DT_ERROR(DT_ERR_OOM, "attention: %lld f32 elements for a %s %s", (long long)n,
                    dt_dtype_name(ex->dtype), what);
  return DT_OK;
}

/* n elements of a 16-bit tensor x (ex->dtype) widened into a new f32
 * buffer (*wide, to free; NULL for f32 x), to which *x then points: the
 * CPU stores 16-bit and computes in f32. */
static dt_status f32_of(const dt_exec *ex, const float **x, int64_t n, const char *what,
                        float **wide) {
  *wide = NULL;
  if (!dt_dtype_is_half(ex->dtype))
    return DT_OK;
  DT_CHECK(f32_buffer(ex, n, what, wide));
  dt_status st = dt_half_to_f32(ex->dtype, (const uint16_t *)*x, *wide, n);
  if (st != DT_OK) {
    free(*wide);
    *wide = NULL;
    return st;
  }
  *x = *wide;
  return DT_OK;
}

/* An f32 result of n elements for y of ex->dtype: y itself for f32, else a
 * new buffer (*wide, to free) that f32_result_store rounds into y once. */
static dt_status f32_result(const dt_exec *ex, float *y, int64_t n, const char *what, float **out,
                            float **wide) {
  *wide = NULL;
  *out = y;
  if (!dt_dtype_is_half(ex->dtype))
    return DT_OK;
  DT_CHECK(f32_buffer(ex, n, what, wide));
  *out = *wide;
  return DT_OK;
}

static dt_status f32_result_store(const dt_exec *ex, dt_status st, float *y, int64_t n,
                                  float *wide) {
  if (st == DT_OK && wide)
    st = dt_half_from_f32(ex->dtype, wide, (uint16_t *)y, n);
  free(wide);
  return st;
}

// qkv (b, t, 3*h*hd) -> out (b, t, h*hd), lse (b, h, t); qkv and out of ex->dtype
dt_status dt_cpu_causal_attention_forward(const dt_exec *ex, const float *qkv, float *out,
                                          float *lse, int64_t b, int64_t t, int64_t h, int64_t hd) {
  const int64_t nout = b * t * h * hd;
  float *wide = NULL, *y = NULL, *ywide = NULL;
  DT_CHECK(f32_of(ex, &qkv, 3 * nout, "qkv", &wide));
  dt_status st = f32_result(ex, out, nout, "out", &y, &ywide);
  if (st == DT_OK) {
    att_args a = {att_geom_of(t, h, hd), qkv, NULL, NULL, NULL, y, lse, NULL, 0};
    a.qblocks = (t + ATT_QB - 1) / ATT_QB;
    const size_t scratch = (size_t)(ATT_QB * ATT_KB + ATT_QB * hd + 2 * ATT_QB);
    st = run_tasks("causal_attention_forward", &a, b * h * a.qblocks, scratch,
                   b * h * t * t * hd >= ATT_PAR_MIN, forward_task);
  }
  st = f32_result_store(ex, st, out, nout, ywide);
  free(wide);
  return st;
}

/* The backward of one (sequence, head). scratch: 2 * ATT_QB * ATT_KB (P and
 * dP, then dS) + t (D = rowsum(dout * out)). */
DT_CPU_CLONES static void attention_backward_head(const att_geom *g, const float *qkv,
                                                  const float *out, const float *lse,
                                                  const float *dout, float *dqkv, int64_t b,
                                                  int64_t h, float *scratch) {
  const int64_t t = g->t, hd = g->hd, c = g->c, row = g->row;
  float *p = scratch, *ds = p + ATT_QB * ATT_KB, *dsum = ds + ATT_QB * ATT_KB;
  const float *base = qkv + b * t * row + h * hd, *lrow = lse + (b * g->heads + h) * t;
  const float *obase = out + b * t * c + h * hd, *gbase = dout + b * t * c + h * hd;
  float *dbase = dqkv + b * t * row + h * hd;
  for (int64_t i = 0; i < t; i++) {
    dsum[i] = dot(gbase + i * c, obase + i * c, hd);
    for (int part = 0; part < 3; part++)
      memset(dbase + i * row + part * c, 0, (size_t)hd * sizeof(float));
  }
  for (int64_t j0 = 0; j0 < t; j0 += ATT_KB) {
    const int64_t nk = MIN(ATT_KB, t - j0);
    const float *k = base + j0 * row + g->c, *v = base + j0 * row + 2 * g->c;
    float *dk = dbase + j0 * row + c, *dv = dbase + j0 * row + 2 * c;
    for (int64_t i0 = j0; i0 < t; i0 += ATT_QB) { /* the queries that see a key of this block */
      const int64_t nq = MIN(ATT_QB, t - i0);
      const float *q = base + i0 * row, *gq = gbase + i0 * c;
      block_gemm(0, 1, nq, nk, hd, g->scale, q, row, k, row, 0.0f, p, ATT_KB); /* S */
      block_gemm(0, 1, nq, nk, hd, 1.0f, gq, c, v, row, 0.0f, ds, ATT_KB);     /* dP */
      for (int64_t r = 0; r < nq; r++) {
        float *pr = p + r * ATT_KB, *dr = ds + r * ATT_KB;
        const int64_t i = i0 + r, n = MIN(nk, i + 1 - j0);
        const float di = dsum[i];
        dt_cpu_exp_shifted(pr, lrow[i], 1.0f, pr, n);
        for (int64_t j = 0; j < n; j++)
          dr[j] = pr[j] * (dr[j] - di) * g->scale; /* dS, times the scale of q k^T */
        for (int64_t j = n; j < nk; j++)
          pr[j] = dr[j] = 0.0f;
      }
      block_gemm(1, 0, nk, hd, nq, 1.0f, p, ATT_KB, gq, c, 1.0f, dv, row);   /* dV += P^T dO */
      block_gemm(1, 0, nk, hd, nq, 1.0f, ds, ATT_KB, q, row, 1.0f, dk, row); /* dK += dS^T Q */
      block_gemm(0, 0, nq, hd, nk, 1.0f, ds, ATT_KB, k, row, 1.0f, dbase + i0 * row, row); /* dQ */
    }
  }
}

static dt_status backward_task(const void *args, int64_t bh, float *scratch) {
  const att_args *a = args;
  attention_backward_head(&a->g, a->qkv, a->out, a->lse, a->dout, a->dqkv, bh / a->g.heads,
                          bh % a->g.heads, scratch);
  return DT_OK;
}

// qkv, out, lse, dout -> dqkv (b, t, 3*h*hd) overwritten; all but lse of ex->dtype
dt_status dt_cpu_causal_attention_backward(const dt_exec *ex, const float *qkv, const float *out,
                                           const float *lse, const float *dout, float *dqkv,
                                           int64_t b, int64_t t, int64_t h, int64_t hd) {
  const int64_t nout = b * t * h * hd;
  float *wide[3] = {NULL, NULL, NULL}, *dq = NULL, *dqwide = NULL;
  dt_status st = f32_of(ex, &qkv, 3 * nout, "qkv", &wide[0]);
  if (st == DT_OK)
    st = f32_of(ex, &out, nout, "out", &wide[1]);
  if (st == DT_OK)
    st = f32_of(ex, &dout, nout, "dout", &wide[2]);
  if (st == DT_OK)
    st = f32_result(ex, dqkv, 3 * nout, "dqkv", &dq, &dqwide);
  if (st == DT_OK) {
    att_args a = {att_geom_of(t, h, hd), qkv, out, lse, dout, NULL, NULL, dq, 0};
    /* one task per (sequence, head): its dq, dk and dv columns are its own */
    const size_t scratch = (size_t)(2 * ATT_QB * ATT_KB + t);
    st = run_tasks("causal_attention_backward", &a, b * h, scratch,
                   b * h * t * t * hd >= ATT_PAR_MIN, backward_task);
  }
  st = f32_result_store(ex, st, dqkv, 3 * nout, dqwide);
  for (int i = 0; i < 3; i++)
    free(wide[i]);
  return st;
}

/* ---- the attention as GEMMs: its row kernels ---- */

/* What a row of causal_attention_probs / causal_attention_dscores reads and writes. */
typedef struct att_rows {
  dt_dtype dtype; /* of p and ds */
  const float *s, *dp;
  const void *p_in;
  void *p_out;
  float *lse;
  bool lse_in;
  int64_t t;
} att_rows;

/* Row r's f32 values out of buf into dst (ex->dtype) at row r. */
static dt_status att_row_store(const att_rows *a, int64_t r, const float *buf, void *dst) {
  if (!dt_dtype_is_half(a->dtype))
    return DT_OK; /* buf was the f32 row itself */
  return dt_half_from_f32(a->dtype, buf, (uint16_t *)dst + r * a->t, a->t);
}

DT_CPU_CLONES static dt_status probs_row(const void *args, int64_t r, float *buf) {
  const att_rows *a = args;
  const int64_t t = a->t, keep = r % t + 1;
  const float *sr = a->s + r * t;
  float *pr = dt_dtype_is_half(a->dtype) ? buf : (float *)a->p_out + r * t;
  float l;
  if (a->lse_in) {
    l = a->lse[r];
  } else {
    float mx = -INFINITY;
    for (int64_t j = 0; j < keep; j++)
      mx = sr[j] > mx ? sr[j] : mx;
    dt_cpu_exp_shifted(sr, mx, 1.0f, pr, keep);
    l = (float)((double)mx + log(dt_cpu_sum_contiguous(pr, keep)));
    a->lse[r] = l;
  }
  dt_cpu_exp_shifted(sr, l, 1.0f, pr, keep);
  for (int64_t j = keep; j < t; j++)
    pr[j] = 0.0f;
  return att_row_store(a, r, pr, a->p_out);
}

DT_CPU_CLONES static dt_status dscores_row(const void *args, int64_t r, float *buf) {
  const att_rows *a = args;
  const int64_t t = a->t, keep = r % t + 1;
  const float *dpr = a->dp + r * t;
  const float *pr = (const float *)a->p_in + r * t;
  float *dsr = (float *)a->p_out + r * t; /* f32: may be pr, read before written */
  if (dt_dtype_is_half(a->dtype)) {
    DT_CHECK(dt_half_to_f32(a->dtype, (const uint16_t *)a->p_in + r * t, buf, keep));
    pr = dsr = buf;
  }
  double dot = 0.0;
  for (int64_t j = 0; j < keep; j++)
    dot += (double)pr[j] * dpr[j];
  const float d = (float)dot;
#pragma omp simd
  for (int64_t j = 0; j < keep; j++)
    dsr[j] = pr[j] * (dpr[j] - d);
  for (int64_t j = keep; j < t; j++)
    dsr[j] = 0.0f;
  return att_row_store(a, r, buf, a->p_out);
}

// s (n, t, t) f32 -> p (n, t, t) of ex->dtype, lse (n, t) written or read
dt_status dt_cpu_causal_attention_probs(const dt_exec *ex, const float *s, float *p, float *lse,
                                        bool lse_in, int64_t n, int64_t t) {
  const att_rows a = {ex->dtype, s, NULL, NULL, p, lse, lse_in, t};
  /* a task per row, with an f32 row of t floats (the 16-bit row's) */
  return run_tasks("causal_attention_probs", &a, n * t, (size_t)t, n * t * t >= ATT_PAR_MIN,
                   probs_row);
}

// p (n, t, t) of ex->dtype, dp f32 -> ds of ex->dtype (may be p)
dt_status dt_cpu_causal_attention_dscores(const dt_exec *ex, const float *p, const float *dp,
                                          float *ds, int64_t n, int64_t t) {
  const att_rows a = {ex->dtype, NULL, dp, p, ds, NULL, false, t};
  return run_tasks("causal_attention_dscores", &a, n * t, (size_t)t, n * t * t >= ATT_PAR_MIN,
                   dscores_row);
}
