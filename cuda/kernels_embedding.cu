/* CUDA kernels of the embedding (core/ops_embedding.c). The forward
 * validates the ids inside the kernel (kernels_index.cu). The backward is
 * deterministic (llm.c's encoder_backward
 * idea, on the device): no float atomics. The positions are sorted by their
 * index (CUB's radix sort is stable, so each index's positions stay in
 * ascending order); then one block per run of equal indices (and per 256
 * columns) adds that run's dy rows into the table row in position order.
 * That is the CPU reference's order (core/cpu_kernels_embedding.c), so the two
 * agree bit for bit, and repeated runs agree with each other. */
#include <cub/cub.cuh>

#include "cuda/kernels_common.cuh"

/* ---- embedding ---- */

// idx (n), table (v,d) -> y (n,d); report: first bad position
static __global__ void embedding_forward_kernel(const void *idx, int i32, const float *table,
                                                float *y, int64_t n, int64_t v, int64_t d,
                                                dt_cuda_index_slot *rep) {
  DT_GRID_STRIDE(k, n * d) {
    int64_t i = k / d, j = k - i * d;
    int64_t t = index_at(idx, i32, i);
    if (t < 0 || t >= v) {
      if (j == 0)
        atomicMin(&rep->bad, (unsigned long long)i);
      y[k] = 0.0f;
    } else {
      y[k] = table[t * d + j];
    }
  }
}

extern "C" dt_status dt_cuda_embedding_forward(const dt_exec *ex, const void *idx,
                                               dt_dtype idx_dtype, const float *table, float *y,
                                               int64_t n, int64_t v, int64_t d) {
  if (n == 0)
    return DT_OK;
  DT_CUDA_EXEC(ex, ctx, stream);
  int i32 = idx_dtype == DT_DTYPE_I32;
  if (d > 0)
    embedding_forward_kernel<<<dt_grid_for(n * d), DT_THREADS, 0, stream>>>(
        idx, i32, table, y, n, v, d, dt_cuda_index_slot_of(ctx, stream));
  return dt_cuda_index_checked(ctx, stream, d > 0, idx, i32, DT_CUDA_INDEX_EMBEDDING, v, 0, NULL);
}

#define EMB_COLS 256 /* columns per block of the accumulation */

// idx (n) -> keys (n): the index, or v for one outside [0, v) (skipped); pos (n) = 0..n-1
static __global__ void embedding_keys_kernel(const void *idx, int i32, int64_t n, int64_t v,
                                             uint32_t *keys, int32_t *pos) {
  DT_GRID_STRIDE(i, n) {
    int64_t t = index_at(idx, i32, i);
    keys[i] = (uint32_t)(t >= 0 && t < v ? t : v);
    pos[i] = (int32_t)i;
  }
}

// keys, pos (n) sorted by key -> dtable (v,d) += the dy (n,d) rows of each run, in position order
static __global__ void embedding_runs_kernel(const uint32_t *keys, const int32_t *pos,
                                             const float *dy, float *dtable, int64_t n, int64_t v,
                                             int64_t d) {
  const int64_t i = blockIdx.x, j = (int64_t)blockIdx.y * EMB_COLS + threadIdx.x;
  const uint32_t k = keys[i];
  if ((i > 0 && keys[i - 1] == k) || k >= v || j >= d)
    return; /* not the start of a run, an invalid index, or past the row */
  float acc = dtable[k * d + j];
  for (int64_t p = i; p < n && keys[p] == k; p++)
    acc += dy[(int64_t)pos[p] * d + j];
  dtable[k * d + j] = acc;
}

extern "C" dt_status dt_cuda_embedding_backward(const dt_exec *ex, const void *idx,
                                                dt_dtype idx_dtype, const float *dy, float *dtable,
                                                int64_t n, int64_t v, int64_t d) {
  if (n * d == 0)
    return DT_OK;
  if (n > 0x7fffffff || v >= 0xffffffffll || (d + EMB_COLS - 1) / EMB_COLS > 65535)
    return DT_ERROR(DT_ERR_UNSUPPORTED,
                    "embedding_backward: %lld indices into a (%lld, %lld) table: the CUDA "
                    "kernel takes below 2^31 indices, 2^32 rows and 2^24 columns",
                    (long long)n, (long long)v, (long long)d);
  DT_CUDA_EXEC(ex, ctx, stream);
  int end_bit = 1;
  while (end_bit < 32 && ((uint64_t)v >> end_bit) != 0)
    end_bit++; /* keys are 0..v: sort only their bits */
  size_t temp_bytes = 0;
  DT_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(NULL, temp_bytes, (const uint32_t *)NULL,
                                                (uint32_t *)NULL, (const int32_t *)NULL,
                                                (int32_t *)NULL, (int)n, 0, end_bit, stream));
  /* keys, sorted keys, positions, sorted positions, then CUB's temporary */
  const size_t lane = ((size_t)n * 4 + 255) / 256 * 256;
  char *buf = NULL;
  DT_CHECK(dt_cuda_scratch_alloc(ctx, 4 * lane + temp_bytes, (void **)&buf));
  uint32_t *keys = (uint32_t *)buf, *keys_sorted = (uint32_t *)(buf + lane);
  int32_t *pos = (int32_t *)(buf + 2 * lane), *pos_sorted = (int32_t *)(buf + 3 * lane);
  dt_status st = DT_OK;
  embedding_keys_kernel<<<dt_grid_for(n), DT_THREADS, 0, stream>>>(idx, idx_dtype == DT_DTYPE_I32,
                                                                   n, v, keys, pos);
  DT_CUDA_CHECK_GOTO(cudaGetLastError(), st, free_buf);
  DT_CUDA_CHECK_GOTO(cub::DeviceRadixSort::SortPairs(buf + 4 * lane, temp_bytes, keys, keys_sorted,
                                                     pos, pos_sorted, (int)n, 0, end_bit, stream),
                     st, free_buf);
  {
    dim3 grid((unsigned)n, (unsigned)((d + EMB_COLS - 1) / EMB_COLS));
    embedding_runs_kernel<<<grid, EMB_COLS, 0, stream>>>(keys_sorted, pos_sorted, dy, dtable, n, v,
                                                         d);
  }
  DT_CUDA_CHECK_GOTO(cudaGetLastError(), st, free_buf);
free_buf:
  dt_cuda_scratch_free(ctx, buf);
  return st;
}
