/* Timing events and NVTX ranges for traces (cuda/cuda.h). */
#include <cuda_runtime.h>
#include <nvtx3/nvToolsExt.h>

#include "cuda/cuda.h"
#include "cuda/cuda_check.h"
#include "cuda/cuda_internal.h"

dt_status dt_cuda_timer_record(dt_device dev, void **event) {
  *event = NULL;
  dt_cuda_ctx *ctx = NULL;
  DT_CHECK(dt_cuda_ctx_get(dev, &ctx));
  cudaEvent_t e = NULL;
  dt_status st = DT_OK;
  DT_CUDA_CHECK(cudaEventCreate(&e));
  DT_CUDA_CHECK_GOTO(cudaEventRecord(e, dt_cuda_compute_stream(ctx)), st, destroy_event);
  *event = (void *)e;
  return DT_OK;
destroy_event:
  cudaEventDestroy(e);
  return st;
}

dt_status dt_cuda_timer_elapsed_ms(void *start, void *end, double *ms) {
  *ms = 0.0;
  float f = 0.0f;
  DT_CUDA_CHECK(cudaEventSynchronize((cudaEvent_t)end));
  DT_CUDA_CHECK(cudaEventElapsedTime(&f, (cudaEvent_t)start, (cudaEvent_t)end));
  *ms = (double)f;
  return DT_OK;
}

void dt_cuda_timer_destroy(void *event) {
  if (event)
    cudaEventDestroy((cudaEvent_t)event);
}

void dt_cuda_nvtx_push(const char *name) { nvtxRangePushA(name); }

void dt_cuda_nvtx_pop(void) { nvtxRangePop(); }
