/* 16-bit storage, f32 math: the CPU's f16/bf16 elementwise kernels. Each
 * runs its f32 kernel on blocks: the 16-bit inputs of a block are widened
 * with the bulk converters of core/half.h, the f32 body computes, and the
 * result is rounded once to 16 bits. One body per op, whatever the storage
 * type. The row kernels (softmax, layer norm) widen blocks of whole rows
 * the same way (dt_cpu_rows). */
#include <omp.h>
#include <stdbool.h>

#include "core/cpu_internal.h"
#include "core/half.h"
#include "core/rng.h"

#define HALF_BLOCK 2048 /* elements per block: 8 KiB of f32 per buffer, on the stack */

dt_status dt_cpu_half_blocks(const dt_exec *ex, int64_t n, int nin, const void *const *in,
                             void *out, dt_cpu_block_fn fn, const void *ctx) {
  DT_ASSERT(nin >= 1 && nin <= DT_CPU_HALF_MAX_INPUTS && dt_dtype_is_half(ex->dtype));
  const dt_dtype dtype = ex->dtype;
  dt_exec ex32 = *ex;
  ex32.dtype = DT_DTYPE_F32;
  const int64_t blocks = (n + HALF_BLOCK - 1) / HALF_BLOCK;
  dt_status st = DT_OK;
#pragma omp parallel for if (n >= DT_CPU_PAR_MIN) num_threads(dt_cpu_threads()) schedule(static)
  for (int64_t b = 0; b < blocks; b++) {
    float buf[DT_CPU_HALF_MAX_INPUTS][HALF_BLOCK], res[HALF_BLOCK];
    const float *args[DT_CPU_HALF_MAX_INPUTS];
    const int64_t i0 = b * HALF_BLOCK, len = n - i0 < HALF_BLOCK ? n - i0 : HALF_BLOCK;
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

dt_status dt_cpu_rows(const char *op, int64_t rows, int64_t cols, int nin, const void *const *in,
                      const dt_dtype *dtypes, int64_t min_work, dt_cpu_rows_fn fn,
                      const void *ctx) {
  DT_ASSERT(nin >= 1 && nin <= DT_CPU_ROWS_MAX_INPUTS && cols > 0);
  /* whole rows of about HALF_BLOCK elements: one row when a row is longer */
  const int64_t per_block = cols < HALF_BLOCK ? HALF_BLOCK / cols : 1;
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

/* ---- the 16-bit variants of the f32 kernels (their dispatch calls these
 * for ex->dtype f16/bf16) ---- */

typedef struct axpby_ctx {
  float alpha, beta;
} axpby_ctx;

static dt_status axpby_block(const dt_exec *ex32, const void *ctx, const float *const *in,
                             float *out, int64_t len) {
  const axpby_ctx *c = ctx;
  if (c->beta != 0.0f) { /* in[1] is y's old value */
    for (int64_t i = 0; i < len; i++)
      out[i] = in[1][i];
  }
  return dt_cpu_axpby(ex32, len, c->alpha, in[0], c->beta, out);
}

// y (n) = alpha * x + beta * y, x and y 16-bit
dt_status dt_cpu_half_axpby(const dt_exec *ex, int64_t n, float alpha, const void *x, float beta,
                            void *y) {
  const axpby_ctx c = {alpha, beta};
  const void *in[2] = {x, y};
  return dt_cpu_half_blocks(ex, n, beta != 0.0f ? 2 : 1, in, y, axpby_block, &c);
}

static dt_status unary_forward_block(const dt_exec *ex32, const void *ctx, const float *const *in,
                                     float *out, int64_t len) {
  return dt_cpu_unary_forward(ex32, *(const dt_unary_op *)ctx, len, in[0], out);
}

// y (n) = f(x), 16-bit x and y
dt_status dt_cpu_half_unary_forward(const dt_exec *ex, dt_unary_op op, int64_t n, const void *x,
                                    void *y) {
  return dt_cpu_half_blocks(ex, n, 1, (const void *[]){x}, y, unary_forward_block, &op);
}

static dt_status unary_backward_block(const dt_exec *ex32, const void *ctx, const float *const *in,
                                      float *out, int64_t len) {
  return dt_cpu_unary_backward(ex32, *(const dt_unary_op *)ctx, len, in[0], in[1], out);
}

// dx (n) = dy * f'(x), 16-bit x, dy and dx
dt_status dt_cpu_half_unary_backward(const dt_exec *ex, dt_unary_op op, int64_t n, const void *x,
                                     const void *dy, void *dx) {
  return dt_cpu_half_blocks(ex, n, 2, (const void *[]){x, dy}, dx, unary_backward_block, &op);
}

/* ---- dropout: the mask from the element's global index, so a block
 * loop of its own (the keep test and the scaling are the f32 kernel's) ---- */

// x (n) -> y (n), mask (n) u8, x and y 16-bit
dt_status dt_cpu_half_dropout_forward(const dt_exec *ex, const void *x, void *y, uint8_t *mask,
                                      int64_t n, float p, uint64_t seed, uint64_t offset) {
  const dt_dtype dtype = ex->dtype;
  const float scale = p < 1.0f ? 1.0f / (1.0f - p) : 0.0f;
  const int64_t blocks = (n + HALF_BLOCK - 1) / HALF_BLOCK;
#pragma omp parallel for if (n >= DT_CPU_PAR_MIN / 4) num_threads(dt_cpu_threads()) schedule(static)
  for (int64_t b = 0; b < blocks; b++) {
    float buf[HALF_BLOCK];
    const int64_t i0 = b * HALF_BLOCK, len = n - i0 < HALF_BLOCK ? n - i0 : HALF_BLOCK;
    (void)dt_half_to_f32(dtype, (const uint16_t *)x + i0, buf, len);
    for (int64_t j = 0; j < len; j++) {
      uint8_t keep = dt_rng_uniform(seed, offset + (uint64_t)(i0 + j)) >= p;
      mask[i0 + j] = keep;
      buf[j] = keep ? buf[j] * scale : 0.0f;
    }
    (void)dt_half_from_f32(dtype, buf, (uint16_t *)y + i0, len);
  }
  return DT_OK;
}

// dy (n), mask (n) -> dx (n) = dy * mask / (1-p), dy and dx 16-bit
dt_status dt_cpu_half_dropout_backward(const dt_exec *ex, const void *dy, const uint8_t *mask,
                                       void *dx, int64_t n, float p) {
  const dt_dtype dtype = ex->dtype;
  const float scale = p < 1.0f ? 1.0f / (1.0f - p) : 0.0f;
  const int64_t blocks = (n + HALF_BLOCK - 1) / HALF_BLOCK;
#pragma omp parallel for if (n >= DT_CPU_PAR_MIN) num_threads(dt_cpu_threads()) schedule(static)
  for (int64_t b = 0; b < blocks; b++) {
    float buf[HALF_BLOCK];
    const int64_t i0 = b * HALF_BLOCK, len = n - i0 < HALF_BLOCK ? n - i0 : HALF_BLOCK;
    (void)dt_half_to_f32(dtype, (const uint16_t *)dy + i0, buf, len);
    for (int64_t j = 0; j < len; j++)
      buf[j] = mask[i0 + j] ? buf[j] * scale : 0.0f;
    (void)dt_half_from_f32(dtype, buf, (uint16_t *)dx + i0, len);
  }
  return DT_OK;
}
