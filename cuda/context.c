/* The CUDA backend's process state: the availability probe (driver, runtime,
 * devices), per-device contexts (streams, cuBLAS and cuDNN handles, the
 * caching allocator, scratch), settings read from the environment (here
 * only: DT_CUDA_TF32, DT_CUDA_MEMORY_LIMIT, DT_CUDNN_BENCHMARK), error
 * translation, versions and device properties. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <nccl.h> /* the version the build was made against; not linked */
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/env.h"
#include "core/memory.h"
#include "cuda/cuda.h"
#include "cuda/cuda_internal.h"

/* ---- error translation ---- */

static int current_device(void) {
  int d = -1;
  if (cudaGetDevice(&d) != cudaSuccess)
    return -1;
  return d;
}

static const char *cuda_advice(cudaError_t e) {
  switch (e) {
    case cudaErrorMemoryAllocation:
      return "the GPU is out of memory: reduce the micro-batch size or use gradient "
             "accumulation (--accum N); `nvidia-smi` shows other processes on the GPU";
    case cudaErrorInsufficientDriver:
      return "the NVIDIA driver is older than the CUDA runtime dtrain was built with: update "
             "the driver or rebuild with an older toolkit (`dtrain doctor` shows both versions)";
    case cudaErrorNoDevice:
      return "no GPU is visible: check CUDA_VISIBLE_DEVICES and `nvidia-smi`, or use --device cpu";
    case cudaErrorIllegalAddress:
    case cudaErrorLaunchFailure:
      return "a kernel faulted and the CUDA context is unusable: rerun with "
             "CUDA_LAUNCH_BLOCKING=1 (and compute-sanitizer) to find the kernel";
    case cudaErrorNoKernelImageForDevice:
    case cudaErrorUnsupportedPtxVersion:
      return "this build has no code for this GPU: dtrain carries sm_80/sm_90 machine code and "
             "compute_90 PTX; rebuild with the GPU's architecture added to CUDA_GENCODE in "
             "third_party/cuda_rules.bzl";
    default:
      return "CUDA errors from earlier asynchronous work surface at the next call: rerun with "
             "CUDA_LAUNCH_BLOCKING=1 to find the failing kernel";
  }
}

dt_status dt_cuda_fail(cudaError_t e, const char *stmt, const char *func, const char *file,
                       int line) {
  dt_status s = DT_ERR_CUDA;
  if (e == cudaErrorMemoryAllocation)
    s = DT_ERR_OOM;
  else if (e == cudaErrorNoDevice)
    s = DT_ERR_NO_DEVICE;
  else if (e == cudaErrorInsufficientDriver)
    s = DT_ERR_VERSION;
  return dt_error_set(s, func, file, line, "CUDA error %s (%s) on cuda:%d in `%s`: %s",
                      cudaGetErrorName(e), cudaGetErrorString(e), current_device(), stmt,
                      cuda_advice(e));
}

/* The status of a cuBLAS or cuDNN error, by its class: out of memory, not
 * supported, a bad argument, else DT_ERR_CUDA. */
static dt_status library_status(bool alloc_failed, bool not_supported, bool bad_param) {
  return alloc_failed    ? DT_ERR_OOM
         : not_supported ? DT_ERR_UNSUPPORTED
         : bad_param     ? DT_ERR_INVALID_ARG
                         : DT_ERR_CUDA;
}

dt_status dt_cublas_fail(cublasStatus_t e, const char *stmt, const char *func, const char *file,
                         int line) {
  dt_status s = library_status(e == CUBLAS_STATUS_ALLOC_FAILED, e == CUBLAS_STATUS_NOT_SUPPORTED,
                               e == CUBLAS_STATUS_INVALID_VALUE);
  return dt_error_set(s, func, file, line, "cuBLAS error %s (%s) on cuda:%d in `%s`%s",
                      cublasGetStatusName(e), cublasGetStatusString(e), current_device(), stmt,
                      e == CUBLAS_STATUS_ALLOC_FAILED
                          ? ": out of GPU memory for cuBLAS workspace: reduce the batch size"
                          : ": check the GEMM sizes and leading dimensions");
}

dt_status dt_cudnn_fail(cudnnStatus_t e, const char *stmt, const char *func, const char *file,
                        int line) {
  dt_status s = library_status(e == CUDNN_STATUS_ALLOC_FAILED, e == CUDNN_STATUS_NOT_SUPPORTED,
                               e == CUDNN_STATUS_BAD_PARAM);
  return dt_error_set(
      s, func, file, line, "cuDNN error %d (%s) on cuda:%d in `%s`%s", (int)e,
      cudnnGetErrorString(e), current_device(), stmt,
      s == DT_ERR_UNSUPPORTED ? ": cuDNN has no algorithm for this shape/configuration" : "");
}

/* ---- probe: is there a usable GPU? ---- */

static pthread_once_t probe_once = PTHREAD_ONCE_INIT;
static dt_status probe_status = DT_ERR_NO_DEVICE;
static char probe_message[1024];
static int probe_devices;

/* The kernel module's version from /proc ("535.104.05"), or "" when absent. */
static void kernel_driver_version(char *buf, size_t cap) {
  buf[0] = '\0';
  FILE *f = fopen("/proc/driver/nvidia/version", "r");
  if (!f)
    return;
  char line[512];
  if (fgets(line, sizeof line, f)) {
    /* "NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.104.05  Thu ..." */
    const char *p = strstr(line, "Module");
    if (p) {
      p += strlen("Module");
      while (*p == ' ')
        p++;
      size_t n = strcspn(p, " \n");
      if (n >= cap)
        n = cap - 1;
      memcpy(buf, p, n);
      buf[n] = '\0';
    }
  }
  fclose(f);
}

static void probe_run(void) {
  int drv = 0, rt = 0, n = 0;
  cudaDriverGetVersion(&drv);
  cudaRuntimeGetVersion(&rt);
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e == cudaSuccess && n > 0) {
    probe_devices = n < DT_CUDA_MAX_DEVICES ? n : DT_CUDA_MAX_DEVICES;
    probe_status = DT_OK;
    return;
  }
  cudaGetLastError(); /* clear the sticky-free error of the failed query */
  char kver[64];
  kernel_driver_version(kver, sizeof kver);
  if (drv == 0) {
    probe_status = DT_ERR_NO_DEVICE;
    snprintf(probe_message, sizeof probe_message,
             "no NVIDIA driver found (libcuda.so.1 could not be loaded; cudaGetDeviceCount: "
             "%s): this machine has no usable GPU; install the NVIDIA driver, or use --device "
             "cpu",
             cudaGetErrorString(e));
  } else if (drv < rt) {
    probe_status = DT_ERR_VERSION;
    snprintf(probe_message, sizeof probe_message,
             "CUDA driver %s supports up to CUDA %d.%d but dtrain was built with runtime "
             "%d.%d: update the driver or rebuild with an older toolkit (cudaGetDeviceCount: %s)",
             kver[0] ? kver : "(version unknown)", drv / 1000, (drv % 1000) / 10, rt / 1000,
             (rt % 1000) / 10, cudaGetErrorString(e));
  } else if (e == cudaSuccess || e == cudaErrorNoDevice) {
    const char *vis = getenv("CUDA_VISIBLE_DEVICES");
    probe_status = DT_ERR_NO_DEVICE;
    snprintf(probe_message, sizeof probe_message,
             "the NVIDIA driver (CUDA %d.%d) sees no GPU (CUDA_VISIBLE_DEVICES=%s): check "
             "`nvidia-smi` and CUDA_VISIBLE_DEVICES, or use --device cpu",
             drv / 1000, (drv % 1000) / 10, vis ? vis : "(unset)");
  } else {
    probe_status = DT_ERR_CUDA;
    snprintf(probe_message, sizeof probe_message,
             "cudaGetDeviceCount failed: %s (%s) with driver CUDA %d.%d and runtime %d.%d: check "
             "`nvidia-smi`, or use --device cpu",
             cudaGetErrorName(e), cudaGetErrorString(e), drv / 1000, (drv % 1000) / 10, rt / 1000,
             (rt % 1000) / 10);
  }
}

int dt_cuda_built(void) { return 1; }

dt_status dt_cuda_probe(void) {
  pthread_once(&probe_once, probe_run);
  if (probe_status == DT_OK)
    return DT_OK;
  return DT_ERROR(probe_status, "%s", probe_message);
}

int dt_cuda_device_count(void) {
  pthread_once(&probe_once, probe_run);
  return probe_devices;
}

/* ---- settings ---- */

static atomic_int tf32_setting = -1; /* -1: not read from the environment yet */

int dt_cuda_tf32_enabled(void) {
  int v = atomic_load(&tf32_setting);
  if (v < 0) {
    bool on = true;
    dt_env_bool(DT_ENV_CUDA_TF32, &on); /* a bad value keeps the default (dtrain refuses it) */
    v = on;
    int expected = -1;
    atomic_compare_exchange_strong(&tf32_setting, &expected, v);
    v = atomic_load(&tf32_setting);
  }
  return v;
}

void dt_cuda_set_tf32(int enabled) { atomic_store(&tf32_setting, enabled ? 1 : 0); }

dt_status dt_cuda_ctx_sync_math_mode(dt_cuda_ctx *ctx) {
  int want = dt_cuda_tf32_enabled();
  if (ctx->cublas_tf32 != want) {
    DT_CUBLAS_CHECK(
        cublasSetMathMode(ctx->cublas, want ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_DEFAULT_MATH));
    ctx->cublas_tf32 = want;
  }
  return DT_OK;
}

dt_status dt_cuda_fence_after_compute(dt_cuda_ctx *ctx, cudaStream_t s) {
  cudaStream_t compute = dt_cuda_compute_stream(ctx);
  if (s == compute)
    return DT_OK;
  pthread_mutex_lock(&ctx->fence_lock);
  cudaError_t e = cudaEventRecord(ctx->fence, compute);
  if (e == cudaSuccess)
    e = cudaStreamWaitEvent(s, ctx->fence, 0);
  pthread_mutex_unlock(&ctx->fence_lock);
  DT_CUDA_CHECK(e);
  return DT_OK;
}

/* The slots start empty, the error unclaimed; the one sync at creation
 * makes that visible to every stream. */
static dt_status index_check_create(dt_cuda_ctx *c) {
  dt_cuda_index_check *ic = &c->index_check;
  size_t slots = 3 * sizeof *ic->slots;
  DT_CUDA_CHECK(cudaMalloc((void **)&ic->slots, slots + sizeof(int)));
  ic->claim = (int *)(ic->slots + 3);
  DT_CUDA_CHECK(cudaHostAlloc((void **)&ic->error, sizeof *ic->error,
                              cudaHostAllocMapped | cudaHostAllocPortable));
  memset(ic->error, 0, sizeof *ic->error);
  DT_CUDA_CHECK(cudaHostGetDevicePointer((void **)&ic->error_dev, ic->error, 0));
  cudaStream_t s = dt_cuda_compute_stream(c);
  DT_CUDA_CHECK(cudaMemsetAsync(ic->slots, 0xff, slots, s));
  DT_CUDA_CHECK(cudaMemsetAsync(ic->claim, 0, sizeof(int), s));
  for (int k = 0; k < 3; k++)
    DT_CUDA_CHECK(cudaMemsetAsync(&ic->slots[k].kept, 0, sizeof ic->slots[k].kept, s));
  DT_CUDA_CHECK(cudaStreamSynchronize(s));
  return DT_OK;
}

static void index_check_destroy(dt_cuda_ctx *c) {
  if (c->index_check.slots)
    cudaFree(c->index_check.slots);
  if (c->index_check.error)
    cudaFreeHost(c->index_check.error);
}

dt_status dt_cuda_take_index_error(dt_cuda_ctx *ctx) {
  volatile dt_cuda_index_error *e = ctx->index_check.error;
  if (!e || !e->set)
    return DT_OK;
  dt_cuda_index_error r = {e->set, e->kind, e->position, e->value, e->bound, e->ignore_index};
  e->set = 0;
  /* Unclaim in stream order: a failure queued before this point and not
   * yet run may still claim the record (and is reported next time). */
  DT_CUDA_CHECK(
      cudaMemsetAsync(ctx->index_check.claim, 0, sizeof(int), dt_cuda_compute_stream(ctx)));
  /* The CPU's messages (core/cpu_kernels_loss.c, cpu_kernels_embedding.c), word for word, then
   * where the GPU found it. */
  if (r.kind != DT_CUDA_INDEX_EMBEDDING)
    return DT_ERROR(
        DT_ERR_INVALID_ARG,
        "%s: target %lld at row %lld is outside [0, %lld) and is not ignore_index "
        "(%lld): check the labels against the number of classes (found on cuda:%d "
        "by a kernel queued before this synchronisation)",
        r.kind == DT_CUDA_INDEX_CLASSIFIER ? "classifier_loss_forward" : "cross_entropy_forward",
        r.value, r.position, r.bound, r.ignore_index, ctx->index);
  return DT_ERROR(DT_ERR_INVALID_ARG,
                  "embedding_forward: index %lld at position %lld is outside [0, %lld): check the "
                  "token ids against the vocabulary size (found on cuda:%d by a kernel queued "
                  "before this synchronisation)",
                  r.value, r.position, r.bound, ctx->index);
}

int dt_cuda_cudnn_benchmark(void) {
  static atomic_int setting = -1;
  int v = atomic_load(&setting);
  if (v < 0) {
    bool on = false;
    dt_env_bool(DT_ENV_CUDNN_BENCHMARK, &on); /* a bad value keeps the default */
    v = on;
    atomic_store(&setting, v);
  }
  return v;
}

static dt_status memory_limit_from_env(size_t *out) {
  *out = 0;
  return dt_env_bytes(DT_ENV_CUDA_MEMORY_LIMIT, out);
}

/* ---- contexts ---- */

static pthread_mutex_t ctx_lock = PTHREAD_MUTEX_INITIALIZER;
static _Atomic(dt_cuda_ctx *) ctxs[DT_CUDA_MAX_DEVICES];

static dt_status ctx_create(int index, dt_cuda_ctx **out) {
  dt_status st = DT_OK;
  dt_cuda_ctx *c = calloc(1, sizeof *c);
  if (!c)
    return DT_ERROR(DT_ERR_OOM, "cuda context: host malloc failed");
  c->index = index;
  c->cublas_tf32 = -1;
  pthread_mutex_init(&c->scratch_lock, NULL);
  pthread_mutex_init(&c->conv_lock, NULL);
  pthread_mutex_init(&c->gemm_lock, NULL);
  pthread_mutex_init(&c->fence_lock, NULL);
  DT_CUDA_CHECK_GOTO(cudaSetDevice(index), st, fail);
  struct cudaDeviceProp prop;
  DT_CUDA_CHECK_GOTO(cudaGetDeviceProperties(&prop, index), st, fail);
  snprintf(c->name, sizeof c->name, "%s", prop.name);
  c->total_memory = prop.totalGlobalMem;
  c->cc_major = prop.major;
  c->cc_minor = prop.minor;
  /* The comm stream gets the highest priority, as NCCL's users give it:
   * its collectives then overtake queued compute kernels instead of
   * waiting behind them, which is what lets them overlap backward. */
  int prio_least = 0, prio_greatest = 0;
  DT_CUDA_CHECK_GOTO(cudaDeviceGetStreamPriorityRange(&prio_least, &prio_greatest), st, fail);
  for (int k = 0; k < 3; k++) {
    c->streams[k].device = index;
    c->streams[k].kind = k;
    int prio = k == DT_STREAM_COMM ? prio_greatest : prio_least;
    DT_CUDA_CHECK_GOTO(cudaStreamCreateWithPriority(&c->streams[k].s, cudaStreamNonBlocking, prio),
                       st, fail);
  }
  {
    cublasStatus_t be = cublasCreate(&c->cublas);
    if (be != CUBLAS_STATUS_SUCCESS) {
      st = dt_cublas_fail(be, "cublasCreate(&c->cublas)", __func__, __FILE__, __LINE__);
      goto fail;
    }
    be = cublasSetStream(c->cublas, c->streams[DT_STREAM_COMPUTE].s);
    if (be != CUBLAS_STATUS_SUCCESS) {
      st = dt_cublas_fail(be, "cublasSetStream", __func__, __FILE__, __LINE__);
      goto fail;
    }
  }
  DT_CHECK_GOTO(dt_cuda_ctx_sync_math_mode(c), st, fail);
  DT_CUBLAS_CHECK_GOTO(cublasLtCreate(&c->cublaslt), st, fail);
  DT_CUDA_CHECK_GOTO(cudaEventCreateWithFlags(&c->fence, cudaEventDisableTiming), st, fail);
  DT_CUDNN_CHECK_GOTO(cudnnCreate(&c->cudnn), st, fail);
  DT_CUDNN_CHECK_GOTO(cudnnSetStream(c->cudnn, c->streams[DT_STREAM_COMPUTE].s), st, fail);
  DT_CUDA_CHECK_GOTO(cudaMalloc(&c->dev_scratch, DT_CUDA_SCRATCH_BYTES), st, fail);
  DT_CUDA_CHECK_GOTO(cudaHostAlloc(&c->host_scratch, DT_CUDA_SCRATCH_BYTES, cudaHostAllocPortable),
                     st, fail);
  DT_CHECK_GOTO(index_check_create(c), st, fail);
  DT_CHECK_GOTO(dt_cuda_pool_create(c, &c->pool), st, fail);
  {
    size_t limit = 0;
    DT_CHECK_GOTO(memory_limit_from_env(&limit), st, fail);
    dt_block_pool_set_limit(c->pool, limit);
  }
  *out = c;
  return DT_OK;
fail:
  /* Creation failures leave handles behind only on a broken GPU; release
   * what is cheap to release. */
  if (c->cudnn)
    cudnnDestroy(c->cudnn);
  if (c->cublaslt)
    cublasLtDestroy(c->cublaslt);
  if (c->cublas)
    cublasDestroy(c->cublas);
  if (c->fence)
    cudaEventDestroy(c->fence);
  for (int k = 0; k < 3; k++)
    if (c->streams[k].s)
      cudaStreamDestroy(c->streams[k].s);
  if (c->dev_scratch)
    cudaFree(c->dev_scratch);
  if (c->host_scratch)
    cudaFreeHost(c->host_scratch);
  index_check_destroy(c);
  dt_block_pool_destroy(c->pool);
  free(c);
  return dt_error_wrap(st, "initialising cuda:%d", index);
}

dt_status dt_cuda_ctx_get(dt_device dev, dt_cuda_ctx **out) {
  if (dev.type != DT_DEVICE_CUDA) {
    char b[32];
    return DT_ERROR(DT_ERR_DEVICE_MISMATCH, "the CUDA backend got device %s: pass a cuda:N device",
                    dt_device_format(dev, b, sizeof b));
  }
  int n = dt_cuda_device_count();
  if (dev.index < 0 || dev.index >= n) {
    if (n == 0) {
      dt_status s = dt_cuda_probe();
      return dt_error_wrap(s, "cuda:%d requested", dev.index);
    }
    return DT_ERROR(DT_ERR_NO_DEVICE, "cuda:%d does not exist: %d CUDA device(s) visible",
                    dev.index, n);
  }
  dt_cuda_ctx *c = atomic_load_explicit(&ctxs[dev.index], memory_order_acquire);
  if (!c) {
    pthread_mutex_lock(&ctx_lock);
    c = atomic_load(&ctxs[dev.index]);
    if (!c) {
      dt_status st = ctx_create(dev.index, &c);
      if (st != DT_OK) {
        pthread_mutex_unlock(&ctx_lock);
        return st;
      }
      atomic_store_explicit(&ctxs[dev.index], c, memory_order_release);
    }
    pthread_mutex_unlock(&ctx_lock);
  }
  if (current_device() != dev.index)
    DT_CUDA_CHECK(cudaSetDevice(dev.index));
  *out = c;
  return DT_OK;
}

int dt_cuda_streams_idle(const dt_cuda_ctx *only) {
  for (int i = 0; i < DT_CUDA_MAX_DEVICES; i++) {
    dt_cuda_ctx *c = atomic_load_explicit(&ctxs[i], memory_order_acquire);
    if (!c || (only && c != only))
      continue;
    for (int k = 0; k < 3; k++)
      if (cudaStreamQuery(c->streams[k].s) != cudaSuccess) {
        cudaGetLastError(); /* cudaErrorNotReady is not sticky */
        return 0;
      }
  }
  return 1;
}

dt_status dt_cuda_exec_begin(const dt_exec *ex, dt_cuda_ctx **ctx, cudaStream_t *stream) {
  DT_CHECK(dt_cuda_ctx_get(ex->dev, ctx));
  if (!ex->stream) {
    *stream = dt_cuda_compute_stream(*ctx);
    return DT_OK;
  }
  if (ex->stream->device != ex->dev.index)
    return DT_ERROR(DT_ERR_DEVICE_MISMATCH,
                    "a kernel for cuda:%d was given a stream of cuda:%d: use a stream of the "
                    "device the kernel runs on",
                    ex->dev.index, ex->stream->device);
  *stream = ex->stream->s;
  return DT_OK;
}

dt_status dt_cuda_set_memory_limit(int index, size_t bytes) {
  dt_cuda_ctx *c = NULL;
  DT_CHECK(dt_cuda_ctx_get((dt_device){DT_DEVICE_CUDA, index}, &c));
  dt_block_pool_set_limit_from(c->pool, bytes, "the program (--max-memory)");
  return DT_OK;
}

/* ---- versions and device properties ---- */

dt_status dt_cuda_get_versions(dt_cuda_versions *out) {
  memset(out, 0, sizeof *out);
  cudaDriverGetVersion(&out->driver);
  cudaRuntimeGetVersion(&out->runtime);
  int ma = 0, mi = 0, pa = 0;
  if (cublasGetProperty(MAJOR_VERSION, &ma) == CUBLAS_STATUS_SUCCESS &&
      cublasGetProperty(MINOR_VERSION, &mi) == CUBLAS_STATUS_SUCCESS &&
      cublasGetProperty(PATCH_LEVEL, &pa) == CUBLAS_STATUS_SUCCESS)
    out->cublas = ma * 10000 + mi * 100 + pa;
  out->cudnn = (int)cudnnGetVersion();
  out->built_runtime = CUDART_VERSION;
  out->built_cudnn = CUDNN_VERSION;
#ifdef NCCL_VERSION_CODE
  out->built_nccl = NCCL_VERSION_CODE;
#endif
  /* NCCL belongs to dist/: look it up without linking it. */
  void *h = dlopen("libnccl.so.2", RTLD_LAZY | RTLD_LOCAL);
  if (h) {
    int (*get)(int *) = (int (*)(int *))dlsym(h, "ncclGetVersion");
    int v = 0;
    if (get && get(&v) == 0)
      out->nccl = v;
    dlclose(h);
  }
  return DT_OK;
}

dt_status dt_cuda_get_device_info(int index, dt_cuda_device_info *out) {
  memset(out, 0, sizeof *out);
  int n = dt_cuda_device_count();
  if (index < 0 || index >= n) {
    if (n == 0)
      return dt_error_wrap(dt_cuda_probe(), "device info for cuda:%d", index);
    return DT_ERROR(DT_ERR_NO_DEVICE, "cuda:%d does not exist: %d CUDA device(s) visible", index,
                    n);
  }
  struct cudaDeviceProp prop;
  DT_CUDA_CHECK(cudaGetDeviceProperties(&prop, index));
  out->index = index;
  snprintf(out->name, sizeof out->name, "%s", prop.name);
  out->total_memory = prop.totalGlobalMem;
  out->cc_major = prop.major;
  out->cc_minor = prop.minor;
  out->multiprocessors = prop.multiProcessorCount;
  int prev = current_device();
  size_t free_b = 0, total_b = 0;
  if (cudaSetDevice(index) == cudaSuccess && cudaMemGetInfo(&free_b, &total_b) == cudaSuccess)
    out->free_memory = free_b;
  if (prev >= 0)
    cudaSetDevice(prev);
  return DT_OK;
}

dt_status dt_cuda_peer_access(int i, int j, int *ok) {
  *ok = 0;
  int n = dt_cuda_device_count();
  if (i < 0 || j < 0 || i >= n || j >= n) {
    if (n == 0)
      return dt_error_wrap(dt_cuda_probe(), "peer access cuda:%d -> cuda:%d", i, j);
    return DT_ERROR(DT_ERR_NO_DEVICE,
                    "peer access cuda:%d -> cuda:%d: %d CUDA device(s) visible "
                    "(CUDA_VISIBLE_DEVICES)",
                    i, j, n);
  }
  if (i == j) {
    *ok = 1;
    return DT_OK;
  }
  int can = 0;
  DT_CUDA_CHECK(cudaDeviceCanAccessPeer(&can, i, j));
  *ok = can != 0;
  return DT_OK;
}
