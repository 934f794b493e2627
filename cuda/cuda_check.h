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

#define DT_CUDA_CHECK(stmt)                                                 \
  do {                                                                      \
    cudaError_t dt_cuda_e_ = (stmt);                                        \
    if (dt_cuda_e_ != cudaSuccess)                                          \
      return dt_cuda_fail(dt_cuda_e_, #stmt, __func__, __FILE__, __LINE__); \
  } while (0)

#define DT_CUDA_CHECK_GOTO(stmt, status_var, label)                                 \
  do {                                                                              \
    cudaError_t dt_cuda_e_ = (stmt);                                                \
    if (dt_cuda_e_ != cudaSuccess) {                                                \
      (status_var) = dt_cuda_fail(dt_cuda_e_, #stmt, __func__, __FILE__, __LINE__); \
      goto label;                                                                   \
    }                                                                               \
  } while (0)

#define DT_CUBLAS_CHECK(stmt)                                                   \
  do {                                                                          \
    cublasStatus_t dt_cublas_e_ = (stmt);                                       \
    if (dt_cublas_e_ != CUBLAS_STATUS_SUCCESS)                                  \
      return dt_cublas_fail(dt_cublas_e_, #stmt, __func__, __FILE__, __LINE__); \
  } while (0)

#define DT_CUDNN_CHECK(stmt)                                                  \
  do {                                                                        \
    cudnnStatus_t dt_cudnn_e_ = (stmt);                                       \
    if (dt_cudnn_e_ != CUDNN_STATUS_SUCCESS)                                  \
      return dt_cudnn_fail(dt_cudnn_e_, #stmt, __func__, __FILE__, __LINE__); \
  } while (0)

#define DT_CUDNN_CHECK_GOTO(stmt, status_var, label)                                  \
  do {                                                                                \
    cudnnStatus_t dt_cudnn_e_ = (stmt);                                               \
    if (dt_cudnn_e_ != CUDNN_STATUS_SUCCESS) {                                        \
      (status_var) = dt_cudnn_fail(dt_cudnn_e_, #stmt, __func__, __FILE__, __LINE__); \
      goto label;                                                                     \
    }                                                                                 \
  } while (0)

/* After a kernel launch: launch-configuration errors surface here. */
#define DT_CUDA_CHECK_LAUNCH() DT_CUDA_CHECK(cudaGetLastError())

#ifdef __cplusplus
}
#endif
#endif
