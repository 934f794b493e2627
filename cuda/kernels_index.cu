/* Index validation inside the CUDA kernels (cross-entropy targets, the
 * classifier's, embedding ids), shared by kernels_loss.cu and
 * kernels_embedding.cu: the forward kernels record the first bad position
 * in their stream's slot and never wait for the host; the report queued
 * behind them turns it into the device's index error (cuda_internal.h),
 * which the host reports at its next synchronisation with the CPU's
 * message. Declared in kernels_common.cuh. */
#include "cuda/kernels_common.cuh"

/* The slot of index checks for kernels on `stream` (one per stream kind:
 * kernels on one stream run in order, so a slot serves one launch at a
 * time). */
dt_cuda_index_slot *dt_cuda_index_slot_of(dt_cuda_ctx *ctx, cudaStream_t stream) {
  int k = DT_STREAM_COMPUTE;
  for (int i = 0; i < 3; i++)
    if (ctx->streams[i].s == stream)
      k = i;
  return &ctx->index_check.slots[k];
}

// slot of the launch just checked -> the device's index error (the first
// one claims it), *count = rows kept (cross-entropy); resets the slot
static __global__ void index_report_kernel(dt_cuda_index_slot *slot, int *claim,
                                           dt_cuda_index_error *err, const void *idx, int i32,
                                           int kind, long long bound, long long ignore,
                                           float *count) {
  unsigned long long bad = slot->bad;
  if (count)
    *count = (float)slot->kept;
  slot->kept = 0;
  if (bad == ~0ull)
    return;
  slot->bad = ~0ull;
  if (atomicCAS(claim, 0, 1) != 0)
    return; /* an earlier failure is waiting for the host */
  err->kind = kind;
  err->position = (long long)bad;
  err->value = (long long)index_at(idx, i32, (int64_t)bad);
  err->bound = bound;
  err->ignore_index = ignore;
  __threadfence_system();
  *(volatile int *)&err->set = 1;
}

/* The end of an index-checking launch on `stream`: its launch error, else
 * (when `report`) the report of its slot queued behind it (no host wait). */
dt_status dt_cuda_index_checked(dt_cuda_ctx *ctx, cudaStream_t stream, bool report, const void *idx,
                                int i32, dt_cuda_index_kind kind, int64_t bound, int64_t ignore,
                                float *count) {
  cudaError_t e = cudaGetLastError();
  if (e == cudaSuccess && report) {
    index_report_kernel<<<1, 1, 0, stream>>>(
        dt_cuda_index_slot_of(ctx, stream), ctx->index_check.claim, ctx->index_check.error_dev, idx,
        i32, (int)kind, (long long)bound, (long long)ignore, count);
    e = cudaGetLastError();
  }
  DT_CUDA_CHECK(e);
  return DT_OK;
}
