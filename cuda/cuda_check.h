/* Error checks for CUDA runtime, cuBLAS and cuDNN calls: each failing call
 * becomes a dt_status with the statement, the device and the caller's
 * file:line in the message (ggml's ggml_cuda_error, NCCL's CUDACHECK).
 *
 *   DT_CUDA_CHECK(cudaMalloc(&p, n));              returns on failure
 *   DT_CUDA_CHECK_GOTO(cudaMemcpy(...), st, free_p);   needs `dt_status st`
 *
 * Mapping: cudaErrorMemoryAllocation -> DT_ERR_OOM, cudaErrorNoDevice ->
 * DT_ERR_NO_DEVICE, cudaErrorInsufficientDriver -> DT_ERR_VERSION, the rest
 * -> DT_ERR_CUDA; CUBLAS_STATUS_ALLOC_FAILED / CUDNN_STATUS_ALLOC_FAILED ->
 * DT_ERR_OOM, CUBLAS_STATUS_NOT_SUPPORTED / CUDNN_STATUS_NOT_SUPPORTED ->
 * DT_ERR_UNSUPPORTED, the rest -> DT_ERR_CUDA. Internal to cuda/.
 */
#ifndef DT_CUDA_CUDA_CHECK_H
#define DT_CUDA_CUDA_CHECK_H

#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <cudnn.h>

#include "core/status.h"

#ifdef __cplusplus
extern "C" {
#endif

dt_status dt_cuda_fail(cudaError_t e, const char *stmt, const char *func, const char *file,
                       int line);
dt_status dt_cublas_fail(cublasStatus_t e, const char *stmt, const char *func, const char *file,
                         int line);
dt_status dt_cudnn_fail(cudnnStatus_t e, const char *stmt, const char *func, const char *file,
                        int line);

/* A foreign library's call: on a result other than `ok`, `fail` turns it
 * into a dt_status naming the statement; CHECK returns it, CHECK_GOTO
 * stores it in `status_var` and jumps to `label`. */
#define DT_FOREIGN_CHECK(type, ok, fail, stmt)                         \
  do {                                                                 \
    type dt_foreign_e_ = (stmt);                                       \
    if (dt_foreign_e_ != (ok))                                         \
      return fail(dt_foreign_e_, #stmt, __func__, __FILE__, __LINE__); \
  } while (0)
#define DT_FOREIGN_CHECK_GOTO(type, ok, fail, stmt, status_var, label)         \
  do {                                                                         \
    type dt_foreign_e_ = (stmt);                                               \
    if (dt_foreign_e_ != (ok)) {                                               \
      (status_var) = fail(dt_foreign_e_, #stmt, __func__, __FILE__, __LINE__); \
      goto label;                                                              \
    }                                                                          \
  } while (0)

#define DT_CUDA_CHECK(stmt) DT_FOREIGN_CHECK(cudaError_t, cudaSuccess, dt_cuda_fail, stmt)
#define DT_CUDA_CHECK_GOTO(stmt, status_var, label) \
  DT_FOREIGN_CHECK_GOTO(cudaError_t, cudaSuccess, dt_cuda_fail, stmt, status_var, label)
#define DT_CUBLAS_CHECK(stmt) \
  DT_FOREIGN_CHECK(cublasStatus_t, CUBLAS_STATUS_SUCCESS, dt_cublas_fail, stmt)
#define DT_CUBLAS_CHECK_GOTO(stmt, status_var, label)                                            \
  DT_FOREIGN_CHECK_GOTO(cublasStatus_t, CUBLAS_STATUS_SUCCESS, dt_cublas_fail, stmt, status_var, \
                        label)
#define DT_CUDNN_CHECK(stmt) \
  DT_FOREIGN_CHECK(cudnnStatus_t, CUDNN_STATUS_SUCCESS, dt_cudnn_fail, stmt)
#define DT_CUDNN_CHECK_GOTO(stmt, status_var, label) \
  DT_FOREIGN_CHECK_GOTO(cudnnStatus_t, CUDNN_STATUS_SUCCESS, dt_cudnn_fail, stmt, status_var, label)

/* After a kernel launch: launch-configuration errors surface here. */
#define DT_CUDA_CHECK_LAUNCH() DT_CUDA_CHECK(cudaGetLastError())

#ifdef __cplusplus
}
#endif
#endif
