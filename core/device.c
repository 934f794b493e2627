/* dtypes and device names. */
#include "core/device.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

size_t dt_dtype_size(dt_dtype t) {
  switch (t) {
    case DT_DTYPE_F32: return 4;
    case DT_DTYPE_F16: return 2;
    case DT_DTYPE_BF16: return 2;
    case DT_DTYPE_I32: return 4;
    case DT_DTYPE_I64: return 8;
    case DT_DTYPE_U8: return 1;
    default: return 0;
  }
}

const char *dt_dtype_name(dt_dtype t) {
  switch (t) {
    case DT_DTYPE_F32: return "f32";
    case DT_DTYPE_F16: return "f16";
    case DT_DTYPE_BF16: return "bf16";
    case DT_DTYPE_I32: return "i32";
    case DT_DTYPE_I64: return "i64";
    case DT_DTYPE_U8: return "u8";
    default: return "invalid";
  }
}

int dt_dtype_is_float(dt_dtype t) {
  return t == DT_DTYPE_F32 || t == DT_DTYPE_F16 || t == DT_DTYPE_BF16;
}

char *dt_device_format(dt_device d, char *buf, size_t cap) {
  snprintf(buf, cap, "%s:%d", d.type == DT_DEVICE_CUDA ? "cuda" : "cpu", d.index);
  return buf;
}

dt_status dt_device_parse(const char *s, dt_device *out) {
  const char *rest;
  dt_device d;
  if (s == NULL)
    return DT_ERROR(DT_ERR_INVALID_ARG, "device is NULL");
  if (strncmp(s, "cpu", 3) == 0) {
    d.type = DT_DEVICE_CPU;
    rest = s + 3;
  } else if (strncmp(s, "cuda", 4) == 0) {
    d.type = DT_DEVICE_CUDA;
    rest = s + 4;
  } else {
    return DT_ERROR(DT_ERR_INVALID_ARG, "unknown device '%s': expected cpu, cpu:N, cuda or cuda:N",
                    s);
  }
  d.index = 0;
  if (*rest == ':') {
    char *end;
    long v = strtol(rest + 1, &end, 10);
    if (end == rest + 1 || *end != '\0' || v < 0 || v > 1023)
      return DT_ERROR(DT_ERR_INVALID_ARG, "bad device index in '%s': expected %s:N with N >= 0", s,
                      d.type == DT_DEVICE_CUDA ? "cuda" : "cpu");
    d.index = (int)v;
  } else if (*rest != '\0') {
    return DT_ERROR(DT_ERR_INVALID_ARG, "unknown device '%s': expected cpu, cpu:N, cuda or cuda:N",
                    s);
  }
  *out = d;
  return DT_OK;
}

int dt_device_equal(dt_device a, dt_device b) { return a.type == b.type && a.index == b.index; }
