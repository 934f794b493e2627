/* GEMM through cuBLAS. dtrain's matrices are row-major and cuBLAS is
 * column-major: a row-major (m,n) C is a column-major (n,m) C^T, and
 * C^T = op(B)^T op(A)^T, so every call swaps the operands (and m with n)
 * and keeps the transpose flags. */
#include "cuda/cuda.h"
#include "cuda/cuda_internal.h"

static int cuda_type(dt_dtype t, cudaDataType_t *out) {
  switch (t) {
    case DT_DTYPE_F32: *out = CUDA_R_32F; return 1;
    case DT_DTYPE_F16: *out = CUDA_R_16F; return 1;
    case DT_DTYPE_BF16: *out = CUDA_R_16BF; return 1;
    default: return 0;
  }
}

/* C (c_type) = alpha op(A) op(B) + beta C with A, B of ab_type and f32
 * accumulation, on the handle's current stream. f32 inputs follow the TF32
 * setting; f16/bf16 inputs always use tensor cores. */
static dt_status gemm_ex_call(dt_cuda_ctx *ctx, int trans_a, int trans_b, int m, int n, int k,
                              float alpha, const void *a, int lda, int64_t stride_a, const void *b,
                              int ldb, int64_t stride_b, cudaDataType_t tab, dt_dtype ab_type,
                              float beta, void *c, int ldc, int64_t stride_c, cudaDataType_t tc,
                              int batch) {
  /* The handle's math mode applies to CUBLAS_COMPUTE_32F too: keep it in
   * step with the setting so that TF32 off means exact f32 products. */
  DT_CHECK(dt_cuda_ctx_sync_math_mode(ctx));
  cublasComputeType_t compute = CUBLAS_COMPUTE_32F;
  if (ab_type == DT_DTYPE_F32 && dt_cuda_tf32_enabled())
    compute = CUBLAS_COMPUTE_32F_FAST_TF32;
  cublasOperation_t op_a = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  cublasOperation_t op_b = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  DT_CUBLAS_CHECK(cublasGemmStridedBatchedEx(ctx->cublas, op_b, op_a, n, m, k, &alpha, b, tab, ldb,
                                             stride_b, a, tab, lda, stride_a, &beta, c, tc, ldc,
                                             stride_c, batch, compute, CUBLAS_GEMM_DEFAULT));
  return DT_OK;
}

// A (m,k) or (k,m) if trans_a, B (k,n) or (n,k) if trans_b -> C (m,n), per batch;
// f16/bf16 A and B (ex->dtype) with an f32 C through cublasGemmStridedBatchedEx
dt_status dt_cuda_gemm(const dt_exec *ex, bool trans_a, bool trans_b, int m, int n, int k,
                       float alpha, const float *a, int lda, int64_t stride_a, const float *b,
                       int ldb, int64_t stride_b, float beta, float *c, int ldc, int64_t stride_c,
                       int batch) {
  if (m == 0 || n == 0 || batch == 0)
    return DT_OK;
  DT_CUDA_EXEC(ex, ctx, stream);
  DT_CHECK(dt_cuda_ctx_sync_math_mode(ctx));
  DT_CUBLAS_CHECK(cublasSetStream(ctx->cublas, stream));
  if (ex->dtype != DT_DTYPE_F32) {
    cudaDataType_t tab = CUDA_R_16BF;
    (void)cuda_type(ex->dtype, &tab); /* the dispatch admits f32, f16 and bf16 only */
    return gemm_ex_call(ctx, trans_a, trans_b, m, n, k, alpha, a, lda, stride_a, b, ldb, stride_b,
                        tab, ex->dtype, beta, c, ldc, stride_c, CUDA_R_32F, batch);
  }
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
  return gemm_ex_call(ctx, trans_a, trans_b, m, n, k, alpha, a, lda, stride_a, b, ldb, stride_b,
                      tab, ab_type, beta, c, ldc, stride_c, tc, batch);
}
