/* The CUDA backend's own API, beyond the dt_backend_ops table it registers:
 * availability and versions (for `dtrain doctor`), pinned host memory,
 * the CUDA handles behind dt_stream / dt_event, TF32 and memory caps, and a
 * mixed-precision GEMM.
 *
 * Linking //cuda registers the backend for DT_DEVICE_CUDA (a constructor
 * in cuda/backend.c). Nothing here needs the CUDA headers: handles are
 * passed as void * (cast to cudaStream_t / cudaEvent_t). In a build without
 * CUDA (no toolkit, or --config=cpu) the same functions exist and fail with
 * DT_ERR_UNSUPPORTED, and dt_cuda_doctor says that CUDA was not built in.
 */
#ifndef DT_CUDA_CUDA_H
#define DT_CUDA_CUDA_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "core/backend.h"
#include "core/status.h"
#include "core/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- availability ---- */

/* 1 when this binary was built with the CUDA toolkit, else 0. */
int dt_cuda_built(void);

/* DT_OK when at least one GPU is usable. Otherwise the reason, with the
 * message set: DT_ERR_UNSUPPORTED (built without CUDA), DT_ERR_NO_DEVICE
 * (no driver, or no GPU visible), DT_ERR_VERSION (the driver is older than
 * the CUDA runtime dtrain was built with), DT_ERR_CUDA (anything else).
 * Cheap after the first call (the probe runs once). */
dt_status dt_cuda_probe(void);

typedef struct dt_cuda_versions {
  int driver;  /* cudaDriverGetVersion, e.g. 13000 = 13.0; 0 = no driver */
  int runtime; /* cudaRuntimeGetVersion (the toolkit dtrain was built with) */
  int cublas;  /* cublasGetVersion, e.g. 130001; 0 = unknown */
  int cudnn;   /* cudnnGetVersion, e.g. 91900; 0 = unknown */
  int nccl;    /* ncclGetVersion via libnccl.so.2, e.g. 22805; 0 = not found */
  /* What the build's headers said (loaded libraries may differ). */
  int built_runtime, built_cudnn, built_nccl;
} dt_cuda_versions;

/* Fills what can be found; never fails for a missing GPU (fields stay 0). */
dt_status dt_cuda_get_versions(dt_cuda_versions *out);

typedef struct dt_cuda_device_info {
  int index;
  char name[256];
  size_t total_memory; /* bytes */
  size_t free_memory;  /* bytes, at the time of the call */
  int cc_major, cc_minor;
  int multiprocessors;
} dt_cuda_device_info;

/* Properties of GPU `index` (0 .. dt_device_count(DT_DEVICE_CUDA)-1). */
dt_status dt_cuda_get_device_info(int index, dt_cuda_device_info *out);

/* Whether GPU `i` can read and write GPU `j`'s memory directly
 * (cudaDeviceCanAccessPeer: NVLink or PCIe peer-to-peer), indices relative
 * to CUDA_VISIBLE_DEVICES; *ok = 1 for i == j. NCCL uses P2P between such
 * GPUs and host shared memory between the others. DT_ERR_NO_DEVICE for an
 * index that is not visible; DT_ERR_UNSUPPORTED without CUDA. */
dt_status dt_cuda_peer_access(int i, int j, int *ok);

/* The `dtrain doctor` section on CUDA: build, driver and runtime versions
 * and whether they are compatible, each GPU (name, memory, compute
 * capability and whether this build has code for it), cuBLAS, cuDNN and
 * NCCL versions, each problem with advice. Writes human-readable lines to
 * `out`; *problems (may be NULL) gets the number of problems found (0 =
 * CUDA is ready). A machine with no GPU is a problem, not an error: the
 * return is DT_OK unless writing fails. */
dt_status dt_cuda_doctor(FILE *out, int *problems);

/* ---- pinned (page-locked) host memory, cached like device memory ---- */

/* Page-locked host memory (cudaHostAlloc, portable) of at least `bytes`,
 * from a cache; release with dt_cuda_pinned_free. Do not free a buffer
 * while an asynchronous copy from/to it may still run: synchronise the
 * stream or an event recorded after the copy first. */
dt_status dt_cuda_pinned_alloc(size_t bytes, void **out);
void dt_cuda_pinned_free(void *ptr); /* NULL is a no-op */
dt_status dt_cuda_pinned_stats(dt_memory_stats *out);
dt_status dt_cuda_pinned_empty_cache(void);

/* ---- streams and events ---- */

/* The cudaStream_t of a backend stream (dt_backend_ops.stream); NULL for
 * NULL. */
void *dt_cuda_stream_handle(dt_stream *s);
/* The cudaEvent_t of a backend event. */
void *dt_cuda_event_handle(dt_event *ev);

/* Timing marks, for timeline checks (tests/cuda_loader_test.cc,
 * tools/gpu_check.sh): an event with timing, recorded on a backend stream
 * of its device. The backend's own events have no timing (cheaper). */
typedef struct dt_cuda_mark dt_cuda_mark;
dt_status dt_cuda_mark_create(dt_device dev, dt_cuda_mark **out);
void dt_cuda_mark_destroy(dt_cuda_mark *m); /* NULL is a no-op */
dt_status dt_cuda_mark_record(dt_cuda_mark *m, dt_stream *s);
/* *ms = time from mark a to mark b (negative when b came first), waiting
 * for both to complete. */
dt_status dt_cuda_mark_elapsed(dt_cuda_mark *a, dt_cuda_mark *b, float *ms);
/* *done = 1 when the work before the mark has completed (no wait). */
dt_status dt_cuda_mark_query(dt_cuda_mark *m, int *done);

/* ---- timing and NVTX, for traces ---- */

/* A new timing event (a cudaEvent_t) recorded now on the compute stream of
 * `dev`; destroy it with dt_cuda_timer_destroy. */
dt_status dt_cuda_timer_record(dt_device dev, void **event);
/* Milliseconds between two timer events on the device (waits for `end`). */
dt_status dt_cuda_timer_elapsed_ms(void *start, void *end, double *ms);
void dt_cuda_timer_destroy(void *event); /* NULL is a no-op */
/* NVTX ranges on the calling thread (nvtxRangePushA / nvtxRangePop), so that
 * Nsight Systems shows dtrain's span names; no-ops without CUDA. */
void dt_cuda_nvtx_push(const char *name);
void dt_cuda_nvtx_pop(void);

/* ---- settings ---- */

/* TF32 tensor cores for f32 GEMMs (default on, DT_CUDA_TF32=0 turns it
 * off): ~10 bits of mantissa in the products, several times the speed on
 * A100/H100. Applies to every device, from the next GEMM. */
void dt_cuda_set_tf32(int enabled);
int dt_cuda_tf32_enabled(void);

/* Caps what the caching allocator of GPU `index` may reserve (0 = no cap);
 * overrides DT_CUDA_MEMORY_LIMIT. */
dt_status dt_cuda_set_memory_limit(int index, size_t bytes);
/* 1 when cuda:index takes its segments from the stream-ordered allocator,
 * so that releasing them (dt_empty_cache, the OOM retry) never waits for
 * the device; 0 for the cudaFree fallback (segments are then released
 * only while the device is idle) or before the device's first use. */
int dt_cuda_stream_ordered_memory(int index);

/* ---- mixed-precision GEMM ---- */

/* As dt_backend_ops.gemm (row-major, same argument meaning) with the
 * element types given: a and b f32, f16 or bf16 (the same), c f32 or the
 * type of a; accumulation in f32. */
dt_status dt_cuda_gemm_ex(dt_device dev, int trans_a, int trans_b, int m, int n, int k, float alpha,
                          const void *a, int lda, int64_t stride_a, const void *b, int ldb,
                          int64_t stride_b, dt_dtype ab_type, float beta, void *c, int ldc,
                          int64_t stride_c, dt_dtype c_type, int batch);

/* How the 16-bit GEMMs of a device ran since it was first used: through
 * cuBLASLt, or through cublasGemmStridedBatchedEx where cuBLASLt's
 * heuristic had no algorithm (cuda/blas.c); gelu_calls = the cuBLASLt
 * calls with a GELU epilogue (GELU_AUX, GELU_AUX_BIAS, DGELU: the MLP's
 * fused kernels; their fallbacks are plain GEMMs and GELU kernels); plans
 * = the cached cuBLASLt plans. */
typedef struct dt_cuda_gemm_counts {
  int64_t lt_calls, fallback_calls, plans, gelu_calls;
} dt_cuda_gemm_counts;
dt_status dt_cuda_gemm_counts_get(dt_device dev, dt_cuda_gemm_counts *out);

/* How the 16-bit batch norms of a device ran since it was first used
 * (cuda/dnn.c): through cuDNN on the 16-bit tensors, or on f32 copies
 * (an f32 x with a 16-bit y, or cuDNN declined the 16-bit call: then
 * `declined` counts it too). Forward and backward calls alike. */
typedef struct dt_cuda_bn_counts {
  int64_t half_cudnn, f32_copies, declined;
} dt_cuda_bn_counts;
dt_status dt_cuda_bn_counts_get(dt_device dev, dt_cuda_bn_counts *out);

#ifdef __cplusplus
}
#endif
#endif
