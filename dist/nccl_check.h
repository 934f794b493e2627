/* Error checks for NCCL and the CUDA runtime inside dist/ (CUDA builds
 * only; internal to comm_nccl.c). Each failing call becomes a dt_status
 * whose message has the statement, the rank, the GPU, the caller's
 * file:line, ncclGetErrorString and ncclGetLastError, and advice.
 *
 *   DT_NCCL_CHECK(ncclAllReduce(...), comm, rank, device);
 *   DT_NCCL_CUDA_CHECK(cudaEventRecord(...), rank, device);
 */
#ifndef DT_DIST_NCCL_CHECK_H
#define DT_DIST_NCCL_CHECK_H

#include <cuda_runtime_api.h>
#include <nccl.h>

#include "core/status.h"

dt_status dt_nccl_fail(ncclResult_t r, ncclComm_t comm, int rank, int device, const char *stmt,
                       const char *func, const char *file, int line);
dt_status dt_nccl_cuda_fail(cudaError_t e, int rank, int device, const char *stmt, const char *func,
                            const char *file, int line);

/* ncclInProgress is not an error: it only appears with nonblocking
 * communicators, whose state ncclCommGetAsyncError reports. */
#define DT_NCCL_CHECK(stmt, comm, rank, device)                                            \
  do {                                                                                     \
    ncclResult_t dt_nccl_r_ = (stmt);                                                      \
    if (dt_nccl_r_ != ncclSuccess && dt_nccl_r_ != ncclInProgress)                         \
      return dt_nccl_fail(dt_nccl_r_, (comm), (rank), (device), #stmt, __func__, __FILE__, \
                          __LINE__);                                                       \
  } while (0)

#define DT_NCCL_CUDA_CHECK(stmt, rank, device)                                           \
  do {                                                                                   \
    cudaError_t dt_nccl_ce_ = (stmt);                                                    \
    if (dt_nccl_ce_ != cudaSuccess)                                                      \
      return dt_nccl_cuda_fail(dt_nccl_ce_, (rank), (device), #stmt, __func__, __FILE__, \
                               __LINE__);                                                \
  } while (0)

#endif
