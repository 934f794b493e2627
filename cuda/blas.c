/* GEMM. dtrain's matrices are row-major and cuBLAS is column-major: a
 * row-major (m,n) C is a column-major (n,m) C^T, and C^T = op(B)^T op(A)^T,
 * so every call swaps the operands (and m with n) and keeps the transpose
 * flags.
 *
 * f32 inputs go through cuBLAS (cublasSgemm*, TF32 per the setting). f16
 * and bf16 inputs go through cuBLASLt (cublasLtMatmul) with f32
 * accumulation (CUBLAS_COMPUTE_32F) and f32 alpha/beta, into an f32 or a
 * 16-bit output, optionally with an epilogue: the bias (the 16-bit
 * linear forward: the bias is added to the f32 accumulator before the one
 * rounding), GELU with its input kept (GELU_AUX, GELU_AUX_BIAS: the MLP's
 * first projection) and GELU's gradient (DGELU: the second projection's
 * dx times gelu'(its kept input)). Each distinct call -- types, transposes, sizes, leading
 * dimensions, batch strides, epilogue and the alignment of the pointers,
 * which the heuristic's choice depends on -- gets a plan, made once per
 * device and cached: the matmul descriptor, the three layouts and the
 * heuristic's first algorithm within a workspace of at most
 * DT_LT_WORKSPACE_BYTES. The workspace the algorithm asks for is taken
 * from the caching allocator for the call, on the call's stream, and given
 * back right after the enqueue (stream-ordered reuse), so nothing is held
 * between GEMMs. A call for which the heuristic has no algorithm (an odd
 * alignment, a batch stride of 0) runs through cublasGemmStridedBatchedEx
 * instead, counted in dt_cuda_gemm_counts. */
#include <stdlib.h>
#include <string.h>

#include "cuda/cuda.h"
#include "cuda/cuda_internal.h"

/* 32 MiB, llm.c's choice for Hopper: cuBLASLt's sm_90 kernels (split-K
 * and stream-K among them) ask for up to that, and on a 141 GB device it is
 * noise. Only what the chosen algorithm needs is allocated per call. */
#define DT_LT_WORKSPACE_BYTES ((size_t)32 << 20)
#define DT_LT_MAX_PLANS 1024 /* the cache starts over beyond this */

static int cuda_type(dt_dtype t, cudaDataType_t *out) {
  switch (t) {
    case DT_DTYPE_F32: *out = CUDA_R_32F; return 1;
    case DT_DTYPE_F16: *out = CUDA_R_16F; return 1;
    case DT_DTYPE_BF16: *out = CUDA_R_16BF; return 1;
    default: return 0;
  }
}

/* ---- the cuBLASLt plans ---- */

/* The epilogues a plan may have. */
enum { EPI_NONE = 0, EPI_BIAS, EPI_GELU_AUX, EPI_GELU_AUX_BIAS, EPI_DGELU };

static int epi_has_bias(int epi) { return epi == EPI_BIAS || epi == EPI_GELU_AUX_BIAS; }
static int epi_has_aux(int epi) { return epi >= EPI_GELU_AUX; }

/* Everything the plan depends on; zeroed before it is filled, so that
 * memcmp compares it (padding included). */
typedef struct lt_key {
  int trans_a, trans_b, m, n, k, lda, ldb, ldc, batch;
  int ab, c; /* dt_dtype of A and B, of C */
  int epi;   /* EPI_*: a bias of C's type (n elements), an aux matrix laid out as C */
  int align_a, align_b, align_c, align_bias, align_aux; /* bytes, at most 256 */
  int64_t stride_a, stride_b, stride_c;
} lt_key;

typedef struct lt_plan {
  lt_key key;
  int usable; /* 0: the heuristic offered no algorithm: the fallback runs */
  cublasLtMatmulDesc_t desc;
  cublasLtMatrixLayout_t la, lb, lc; /* cuBLASLt's A (our B), B (our A), C = D */
  cublasLtMatmulAlgo_t algo;
  size_t ws;
} lt_plan;

struct dt_cuda_gemm_cache {
  lt_plan **plans;
  size_t n, cap;
  dt_cuda_gemm_counts counts;
};

static void plan_destroy(lt_plan *p) {
  if (!p)
    return;
  if (p->la)
    cublasLtMatrixLayoutDestroy(p->la);
  if (p->lb)
    cublasLtMatrixLayoutDestroy(p->lb);
  if (p->lc)
    cublasLtMatrixLayoutDestroy(p->lc);
  if (p->desc)
    cublasLtMatmulDescDestroy(p->desc);
  free(p);
}

static void cache_clear(dt_cuda_gemm_cache *c) {
  for (size_t i = 0; i < c->n; i++)
    plan_destroy(c->plans[i]);
  c->n = 0;
}

/* The largest power of two up to 256 that divides the address. */
static int alignment_of(const void *p) {
  uintptr_t u = (uintptr_t)p;
  int a = 1;
  while (a < 256 && (u & (uintptr_t)(2 * a - 1)) == 0)
    a *= 2;
  return a;
}

/* Sets attribute `attr` of a cuBLASLt object to `value` of C type `type`;
 * jumps to `fail` with `st` set on an error. */
#define LT_SET(kind, obj, attr, type, value)                                                     \
  do {                                                                                           \
    type v_ = (value);                                                                           \
    DT_CUBLAS_CHECK_GOTO(cublasLt##kind##SetAttribute((obj), (attr), &v_, sizeof v_), st, fail); \
  } while (0)

static dt_status layout_create(cublasLtMatrixLayout_t *out, cudaDataType_t t, int rows, int cols,
                               int ld, int batch, int64_t stride) {
  dt_status st = DT_OK;
  DT_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(out, t, (uint64_t)rows, (uint64_t)cols, (int64_t)ld));
  if (batch > 1) {
    LT_SET(MatrixLayout, *out, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, int32_t, batch);
    LT_SET(MatrixLayout, *out, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, int64_t, stride);
  }
  return DT_OK;
fail:
  cublasLtMatrixLayoutDestroy(*out);
  *out = NULL;
  return st;
}

/* Builds the plan of k: descriptors, layouts, the heuristic's algorithm. */
static dt_status plan_create(dt_cuda_ctx *ctx, const lt_key *k, const void *bias, const void *aux,
                             lt_plan **out) {
  dt_status st = DT_OK;
  cublasLtMatmulPreference_t pref = NULL;
  lt_plan *p = calloc(1, sizeof *p);
  if (!p)
    return DT_ERROR(DT_ERR_OOM, "gemm plan: host malloc failed");
  p->key = *k;
  cudaDataType_t tab = CUDA_R_16BF, tc = CUDA_R_32F;
  (void)cuda_type((dt_dtype)k->ab, &tab);
  (void)cuda_type((dt_dtype)k->c, &tc);
  DT_CUBLAS_CHECK_GOTO(cublasLtMatmulDescCreate(&p->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F), st,
                       fail);
  /* swapped operands: cuBLASLt's A is our B, its B our A */
  LT_SET(MatmulDesc, p->desc, CUBLASLT_MATMUL_DESC_TRANSA, cublasOperation_t,
         k->trans_b ? CUBLAS_OP_T : CUBLAS_OP_N);
  LT_SET(MatmulDesc, p->desc, CUBLASLT_MATMUL_DESC_TRANSB, cublasOperation_t,
         k->trans_a ? CUBLAS_OP_T : CUBLAS_OP_N);
  if (k->epi != EPI_NONE) {
    static const cublasLtEpilogue_t epilogues[] = {
        CUBLASLT_EPILOGUE_DEFAULT, CUBLASLT_EPILOGUE_BIAS, CUBLASLT_EPILOGUE_GELU_AUX,
        CUBLASLT_EPILOGUE_GELU_AUX_BIAS, CUBLASLT_EPILOGUE_DGELU};
    LT_SET(MatmulDesc, p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE, cublasLtEpilogue_t,
           epilogues[k->epi]);
  }
  if (epi_has_bias(k->epi)) {
    /* the bias has one element per row of the column-major D (n x m) */
    LT_SET(MatmulDesc, p->desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, int32_t, (int32_t)tc);
    LT_SET(MatmulDesc, p->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, const void *, bias);
  }
  if (epi_has_aux(k->epi)) {
    /* GELU's input, of D's type and layout (written by GELU_AUX, read by
     * DGELU); the heuristic reads the pointer for its alignment */
    LT_SET(MatmulDesc, p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, const void *, aux);
    LT_SET(MatmulDesc, p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, int64_t, (int64_t)k->ldc);
  }
  /* column-major: our B is (n x k), or (k x n) when transposed; our A is
   * (k x m), or (m x k); C is (n x m) */
  DT_CHECK_GOTO(layout_create(&p->la, tab, k->trans_b ? k->k : k->n, k->trans_b ? k->n : k->k,
                              k->ldb, k->batch, k->stride_b),
                st, fail);
  DT_CHECK_GOTO(layout_create(&p->lb, tab, k->trans_a ? k->m : k->k, k->trans_a ? k->k : k->m,
                              k->lda, k->batch, k->stride_a),
                st, fail);
  DT_CHECK_GOTO(layout_create(&p->lc, tc, k->n, k->m, k->ldc, k->batch, k->stride_c), st, fail);
  DT_CUBLAS_CHECK_GOTO(cublasLtMatmulPreferenceCreate(&pref), st, fail);
  LT_SET(MatmulPreference, pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, uint64_t,
         DT_LT_WORKSPACE_BYTES);
  /* the pointers' real alignment: the default (256) would let the
   * heuristic pick kernels that fault on a less aligned slice */
  LT_SET(MatmulPreference, pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, uint32_t, k->align_b);
  LT_SET(MatmulPreference, pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, uint32_t, k->align_a);
  LT_SET(MatmulPreference, pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, uint32_t, k->align_c);
  LT_SET(MatmulPreference, pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, uint32_t, k->align_c);
  cublasLtMatmulHeuristicResult_t r;
  memset(&r, 0, sizeof r);
  int got = 0;
  cublasStatus_t e = cublasLtMatmulAlgoGetHeuristic(ctx->cublaslt, p->desc, p->la, p->lb, p->lc,
                                                    p->lc, pref, 1, &r, &got);
  if (e == CUBLAS_STATUS_SUCCESS && got > 0 && r.state == CUBLAS_STATUS_SUCCESS) {
    p->usable = 1;
    p->algo = r.algo;
    p->ws = r.workspaceSize;
  } else if (e != CUBLAS_STATUS_SUCCESS && e != CUBLAS_STATUS_NOT_SUPPORTED) {
    st = dt_cublas_fail(e, "cublasLtMatmulAlgoGetHeuristic", __func__, __FILE__, __LINE__);
    goto fail;
  }
  cublasLtMatmulPreferenceDestroy(pref);
  *out = p;
  return DT_OK;
fail:
  if (pref)
    cublasLtMatmulPreferenceDestroy(pref);
  plan_destroy(p);
  return st;
}

/* The cached plan of k (made on first use); ctx->gemm_lock is held. */
static dt_status plan_get(dt_cuda_ctx *ctx, const lt_key *k, const void *bias, const void *aux,
                          lt_plan **out) {
  if (!ctx->gemm_cache) {
    ctx->gemm_cache = calloc(1, sizeof *ctx->gemm_cache);
    if (!ctx->gemm_cache)
      return DT_ERROR(DT_ERR_OOM, "gemm plan cache: host malloc failed");
  }
  dt_cuda_gemm_cache *c = ctx->gemm_cache;
  for (size_t i = 0; i < c->n; i++)
    if (memcmp(&c->plans[i]->key, k, sizeof *k) == 0) {
      *out = c->plans[i];
      return DT_OK;
    }
  if (c->n == DT_LT_MAX_PLANS)
    cache_clear(c);
  if (c->n == c->cap) {
    size_t cap = c->cap ? 2 * c->cap : 32;
    lt_plan **plans = realloc(c->plans, cap * sizeof *plans);
    if (!plans)
      return DT_ERROR(DT_ERR_OOM, "gemm plan cache: host realloc failed");
    c->plans = plans;
    c->cap = cap;
  }
  DT_CHECK(plan_create(ctx, k, bias, aux, out));
  c->plans[c->n++] = *out;
  return DT_OK;
}

/* ---- the calls ---- */

/* One 16-bit GEMM's arguments (row-major, as dt_backend_ops.gemm). */
typedef struct half_gemm {
  int trans_a, trans_b, m, n, k, lda, ldb, ldc, batch;
  int64_t stride_a, stride_b, stride_c;
  const void *a, *b, *bias;
  const void *aux; /* EPI_GELU_AUX*: written; EPI_DGELU: read */
  int epi;
  void *c;
  float alpha, beta;
  dt_dtype ab, c_type;
} half_gemm;

/* The arguments of a GEMM (no bias; strides read when batch > 1), in
 * dt_cuda_gemm_ex's order. */
static half_gemm half_gemm_of(int trans_a, int trans_b, int m, int n, int k, float alpha,
                              const void *a, int lda, int64_t stride_a, const void *b, int ldb,
                              int64_t stride_b, dt_dtype ab, float beta, void *c, int ldc,
                              int64_t stride_c, dt_dtype c_type, int batch) {
  half_gemm g;
  memset(&g, 0, sizeof g);
  g.trans_a = trans_a, g.trans_b = trans_b, g.m = m, g.n = n, g.k = k;
  g.lda = lda, g.ldb = ldb, g.ldc = ldc, g.batch = batch;
  g.stride_a = stride_a, g.stride_b = stride_b, g.stride_c = stride_c;
  g.a = a, g.b = b, g.c = c, g.alpha = alpha, g.beta = beta, g.ab = ab, g.c_type = c_type;
  return g;
}

/* C (c_type) = alpha op(A) op(B) + beta C with A, B of ab_type and f32
 * accumulation through cublasGemmStridedBatchedEx, on the handle's
 * stream (set by the caller). f32 inputs follow the TF32 setting;
 * f16/bf16 inputs use the tensor cores. */
static dt_status gemm_ex_call(dt_cuda_ctx *ctx, const half_gemm *g) {
  /* The handle's math mode applies to CUBLAS_COMPUTE_32F too: keep it in
   * step with the setting so that TF32 off means exact f32 products. */
  DT_CHECK(dt_cuda_ctx_sync_math_mode(ctx));
  cudaDataType_t tab = CUDA_R_32F, tc = CUDA_R_32F;
  (void)cuda_type(g->ab, &tab);
  (void)cuda_type(g->c_type, &tc);
  cublasComputeType_t compute = CUBLAS_COMPUTE_32F;
  if (g->ab == DT_DTYPE_F32 && dt_cuda_tf32_enabled())
    compute = CUBLAS_COMPUTE_32F_FAST_TF32;
  cublasOperation_t op_a = g->trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  cublasOperation_t op_b = g->trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  DT_CUBLAS_CHECK(cublasGemmStridedBatchedEx(ctx->cublas, op_b, op_a, g->n, g->m, g->k, &g->alpha,
                                             g->b, tab, g->ldb, g->stride_b, g->a, tab, g->lda,
                                             g->stride_a, &g->beta, g->c, tc, g->ldc, g->stride_c,
                                             g->batch, compute, CUBLAS_GEMM_DEFAULT));
  return DT_OK;
}

static void key_of(const half_gemm *g, lt_key *k) {
  memset(k, 0, sizeof *k);
  k->trans_a = g->trans_a, k->trans_b = g->trans_b, k->m = g->m, k->n = g->n, k->k = g->k;
  k->lda = g->lda, k->ldb = g->ldb, k->ldc = g->ldc, k->batch = g->batch;
  k->ab = (int)g->ab, k->c = (int)g->c_type, k->epi = g->epi;
  k->align_a = alignment_of(g->a), k->align_b = alignment_of(g->b);
  k->align_c = alignment_of(g->c);
  k->align_bias = g->bias ? alignment_of(g->bias) : 0;
  k->align_aux = g->aux ? alignment_of(g->aux) : 0;
  if (g->batch > 1)
    k->stride_a = g->stride_a, k->stride_b = g->stride_b, k->stride_c = g->stride_c;
}

static void count(dt_cuda_ctx *ctx, int lt, int epi) {
  if (ctx->gemm_cache) {
    if (epi_has_aux(epi))
      ctx->gemm_cache->counts.gelu_calls++;
    if (lt)
      ctx->gemm_cache->counts.lt_calls++;
    else
      ctx->gemm_cache->counts.fallback_calls++;
    ctx->gemm_cache->counts.plans = (int64_t)ctx->gemm_cache->n;
  }
}

/* A 16-bit GEMM (no bias) on `stream`: cuBLASLt where the heuristic has an
 * algorithm, else cublasGemmStridedBatchedEx. */
static dt_status half_gemm_run(dt_cuda_ctx *ctx, cudaStream_t stream, const half_gemm *g) {
  lt_key k;
  key_of(g, &k);
  /* a batch that reuses an operand (stride 0) is left to GemmEx */
  int try_lt = g->batch == 1 || (g->stride_a != 0 && g->stride_b != 0 && g->stride_c != 0);
  dt_status st = DT_OK;
  void *ws = NULL;
  pthread_mutex_lock(&ctx->gemm_lock);
  lt_plan *p = NULL;
  if (try_lt)
    DT_CHECK_GOTO(plan_get(ctx, &k, g->bias, g->aux, &p), st, unlock);
  if (p && p->usable) {
    if (p->ws > 0)
      DT_CHECK_GOTO(dt_block_pool_alloc(ctx->pool, p->ws, (uintptr_t)stream, &ws), st, unlock);
    if (epi_has_bias(g->epi))
      DT_CUBLAS_CHECK_GOTO(
          cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &g->bias,
                                         sizeof g->bias),
          st, unlock);
    if (epi_has_aux(g->epi))
      DT_CUBLAS_CHECK_GOTO(
          cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER,
                                         &g->aux, sizeof g->aux),
          st, unlock);
    DT_CUBLAS_CHECK_GOTO(
        cublasLtMatmul(ctx->cublaslt, p->desc, &g->alpha, g->b, p->la, g->a, p->lb, &g->beta, g->c,
                       p->lc, g->c, p->lc, &p->algo, ws, p->ws, stream),
        st, unlock);
    count(ctx, 1, g->epi);
  } else {
    DT_ASSERT(g->epi == EPI_NONE); /* a caller with an epilogue has its own fallback */
    DT_CUBLAS_CHECK_GOTO(cublasSetStream(ctx->cublas, stream), st, unlock);
    DT_CHECK_GOTO(gemm_ex_call(ctx, g), st, unlock);
    count(ctx, 0, EPI_NONE);
  }
unlock:
  pthread_mutex_unlock(&ctx->gemm_lock);
  if (ws)
    (void)dt_block_pool_free(ctx->pool, ws);
  return st;
}

/* Whether the GEMM g with an epilogue has a cuBLASLt algorithm (its plan
 * is made and cached on the way). */
static dt_status lt_usable(dt_cuda_ctx *ctx, const half_gemm *g, int *usable) {
  lt_key k;
  key_of(g, &k);
  lt_plan *p = NULL;
  pthread_mutex_lock(&ctx->gemm_lock);
  dt_status st = plan_get(ctx, &k, g->bias, g->aux, &p);
  pthread_mutex_unlock(&ctx->gemm_lock);
  *usable = st == DT_OK && p->usable;
  return st;
}

// A (m,k) or (k,m) if trans_a, B (k,n) or (n,k) if trans_b -> C (m,n), per batch;
// f16/bf16 A and B (ex->dtype) with an f32 C through cuBLASLt
dt_status dt_cuda_gemm(const dt_exec *ex, bool trans_a, bool trans_b, int m, int n, int k,
                       float alpha, const float *a, int lda, int64_t stride_a, const float *b,
                       int ldb, int64_t stride_b, float beta, float *c, int ldc, int64_t stride_c,
                       int batch) {
  if (m == 0 || n == 0 || batch == 0)
    return DT_OK;
  DT_CUDA_EXEC(ex, ctx, stream);
  if (ex->dtype != DT_DTYPE_F32) { /* the dispatch admits f32, f16 and bf16 only */
    const half_gemm g =
        half_gemm_of(trans_a, trans_b, m, n, k, alpha, a, lda, stride_a, b, ldb, stride_b,
                     ex->dtype, beta, c, ldc, stride_c, DT_DTYPE_F32, batch);
    return half_gemm_run(ctx, stream, &g);
  }
  DT_CHECK(dt_cuda_ctx_sync_math_mode(ctx));
  DT_CUBLAS_CHECK(cublasSetStream(ctx->cublas, stream));
  cublasOperation_t op_a = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  cublasOperation_t op_b = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  if (batch == 1)
    DT_CUBLAS_CHECK(
        cublasSgemm(ctx->cublas, op_b, op_a, n, m, k, &alpha, b, ldb, a, lda, &beta, c, ldc));
  else
    DT_CUBLAS_CHECK(cublasSgemmStridedBatched(ctx->cublas, op_b, op_a, n, m, k, &alpha, b, ldb,
                                              stride_b, a, lda, stride_a, &beta, c, ldc, stride_c,
                                              batch));
  return DT_OK;
}

/* The 16-bit linear's GEMM: y (m,n) = x (m,k) @ w^T, w (n,k), all of
 * `dtype`, with the bias and the epilogue `epi` (bias, EPI_NONE or a GELU
 * one; aux for the latter set by the caller). */
static half_gemm linear_gemm_of(dt_dtype dtype, int m, int n, int k, const void *x, const void *w,
                                const void *bias, void *y, int epi) {
  half_gemm g = half_gemm_of(0, 1, m, n, k, 1.0f, x, k, 0, w, k, 0, dtype, 0.0f, y, n, 0, dtype, 1);
  g.bias = bias;
  g.epi = epi;
  return g;
}

// x (m,k), w (n,k), bias (n) or NULL -> y (m,n), all of ex->dtype (f16/bf16); f32 accumulation,
// the bias added before the one rounding: cuBLASLt's bias epilogue
dt_status dt_cuda_linear_forward(const dt_exec *ex, int m, int n, int k, const float *x,
                                 const float *w, const float *bias, float *y) {
  if (m == 0 || n == 0)
    return DT_OK;
  DT_CUDA_EXEC(ex, ctx, stream);
  half_gemm g = linear_gemm_of(ex->dtype, m, n, k, x, w, bias, y, bias ? EPI_BIAS : EPI_NONE);
  /* cuBLASLt's bias epilogue reads the bias 16 bytes at a time: a bias at
   * a lesser alignment (a 16-bit linear's bias in the packed working copy,
   * LeNet's fc1.b and fc2.b at 8 bytes) takes the fallback below */
  int usable = 0;
  if (bias && alignment_of(bias) >= 16)
    DT_CHECK(lt_usable(ctx, &g, &usable));
  if (!bias || usable)
    return half_gemm_run(ctx, stream, &g);
  /* no algorithm with the epilogue: acc (m,n) f32 = x w^T, then y = round(acc + bias) */
  float *acc = NULL;
  DT_CHECK(dt_block_pool_alloc(ctx->pool, (size_t)m * (size_t)n * sizeof(float), (uintptr_t)stream,
                               (void **)&acc));
  g.bias = NULL;
  g.epi = EPI_NONE;
  g.c = acc;
  g.c_type = DT_DTYPE_F32;
  dt_status st = half_gemm_run(ctx, stream, &g);
  if (st == DT_OK)
    st = dt_cuda_add_bias_rows(stream, ex->dtype, acc, bias, y, m, n);
  (void)dt_block_pool_free(ctx->pool, acc);
  return st;
}

// A, B and C of ex->dtype (f16/bf16): C = alpha op(A) op(B), the f32 accumulator rounded once
// by cuBLASLt
dt_status dt_cuda_gemm_rounded(const dt_exec *ex, bool trans_a, bool trans_b, int m, int n, int k,
                               float alpha, const float *a, int lda, const float *b, int ldb,
                               float *c, int ldc) {
  if (m == 0 || n == 0)
    return DT_OK;
  DT_CUDA_EXEC(ex, ctx, stream);
  if (k == 0) { /* no products: C = 0 (+0.0 is all bits zero in f16 and bf16) */
    DT_CUDA_CHECK(cudaMemset2DAsync(c, (size_t)ldc * 2, 0, (size_t)n * 2, (size_t)m, stream));
    return DT_OK;
  }
  const half_gemm g = half_gemm_of(trans_a, trans_b, m, n, k, alpha, a, lda, 0, b, ldb, 0,
                                   ex->dtype, 0.0f, c, ldc, 0, ex->dtype, 1);
  return half_gemm_run(ctx, stream, &g);
}

/* Whether the GELU epilogues may be tried for g: cuBLASLt wants the aux
 * matrix's leading dimension a multiple of 8 and reads the aux matrix and
 * the bias 16 bytes at a time. Otherwise the caller's two kernels run. */
static int gelu_epilogue_fits(const half_gemm *g) {
  return g->ldc % 8 == 0 && alignment_of(g->aux) >= 16 && alignment_of(g->c) >= 16 &&
         (g->bias == NULL || alignment_of(g->bias) >= 16);
}

// x (m,k), w (n,k), bias (n) or NULL -> pre = x w^T + bias and y = gelu(pre) (m,n), all of
// ex->dtype: one GEMM with cuBLASLt's GELU_AUX(_BIAS) epilogue (GELU of the f32 sum, both
// rounded once), else linear_forward into pre and the GELU kernel
dt_status dt_cuda_linear_gelu_forward(const dt_exec *ex, int m, int n, int k, const float *x,
                                      const float *w, const float *bias, float *pre, float *y) {
  if (m == 0 || n == 0)
    return DT_OK;
  DT_CUDA_EXEC(ex, ctx, stream);
  half_gemm g =
      linear_gemm_of(ex->dtype, m, n, k, x, w, bias, y, bias ? EPI_GELU_AUX_BIAS : EPI_GELU_AUX);
  g.aux = pre;
  int usable = 0;
  if (gelu_epilogue_fits(&g))
    DT_CHECK(lt_usable(ctx, &g, &usable));
  if (usable)
    return half_gemm_run(ctx, stream, &g);
  DT_CHECK(dt_cuda_linear_forward(ex, m, n, k, x, w, bias, pre));
  return dt_cuda_unary_forward(ex, DT_UNARY_GELU, (int64_t)m * n, pre, y);
}

// g (m,k) @ w (k,n) -> dpre (m,n) = that * gelu'(pre (m,n)), all of ex->dtype: one GEMM with
// cuBLASLt's DGELU epilogue (the f32 product, rounded once), else gemm_rounded and the GELU
// gradient kernel in place
dt_status dt_cuda_gemm_dgelu(const dt_exec *ex, int m, int n, int k, const float *g_rows,
                             const float *w, const float *pre, float *dpre) {
  if (m == 0 || n == 0)
    return DT_OK;
  DT_CUDA_EXEC(ex, ctx, stream);
  half_gemm g = half_gemm_of(0, 0, m, n, k, 1.0f, g_rows, k, 0, w, n, 0, ex->dtype, 0.0f, dpre, n,
                             0, ex->dtype, 1);
  g.aux = pre;
  g.epi = EPI_DGELU;
  int usable = 0;
  if (gelu_epilogue_fits(&g))
    DT_CHECK(lt_usable(ctx, &g, &usable));
  if (usable)
    return half_gemm_run(ctx, stream, &g);
  DT_CHECK(dt_cuda_gemm_rounded(ex, false, false, m, n, k, 1.0f, g_rows, k, w, n, dpre, n));
  return dt_cuda_unary_backward(ex, DT_UNARY_GELU, (int64_t)m * n, pre, dpre, dpre);
}

// mixed precision: A, B (ab_type) -> C (c_type), f32 accumulation
dt_status dt_cuda_gemm_ex(dt_device dev, int trans_a, int trans_b, int m, int n, int k, float alpha,
                          const void *a, int lda, int64_t stride_a, const void *b, int ldb,
                          int64_t stride_b, dt_dtype ab_type, float beta, void *c, int ldc,
                          int64_t stride_c, dt_dtype c_type, int batch) {
  DT_CHECK(dt_kcheck_gemm(trans_a, trans_b, m, n, k, lda, ldb, ldc, batch));
  cudaDataType_t tab, tc;
  if (!cuda_type(ab_type, &tab) || !cuda_type(c_type, &tc) ||
      (c_type != DT_DTYPE_F32 && c_type != ab_type))
    return DT_ERROR(DT_ERR_DTYPE,
                    "gemm_ex: inputs %s, output %s: inputs must be f32, f16 or bf16 and the "
                    "output f32 or the input type",
                    dt_dtype_name(ab_type), dt_dtype_name(c_type));
  if (m == 0 || n == 0 || batch == 0)
    return DT_OK;
  dt_cuda_ctx *ctx = NULL;
  DT_CHECK(dt_cuda_ctx_get(dev, &ctx));
  cudaStream_t stream = dt_cuda_compute_stream(ctx);
  const half_gemm g = half_gemm_of(trans_a, trans_b, m, n, k, alpha, a, lda, stride_a, b, ldb,
                                   stride_b, ab_type, beta, c, ldc, stride_c, c_type, batch);
  if (ab_type != DT_DTYPE_F32)
    return half_gemm_run(ctx, stream, &g);
  DT_CUBLAS_CHECK(cublasSetStream(ctx->cublas, stream));
  return gemm_ex_call(ctx, &g);
}

dt_status dt_cuda_gemm_counts_get(dt_device dev, dt_cuda_gemm_counts *out) {
  memset(out, 0, sizeof *out);
  dt_cuda_ctx *ctx = NULL;
  DT_CHECK(dt_cuda_ctx_get(dev, &ctx));
  pthread_mutex_lock(&ctx->gemm_lock);
  if (ctx->gemm_cache) {
    *out = ctx->gemm_cache->counts;
    out->plans = (int64_t)ctx->gemm_cache->n;
  }
  pthread_mutex_unlock(&ctx->gemm_lock);
  return DT_OK;
}
