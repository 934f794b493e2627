/* The CPU reference backend (//core:cpu): OpenBLAS sgemm and OpenMP
 * kernels over host memory. It registers itself for DT_DEVICE_CPU when
 * linked; these are its settings.
 */
#ifndef DT_CORE_CPU_H
#define DT_CORE_CPU_H

#include <stddef.h>

#include "core/backend.h"

#ifdef __cplusplus
extern "C" {
#endif

/* CPU-backend settings. Threads: default = cores available to this process
 * (sched_getaffinity), overridden by DT_NUM_THREADS or this call; at most
 * DT_CPU_MAX_THREADS (a larger n is clamped: OpenMP would fail to create
 * the threads, or crash). Callers taking a count from the user reject
 * larger values with a message. */
void dt_cpu_set_num_threads(int n);
int dt_cpu_num_threads(void);

/* The CPU backend's table (registered automatically). */
const dt_backend_ops *dt_cpu_backend(void);
/* The OpenBLAS kernel set the GEMMs run on and who chose it, e.g.
 * "Cooperlake, chosen by OpenBLAS for this CPU"; names an OPENBLAS_CORETYPE
 * that forces AVX2 kernels on a CPU with AVX-512. Static text. */
const char *dt_cpu_blas_kernels(void);
/* Stride-1 convolutions of small images run on the backend's own AVX-512
 * kernels where the CPU has them (core/cpu_conv_direct.h); 0 sends them to
 * the im2col + sgemm path instead. Returns the previous setting (default
 * 1). For tests and benchmarks: call it while no kernel runs. */
int dt_cpu_set_conv_direct(int enabled);
/* 1 when a convolution of geometry g qualifies for those kernels on this
 * CPU (they run it when the batch has at least one image per thread). */
int dt_cpu_conv_direct_eligible(const dt_conv2d_geom *g);
/* Overrides DT_CPU_MEMORY_LIMIT for CPU devices (0 = no cap). For tests. */
void dt_cpu_set_memory_limit(size_t bytes);

#ifdef __cplusplus
}
#endif
#endif
