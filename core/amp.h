/* Mixed precision: the training precision, autocast and its per-op policy
 * (core/autocast_policy.def). The GradScaler is in core/optim.h (it acts on
 * the optimizer's gradients); docs/mixed-precision.md explains the whole.
 *
 *   dt_dtype prev = dt_autocast_begin(DT_DTYPE_BF16);  // this thread only
 *   ... forward ...                                     // GEMMs in bf16
 *   dt_autocast_end(prev);
 */
#ifndef DT_CORE_AMP_H
#define DT_CORE_AMP_H

#include "core/device.h"
#include "core/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* `--precision`: the arithmetic of a run. */
typedef enum dt_precision {
  DT_PRECISION_DEVICE_DEFAULT = -1, /* what the device does by default: tf32 on CUDA, else fp32 */
  DT_PRECISION_FP32 = 0,            /* f32 everywhere (on CUDA with TF32 off) */
  DT_PRECISION_TF32, /* f32 storage, TF32 tensor-core GEMMs/convolutions (CUDA only) */
  DT_PRECISION_BF16, /* autocast to bf16, f32 master weights */
  DT_PRECISION_FP16, /* autocast to f16, f32 master weights, dynamic loss scaling */
  DT_PRECISION_COUNT,
} dt_precision;

/* "fp32", "tf32", "bf16", "fp16" ("default" for DT_PRECISION_DEVICE_DEFAULT). */
const char *dt_precision_name(dt_precision p);
/* Parses one of the names above; anything else is DT_ERR_INVALID_ARG naming
 * the choices. */
dt_status dt_precision_parse(const char *s, dt_precision *out);
/* The autocast dtype of p: DT_DTYPE_BF16, DT_DTYPE_F16, or DT_DTYPE_F32 (no
 * autocast) for fp32 and tf32. */
dt_dtype dt_precision_autocast_dtype(dt_precision p);
/* p, or for DT_PRECISION_DEVICE_DEFAULT the default of a device of type
 * `type`: tf32 on CUDA, fp32 elsewhere. */
dt_precision dt_precision_resolve(dt_precision p, dt_device_type type);
/* Whether p needs a GradScaler (fp16: its 5-bit exponent underflows small
 * gradients). */
int dt_precision_needs_scaler(dt_precision p);

typedef enum dt_autocast_policy {
  DT_AUTOCAST_F32 = 0, /* f32 math and an f32 result; 16-bit inputs are widened */
  DT_AUTOCAST_LOW,     /* 16-bit inputs, f32 accumulation, a 16-bit result */
  DT_AUTOCAST_PROMOTE, /* f32 math, the result in the inputs' dtype: 16-bit when all
                          are, f32 when any is (PyTorch's type promotion) */
  DT_AUTOCAST_NORM,    /* inputs read as they are, f32 statistics and math, the result
                          rounded once to the 16-bit dtype (the norms, whose result feeds
                          a GEMM that would round it anyway) */
} dt_autocast_policy;

/* The policy of the op named `op` ("dt_op_linear"), from the table; an op
 * missing from the table runs in f32. */
dt_autocast_policy dt_autocast_policy_of(const char *op);

/* Autocast is per thread (as grad mode): ops run on this thread between
 * begin and end follow the policy with `dtype` (DT_DTYPE_BF16 or
 * DT_DTYPE_F16; DT_DTYPE_F32 turns autocast off). Returns the previous
 * dtype, to pass to dt_autocast_end (scopes nest). */
dt_dtype dt_autocast_begin(dt_dtype dtype);
void dt_autocast_end(dt_dtype previous);
/* The dtype in effect on this thread: DT_DTYPE_F32 when off. */
dt_dtype dt_autocast_dtype(void);
/* The dtype op's float inputs are computed in on this thread now: the
 * autocast dtype for a DT_AUTOCAST_LOW op under autocast, else f32. */
dt_dtype dt_autocast_dtype_for(const char *op);
/* The dtype a DT_AUTOCAST_NORM op writes its result in on this thread: the
 * autocast dtype under autocast, else (and for the other policies) f32. */
dt_dtype dt_autocast_norm_dtype_for(const char *op);

#ifdef __cplusplus
}
#endif
#endif
