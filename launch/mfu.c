/* Device peaks for MFU (launch/mfu.h). */
#include "launch/mfu.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/backend.h"
#include "core/cpu.h"
#include "core/env.h"
#include "cuda/cuda.h"

/* Dense peaks in TFLOP/s; the first name found in the device's name wins
 * (so "H100 PCIe" comes before "H100"). */
static const struct {
  const char *name;
  double f32, tf32, bf16;
} gpu_peaks[] = {
    {"H200", 66.9, 494.7, 989.4},
    {"H100 PCIe", 51.2, 378.0, 756.0},
    {"H100", 66.9, 494.7, 989.4},
    {"A100", 19.5, 156.0, 312.0},
};

double dt_mfu_gpu_peak(const char *gpu_name, const char *precision) {
  for (size_t i = 0; gpu_name && i < sizeof gpu_peaks / sizeof gpu_peaks[0]; i++) {
    if (!strstr(gpu_name, gpu_peaks[i].name))
      continue;
    double t = !strcmp(precision, "bf16")   ? gpu_peaks[i].bf16
               : !strcmp(precision, "tf32") ? gpu_peaks[i].tf32
                                            : gpu_peaks[i].f32;
    return t * 1e12;
  }
  return 0.0;
}

static double now_seconds(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

#define ROOF_N 1024
#define ROOF_RUNS 4

/* The best of ROOF_RUNS square sgemms after one warm-up, in FLOP/s. */
static dt_status measure_cpu_roof(double *flops) {
  dt_exec ex;
  DT_CHECK(dt_exec_init(DT_CPU, DT_DTYPE_F32, &ex));
  size_t n = (size_t)ROOF_N * ROOF_N;
  float *a = malloc(n * sizeof *a), *b = malloc(n * sizeof *b), *c = malloc(n * sizeof *c);
  dt_status st = DT_OK;
  if (!a || !b || !c)
    st = DT_ERROR(DT_ERR_OOM, "no host memory for the sgemm roof (%d^2 floats x 3)", ROOF_N);
  for (size_t i = 0; st == DT_OK && i < n; i++) {
    a[i] = (float)(i % 7) * 0.125f;
    b[i] = (float)(i % 5) * 0.25f;
  }
  double best = 1e30;
  for (int r = 0; st == DT_OK && r <= ROOF_RUNS; r++) {
    double t0 = now_seconds();
    st = dt_kernel_gemm(&ex, false, false, ROOF_N, ROOF_N, ROOF_N, 1.0f, a, ROOF_N, 0, b, ROOF_N, 0,
                        0.0f, c, ROOF_N, 0, 1);
    double t = now_seconds() - t0;
    if (r > 0 && t < best)
      best = t;
  }
  free(c);
  free(b);
  free(a);
  DT_CHECK(st);
  *flops = 2.0 * ROOF_N * (double)ROOF_N * ROOF_N / best;
  return DT_OK;
}

dt_status dt_mfu_peak(dt_device dev, dt_peak_flops *out) {
  memset(out, 0, sizeof *out);
  if (dev.type == DT_DEVICE_CPU) {
    static double cached = 0.0;
    static int cached_threads = 0;
    int threads = dt_cpu_num_threads();
    if (cached <= 0.0 || cached_threads != threads) {
      DT_CHECK(measure_cpu_roof(&cached));
      cached_threads = threads;
    }
    out->flops = cached;
    snprintf(out->source, sizeof out->source, "cpu sgemm %d^3, %d threads (measured)", ROOF_N,
             threads);
    return DT_OK;
  }
  dt_cuda_device_info info;
  DT_CHECK(dt_cuda_get_device_info(dev.index, &info));
  bool tf32 = true;
  DT_CHECK(dt_env_bool(DT_ENV_CUDA_TF32, &tf32));
  const char *precision = tf32 ? "tf32" : "f32";
  out->flops = dt_mfu_gpu_peak(info.name, precision);
  if (out->flops <= 0.0)
    return DT_ERROR(DT_ERR_UNSUPPORTED, "no peak FLOP/s known for %s (known: H200, H100, A100)",
                    info.name);
  snprintf(out->source, sizeof out->source, "%.60s %s (table)", info.name, precision);
  return DT_OK;
}
