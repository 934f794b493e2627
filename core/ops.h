/* Differentiable operations. Each returns a new tensor through `out` (the
 * caller owns one reference) and records a backward node when grad mode is
 * on and an input requires grad. Inputs must be on the same device
 * (DT_ERR_DEVICE_MISMATCH names the op and both devices); float math is f32
 * (f16/bf16 tensors must be converted first: DT_ERR_DTYPE otherwise).
 * Non-contiguous inputs are made contiguous internally.
 */
#ifndef DT_CORE_OPS_H
#define DT_CORE_OPS_H

#include <stdbool.h>
#include <stdint.h>

#include "core/rng.h"
#include "core/status.h"
#include "core/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The target value cross-entropy skips by convention (PyTorch's default). */
#define DT_IGNORE_INDEX (-100)

typedef enum dt_reduction {
  DT_REDUCTION_MEAN = 0,
  DT_REDUCTION_SUM,
  DT_REDUCTION_NONE,
} dt_reduction;

/* Sums t (f32, contiguous, on the op's device) in place over every process
 * taking part: an allreduce (SUM) of the process group, for SyncBatchNorm
 * (dt_op_sync_batch_norm2d). `user` must outlive the backward passes of
 * the ops given it. */
typedef struct dt_sum_across {
  dt_status (*sum)(dt_tensor *t, void *user);
  void *user;
} dt_sum_across;

/* The differentiable ops, with their shapes and semantics: one DT_OP entry
 * each in core/op_table.def (next to the kernels they run). */
#define DT_OP(name, params) dt_status name params;
#include "core/op_table.def"

/* ---- non-differentiable helpers ---- */
/* argmax over the last dim -> i64 (..., ); the first maximum wins ties and
 * NaN counts as the maximum (as PyTorch). Computed on the host for now. */
dt_status dt_op_argmax(dt_tensor *x, dt_tensor **out);

#ifdef __cplusplus
}
#endif
#endif
