/* Device peaks for MFU (train/mfu.h). */
#include "train/mfu.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/autograd.h"
#include "core/backend.h"
#include "core/cpu.h"
#include "core/env.h"
#include "core/ops.h"
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

static double seconds(clockid_t clock) {
  struct timespec ts;
  clock_gettime(clock, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

#define ROOF_N 1024
#define ROOF_RUNS 6

double dt_mfu_roof_of_runs(double flops, const double *wall_s, const double *cpu_s, int n,
                           int threads) {
  double best = 0.0;
  for (int i = 0; i < n; i++) {
    double rate = wall_s[i] > 0 ? flops / wall_s[i] : 0.0;
    double per_cpu = cpu_s && cpu_s[i] > 0 ? (double)threads * flops / cpu_s[i] : 0.0;
    if (per_cpu > rate)
      rate = per_cpu;
    if (rate > best)
      best = rate;
  }
  return best;
}

/* ROOF_RUNS square sgemms after one warm-up (dt_mfu_roof_of_runs). */
static dt_status measure_cpu_roof(int threads, double *flops) {
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
  double wall[ROOF_RUNS + 1], cpu[ROOF_RUNS + 1];
  for (int r = 0; st == DT_OK && r <= ROOF_RUNS; r++) {
    double w0 = seconds(CLOCK_MONOTONIC), c0 = seconds(CLOCK_PROCESS_CPUTIME_ID);
    st = dt_kernel_gemm(&ex, false, false, ROOF_N, ROOF_N, ROOF_N, 1.0f, a, ROOF_N, 0, b, ROOF_N, 0,
                        0.0f, c, ROOF_N, 0, 1);
    cpu[r] = seconds(CLOCK_PROCESS_CPUTIME_ID) - c0;
    wall[r] = seconds(CLOCK_MONOTONIC) - w0;
  }
  free(c);
  free(b);
  free(a);
  DT_CHECK(st);
  /* run 0 warms up (threads started, pages touched) */
  *flops = dt_mfu_roof_of_runs(2.0 * ROOF_N * (double)ROOF_N * ROOF_N, wall + 1, cpu + 1, ROOF_RUNS,
                               threads);
  if (!(*flops > 0))
    return DT_ERROR(DT_ERR_INTERNAL, "the sgemm roof took no measurable time");
  return DT_OK;
}

/* The CPU roof at this thread count (kept in *cache, the caller's; NULL =
 * measured every time; `again`: measured anew, the higher value kept). */
static dt_status cpu_peak(dt_mfu_cache *cache, bool again, dt_peak_flops *out) {
  dt_mfu_cache none = {0.0, 0};
  dt_mfu_cache *c = cache ? cache : &none;
  int threads = dt_cpu_num_threads();
  if (c->roof <= 0.0 || c->threads != threads || again) {
    double flops = 0.0;
    DT_CHECK(measure_cpu_roof(threads, &flops));
    if (c->threads != threads || flops > c->roof)
      c->roof = flops;
    c->threads = threads;
  }
  out->flops = c->roof;
  snprintf(out->source, sizeof out->source, "cpu sgemm %d^3, %d threads (measured)", ROOF_N,
           threads);
  return DT_OK;
}

#define HALF_ROOF_WIDTH 768 /* GPT-2's model width */

static bool is_half(dt_precision p) { return p == DT_PRECISION_BF16 || p == DT_PRECISION_FP16; }

/* One 16-bit linear forward and backward (x and w leaves of `dtype`). */
static dt_status half_linear_step(dt_tensor *x, dt_tensor *w, dt_tensor *dy) {
  dt_tensor *y = NULL;
  DT_CHECK(dt_op_linear(x, w, NULL, &y));
  dt_status st = dt_backward(y, dy);
  dt_tensor_release(y);
  return st;
}

static dt_status measure_cpu_linear_roof(dt_precision precision, int rows, int threads,
                                         double *flops) {
  dt_dtype dtype = is_half(precision) ? dt_precision_autocast_dtype(precision) : DT_DTYPE_F32;
  const int64_t xs[2] = {rows, HALF_ROOF_WIDTH}, ws[2] = {HALF_ROOF_WIDTH, HALF_ROOF_WIDTH};
  dt_tensor *x32 = NULL, *w32 = NULL, *x = NULL, *w = NULL, *dy = NULL;
  dt_status st = DT_OK;
  DT_CHECK_GOTO(dt_tensor_full(xs, 2, 0.5f, DT_CPU, &x32), st, done);
  DT_CHECK_GOTO(dt_tensor_full(ws, 2, 0.25f, DT_CPU, &w32), st, done);
  DT_CHECK_GOTO(dt_tensor_to_dtype(x32, dtype, &x), st, done);
  DT_CHECK_GOTO(dt_tensor_to_dtype(w32, dtype, &w), st, done);
  DT_CHECK_GOTO(dt_tensor_set_requires_grad(x, 1), st, done);
  DT_CHECK_GOTO(dt_tensor_set_requires_grad(w, 1), st, done);
  DT_CHECK_GOTO(dt_tensor_to_dtype(x32, dtype, &dy), st, done);
  double wall[ROOF_RUNS + 1], cpu[ROOF_RUNS + 1];
  dt_dtype prev = is_half(precision) ? dt_autocast_begin(dtype) : DT_DTYPE_F32;
  for (int r = 0; st == DT_OK && r <= ROOF_RUNS; r++) {
    double w0 = seconds(CLOCK_MONOTONIC), c0 = seconds(CLOCK_PROCESS_CPUTIME_ID);
    st = half_linear_step(x, w, dy);
    cpu[r] = seconds(CLOCK_PROCESS_CPUTIME_ID) - c0;
    wall[r] = seconds(CLOCK_MONOTONIC) - w0;
  }
  if (is_half(precision))
    dt_autocast_end(prev);
  DT_CHECK_GOTO(st, st, done);
  *flops = dt_mfu_roof_of_runs(6.0 * rows * (double)HALF_ROOF_WIDTH * HALF_ROOF_WIDTH, wall + 1,
                               cpu + 1, ROOF_RUNS, threads);
  if (!(*flops > 0))
    st = DT_ERROR(DT_ERR_INTERNAL, "the linear roof took no measurable time");
done:
  dt_tensor *all[] = {dy, w, x, w32, x32};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
    dt_tensor_release(all[i]);
  return st;
}

dt_status dt_mfu_cpu_linear_roof(dt_precision precision, int rows, dt_mfu_cache *cache,
                                 dt_peak_flops *out) {
  memset(out, 0, sizeof *out);
  if (precision == DT_PRECISION_DEVICE_DEFAULT || precision == DT_PRECISION_TF32)
    precision = DT_PRECISION_FP32; /* the CPU has no TF32 */
  if (!is_half(precision) && precision != DT_PRECISION_FP32)
    return DT_ERROR(DT_ERR_INVALID_ARG, "`precision` %s: the linear roof is for fp32, bf16 or fp16",
                    dt_precision_name(precision));
  rows = rows < 16 ? 16 : rows > 1024 ? 1024 : rows;
  dt_mfu_cache none = {0};
  dt_mfu_cache *c = cache ? cache : &none;
  int threads = dt_cpu_num_threads();
  if (c->half_roof <= 0.0 || c->half_threads != threads || c->half_rows != rows ||
      c->half_precision != precision) {
    DT_CHECK(measure_cpu_linear_roof(precision, rows, threads, &c->half_roof));
    c->half_threads = threads;
    c->half_rows = rows;
    c->half_precision = precision;
  }
  out->flops = c->half_roof;
  snprintf(out->source, sizeof out->source, "cpu %s linear %dx%d^2, %d threads (measured)",
           dt_precision_name(precision), rows, HALF_ROOF_WIDTH, threads);
  return DT_OK;
}

dt_status dt_mfu_of(dt_device dev, dt_precision precision, dt_mfu_cache *cache, double achieved,
                    dt_mfu *out) {
  memset(out, 0, sizeof *out);
  out->value = -1.0;
  DT_CHECK(dt_mfu_peak(dev, precision, cache, &out->peak));
  if (achieved > out->peak.flops && dev.type == DT_DEVICE_CPU)
    DT_CHECK(cpu_peak(cache, true, &out->peak));
  if (achieved > out->peak.flops)
    out->above_roof = true;
  else
    out->value = achieved / out->peak.flops;
  return DT_OK;
}

/* The column of the peak table for a run at `precision` (see dt_mfu_peak). */
static dt_status peak_column(dt_precision precision, const char **out) {
  if (precision == DT_PRECISION_BF16 || precision == DT_PRECISION_FP16) {
    *out = "bf16";
    return DT_OK;
  }
  if (precision == DT_PRECISION_FP32) {
    *out = "f32";
    return DT_OK;
  }
  bool tf32 = true;
  if (precision == DT_PRECISION_DEVICE_DEFAULT)
    DT_CHECK(dt_env_bool(DT_ENV_CUDA_TF32, &tf32));
  *out = tf32 ? "tf32" : "f32";
  return DT_OK;
}

dt_status dt_mfu_peak(dt_device dev, dt_precision precision, dt_mfu_cache *cache,
                      dt_peak_flops *out) {
  memset(out, 0, sizeof *out);
  if (dev.type == DT_DEVICE_CPU)
    return cpu_peak(cache, false, out);
  dt_cuda_device_info info;
  DT_CHECK(dt_cuda_get_device_info(dev.index, &info));
  const char *column = NULL;
  DT_CHECK(peak_column(precision, &column));
  out->flops = dt_mfu_gpu_peak(info.name, column);
  if (out->flops <= 0.0)
    return DT_ERROR(DT_ERR_UNSUPPORTED, "no peak FLOP/s known for %s (known: H200, H100, A100)",
                    info.name);
  snprintf(out->source, sizeof out->source, "%.60s %s (table)", info.name, column);
  return DT_OK;
}
