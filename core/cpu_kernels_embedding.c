/* CPU kernels of the embedding (core/ops_embedding.c). */
#include <string.h>

#include "core/cpu_internal.h"

#define MIN(a, b) ((a) < (b) ? (a) : (b))

/* ---- embedding ---- */

static dt_status check_indices(const char *op, const void *idx, dt_dtype dt, int64_t n, int64_t v) {
  for (int64_t i = 0; i < n; i++) {
    int64_t k = dt_cpu_index_at(idx, dt, i);
    if (k < 0 || k >= v)
      return DT_ERROR(DT_ERR_INVALID_ARG,
                      "%s: index %lld at position %lld is outside [0, %lld): check the token "
                      "ids against the vocabulary size",
                      op, (long long)k, (long long)i, (long long)v);
  }
  return DT_OK;
}

// idx (n), table (v,d) -> y (n,d)
dt_status dt_cpu_embedding_forward(const dt_exec *ex, const void *idx, dt_dtype idx_dtype,
                                   const float *table, float *y, int64_t n, int64_t v, int64_t d) {
  (void)ex;
  DT_CHECK(check_indices("embedding_forward", idx, idx_dtype, n, v));
  DT_CPU_PARALLEL_FOR(i, n, n * d, DT_CPU_PAR_MIN)
  memcpy(y + i * d, table + dt_cpu_index_at(idx, idx_dtype, i) * d, (size_t)d * sizeof(float));
  return DT_OK;
}

#define EMB_COL_BLOCK 64

// dy (n,d) -> dtable (v,d) += scatter by idx (n)
dt_status dt_cpu_embedding_backward(const dt_exec *ex, const void *idx, dt_dtype idx_dtype,
                                    const float *dy, float *dtable, int64_t n, int64_t v,
                                    int64_t d) {
  (void)ex;
  DT_CHECK(check_indices("embedding_backward", idx, idx_dtype, n, v));
  /* Threads own disjoint column blocks, so repeated indices never race and
   * the summation order (by position) is fixed. */
  int64_t blocks = (d + EMB_COL_BLOCK - 1) / EMB_COL_BLOCK;
  int nt = dt_cpu_threads();
#pragma omp parallel for if (n * d >= DT_CPU_PAR_MIN && blocks > 1) num_threads(nt) schedule(static)
  for (int64_t b = 0; b < blocks; b++) {
    int64_t j0 = b * EMB_COL_BLOCK, len = MIN(EMB_COL_BLOCK, d - j0);
    for (int64_t i = 0; i < n; i++) {
      float *dst = dtable + dt_cpu_index_at(idx, idx_dtype, i) * d + j0;
      const float *src = dy + i * d + j0;
      for (int64_t j = 0; j < len; j++)
        dst[j] += src[j];
    }
  }
  return DT_OK;
}
