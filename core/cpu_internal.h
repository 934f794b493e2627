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
#include "core/status.h"
#include "core/device.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Below this many elements a kernel runs on the calling thread only: an
 * OpenMP fork/join costs more than the work. */
#define DT_CPU_PAR_MIN 32768

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

/* Sum of x (n) in double with four interleaved accumulators (the order
 * every CPU reduction uses). */
double dt_cpu_sum_contiguous(const float *x, int64_t n);

/* The kernels (cpu_kernels_*.c), one per DT_KERNEL of core/op_table.def:
 *   dt_status dt_cpu_<name>(const dt_exec *ex, <params>);
 * Arguments were checked by the dispatch (core/kernels.c). */
#define DT_KERNEL(name, dtypes, check, params, args) dt_status dt_cpu_##name DT_KPARAMS params;
#include "core/op_table.def"

#ifdef __cplusplus
}
#endif
#endif
