/* Model FLOPs utilisation: the training FLOPs a model needs per second
 * (the task's flops_per_sample times the samples per second) over what the
 * device can do at its peak.
 *
 * The peak: for a known GPU a table (dense tensor-core figures from
 * NVIDIA's data sheets: A100 19.5 / 156 / 312 TFLOP/s at f32 / TF32 /
 * bf16; H100 SXM and H200 67 / 495 / 989, H100 PCIe 51 / 378 / 756), at
 * the run's precision: bf16 (and fp16, the same rate) under --precision
 * bf16/fp16, else TF32 when TF32 is on (DT_CUDA_TF32, the default) and f32
 * otherwise; for the CPU the measured roof of a square sgemm
 * (1024^3 through the CPU backend with this thread's thread count, cached
 * per thread count).
 *
 * The CPU roof is what the run's cores do at their best, not what they did
 * while other work held them: each of a few timed sgemms counts at the
 * higher of its wall-clock rate and its rate per CPU-second of the process
 * times the thread count (a thread that lost its core for part of the run
 * loses wall time, not CPU time), and the roof is the best run. An MFU
 * above 1 means the roof was still measured low: it is measured again
 * (keeping the higher value), and an MFU still above 1 is not reported as
 * a number (dt_mfu_of: above_roof). */
#ifndef DT_TRAIN_MFU_H
#define DT_TRAIN_MFU_H

#include <stdbool.h>
#include <stddef.h>

#include "core/amp.h"
#include "core/device.h"
#include "core/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The measured CPU roof, kept by the caller between calls (one per run:
 * the library keeps no process-global state). Zero-initialise it. */
typedef struct dt_mfu_cache {
  double roof; /* FLOP/s, 0 = not measured */
  int threads; /* the thread count it was measured at */
  /* the linear roof (dt_mfu_cpu_linear_roof), 0 = not measured; its key */
  double half_roof;
  int half_threads, half_rows;
  dt_precision half_precision;
} dt_mfu_cache;

typedef struct dt_peak_flops {
  double flops;    /* FLOP/s, > 0 */
  char source[96]; /* "H200 tf32 (table)", "cpu sgemm 1024^3, 2 threads (measured)" */
} dt_peak_flops;

/* The peak of `dev` for a run at `precision` (bf16 and fp16 take the dense
 * 16-bit tensor-core figure, tf32 TF32, fp32 plain f32;
 * DT_PRECISION_DEVICE_DEFAULT: TF32 unless DT_CUDA_TF32=0; the CPU roof
 * kept in *cache, NULL = measured anew). A GPU
 * not in the table: DT_ERR_UNSUPPORTED naming it (the caller prints no
 * MFU). The CPU's roof is its sgemm whatever the precision. */
dt_status dt_mfu_peak(dt_device dev, dt_precision precision, dt_mfu_cache *cache,
                      dt_peak_flops *out);

typedef struct dt_mfu {
  double value;    /* achieved / peak in [0, 1]; -1 = unknown or above the roof */
  bool above_roof; /* achieved beat the measured CPU roof, measured again */
  dt_peak_flops peak;
} dt_mfu;

/* The CPU's roof at the GEMM shapes of a run: the FLOP/s of the backend's
 * linear forward and backward (dx and dw: 6 FLOPs per multiply-add) at
 * `rows` rows (the GEMMs' rows of the run: tokens or samples of a
 * micro-batch, clamped to [16, 1024]) of a 768 x 768 weight, the best of a
 * few after a warm-up (as the sgemm roof). At bf16 or fp16, which the CPU
 * has no FMA for, it is the path autocast takes (16-bit x and working copy
 * of the weight, widened into the f32 sgemm, the result rounded to 16
 * bits); at fp32 (tf32 and the default count as fp32) the f32 linear,
 * whose small-row GEMMs reach less than the 1024^3 roof. Kept in *cache per
 * precision, rows and thread count (NULL = measured anew). Another
 * precision: DT_ERR_INVALID_ARG naming it. */
dt_status dt_mfu_cpu_linear_roof(dt_precision precision, int rows, dt_mfu_cache *cache,
                                 dt_peak_flops *out);

/* The MFU of `achieved` FLOP/s per device on devices like `dev` at
 * `precision`: the peak from dt_mfu_peak; a CPU roof that `achieved` exceeds is measured again
 * once per call (the higher value kept), and if it is still exceeded,
 * value -1 and above_roof. Errors: dt_mfu_peak's. */
dt_status dt_mfu_of(dt_device dev, dt_precision precision, dt_mfu_cache *cache, double achieved,
                    dt_mfu *out);

/* The roof of timed runs of `flops` each: the best over the runs of
 * max(flops / wall_s[i], threads * flops / cpu_s[i]) (cpu_s: CPU time of
 * the process, 0 = not known). 0 when no run has a positive time. */
double dt_mfu_roof_of_runs(double flops, const double *wall_s, const double *cpu_s, int n,
                           int threads);

/* The peak for a GPU of this name (cudaDeviceProp.name, e.g. "NVIDIA
 * H100 80GB HBM3") at "f32", "tf32" or "bf16"; 0 when unknown. */
double dt_mfu_gpu_peak(const char *gpu_name, const char *precision);

#ifdef __cplusplus
}
#endif
#endif
