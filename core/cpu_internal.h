/* CPU reference backend internals: the kernels that core/cpu_backend.c puts
 * into the dt_backend_ops table, and the helpers they share. Not public API.
 *
 * Every kernel has the signature of its op-table entry (core/op_table.def
 * gives the shapes and the contract of each).
 */
#ifndef DT_CORE_CPU_INTERNAL_H
#define DT_CORE_CPU_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "core/backend.h"
#include "core/cpu.h"
#include "core/device.h"
#include "core/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Below this many elements a kernel runs on the calling thread only: an
 * OpenMP fork/join costs more than the work. */
#define DT_CPU_PAR_MIN 32768

/* On x86-64 with GCC, a hot kernel helper marked DT_CPU_CLONES is compiled
 * three times (AVX-512, AVX2 + FMA, baseline SSE2) and the loader picks the
 * one the CPU runs (the build itself targets baseline x86-64). The results
 * are the same on every thread of a machine; machines of different
 * generations may differ in the last bits (FMA contraction). */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define DT_CPU_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define DT_CPU_CLONES
#endif

/* Logical CPU devices (cpu:0 .. cpu:DT_CPU_MAX_DEVICES-1). */
#define DT_CPU_MAX_DEVICES 64

/* Threads the kernels use (>= 1). Reads DT_NUM_THREADS on first use. */
int dt_cpu_threads(void);

/* `for (int64_t i = 0; i < n; i++)` split across the kernel threads
 * (static schedule) when `work`, the elements the loop touches, reaches
 * `min_work`; further OpenMP clauses (a reduction) may follow:
 *   DT_CPU_PARALLEL_FOR(r, rows, rows * cols, DT_CPU_PAR_MIN / 4) { ... } */
#define DT_CPU_PRAGMA_(x) _Pragma(#x)
#define DT_CPU_PARALLEL_FOR(i, n, work, min_work, ...)                                    \
  DT_CPU_PRAGMA_(omp parallel for if ((work) >= (min_work)) num_threads(dt_cpu_threads()) \
                     schedule(static) __VA_ARGS__)                                        \
  for (int64_t i = 0; i < (n); i++)

/* Mixed precision (core/cpu_half.c): an f32 kernel body over
 * `n` elements of blocks: fn(ex32, ctx, in, out, len) computes out (len)
 * from the f32 inputs in[0..nin) of one block. */
#define DT_CPU_HALF_MAX_INPUTS 3
#define DT_CPU_HALF_BLOCK 2048 /* elements per block: 8 KiB of f32 per buffer, on the stack */
typedef dt_status (*dt_cpu_block_fn)(const dt_exec *ex32, const void *ctx, const float *const *in,
                                     float *out, int64_t len);
/* Runs fn over n elements whose inputs in[k] and output `out` hold 16-bit
 * elements of ex->dtype (f16 or bf16): each block's inputs are widened to
 * f32, fn computes in f32 on the calling thread, the result is rounded
 * once into `out` (which may be one of the inputs). Blocks run on the
 * kernel threads. */
dt_status dt_cpu_half_blocks(const dt_exec *ex, int64_t n, int nin, const void *const *in,
                             void *out, dt_cpu_block_fn fn, const void *ctx);

/* Row kernels whose inputs are f32 or 16-bit (core/cpu_half.c):
 * fn computes rows [r0, r0 + n) from in[k], the f32 values of input k's
 * rows r0.. (`cols` apart), and writes its (f32) outputs itself. */
#define DT_CPU_ROWS_MAX_INPUTS 2
typedef void (*dt_cpu_rows_fn)(const void *ctx, const float *const *in, int64_t r0, int64_t n);
/* Runs fn over `rows` rows of `cols` (> 0) elements, in blocks of whole
 * rows (about 2048 elements, or one longer row); input k holds dtypes[k]
 * (f32, f16 or bf16). An f32 input is passed in place; a 16-bit input's
 * block is widened into the thread's slice of one pooled scratch buffer,
 * so fn sees the values a widened copy of the whole tensor would hold
 * without such a copy. Blocks run on the kernel threads when rows * cols
 * reaches min_work; rows are independent, so the results do not depend on
 * the blocking or the thread count. DT_ERR_OOM when the scratch cannot be
 * had. */
dt_status dt_cpu_rows(const char *op, int64_t rows, int64_t cols, int nin, const void *const *in,
                      const dt_dtype *dtypes, int64_t min_work, dt_cpu_rows_fn fn, const void *ctx);
/* x[off, off + n) as f32: in place when dtype is f32, else widened into
 * buf (n floats), which is returned. */
const float *dt_cpu_f32_span(const void *x, dt_dtype dtype, int64_t off, int64_t n, float *buf);
/* y[off, off + n) of `dtype` = v (n floats): copied when dtype is f32,
 * else rounded once to 16 bits. */
void dt_cpu_store_span(void *y, dt_dtype dtype, int64_t off, int64_t n, const float *v);

/* The f16/bf16 variants of axpby, unary_forward and unary_backward (the
 * f32 kernels call them for a 16-bit ex->dtype). */
dt_status dt_cpu_half_axpby(const dt_exec *ex, int64_t n, float alpha, const void *x, float beta,
                            void *y);
dt_status dt_cpu_half_unary_forward(const dt_exec *ex, dt_unary_op op, int64_t n, const void *x,
                                    void *y);
dt_status dt_cpu_half_unary_backward(const dt_exec *ex, dt_unary_op op, int64_t n, const void *x,
                                     const void *dy, void *dx);
/* dropout of 16-bit x (y, dy, dx in ex->dtype), the f32 body: blocks of x
 * widened, y = keep ? x * scale : 0, one rounding */
dt_status dt_cpu_half_dropout_forward(const dt_exec *ex, const void *x, void *y, uint8_t *mask,
                                      int64_t n, float p, uint64_t seed, uint64_t offset);
dt_status dt_cpu_half_dropout_backward(const dt_exec *ex, const void *dy, const uint8_t *mask,
                                       void *dx, int64_t n, float p);

/* Scratch memory for kernels (core/cpu_scratch.c): a host buffer of at
 * least `bytes` (64-byte aligned) that the caller alone uses until it
 * releases it; released buffers are kept for later calls of any thread
 * and freed by dt_cpu_scratch_free_idle (the backend's empty_cache).
 * Outside the device's memory statistics, like the per-thread im2col
 * buffers: it holds widened copies, never tensors. DT_ERR_OOM when
 * malloc fails. */
typedef struct dt_cpu_scratch dt_cpu_scratch;
dt_status dt_cpu_scratch_acquire(size_t bytes, dt_cpu_scratch **out, void **data);
void dt_cpu_scratch_release(dt_cpu_scratch *s);
void dt_cpu_scratch_free_idle(void);

/* The f16/bf16 gemm (core/cpu_kernels_linear_half.c): A and B of ex->dtype,
 * C f32; each element of C is the f32 sgemm's on the widened operands. */
dt_status dt_cpu_half_gemm(const dt_exec *ex, bool trans_a, bool trans_b, int m, int n, int k,
                           float alpha, const void *a, int lda, int64_t stride_a, const void *b,
                           int ldb, int64_t stride_b, float beta, float *c, int ldc,
                           int64_t stride_c, int batch);

/* Sum of x (n) in double with four interleaved accumulators (the order
 * every CPU reduction uses). */
double dt_cpu_sum_contiguous(const float *x, int64_t n);

/* Row helpers of the row kernels (core/cpu_rows.c), vectorised:
 *   dt_cpu_row_max      max of x[0..n) (NaN ignored, as the reference loops)
 *   dt_cpu_row_exp_sum  sum of exp(x[j] - mx) in double (eight lanes, a fixed
 *                       order); the exponentials go to e (may be x) unless NULL
 *   dt_cpu_row_scale    x[j] *= a
 *   dt_cpu_index_at     element i of an i32 or i64 index array */
float dt_cpu_row_max(const float *x, int64_t n);
double dt_cpu_row_exp_sum(const float *x, int64_t n, float mx, float *e);
void dt_cpu_row_scale(float *x, float a, int64_t n);
int64_t dt_cpu_index_at(const void *idx, dt_dtype dt, int64_t i);

/* Vectorised math (core/cpu_math.c); y may be x.
 *   y[j] = scale * exp(x[j] - shift), for x[j] - shift <= 88 (within 1 ulp
 *          of expf; -inf gives 0)
 *   y = GELU(x) (tanh approximation); dx = dy * GELU'(x) */
void dt_cpu_exp_shifted(const float *x, float shift, float scale, float *y, int64_t n);
void dt_cpu_gelu(const float *x, float *y, int64_t n);
void dt_cpu_gelu_backward(const float *x, const float *dy, float *dx, int64_t n);

/* Channels-last convolution and pooling (g->nhwc, core/cpu_kernels_conv_nhwc.c):
 * the NCHW kernels on transposed copies. The conv backward accumulates dw
 * (conv2d_backward_acc) when `accumulate`; the pooling is max pooling
 * when argmax is not NULL, average pooling when it is. */
dt_status dt_cpu_conv2d_nhwc_forward(const dt_exec *ex, const dt_conv2d_geom *g, const float *x,
                                     const float *w, const float *bias, float *y, void *workspace);
dt_status dt_cpu_conv2d_nhwc_backward(const dt_exec *ex, const dt_conv2d_geom *g, const float *x,
                                      const float *w, const float *dy, float *dx, float *dw,
                                      float *db, void *workspace, int accumulate);
dt_status dt_cpu_pool2d_nhwc_forward(const dt_exec *ex, const dt_conv2d_geom *g, const float *x,
                                     float *y, int32_t *argmax);
dt_status dt_cpu_pool2d_nhwc_backward(const dt_exec *ex, const dt_conv2d_geom *g, const float *dy,
                                      const int32_t *argmax, float *dx);

/* The kernels (cpu_kernels_*.c), one per DT_KERNEL of core/op_table.def:
 *   dt_status dt_cpu_<name>(const dt_exec *ex, <params>);
 * Arguments were checked by the dispatch (core/kernels.c). */
#define DT_KERNEL(name, dtypes, check, params, args) dt_status dt_cpu_##name DT_KPARAMS params;
#include "core/op_table.def"

#ifdef __cplusplus
}
#endif
#endif
