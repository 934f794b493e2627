/* 16-bit storage, f32 math: how the CPU's f16/bf16 kernels run their f32
 * bodies. dt_cpu_half_blocks runs a body on blocks: the 16-bit inputs of a
 * block are widened with the bulk converters of core/half.h, the f32 body
 * computes, and the result is rounded once to 16 bits (one body per op,
 * whatever the storage type; the elementwise kernels use it). The row
 * kernels (softmax, layer norm) widen blocks of whole rows the same way
 * (dt_cpu_rows). */
#include <omp.h>
#include <stdbool.h>
#include <string.h>

#include "core/cpu_internal.h"
#include "core/half.h"

dt_status dt_cpu_half_blocks(const dt_exec *ex, int64_t n, int nin, const void *const *in,
                             void *out, dt_cpu_block_fn fn, const void *ctx) {
  DT_ASSERT(nin >= 1 && nin <= DT_CPU_HALF_MAX_INPUTS && dt_dtype_is_half(ex->dtype));
  const dt_dtype dtype = ex->dtype;
  dt_exec ex32 = *ex;
  ex32.dtype = DT_DTYPE_F32;
  const int64_t blocks = (n + DT_CPU_HALF_BLOCK - 1) / DT_CPU_HALF_BLOCK;
  dt_status st = DT_OK;
#pragma omp parallel for if (n >= DT_CPU_PAR_MIN) num_threads(dt_cpu_threads()) schedule(static)
  for (int64_t b = 0; b < blocks; b++) {
    float buf[DT_CPU_HALF_MAX_INPUTS][DT_CPU_HALF_BLOCK], res[DT_CPU_HALF_BLOCK];
    const float *args[DT_CPU_HALF_MAX_INPUTS];
    const int64_t i0 = b * DT_CPU_HALF_BLOCK,
                  len = n - i0 < DT_CPU_HALF_BLOCK ? n - i0 : DT_CPU_HALF_BLOCK;
    for (int k = 0; k < nin; k++) {
      (void)dt_half_to_f32(dtype, (const uint16_t *)in[k] + i0, buf[k], len);
      args[k] = buf[k];
    }
    dt_status s = fn(&ex32, ctx, args, res, len);
    if (s == DT_OK)
      (void)dt_half_from_f32(dtype, res, (uint16_t *)out + i0, len);
    else {
#pragma omp critical(dt_cpu_half_blocks)
      st = s;
    }
  }
  return st;
}

const float *dt_cpu_f32_span(const void *x, dt_dtype dtype, int64_t off, int64_t n, float *buf) {
  if (!dt_dtype_is_half(dtype))
    return (const float *)x + off;
  (void)dt_half_to_f32(dtype, (const uint16_t *)x + off, buf, n);
  return buf;
}

void dt_cpu_store_span(void *y, dt_dtype dtype, int64_t off, int64_t n, const float *v) {
  if (dt_dtype_is_half(dtype))
    (void)dt_half_from_f32(dtype, v, (uint16_t *)y + off, n);
  else
    memcpy((float *)y + off, v, (size_t)n * sizeof(float));
}

dt_status dt_cpu_rows(const char *op, int64_t rows, int64_t cols, int nin, const void *const *in,
                      const dt_dtype *dtypes, int64_t min_work, dt_cpu_rows_fn fn,
                      const void *ctx) {
  DT_ASSERT(nin >= 1 && nin <= DT_CPU_ROWS_MAX_INPUTS && cols > 0);
  /* whole rows of about DT_CPU_HALF_BLOCK elements: one row when a row is longer */
  const int64_t per_block = cols < DT_CPU_HALF_BLOCK ? DT_CPU_HALF_BLOCK / cols : 1;
  const int64_t blocks = (rows + per_block - 1) / per_block, block_floats = per_block * cols;
  const int par = rows * cols >= min_work && blocks > 1;
  const int nt = par ? dt_cpu_threads() : 1;
  int nhalf = 0;
  for (int k = 0; k < nin; k++)
    nhalf += dt_dtype_is_half(dtypes[k]);
  /* one pooled buffer per call, a slice per thread and 16-bit input: no
   * allocation in steady state, and none at all for f32 inputs */
  dt_cpu_scratch *scratch = NULL;
  float *wide = NULL;
  if (nhalf > 0) {
    size_t bytes = (size_t)nt * (size_t)nhalf * (size_t)block_floats * sizeof(float);
    if (dt_cpu_scratch_acquire(bytes, &scratch, (void **)&wide) != DT_OK)
      return DT_ERROR(DT_ERR_OOM, "%s: %zu bytes to widen 16-bit rows: malloc failed", op, bytes);
  }
#pragma omp parallel for if (par) num_threads(nt) schedule(static)
  for (int64_t b = 0; b < blocks; b++) {
    float *buf = wide ? wide + (int64_t)omp_get_thread_num() * nhalf * block_floats : NULL;
    const float *args[DT_CPU_ROWS_MAX_INPUTS];
    const int64_t r0 = b * per_block, n = rows - r0 < per_block ? rows - r0 : per_block;
    for (int k = 0, h = 0; k < nin; k++) {
      float *kbuf = dt_dtype_is_half(dtypes[k]) ? buf + (h++) * block_floats : NULL;
      args[k] = dt_cpu_f32_span(in[k], dtypes[k], r0 * cols, n * cols, kbuf);
    }
    fn(ctx, args, r0, n);
  }
  dt_cpu_scratch_release(scratch);
  return DT_OK;
}
