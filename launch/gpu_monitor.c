/* NVML through dlopen (launch/gpu_monitor.h). The few NVML entry points
 * used are declared here with their C ABI (nvml.h is not part of the
 * toolkit on every machine). */
#include "launch/gpu_monitor.h"

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef int nvml_return;   /* nvmlReturn_t: 0 = NVML_SUCCESS */
typedef void *nvml_device; /* nvmlDevice_t */
typedef struct {
  unsigned int gpu, memory;
} nvml_utilization;
typedef struct {
  unsigned long long total, free, used;
} nvml_memory;

struct dt_gpu_monitor {
  void *lib;
  unsigned int count;
  nvml_return (*shutdown)(void);
  const char *(*error_string)(nvml_return);
  nvml_return (*handle_by_index)(unsigned int, nvml_device *);
  nvml_return (*get_name)(nvml_device, char *, unsigned int);
  nvml_return (*utilization)(nvml_device, nvml_utilization *);
  nvml_return (*memory)(nvml_device, nvml_memory *);
  nvml_return (*temperature)(nvml_device, int, unsigned int *); /* sensor 0 = GPU */
  nvml_return (*power)(nvml_device, unsigned int *);            /* milliwatts */
  nvml_return (*power_limit)(nvml_device, unsigned int *);
};

static const char *nvml_error(const dt_gpu_monitor *m, nvml_return rc) {
  const char *s = m->error_string ? m->error_string(rc) : NULL;
  return s ? s : "unknown NVML error";
}

static void *sym(void *lib, const char *name) { return dlsym(lib, name); }

dt_status dt_gpu_monitor_open(dt_gpu_monitor **out) {
  *out = NULL;
  void *lib = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    const char *why = dlerror();
    return DT_ERROR(DT_ERR_UNSUPPORTED,
                    "GPU monitor unavailable: the NVIDIA driver's NVML library "
                    "(libnvidia-ml.so.1) cannot be loaded (%s): no NVIDIA driver on this machine",
                    why ? why : "not found");
  }
  dt_gpu_monitor *m = calloc(1, sizeof *m);
  if (!m) {
    dlclose(lib);
    return DT_ERROR(DT_ERR_OOM, "no host memory for the GPU monitor");
  }
  m->lib = lib;
  nvml_return (*init)(void) = (nvml_return(*)(void))sym(lib, "nvmlInit_v2");
  nvml_return (*count)(unsigned int *) =
      (nvml_return(*)(unsigned int *))sym(lib, "nvmlDeviceGetCount_v2");
  m->shutdown = (nvml_return(*)(void))sym(lib, "nvmlShutdown");
  m->error_string = (const char *(*)(nvml_return))sym(lib, "nvmlErrorString");
  m->handle_by_index =
      (nvml_return(*)(unsigned int, nvml_device *))sym(lib, "nvmlDeviceGetHandleByIndex_v2");
  m->get_name = (nvml_return(*)(nvml_device, char *, unsigned int))sym(lib, "nvmlDeviceGetName");
  m->utilization =
      (nvml_return(*)(nvml_device, nvml_utilization *))sym(lib, "nvmlDeviceGetUtilizationRates");
  m->memory = (nvml_return(*)(nvml_device, nvml_memory *))sym(lib, "nvmlDeviceGetMemoryInfo");
  m->temperature =
      (nvml_return(*)(nvml_device, int, unsigned int *))sym(lib, "nvmlDeviceGetTemperature");
  m->power = (nvml_return(*)(nvml_device, unsigned int *))sym(lib, "nvmlDeviceGetPowerUsage");
  m->power_limit =
      (nvml_return(*)(nvml_device, unsigned int *))sym(lib, "nvmlDeviceGetEnforcedPowerLimit");
  dt_status st = DT_OK;
  nvml_return rc;
  if (!init || !count || !m->shutdown || !m->handle_by_index) {
    st = DT_ERROR(DT_ERR_UNSUPPORTED,
                  "GPU monitor unavailable: libnvidia-ml.so.1 lacks nvmlInit_v2 or "
                  "nvmlDeviceGetCount_v2 (a driver too old)");
  } else if ((rc = init()) != 0) {
    st = DT_ERROR(DT_ERR_UNSUPPORTED, "GPU monitor unavailable: nvmlInit failed: %s",
                  nvml_error(m, rc));
    m->shutdown = NULL;
  } else if ((rc = count(&m->count)) != 0) {
    st = DT_ERROR(DT_ERR_UNSUPPORTED, "GPU monitor unavailable: nvmlDeviceGetCount failed: %s",
                  nvml_error(m, rc));
  } else if (m->count == 0) {
    st = DT_ERROR(DT_ERR_UNSUPPORTED, "GPU monitor unavailable: NVML sees no GPU");
  }
  if (st != DT_OK) {
    dt_gpu_monitor_close(m);
    return st;
  }
  *out = m;
  return DT_OK;
}

void dt_gpu_monitor_close(dt_gpu_monitor *m) {
  if (!m)
    return;
  if (m->shutdown)
    m->shutdown();
  dlclose(m->lib);
  free(m);
}

int dt_gpu_monitor_count(const dt_gpu_monitor *m) { return m ? (int)m->count : 0; }

dt_status dt_gpu_monitor_sample(dt_gpu_monitor *m, int index, dt_gpu_sample *out) {
  memset(out, 0, sizeof *out);
  out->util_percent = out->memory_util_percent = out->temperature_c = -1;
  out->memory_used_mib = out->memory_total_mib = out->power_w = out->power_limit_w = -1.0;
  if (!m || index < 0 || (unsigned)index >= m->count)
    return DT_ERROR(DT_ERR_INVALID_ARG, "GPU %d: the monitor sees %d GPU(s)", index,
                    dt_gpu_monitor_count(m));
  nvml_device d = NULL;
  nvml_return rc = m->handle_by_index((unsigned)index, &d);
  if (rc != 0)
    return DT_ERROR(DT_ERR_UNSUPPORTED, "GPU %d: nvmlDeviceGetHandleByIndex failed: %s", index,
                    nvml_error(m, rc));
  if (!m->get_name || m->get_name(d, out->name, sizeof out->name) != 0)
    snprintf(out->name, sizeof out->name, "GPU %d", index);
  nvml_utilization u;
  if (m->utilization && m->utilization(d, &u) == 0) {
    out->util_percent = (int)u.gpu;
    out->memory_util_percent = (int)u.memory;
  }
  nvml_memory mem;
  if (m->memory && m->memory(d, &mem) == 0) {
    out->memory_used_mib = (double)mem.used / (1024.0 * 1024.0);
    out->memory_total_mib = (double)mem.total / (1024.0 * 1024.0);
  }
  unsigned int v = 0;
  if (m->temperature && m->temperature(d, 0, &v) == 0)
    out->temperature_c = (int)v;
  if (m->power && m->power(d, &v) == 0)
    out->power_w = v / 1000.0;
  if (m->power_limit && m->power_limit(d, &v) == 0)
    out->power_limit_w = v / 1000.0;
  return DT_OK;
}

void dt_gpu_sample_format(int index, const dt_gpu_sample *s, char *buf, size_t cap) {
  char util[16] = "?%", temp[16] = "?C", power[32] = "?W";
  if (s->util_percent >= 0)
    snprintf(util, sizeof util, "%d%%", s->util_percent);
  if (s->temperature_c >= 0)
    snprintf(temp, sizeof temp, "%dC", s->temperature_c);
  if (s->power_w >= 0 && s->power_limit_w > 0)
    snprintf(power, sizeof power, "%.0f/%.0fW", s->power_w, s->power_limit_w);
  else if (s->power_w >= 0)
    snprintf(power, sizeof power, "%.0fW", s->power_w);
  snprintf(buf, cap, "gpu%d %s %.1f/%.1f GiB %s %s", index, util, s->memory_used_mib / 1024.0,
           s->memory_total_mib / 1024.0, temp, power);
}
