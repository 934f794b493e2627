/* The CUDA section of `dtrain doctor`: what was built, what the machine has,
 * whether they fit together, and what to do about each problem. Works with
 * no driver and no GPU (that is one of the things it reports). */
#include <stdio.h>
#include <string.h>

#include "core/memory.h"
#include "cuda/cuda.h"
#include "cuda/cuda_internal.h"

static void version_str(int v, int scale_major, int scale_minor, char *buf, size_t cap) {
  /* e.g. 13000 with (1000, 10) -> "13.0"; 91900 with (10000, 100) -> "9.19" */
  snprintf(buf, cap, "%d.%d", v / scale_major, (v % scale_major) / scale_minor);
}

/* Machine code in this build: sm_80 and sm_90 SASS, compute_90 PTX (see
 * CUDA_GENCODE in third_party/cuda_rules.bzl). */
static const char *arch_support(int major, int minor, int *problem) {
  *problem = 0;
  (void)minor;
  if (major == 8 || major == 9)
    return "native code (sm_80/sm_90)";
  if (major > 9)
    return "runs the compute_90 PTX, compiled by the driver at first use (slow start-up once; "
           "add the GPU's sm_XX to CUDA_GENCODE for native code)";
  *problem = 1;
  return "NOT SUPPORTED: this build carries code for compute capability 8.0 and newer only; "
         "add the GPU's architecture to CUDA_GENCODE in third_party/cuda_rules.bzl and rebuild";
}

#define OUT(...)                       \
  do {                                 \
    if (fprintf(out, __VA_ARGS__) < 0) \
      goto write_failed;               \
  } while (0)

dt_status dt_cuda_doctor(FILE *out, int *problems) {
  int nprob = 0;
  dt_cuda_versions v;
  dt_cuda_get_versions(&v);
  char rt[16], drv[16];
  version_str(v.runtime, 1000, 10, rt, sizeof rt);
  version_str(v.driver, 1000, 10, drv, sizeof drv);

  OUT("CUDA\n");
  char built[16];
  version_str(v.built_runtime, 1000, 10, built, sizeof built);
  OUT("  build:    CUDA runtime %s loaded (built against %s); code for sm_80, sm_90 (+ "
      "compute_90 PTX)\n",
      rt, built);
  if (v.driver == 0) {
    OUT("  driver:   none found (libcuda.so.1 not loadable)\n");
  } else {
    OUT("  driver:   supports CUDA up to %s -> %s\n", drv,
        v.driver >= v.runtime ? "compatible with the runtime"
                              : "OLDER than the runtime dtrain was built with");
  }
  OUT("  cuBLAS:   %d.%d.%d\n", v.cublas / 10000, (v.cublas % 10000) / 100, v.cublas % 100);
  if (v.cudnn)
    OUT("  cuDNN:    %d.%d.%d loaded (built against %d.%d.%d)\n", v.cudnn / 10000,
        (v.cudnn % 10000) / 100, v.cudnn % 100, v.built_cudnn / 10000,
        (v.built_cudnn % 10000) / 100, v.built_cudnn % 100);
  else
    OUT("  cuDNN:    version unknown\n");
  if (v.nccl) {
    OUT("  NCCL:     %d.%d.%d loaded (built against %d.%d.%d)\n", v.nccl / 10000,
        (v.nccl % 10000) / 100, v.nccl % 100, v.built_nccl / 10000, (v.built_nccl % 10000) / 100,
        v.built_nccl % 100);
  } else {
    nprob++;
    OUT("  NCCL:     not found (libnccl.so.2): multi-GPU training over NCCL "
        "(--comm-backend auto|nccl) needs it; put its directory on LD_LIBRARY_PATH (pip's "
        "nvidia/nccl/lib works)\n");
  }

  dt_status probe = dt_cuda_probe();
  if (probe != DT_OK) {
    nprob++;
    OUT("  GPUs:     none usable: %s\n", dt_last_error());
    dt_clear_error();
  } else {
    int n = dt_cuda_device_count();
    for (int i = 0; i < n; i++) {
      dt_cuda_device_info info;
      if (dt_cuda_get_device_info(i, &info) != DT_OK) {
        nprob++;
        OUT("  GPU %d:    cannot query: %s\n", i, dt_last_error());
        dt_clear_error();
        continue;
      }
      int bad = 0;
      const char *code = arch_support(info.cc_major, info.cc_minor, &bad);
      nprob += bad;
      char total[32], free_b[32];
      dt_format_bytes(info.total_memory, total, sizeof total);
      dt_format_bytes(info.free_memory, free_b, sizeof free_b);
      OUT("  GPU %d:    %s, %s (%s free), compute capability %d.%d, %d SMs: %s\n", i, info.name,
          total, free_b, info.cc_major, info.cc_minor, info.multiprocessors, code);
    }
  }
  OUT("  TF32:     %s for f32 GEMMs and convolutions (DT_CUDA_TF32=0 turns it off)\n",
      dt_cuda_tf32_enabled() ? "on" : "off");
  if (nprob == 0)
    OUT("  summary:  CUDA is ready\n");
  else
    OUT("  summary:  %d problem%s above; --device cpu works regardless\n", nprob,
        nprob == 1 ? "" : "s");
  if (problems)
    *problems = nprob;
  return DT_OK;
write_failed:
  return DT_ERROR(DT_ERR_IO, "dtrain doctor: writing the CUDA report failed");
}
