/* Precision names and the per-thread autocast state (core/amp.h). */
#include "core/amp.h"

#include <string.h>

static const char *const precision_names[DT_PRECISION_COUNT] = {"fp32", "tf32", "bf16", "fp16"};

const char *dt_precision_name(dt_precision p) {
  if (p == DT_PRECISION_DEVICE_DEFAULT)
    return "default";
  return (unsigned)p < DT_PRECISION_COUNT ? precision_names[p] : "invalid";
}

dt_precision dt_precision_resolve(dt_precision p, dt_device_type type) {
  if (p != DT_PRECISION_DEVICE_DEFAULT)
    return p;
  return type == DT_DEVICE_CUDA ? DT_PRECISION_TF32 : DT_PRECISION_FP32;
}

dt_status dt_precision_parse(const char *s, dt_precision *out) {
  for (int p = 0; s != NULL && p < DT_PRECISION_COUNT; p++)
    if (strcmp(s, precision_names[p]) == 0) {
      *out = (dt_precision)p;
      return DT_OK;
    }
  return DT_ERROR(DT_ERR_INVALID_ARG, "unknown precision '%s': expected fp32, tf32, bf16 or fp16",
                  s ? s : "(null)");
}

dt_dtype dt_precision_autocast_dtype(dt_precision p) {
  return p == DT_PRECISION_BF16   ? DT_DTYPE_BF16
         : p == DT_PRECISION_FP16 ? DT_DTYPE_F16
                                  : DT_DTYPE_F32;
}

int dt_precision_needs_scaler(dt_precision p) { return p == DT_PRECISION_FP16; }

static const struct {
  const char *op;
  dt_autocast_policy policy;
} policies[] = {
#define DT_AUTOCAST(op, policy) {#op, policy},
#include "core/autocast_policy.def"
};

dt_autocast_policy dt_autocast_policy_of(const char *op) {
  for (size_t i = 0; op != NULL && i < sizeof policies / sizeof policies[0]; i++)
    if (strcmp(op, policies[i].op) == 0)
      return policies[i].policy;
  return DT_AUTOCAST_F32;
}

static _Thread_local dt_dtype autocast_dtype = DT_DTYPE_F32;

dt_dtype dt_autocast_begin(dt_dtype dtype) {
  dt_dtype prev = autocast_dtype;
  autocast_dtype = (dtype == DT_DTYPE_BF16 || dtype == DT_DTYPE_F16) ? dtype : DT_DTYPE_F32;
  return prev;
}

void dt_autocast_end(dt_dtype previous) { autocast_dtype = previous; }

dt_dtype dt_autocast_dtype(void) { return autocast_dtype; }

dt_dtype dt_autocast_dtype_for(const char *op) {
  if (autocast_dtype == DT_DTYPE_F32 || dt_autocast_policy_of(op) != DT_AUTOCAST_LOW)
    return DT_DTYPE_F32;
  return autocast_dtype;
}

dt_dtype dt_autocast_norm_dtype_for(const char *op) {
  if (autocast_dtype == DT_DTYPE_F32 || dt_autocast_policy_of(op) != DT_AUTOCAST_NORM)
    return DT_DTYPE_F32;
  return autocast_dtype;
}
