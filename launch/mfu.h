/* Model FLOPs utilisation: the training FLOPs a model needs per second
 * (the task's flops_per_sample times the samples per second) over what the
 * device can do at its peak.
 *
 * The peak: for a known GPU a table (dense tensor-core figures from
 * NVIDIA's data sheets: A100 19.5 / 156 / 312 TFLOP/s at f32 / TF32 /
 * bf16; H100 SXM and H200 67 / 495 / 989, H100 PCIe 51 / 378 / 756), at
 * TF32 when TF32 is on (DT_CUDA_TF32, the default) and f32 otherwise, as
 * dtrain trains in f32; for the CPU the measured roof of a square sgemm
 * (1024^3 through the CPU backend with this thread's thread count, the
 * best of a few runs, measured once per thread count and cached). */
#ifndef DT_LAUNCH_MFU_H
#define DT_LAUNCH_MFU_H

#include <stddef.h>

#include "core/device.h"
#include "core/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct dt_peak_flops {
  double flops;    /* FLOP/s, > 0 */
  char source[96]; /* "H200 tf32 (table)", "cpu sgemm 1024^3, 2 threads (measured)" */
} dt_peak_flops;

/* The peak of `dev`. A GPU not in the table: DT_ERR_UNSUPPORTED naming it
 * (the caller prints no MFU). */
dt_status dt_mfu_peak(dt_device dev, dt_peak_flops *out);

/* The peak for a GPU of this name (cudaDeviceProp.name, e.g. "NVIDIA
 * H100 80GB HBM3") at "f32", "tf32" or "bf16"; 0 when unknown. */
double dt_mfu_gpu_peak(const char *gpu_name, const char *precision);

#ifdef __cplusplus
}
#endif
#endif
