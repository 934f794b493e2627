/* The CPU reference backend (//core:cpu): OpenBLAS sgemm and OpenMP
 * kernels over host memory. It registers itself for DT_DEVICE_CPU when
 * linked; these are its settings.
 */
#ifndef DT_CORE_CPU_H
#define DT_CORE_CPU_H

#include <stdbool.h>
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
/* Once: without OPENBLAS_CORETYPE, when OpenBLAS fell back to a kernel set
 * without AVX2 or AVX-512 on a CPU with AVX-512 (a CPU model newer than the
 * library), has it use SkylakeX's set. The CPU backend calls it before its
 * first GEMM. */
void dt_cpu_blas_choose_kernels(void);
/* Stride-1 convolutions of small images run on the backend's own AVX-512
 * kernels where the CPU has them (core/cpu_conv_direct.h); 0 sends them to
 * the im2col + sgemm path instead, and the small-plane im2col/col2im
 * (core/cpu_conv_table.h) to their scalar loops. Returns the previous
 * setting (default 1). For tests and benchmarks: call it while no kernel runs. */
int dt_cpu_set_conv_direct(int enabled);
/* 1 when a convolution of geometry g qualifies for those kernels on this
 * CPU (they run it when the batch has at least one image per thread). */
int dt_cpu_conv_direct_eligible(const dt_conv2d_geom *g);
/* 3x3 stride-1 convolutions of the shapes where it is faster run as
 * Winograd F(2x2, 3x3) (core/cpu_conv_winograd.h); 0 sends them to the
 * other paths. Returns the previous setting (default DT_CONV_WINOGRAD's,
 * on). For tests and benchmarks: call it while no kernel runs. */
int dt_cpu_set_conv_winograd(int enabled);
/* The batched convolution's products with a few columns (ResNet's deep
 * layers at small batches) run on the backend's own unpacked AVX-512
 * kernel where the CPU has it (core/cpu_skinny_gemm.c), and its small
 * planes with many taps on the padding on kernels that skip them
 * (core/cpu_conv_small.c); 0 sends both to im2col and sgemm. Returns the
 * previous setting (default 1). For tests and benchmarks: call it while
 * no kernel runs. */
int dt_cpu_set_gemm_skinny(int enabled);
/* 1 when a convolution of geometry g runs as Winograd with this process's
 * kernel thread count and setting. */
int dt_cpu_conv_winograd_eligible(const dt_conv2d_geom *g);
/* Overrides DT_CPU_MEMORY_LIMIT for CPU devices (0 = no cap). For tests. */
void dt_cpu_set_memory_limit(size_t bytes);
/* Where the CPU allocator's cap comes from, for `dtrain doctor` and the
 * out-of-memory message: "DT_CPU_MEMORY_LIMIT", "no cap", or the default's
 * derivation ("default: 3.50 GiB of the 4.00 GiB MemAvailable leaves").
 * Static text, valid until the cap changes. */
const char *dt_cpu_memory_limit_source(void);

/* ---- the memory this process may use (core/cpu_host_memory.c) ----
 *
 * Without DT_CPU_MEMORY_LIMIT the CPU allocator caps the live tensors of
 * all CPU devices together at what the process may really use, less
 * headroom, so that a runaway batch fails with an out-of-memory error
 * instead of growing into the kernel's OOM killer (or, under `ulimit -v`,
 * into OpenBLAS, which retries a failed buffer mmap for ever). The figures
 * are read once; the derivation is a pure function of them. */

/* OpenBLAS (0.3.21, x86_64) maps a buffer of 128 MiB for every thread of
 * its pool and for every thread that calls it; with the header and malloc's
 * slack, this much address space each. */
#define DT_HOST_BLAS_BUFFER_BYTES ((size_t)129 << 20)
/* Address space kept free beside OpenBLAS's buffers (the first tensors,
 * thread stacks) when deciding what fits. */
#define DT_HOST_MIN_ROOM ((size_t)64 << 20)

typedef struct dt_host_memory {
  size_t cgroup_limit;  /* the tightest cgroup memory limit above us; 0 = none */
  size_t cgroup_used;   /* that cgroup's usage less its page cache */
  size_t mem_available; /* /proc/meminfo MemAvailable; 0 = unknown */
  size_t as_limit;      /* RLIMIT_AS (ulimit -v), soft; 0 = unlimited */
  size_t as_used;       /* the address space mapped now (VmSize) */
  size_t data_limit;    /* RLIMIT_DATA (ulimit -d), soft; 0 = unlimited */
  size_t data_used;     /* the data segment and private writable maps now (VmData) */
} dt_host_memory;

typedef enum dt_host_cap_source {
  DT_HOST_CAP_NONE = 0, /* nothing limits the process that dtrain could read */
  DT_HOST_CAP_CGROUP,
  DT_HOST_CAP_MEM_AVAILABLE,
  DT_HOST_CAP_RLIMIT_AS,
  DT_HOST_CAP_RLIMIT_DATA,
} dt_host_cap_source;

typedef struct dt_host_memory_cap {
  size_t bytes;              /* the cap; 0 with DT_HOST_CAP_NONE */
  size_t room;               /* what the binding source leaves this process */
  dt_host_cap_source source; /* the binding (smallest) source */
} dt_host_memory_cap;

/* Reads the figures: /proc/self/cgroup and the cgroup's (v2 memory.max,
 * memory.current, memory.stat; v1 memory.limit_in_bytes, usage, stat) up
 * to the hierarchy's root, /proc/meminfo, /proc/self/status, getrlimit.
 * What cannot be read stays 0 (unknown, unlimited). */
void dt_host_memory_read(dt_host_memory *out);
/* Reads only the address-space figures (as_*, data_*); the rest 0. Safe
 * before the libraries' constructors have run. */
void dt_host_memory_read_rlimits(dt_host_memory *out);
/* The value of `key` ("MemAvailable:", "VmSize:", "anon", "total_cache")
 * in text of "key value [kB]" lines, in bytes; false when it is absent. */
bool dt_host_memory_field(const char *text, const char *key, size_t *out);
/* The address space the process may still map (the smaller of RLIMIT_AS's
 * and RLIMIT_DATA's rooms); SIZE_MAX when neither is limited. */
size_t dt_host_address_room(const dt_host_memory *m);
/* Address space still to keep for OpenBLAS's buffers when `threads` CPU
 * threads run: one per pool thread and one per calling thread, less the
 * `mapped` buffers it holds already. */
size_t dt_host_blas_reserve(int threads, int mapped);
/* The threads of OpenBLAS's pool as it starts (its constructor maps a
 * buffer for each): OMP_NUM_THREADS when it is a positive number, else
 * the configured CPUs; at least 1. */
int dt_host_blas_pool(const char *omp_num_threads, long cpus);
/* The address space OpenBLAS needs to start with a pool of `pool` threads
 * and then serve one caller, with DT_HOST_MIN_ROOM to spare. */
size_t dt_host_blas_room_needed(int pool);
/* The most threads, 1..want, whose OpenBLAS buffers fit the address space
 * left (with DT_HOST_MIN_ROOM to spare); want when it is not limited. */
int dt_host_blas_threads_fitting(const dt_host_memory *m, int want, int mapped);
/* The default cap: the room of the tightest source (cgroup limit less its
 * use, MemAvailable, RLIMIT_AS / RLIMIT_DATA less what is mapped and
 * `address_reserve`), less headroom for what is not a tensor: an eighth of
 * the room (the allocator's size classes round a block up by at most an
 * eighth; kernel scratch, loader batches and the cache scale with the
 * batch too), and at least 256 MiB or half the room, whichever is smaller
 * (libraries, thread stacks, MPI). At least 1 MiB when a source exists. */
dt_host_memory_cap dt_host_memory_default_cap(const dt_host_memory *m, size_t address_reserve);
/* "3.50 GiB of the 4.00 GiB MemAvailable leaves" and the like. */
char *dt_host_memory_cap_describe(const dt_host_memory_cap *c, char *buf, size_t cap);

#ifdef __cplusplus
}
#endif
#endif
