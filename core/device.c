/* dtypes, scalar conversions and device names. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/device.h"

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

static uint32_t f32_bits(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  return u;
}

static float bits_f32(uint32_t u) {
  float f;
  memcpy(&f, &u, 4);
  return f;
}

uint16_t dt_f32_to_bf16(float f) {
  uint32_t u = f32_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) /* NaN: keep it quiet, keep the sign */
    return (uint16_t)((u >> 16) | 0x0040u);
  uint32_t rounding = 0x7fffu + ((u >> 16) & 1u); /* round to nearest even */
  return (uint16_t)((u + rounding) >> 16);
}

float dt_bf16_to_f32(uint16_t h) { return bits_f32((uint32_t)h << 16); }

uint16_t dt_f32_to_f16(float f) {
  uint32_t u = f32_bits(f);
  uint32_t sign = (u >> 16) & 0x8000u;
  uint32_t abs = u & 0x7fffffffu;
  if (abs > 0x7f800000u) /* NaN */
    return (uint16_t)(sign | 0x7e00u);
  if (abs >= 0x477ff000u) /* >= 65520 rounds to Inf (and Inf itself) */
    return (uint16_t)(sign | 0x7c00u);
  if (abs < 0x38800000u) { /* below the smallest normal half (2^-14): subnormal */
    /* value = abs_f * 2^24 in units of the smallest subnormal, rounded even */
    float a = bits_f32(abs);
    float scaled = a * 16777216.0f; /* exact: power of two */
    uint32_t q = (uint32_t)scaled;
    float rem = scaled - (float)q;
    if (rem > 0.5f || (rem == 0.5f && (q & 1u)))
      q++;
    return (uint16_t)(sign | q);
  }
  /* normal: rebias exponent 127 -> 15, keep 10 mantissa bits, round even */
  uint32_t mant = abs & 0x7fffffu;
  uint32_t exp = (abs >> 23) - 127 + 15;
  uint32_t h = (exp << 10) | (mant >> 13);
  uint32_t rest = mant & 0x1fffu;
  if (rest > 0x1000u || (rest == 0x1000u && (h & 1u)))
    h++; /* may carry into the exponent, which is correct */
  return (uint16_t)(sign | h);
}

float dt_f16_to_f32(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  if (exp == 0) {
    float v = (float)mant * (1.0f / 16777216.0f); /* mant * 2^-24 */
    return sign ? -v : v;
  }
  if (exp == 31)
    return bits_f32(sign | 0x7f800000u | (mant << 13));
  return bits_f32(sign | ((exp - 15 + 127) << 23) | (mant << 13));
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
    return DT_ERROR(DT_ERR_INVALID_ARG,
                    "unknown device '%s': expected cpu, cpu:N, cuda or cuda:N", s);
  }
  d.index = 0;
  if (*rest == ':') {
    char *end;
    long v = strtol(rest + 1, &end, 10);
    if (end == rest + 1 || *end != '\0' || v < 0 || v > 1023)
      return DT_ERROR(DT_ERR_INVALID_ARG, "bad device index in '%s': expected %s:N with N >= 0",
                      s, d.type == DT_DEVICE_CUDA ? "cuda" : "cpu");
    d.index = (int)v;
  } else if (*rest != '\0') {
    return DT_ERROR(DT_ERR_INVALID_ARG,
                    "unknown device '%s': expected cpu, cpu:N, cuda or cuda:N", s);
  }
  *out = d;
  return DT_OK;
}

int dt_device_equal(dt_device a, dt_device b) { return a.type == b.type && a.index == b.index; }
