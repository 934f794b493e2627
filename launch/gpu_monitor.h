/* GPU monitor: utilisation, memory, temperature and power per GPU through
 * NVML, loaded at run time (dlopen of libnvidia-ml.so.1, the driver's
 * library), so dtrain runs where there is no driver and says why.
 *
 *   dt_gpu_monitor *m = NULL;
 *   if (dt_gpu_monitor_open(&m) != DT_OK) puts(dt_last_error());   // "unavailable: ..."
 *   dt_gpu_sample s;
 *   for (int i = 0; i < dt_gpu_monitor_count(m); i++)
 *     if (dt_gpu_monitor_sample(m, i, &s) == DT_OK) ...
 *   dt_gpu_monitor_close(m);
 *
 * Indices are NVML's (all GPUs of the machine, not CUDA_VISIBLE_DEVICES).
 */
#ifndef DT_LAUNCH_GPU_MONITOR_H
#define DT_LAUNCH_GPU_MONITOR_H

#include <stddef.h>
#include <stdint.h>

#include "core/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct dt_gpu_monitor dt_gpu_monitor;

/* DT_ERR_UNSUPPORTED with "GPU monitor unavailable: <reason>" (no driver
 * library, nvmlInit failed, no GPU). */
dt_status dt_gpu_monitor_open(dt_gpu_monitor **out);
void dt_gpu_monitor_close(dt_gpu_monitor *m); /* NULL is a no-op */
int dt_gpu_monitor_count(const dt_gpu_monitor *m);

typedef struct dt_gpu_sample {
  char name[96];
  int util_percent; /* -1 = unknown, as are the fields below */
  int memory_util_percent;
  double memory_used_mib, memory_total_mib;
  int temperature_c;
  double power_w, power_limit_w;
} dt_gpu_sample;
dt_status dt_gpu_monitor_sample(dt_gpu_monitor *m, int index, dt_gpu_sample *out);

/* "gpu0 57% 12.1/80.0 GiB 61C 230/700W" into buf. */
void dt_gpu_sample_format(int index, const dt_gpu_sample *s, char *buf, size_t cap);

#ifdef __cplusplus
}
#endif
#endif
